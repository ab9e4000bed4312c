"""A SIMULATED landscape of CUDA-graph capture sizes: the pay-off depends on covering the batch.

A cost model, not a measurement: a dense 32B model on one 80 GiB GPU serving a LOW-concurrency
workload (20 concurrent requests, long contexts), where the decode step is launch-bound enough
that CUDA graphs matter and the rows a graph pads to cost real time. Its shape is INTERACTING:
the capture sizes pay off only when they cover the batch the server actually serves, which
``max_num_seqs`` and the workload set; the startup cost grows with the capture sizes.

What the model takes from published figures (the numbers are ASSUMPTIONS fitted to them):

* A decode batch replays a graph only if a capture size >= the batch exists; it is padded up
  to the next size, so coarse lists waste rows (vLLM's capture list: 1, 2, 4, then steps of 8;
  vLLM docs, "CUDA Graphs" design page, https://docs.vllm.ai/en/latest/design/cuda_graphs/).
  A batch above the largest size runs eagerly.
* ``cudagraph_mode``: FULL graphs replay the whole decode step; PIECEWISE keeps attention out
  of the graph; FULL_DECODE_ONLY / FULL fall back to eager for mixed prefill-decode batches
  (the same page; vllm-project/vllm#23184's logs: "CUDAGraphMode.FULL is not supported with
  FlashAttentionMetadataBuilder ... setting cudagraph_mode=FULL_AND_PIECEWISE").
  PIECEWISE graphs are made by the compiler: at ``compilation_level`` 0 they are not captured.
* Capture time per graph: about 0.05-0.1 s per size for an 8B model on one GPU
  (vllm-project/vllm#23184: "Graph capturing for 512 input tokens finished in 0.079 secs");
  67 graphs "can take more than 10s" depending on model size (vllm-project/vllm#20098, the
  lazy-capture RFC); "up to a minute" when warm-up ran at max_model_len
  (vllm-project/vllm#29275); SGLang 12 s for 52 batch sizes (sgl-project/sglang#10088); the
  issue that asked for this suite cites 80 s per start for capture to size 1024. Here a size
  ``s`` costs 0.05 + 0.0015 s seconds (FULL graphs 1.3x), so capture to 1024 at vLLM's spacing
  takes ~80 s and to 32 about 5 s.
* Graph memory lives outside ``gpu_memory_utilization``'s budget (2.4 GiB of graphs on a 4090,
  vllm-project/vllm#7553): a long FULL capture list runs out of memory at start (the start
  dies during capture: it costs the load, the compile and half the capture).
* torch.compile costs ~45 s of a cold start (the issue's "59 s to first response with the
  compile cache reused"; vllm-project/vllm#19840 "10-60 seconds" for capture) and fuses some
  kernels (6 % off the kernels, an assumption).

The served batch is ``min(max_num_seqs, 20)``; 10 % of steps are mixed prefill-decode
batches. ``async_scheduling`` takes the scheduler's 0.8 ms off the step. Distractors with no
effect: ``disable_log_stats``, ``uvicorn_log_level``. No config gives wrong output.
Parameters missing from ``params`` take vLLM's defaults (:data:`DEFAULTS`).
"""

from __future__ import annotations

from typing import Any

#: measurement noise the harness adds by default
NOISE = 0.05
#: accepted, no effect
NOT_MODELLED = ("disable_log_stats", "uvicorn_log_level")
#: minutes per launch besides the startup (``startup_s``): the correctness check and the
#: benchmark; ``load`` is only the fallback of a harness that ignores ``startup_s``
COST_MINUTES = {"load": 3.0, "failed_start": 1.5, "check": 0.5, "bench": 2.0}

CONCURRENCY = 20
PREFILL_SHARE = 0.10
DEFAULTS: dict[str, Any] = {
    "cudagraph_mode": "FULL_AND_PIECEWISE",
    "max_cudagraph_capture_size": None,  # vLLM: min(2 x max_num_seqs, 512)
    "capture_step": 8,
    "max_num_seqs": 256,
    "compilation_level": 3,
    "async_scheduling": False,
}
#: host time per step (ms): eager launches every kernel; piecewise graphs leave attention out
EAGER_HOST_MS = 9.0
PIECEWISE_HOST_MS = 2.5
FULL_HOST_MS = 0.3
SCHEDULER_MS = 0.8
#: memory outside vLLM's budget the graphs may take before the start runs out of memory
GRAPH_HEADROOM_GIB = 1.6
WEIGHTS_S = 30.0
PROFILE_S = 6.0
COMPILE_S = 45.0


def _get(params: dict[str, Any], name: str) -> Any:
    value = params.get(name)
    return DEFAULTS[name] if value is None else value


def capture_sizes(params: dict[str, Any]) -> tuple[int, ...]:
    """vLLM's list shape: 1, 2, 4, then multiples of ``capture_step`` up to the largest size."""
    largest = params.get("max_cudagraph_capture_size")
    if largest is None:
        largest = min(2 * int(_get(params, "max_num_seqs")), 512)
    largest = int(largest)
    step = int(_get(params, "capture_step"))
    sizes = {s for s in (1, 2, 4) if s <= largest}
    sizes.update(range(step, largest + 1, step))
    sizes.add(largest)
    return tuple(sorted(sizes))


def _graphs(params: dict[str, Any]) -> tuple[bool, bool]:
    """(decode steps replay a graph, mixed steps replay piecewise graphs) by mode and compile."""
    mode = _get(params, "cudagraph_mode")
    compiled = _compiled(params)
    piecewise = compiled and mode in ("PIECEWISE", "FULL_AND_PIECEWISE")
    full = mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    return full or piecewise, piecewise


def _compiled(params: dict[str, Any]) -> bool:
    return int(_get(params, "compilation_level")) == 3


def _full(params: dict[str, Any]) -> bool:
    return _get(params, "cudagraph_mode") in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def graph_pool_gib(params: dict[str, Any]) -> float:
    decode, _ = _graphs(params)
    if not decode:
        return 0.0
    sizes = capture_sizes(params)
    per = 0.006 if _full(params) else 0.003
    return per * len(sizes) + max(sizes) / 1024 * (1.1 if _full(params) else 0.5)


def capture_s(params: dict[str, Any]) -> float:
    decode, _ = _graphs(params)
    if not decode:
        return 0.0
    factor = 1.3 if _full(params) else 1.0
    return factor * sum(0.05 + 0.0015 * s for s in capture_sizes(params))


def startup_failure(params: dict[str, Any]) -> str | None:
    if graph_pool_gib(params) > GRAPH_HEADROOM_GIB:
        return "oom_during_graph_capture"
    return None


def startup_s(params: dict[str, Any]) -> float:
    """Seconds from launch to ready (or to the crash, for a start that fails)."""
    compile_s = COMPILE_S if _compiled(params) else 0.0
    if startup_failure(params) is not None:
        return WEIGHTS_S + PROFILE_S + compile_s + capture_s(params) / 2
    return WEIGHTS_S + PROFILE_S + compile_s + capture_s(params)


def step_ms(params: dict[str, Any], batch: int) -> float:
    """One decode step: kernels on the padded rows plus the host time the graphs leave."""
    decode_graphs, piecewise = _graphs(params)
    sizes = capture_sizes(params)
    padded = next((s for s in sizes if s >= batch), None) if decode_graphs else None
    rows = padded if padded is not None else batch
    kernels = (8.0 + 0.25 * rows) * (0.94 if _compiled(params) else 1.0)
    if padded is None:
        decode_host = EAGER_HOST_MS
    else:
        decode_host = FULL_HOST_MS if _full(params) else PIECEWISE_HOST_MS
    mixed_host = PIECEWISE_HOST_MS if piecewise else EAGER_HOST_MS
    host = (1 - PREFILL_SHARE) * decode_host + PREFILL_SHARE * mixed_host
    if not _get(params, "async_scheduling"):
        host += SCHEDULER_MS
    return kernels + host


def landscape(params: dict[str, Any]) -> dict[str, Any]:
    """The harness's landscape protocol: tok/s or ``failure``."""
    failure = startup_failure(params)
    if failure is not None:
        return {"failure": failure}
    batch = max(1, min(int(_get(params, "max_num_seqs")), CONCURRENCY))
    return {"tok_s": 1000.0 * batch / step_ms(params, batch)}
