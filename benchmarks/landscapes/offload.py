"""A SIMULATED landscape that is FLAT WITH A CLIFF: GPU memory fraction, CPU offload, KV dtype.

A cost model, not a measurement: a 32B FP8 model (34 GiB) on one 48 GiB PCIe GPU, 16
concurrent requests of 2,048 tokens. Once the KV cache holds the 16 requests the speed barely
moves with ``gpu_memory_utilization`` (a plateau); just above the plateau's top the server runs
out of memory at start (the cliff); below it the batch shrinks with the KV cache; offloading
weights to the CPU widens the range of fractions that start but makes every step stream the
offloaded weights over PCIe (far slower). Failed starts are cheap next to a measured launch.

What the model takes from published reports (the numbers are ASSUMPTIONS fitted to them):

* The CUDA context and the CUDA-graph pool live outside vLLM's ``gpu_memory_utilization``
  budget: 2.4 GiB of graphs on a 24 GiB 4090 (vllm-project/vllm#7553), so a fraction near 1
  runs out of memory; "setting the value from 0.9 (default) to 0.95 is safe"
  (vllm-project/vllm#1298); a 7B model on a 64 GiB card started at 0.4-0.9 and ran out of
  memory at 0.2 (too little for the weights) and at 0.95 (vllm-project/vllm-ascend#89).
  Here: 0.6 GiB of context plus 1.2 GiB of graphs (none with ``enforce_eager``) and 0.5 GiB the
  driver keeps; a budget that leaves under one request's KV fails at start ("no available
  memory for the cache blocks").
* CPU offload streams the offloaded weights over PCIe every step: 10.5 GiB/s pinned
  host-to-device measured (lvyufeng/PocketLLM#156); 70B on a GH200 with offload 4.6 tok/s
  (vllm-project/vllm#6317); Kimi K2 with 350 GB offloaded 15 tok/s single-user
  (vllm-project/vllm#34535). Here 20 GiB/s (PCIe 5) per offloaded GiB, every step.
* An fp8 KV cache halves the KV per token (correct within the gate's tolerance here);
  ``enforce_eager`` frees the graph pool but puts ~4 ms of kernel launches back on each step.

Startup: 25 s to load the weights (plus 1.5 s per offloaded GiB to pin host memory), 6 s of
memory profiling, 30 s compile and 20 s capture unless eager. A start that runs out of memory
dies when the KV cache is allocated or during capture: after the load and the profiling.
Distractors with no effect: ``swap_space``, ``disable_log_requests``. Parameters missing from
``params`` take vLLM's defaults (:data:`DEFAULTS`).
"""

from __future__ import annotations

from typing import Any

#: measurement noise the harness adds by default
NOISE = 0.05
#: accepted, no effect
NOT_MODELLED = ("swap_space", "disable_log_requests")
#: minutes per launch besides the startup (``startup_s``)
COST_MINUTES = {"load": 1.5, "failed_start": 0.6, "check": 0.5, "bench": 2.0}

DEFAULTS: dict[str, Any] = {
    "gpu_memory_utilization": 0.9,
    "cpu_offload_gb": 0,
    "kv_cache_dtype": "auto",
    "enforce_eager": False,
    "max_num_seqs": 256,
}
GPU_GIB = 48.0
WEIGHTS_GIB = 34.0
ACTIVATION_GIB = 1.5
CONTEXT_GIB = 0.6
GRAPH_POOL_GIB = 1.2
DRIVER_RESERVE_GIB = 0.5
CONCURRENCY = 16
KV_GIB_PER_SEQ = {"auto": 0.5, "fp8": 0.25}
HBM_MS = 38.0
PER_SEQ_MS = 0.6
OFFLOAD_MS_PER_GIB = 1000.0 / 20.0
EAGER_HOST_MS = 4.0
GRAPH_HOST_MS = 0.5
LOAD_S = 25.0
PIN_S_PER_GIB = 1.5
PROFILE_S = 6.0
COMPILE_S = 30.0
CAPTURE_S = 20.0


def _get(params: dict[str, Any], name: str) -> Any:
    value = params.get(name)
    return DEFAULTS[name] if value is None else value


def kv_seqs(params: dict[str, Any]) -> float:
    """Requests of the workload the KV cache holds."""
    budget = float(_get(params, "gpu_memory_utilization")) * GPU_GIB
    on_gpu = WEIGHTS_GIB - float(_get(params, "cpu_offload_gb"))
    return (budget - on_gpu - ACTIVATION_GIB) / KV_GIB_PER_SEQ[_get(params, "kv_cache_dtype")]


def startup_failure(params: dict[str, Any]) -> str | None:
    outside = CONTEXT_GIB + (0.0 if _get(params, "enforce_eager") else GRAPH_POOL_GIB)
    budget = float(_get(params, "gpu_memory_utilization")) * GPU_GIB
    if budget + outside > GPU_GIB - DRIVER_RESERVE_GIB:
        return "oom"
    if kv_seqs(params) < 1.0:
        return "insufficient_kv"
    return None


def startup_s(params: dict[str, Any]) -> float:
    """Seconds from launch to ready, or to the crash (after the load and the profiling)."""
    base = LOAD_S + PIN_S_PER_GIB * float(_get(params, "cpu_offload_gb")) + PROFILE_S
    if startup_failure(params) is not None:
        return base
    return base + (0.0 if _get(params, "enforce_eager") else COMPILE_S + CAPTURE_S)


def landscape(params: dict[str, Any]) -> dict[str, Any]:
    """The harness's landscape protocol: tok/s or ``failure``."""
    failure = startup_failure(params)
    if failure is not None:
        return {"failure": failure}
    batch = max(1, min(int(kv_seqs(params)), CONCURRENCY, int(_get(params, "max_num_seqs"))))
    per_seq = PER_SEQ_MS * (0.9 if _get(params, "kv_cache_dtype") == "fp8" else 1.0)
    step = (
        HBM_MS * (WEIGHTS_GIB - float(_get(params, "cpu_offload_gb"))) / WEIGHTS_GIB
        + OFFLOAD_MS_PER_GIB * float(_get(params, "cpu_offload_gb"))
        + per_seq * batch
        + (EAGER_HOST_MS if _get(params, "enforce_eager") else GRAPH_HOST_MS)
    )
    return {"tok_s": 1000.0 * batch / step}
