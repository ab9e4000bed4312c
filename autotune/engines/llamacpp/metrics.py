"""llama-server's Prometheus names (served with ``--metrics``, which autotune's launch sets), as
a :class:`~autotune.engines.base.MetricsMap` (generic name -> families).

Family names as autotune's reader keys them (:func:`autotune._prometheus.totals`): a counter's
``_total`` suffix stripped. What llama.cpp exposes (``server_task_result_metrics::to_metrics``):
counters of prompt tokens processed (cached ones apart), tokens generated, ``llama_decode``
calls and speculative drafts; gauges of requests processing (busy slots) and deferred (waiting
for a slot). It has no KV-cache usage gauge and no preemption counter, and counts cached prompt
tokens but not the prompt tokens looked up, so ``kv_cache_usage``, ``preemptions`` and
``prefix_cache_queries`` (hence the prefix-cache hit rate) are absent for it, never 0.
"""

from __future__ import annotations

from autotune.engines.base import MetricsMap

LLAMACPP_METRICS = MetricsMap(
    gauges={
        "requests_running": ("llamacpp:requests_processing",),
        "requests_waiting": ("llamacpp:requests_deferred",),
    },
    counters={
        "prompt_tokens": ("llamacpp:prompt_tokens",),
        "generation_tokens": ("llamacpp:tokens_predicted",),
        "prefix_cache_hits": ("llamacpp:prompt_tokens_cached",),
        "decode_calls": ("llamacpp:n_decode",),
        "spec_decode_drafts": ("llamacpp:spec_decode_num_drafts",),
        "spec_decode_draft_tokens": ("llamacpp:spec_decode_num_draft_tokens",),
        "spec_decode_accepted_tokens": ("llamacpp:spec_decode_num_accepted_tokens",),
    },
)
