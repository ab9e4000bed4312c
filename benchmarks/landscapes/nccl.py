"""A SIMULATED landscape of NCCL protocol, algorithm, P2P level and custom all-reduce on PCIe.

A cost model, not a measurement: a large MoE at tensor parallel 8 on eight PCIe GPUs (no
NVLink), decode at 12 concurrent requests, where 184 all-reduces per step (92 layers) of 12 x 14 KB
(168 KB) make communication 40 % of the step. Its shape: a COMBINATION that is wrong (each
of its two settings is a gain or harmless alone), choices that fail at start, and a protocol
ranking that depends on the message size.

What the model takes from published reports (the numbers are ASSUMPTIONS fitted to them):

* NCCL all-reduce over PCIe, 4 V100 behind one PCIe switch, inside a CUDA graph: 19.4 us at
  4 KB, 51.8 us at 128 KB, 83.5 us at 384 KB; a one-shot PUSH custom all-reduce 4.0 / 44.5 /
  120.3 us (wins small messages, loses large ones); the one-shot PULL kernels "never complete
  over PCIe P2P" (haohervchb/sglang-V100#2). Here: LL = 18 + 0.26 us/KB, Simple = 36 + 0.124
  us/KB (the two ends of that NCCL curve), LL128 = 24 + 0.135 us/KB (LL's flags at 120 of 128
  bytes: "LL maximum bandwidth 50% of the peak ... LL128 can achieve 95% peak", NVIDIA/nccl#281);
  left unset, NCCL's tuner picks between LL and Simple and mis-estimates this topology (5 %
  worse than the better of the two; the GLM-5 case's own measurement, ``glm5_sim``, has it
  1.9x LL at batch 1). Push custom all-reduce = 3 + 0.31 us/KB; pull hangs at the first
  all-reduce of the start (a failed start that costs the load and a timeout).
* LL128 "relies on 128B stores being seen in order ... If a 128B store gets split and
  reordered ... silent data corruption" (NVIDIA/nccl#281); NCCL enables it by default only on
  verified NVLink platforms (NVIDIA/nccl#786); forced elsewhere it failed data checks
  (NVIDIA/nccl#831, #1261). Modelled: LL128 through a PCIe switch (the default P2P level) is
  correct; LL128 with ``NCCL_P2P_LEVEL=SYS`` (P2P across the CPU root complex, where stores
  can be split) gives WRONG output, and looks the fastest of all. ``SYS`` alone is a gain
  (P2P instead of host-memory bounces between sockets: -5 us and 0.8x per KB, an assumption);
  ``PIX`` confines P2P to GPU pairs on one switch (+4 us, 1.15x per KB).
* ``NCCL_ALGO``: Tree has lower latency and less bandwidth than Ring at 8 ranks (0.85x
  latency, 1.15x per KB, an assumption); NVLS needs NVSwitch and CollNetDirect a CollNet
  plug-in: NCCL refuses them at communicator init, before the weights load (a cheap failed
  start).
* vLLM turns its own custom all-reduce off on more than two PCIe-only GPUs
  (vllm-project/vllm#56128, and ``custom_all_reduce.py``); ``custom_all_reduce`` here stands
  for the opt-in PCIe variants those reports built.

Distractors with no effect: ``NCCL_DEBUG``, ``NCCL_SOCKET_NTHREADS``. Startup: ~3 minutes to
load a 355 GB FP8 checkpoint over 8 GPUs, 60 s compile, 40 s capture (assumptions of the order
the GLM-5 case measured). Parameters missing from ``params`` take the defaults below.
"""

from __future__ import annotations

from typing import Any

#: measurement noise the harness adds by default
NOISE = 0.05
#: accepted, no effect
NOT_MODELLED = ("NCCL_DEBUG", "NCCL_SOCKET_NTHREADS")
#: minutes per launch besides the startup (``startup_s``)
COST_MINUTES = {"load": 5.0, "failed_start": 1.0, "check": 1.0, "bench": 3.0}

BATCH = 12
KB_PER_SEQ = 14.0
ALLREDUCES_PER_STEP = 184
KERNELS_MS = 12.0
KERNELS_MS_PER_SEQ = 0.2
HOST_MS = 0.6

#: (latency us, us per KB) per protocol, through a PCIe switch with Ring
PROTOCOL = {"LL": (18.0, 0.26), "LL128": (24.0, 0.135), "Simple": (36.0, 0.124)}
PUSH = (3.0, 0.31)
TUNER_PENALTY = 1.05
P2P_LEVEL = {"PIX": (4.0, 1.15), "PXB": (0.0, 1.0), "PHB": (0.0, 1.0), "SYS": (-5.0, 0.8)}
ALGO = {"Ring": (1.0, 1.0), "Tree": (0.85, 1.15)}
FAILS_AT_INIT = ("NVLS", "CollNetDirect")

LOAD_S = 180.0
COMMUNICATOR_S = 25.0
COMPILE_S = 60.0
CAPTURE_S = 40.0
HANG_TIMEOUT_S = 120.0


def allreduce_us(params: dict[str, Any], kb: float) -> float:
    """One all-reduce of ``kb`` kilobytes, replayed from a graph."""
    if params.get("custom_all_reduce", "off") == "push":
        latency, per_kb = PUSH
        return latency + per_kb * kb
    level_add, level_mul = P2P_LEVEL[params.get("NCCL_P2P_LEVEL") or "PXB"]
    algo = params.get("NCCL_ALGO")
    lat_mul, kb_mul = ALGO.get(algo or "", (1.0, 1.0))

    def cost(protocol: str) -> float:
        latency, per_kb = PROTOCOL[protocol]
        return (latency + level_add) * lat_mul + per_kb * level_mul * kb_mul * kb

    protocol = params.get("NCCL_PROTO")
    if protocol is None:
        return TUNER_PENALTY * min(cost("LL"), cost("Simple"))
    return cost(protocol)


def startup_failure(params: dict[str, Any]) -> str | None:
    if params.get("NCCL_ALGO") in FAILS_AT_INIT:
        return "nccl_init_no_algorithm"
    if params.get("custom_all_reduce") == "pull":
        return "hang_first_allreduce"
    return None


def is_correct(params: dict[str, Any]) -> bool:
    """Wrong: LL128 with P2P across the root complex (two settings, neither wrong alone)."""
    return not (params.get("NCCL_PROTO") == "LL128" and params.get("NCCL_P2P_LEVEL") == "SYS")


def startup_s(params: dict[str, Any]) -> float:
    """Seconds from launch to ready, or to the failure: NCCL refuses an algorithm at
    communicator init (before the load); a hung all-reduce is found by a timeout after it."""
    failure = startup_failure(params)
    if failure == "nccl_init_no_algorithm":
        return COMMUNICATOR_S
    if failure is not None:
        return COMMUNICATOR_S + LOAD_S + HANG_TIMEOUT_S
    return COMMUNICATOR_S + LOAD_S + COMPILE_S + CAPTURE_S


def landscape(params: dict[str, Any]) -> dict[str, Any]:
    """The harness's landscape protocol: tok/s, ``correct: False`` or ``failure``."""
    failure = startup_failure(params)
    if failure is not None:
        return {"failure": failure}
    comm_ms = ALLREDUCES_PER_STEP * allreduce_us(params, BATCH * KB_PER_SEQ) / 1000.0
    step = KERNELS_MS + KERNELS_MS_PER_SEQ * BATCH + HOST_MS + comm_ms
    result: dict[str, Any] = {"tok_s": 1000.0 * BATCH / step}
    if not is_correct(params):
        result["correct"] = False
    return result
