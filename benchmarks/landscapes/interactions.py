"""A second SIMULATED landscape, shaped unlike GLM-5: interactions, numeric dims, an OOM cliff.

A cost model, not a measurement: a dense 30B model on one 80 GiB GPU serving a throughput
workload (128 concurrent requests, 1,024-token prompts, 256-token answers). Every number below
is an ASSUMPTION chosen to give the search problems that real tuning has and GLM-5's nearly
separable landscape lacks:

* **interactions**: a decode batch replays a CUDA graph only when it fits under the largest
  capture size; a larger batch runs eagerly (6 ms of host launch per step). So capture sizes up
  to 256/512 pay off only with a matching ``max_num_seqs``, and a large ``max_num_seqs`` pays
  off only with capture sizes that cover it and KV memory that holds it. Coarse lists pad the
  batch up to the next size (wasted rows).
* **numeric dims that matter**: the batch is ``min(max_num_seqs, KV capacity, 192)``; the KV
  capacity grows with ``gpu_memory_utilization`` (and doubles with an fp8 cache) and shrinks
  with the activation memory of ``max_num_batched_tokens``, whose prefill efficiency peaks
  near 8-16k tokens.
* **an OOM cliff**: the CUDA-graph pool (larger for long capture lists) and the CUDA context
  live outside vLLM's budget, so a utilization above about 0.95-0.965 (lower with long lists)
  dies at start; below the KV needed for one request, start-up fails too ("insufficient KV").
* **a wrong region spanning several dims**: an fp8 KV cache with the FlashInfer backend at block
  size 8 or 32 decodes garbage (a layout mismatch), and it looks 4 % faster.
* distractors with no effect (``disable_log_stats``, ``scheduling_policy``).

Parameters missing from ``params`` take vLLM's defaults (:data:`DEFAULTS`).
"""

from __future__ import annotations

import math
from typing import Any

#: measurement noise the harness adds by default
NOISE = 0.10
#: accepted, no effect
NOT_MODELLED = ("disable_log_stats", "scheduling_policy")
#: per-launch cost model in minutes: a 60 GB checkpoint loads and captures in about 4 minutes
COST_MINUTES = {"load": 4.0, "failed_start": 2.0, "check": 0.5, "bench": 2.0}

DEFAULT_CAPTURE = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
DEFAULTS: dict[str, Any] = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "gpu_memory_utilization": 0.9,
    "block_size": 16,
    "kv_cache_dtype": "auto",
    "attention_backend": "auto",
    "enable_prefix_caching": True,
    "async_scheduling": False,
    "enable_chunked_prefill": True,
    "cudagraph_capture_sizes": None,
}

CONCURRENCY = 128
TOKENS_PER_SEQ = 1024 + 256
GPU_GIB = 80.0
DRIVER_RESERVE_GIB = 0.5
CONTEXT_GIB = 1.6
WEIGHTS_GIB = 56.0
ACTIVATION_GIB_PER_1K = 0.22
KV_KIB_PER_TOKEN = {"auto": 96.0, "fp8": 48.0, "fp8_e5m2": 48.0}
BACKEND_SPEED = {"auto": 1.0, "FLASH_ATTN": 1.0, "FLASHINFER": 1.02, "TRITON_ATTN": 0.85}
BLOCK_SPEED = {8: 0.97, 16: 1.0, 32: 1.0}
EAGER_HOST_MS = 6.0
SCHEDULER_MS = 0.2


def _get(params: dict[str, Any], name: str) -> Any:
    value = params.get(name)
    return DEFAULTS[name] if value is None else value


def capture_sizes(params: dict[str, Any]) -> tuple[int, ...]:
    sizes = params.get("cudagraph_capture_sizes")
    if sizes is None:
        cap = 2 * int(_get(params, "max_num_seqs"))
        return tuple(s for s in DEFAULT_CAPTURE if s <= cap)
    return tuple(sorted(int(s) for s in sizes))


def graph_pool_gib(sizes: tuple[int, ...]) -> float:
    """The CUDA-graph pool: a fixed part per size plus one growing with the largest size."""
    return 0.02 * len(sizes) + (max(sizes) / 512.0) * 1.2 if sizes else 0.0


def kv_capacity_seqs(params: dict[str, Any]) -> float:
    budget = float(_get(params, "gpu_memory_utilization")) * GPU_GIB
    activations = ACTIVATION_GIB_PER_1K * int(_get(params, "max_num_batched_tokens")) / 1024
    kv_gib = budget - WEIGHTS_GIB - activations
    per_seq_gib = KV_KIB_PER_TOKEN[_get(params, "kv_cache_dtype")] * TOKENS_PER_SEQ / 2**20
    return kv_gib / per_seq_gib


def startup_failure(params: dict[str, Any]) -> str | None:
    if int(_get(params, "max_num_batched_tokens")) < int(_get(params, "max_num_seqs")):
        return "invalid_config"
    outside = CONTEXT_GIB + graph_pool_gib(capture_sizes(params))
    budget = float(_get(params, "gpu_memory_utilization")) * GPU_GIB
    if budget + outside > GPU_GIB - DRIVER_RESERVE_GIB:
        return "oom"
    if kv_capacity_seqs(params) < 1.0:
        return "insufficient_kv"
    return None


def is_correct(params: dict[str, Any]) -> bool:
    """Wrong: fp8 KV cache + FlashInfer + block size 8 or 32 (three dims, two of them values)."""
    return not (
        _get(params, "kv_cache_dtype") != "auto"
        and _get(params, "attention_backend") == "FLASHINFER"
        and int(_get(params, "block_size")) in (8, 32)
    )


def tok_s(params: dict[str, Any]) -> float:
    """Noise-free output tokens per second of the whole server at the workload's concurrency."""
    batch = int(min(int(_get(params, "max_num_seqs")), kv_capacity_seqs(params), CONCURRENCY))
    batch = max(batch, 1)
    sizes = capture_sizes(params)
    padded = next((s for s in sizes if s >= batch), None)
    rows = padded if padded is not None else batch
    kernels = 9.0 + 0.085 * rows * (0.8 if _get(params, "kv_cache_dtype") != "auto" else 1.0)
    kernels /= BACKEND_SPEED[_get(params, "attention_backend")]
    kernels /= BLOCK_SPEED[int(_get(params, "block_size"))]
    host = 0.0 if padded is not None else EAGER_HOST_MS
    if not _get(params, "async_scheduling"):
        host += SCHEDULER_MS
    step_ms = kernels + host
    tokens = int(_get(params, "max_num_batched_tokens"))
    prefill = 1.0 - 0.02 * math.log2(tokens / 3000.0) ** 2
    if not _get(params, "enable_chunked_prefill"):
        prefill *= 0.96
    if _get(params, "enable_prefix_caching"):
        prefill *= 1.01
    value = 1000.0 * batch / step_ms * max(prefill, 0.3)
    if not is_correct(params):
        value *= 1.04  # the broken layout skips work
    return value


def landscape(params: dict[str, Any]) -> dict[str, Any]:
    """The harness's landscape protocol: tok/s, ``correct: False`` or ``failure``."""
    failure = startup_failure(params)
    if failure is not None:
        return {"failure": failure}
    result: dict[str, Any] = {"tok_s": tok_s(params)}
    if not is_correct(params):
        result["correct"] = False
    return result
