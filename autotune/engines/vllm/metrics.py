"""vLLM's Prometheus metric names, as a :class:`~autotune.engines.base.MetricsMap` (generic
name -> families).

Family names as ``prometheus_client`` reports them: a counter's family has no ``_total``
suffix (its sample does). Older vLLM releases called the KV-cache gauge and the prefix-cache
counters ``gpu_*``; both spellings are listed, the first present wins. Speculative-decoding
counters exist only when a draft method is configured.
"""

from __future__ import annotations

from autotune.engines.base import MetricsMap

VLLM_METRICS = MetricsMap(
    gauges={
        "requests_running": ("vllm:num_requests_running",),
        "requests_waiting": ("vllm:num_requests_waiting",),
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
    counters={
        "preemptions": ("vllm:num_preemptions",),
        "prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
        "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
        "prompt_tokens": ("vllm:prompt_tokens",),
        "generation_tokens": ("vllm:generation_tokens",),
        "spec_decode_drafts": ("vllm:spec_decode_num_drafts",),
        "spec_decode_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
        "spec_decode_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
    },
)
