"""SIMULATION of the motivating GLM-5 deployment: a cost model, not a measurement of anything.

Used only by the search-efficiency benchmark, tests, and ``fake_server --simulate glm5-8gpu``.
It lets us ask "does autotune find the 57 tok/s config, and does it avoid the fast-but-wrong
one?" without eight GPUs. The numbers are calibrated to the case in ``shared/seeds/`` (GLM-5 744B
MoE, MLA attention, GGUF Q4, 8x RTX PRO 6000 Blackwell on PCIe, tensor parallel 8, vLLM):

* eager: 50.5 ms per single-request decode step (about 20 tok/s), of which 157 all-reduces x
  about 135 us = 21.2 ms (42 %) are communication;
* CUDA graphs on (upstream MLA custom op): about 43 tok/s;
* CUDA graphs plus the best NCCL protocol/algorithm: about 57 tok/s;
* CUDA graphs together with the MLA "direct_call" path: fast, but the text is whitespace.

How a decode step is modelled (all numbers per step, per GPU, single node):

``step = gpu_kernels(batch) + host_overhead(mode) + n_allreduce * allreduce_latency(...)``

* ``gpu_kernels``: 12 ms at batch 1 -- streaming the active experts' Q4 weights. It grows with
  the batch because more distinct experts are touched (MoE), capped at 4x.
* ``host_overhead``: in eager mode Python launches thousands of kernels one by one: 17.3 ms, plus
  63.3 us of host launch/sync per all-reduce. torch.compile without graphs fuses some kernels
  (14.7 ms). PIECEWISE graphs keep attention outside the graph: 78 layers x 40 us = 3.1 ms. FULL
  graphs replay the whole step: no host overhead. A batch larger than the biggest capture size
  cannot replay a graph and runs compiled-eager.
* ``allreduce_latency``: a ~12 KB all-reduce over PCIe is latency bound. LL is the
  low-latency protocol and wins at small messages; LL128 is made for NVLink and is poor on PCIe;
  Simple has the highest latency but the best bandwidth, so it loses less as the batch grows.
  Tree beats Ring slightly for 8 ranks at this size. Left unset, NCCL's tuner mis-estimates this
  PCIe topology and mixes in Simple: 1.89x the LL latency. More channels than 4 add per-channel
  sync cost; 1 channel serialises.
* ``disable_custom_all_reduce``: a red herring on purpose. vLLM's custom all-reduce needs P2P or
  NVLink and vLLM turns it off itself on more than two PCIe-only GPUs, so the flag changes
  nothing here -- exactly the kind of change an ablation should show to be irrelevant.
* ``mla_path="direct_call"`` bypasses the ``unified_mla_attention_with_output`` custom op. In
  eager mode it is correct and saves the op dispatch (0.6 ms). Under any CUDA graph capture the
  call is inlined into the graph with its output buffer, replay writes to a dead buffer and the
  model emits whitespace: *incorrect*, and (skipping work) even 8 % faster -- the trap a tuner
  that does not check outputs walks into.

The remaining levers of the space (issue 14), each an ASSUMPTION of this model, not a
measurement; defaults are vLLM's, so the calibrated figures above are unchanged:

* ``async_scheduling``: vLLM 0.32 turns it on by default; off (or disabled because a speculative
  method cannot use it) puts the scheduler's ~1 ms of Python per step back on the critical path.
  Explicitly on together with the CPU n-gram proposer is refused at start (as vLLM does).
* ``fuse_allreduce_rms`` (compiled, not eager): each all-reduce fused with the RMSNorm after it
  saves a kernel launch and a memory round trip, modelled as 6 us per fused pair (156 pairs).
* ``performance_mode``: ``interactivity`` captures every batch size 1..32 (decode pads less:
  no effect at batch 1, fewer wasted rows at 3, 5, 6, 7 ...); ``throughput`` doubles the
  default max_num_seqs and max_num_batched_tokens (more activation memory).
* ``kv_cache_dtype`` fp8: 2 % faster kernels at batch > 1 (less KV read), never at batch 1 with
  the benchmark's short contexts; within tolerance, so correct.
* ``speculative_method``: ``mtp`` uses GLM-5's own MTP head, with per-position acceptance
  0.834 / 0.653 / 0.494 / 0.37 (the first three measured by llama.cpp's GLM_DSA MTP work on a
  GGUF, the fourth extrapolated); each step verifies k+1 tokens (costed like a batch of k+1)
  and runs the MTP layer k times (1/78 of the kernels plus two all-reduces each). ASSUMED: the
  GGUF keeps the MTP weights (``MTP_IN_GGUF``). ``ngram`` drafts for free but is rarely right
  on this prose workload (0.30 / 0.15 / 0.08 / 0.04). Lossless (greedy verification) in both.

Not modelled (accepted by :meth:`Glm5Config.from_mapping`, no effect; listed in
``NOT_MODELLED``): ``moe_backend`` (the GGUF plugin's MoE method picks its own kernels),
``enable_eplb`` / ``eplb_num_redundant_experts`` (single-request decode has no expert load
imbalance to fix), ``fi_allreduce_fusion_max_size_mb`` (decode all-reduces are far below every
choice; only prefill would notice), ``prompt_lookup_max`` / ``prompt_lookup_min`` (folded into
the n-gram acceptance), ``enable_expert_parallel``.

Memory (per GPU, 95.6 GiB): weights 56 GiB; vLLM's budget is ``gpu_memory_utilization`` x total;
CUDA context, NCCL buffers (more with more channels) and the CUDA graph pool (per capture size)
live outside it, so a utilization above about 0.95 runs out of memory at start with vLLM's default
capture sizes (eager or a few capture sizes allow up to about 0.958; many channels lower it). A
budget that leaves under 2 GiB of KV cache (utilization below about 0.635 with the default
batched-token budget) fails at start with vLLM's "insufficient
KV cache" error, and ``max_num_batched_tokens < max_num_seqs`` is rejected as invalid.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE")
NCCL_PROTOS = ("LL", "LL128", "Simple")
NCCL_ALGOS = ("Ring", "Tree")
MLA_PATHS = ("custom_op", "direct_call")

N_LAYERS = 78
N_ALLREDUCE = 157  # two per layer (attention and MoE outputs) plus the final norm/logits one
GPU_KERNELS_MS = 12.0
EAGER_LAUNCH_MS = 17.3
COMPILED_LAUNCH_MS = 14.7
PIECEWISE_ATTENTION_MS = N_LAYERS * 0.040
EAGER_ALLREDUCE_HOST_US = 63.3
DIRECT_CALL_SAVING_MS = 0.6
BROKEN_GRAPH_SPEEDUP = 0.92

# All-reduce latency at batch 1 in microseconds (graph replay, no host cost).
_ALGO_BASE_US = {"Ring": 38.0, "Tree": 35.3, None: 38.0}
_PROTO_FACTOR = {"LL": 1.0, "LL128": 1.37, "Simple": 2.5, None: 1.887}
# Relative latency growth per extra sequence in the batch (message size grows with the batch).
_PROTO_GROWTH = {"LL": 0.012, "LL128": 0.005, "Simple": 0.0015, None: 0.003}

GPU_TOTAL_GIB = 95.6
WEIGHTS_GIB = 56.0
OUTSIDE_BUDGET_GIB = 3.5  # CUDA context, cuBLAS workspace, NCCL buffers at default channels
DRIVER_RESERVE_GIB = 0.5
GRAPH_POOL_GIB_PER_SIZE = 0.012
NCCL_GIB_PER_EXTRA_CHANNEL = 0.016
ACTIVATION_GIB_PER_1K_TOKENS = 0.35
MIN_KV_CACHE_GIB = 2.0

PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")
SPECULATIVE_METHODS = ("mtp", "ngram")
#: scheduler time per step that async scheduling hides (ms)
ASYNC_OFF_MS = 1.0
#: saving per all-reduce fused with its RMSNorm (us)
ALLREDUCE_RMS_FUSION_US = 6.0
FP8_KV_KERNEL_FACTOR = 0.98
#: per-position acceptance of the draft tokens (fraction of drafts accepted at position i)
MTP_ACCEPTANCE = (0.834, 0.653, 0.494, 0.37)
NGRAM_ACCEPTANCE = (0.30, 0.15, 0.08, 0.04)
NGRAM_DRAFT_MS = 0.1
#: ASSUMED, not verified here: the GGUF keeps GLM-5's MTP block (blk.78.nextn.*)
MTP_IN_GGUF = True
#: parameter names the model accepts but gives no effect (see the module docstring)
NOT_MODELLED = (
    "moe_backend",
    "enable_eplb",
    "eplb_num_redundant_experts",
    "fi_allreduce_fusion_max_size_mb",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "enable_expert_parallel",
)

DEFAULT_CAPTURE_SIZES: tuple[int, ...] = (
    1,
    2,
    4,
    *range(8, 256, 8),
    *range(256, 513, 16),
)


@dataclass(frozen=True)
class Glm5Config:
    """One point of the simulated search space. Field names match the search-space parameters.

    ``None`` means "left at the engine's default" (for NCCL variables: unset).
    """

    enforce_eager: bool = False
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    NCCL_PROTO: str | None = None
    NCCL_ALGO: str | None = None
    NCCL_MIN_NCHANNELS: int | None = None
    disable_custom_all_reduce: bool = False
    mla_path: str = "custom_op"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    performance_mode: str = "balanced"
    async_scheduling: bool | None = None  # None: vLLM's default (on where it can be)
    fuse_allreduce_rms: bool = False
    kv_cache_dtype: str = "auto"
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None
    # accepted, not modelled (NOT_MODELLED)
    fi_allreduce_fusion_max_size_mb: float | None = None
    moe_backend: str = "auto"
    enable_eplb: bool = False
    eplb_num_redundant_experts: int | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    enable_expert_parallel: bool = False

    def __post_init__(self) -> None:
        if self.performance_mode not in PERFORMANCE_MODES:
            raise ValueError(f"performance_mode must be one of {PERFORMANCE_MODES}")
        if self.speculative_method not in (*SPECULATIVE_METHODS, None):
            raise ValueError(f"speculative_method must be one of {SPECULATIVE_METHODS} or unset")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(f"cudagraph_mode must be one of {CUDAGRAPH_MODES}")
        if self.NCCL_PROTO not in (*NCCL_PROTOS, None):
            raise ValueError(f"NCCL_PROTO must be one of {NCCL_PROTOS} or unset")
        if self.NCCL_ALGO not in (*NCCL_ALGOS, None):
            raise ValueError(f"NCCL_ALGO must be one of {NCCL_ALGOS} or unset")
        if self.mla_path not in MLA_PATHS:
            raise ValueError(f"mla_path must be one of {MLA_PATHS}")
        if self.NCCL_MIN_NCHANNELS is not None and self.NCCL_MIN_NCHANNELS < 1:
            raise ValueError("NCCL_MIN_NCHANNELS must be >= 1")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Glm5Config:
        """Build from a flat mapping of parameter names (unknown names raise ``KeyError``).

        ``channels`` is accepted as an alias of ``NCCL_MIN_NCHANNELS``; lists become tuples.
        """
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            name = "NCCL_MIN_NCHANNELS" if key == "channels" else key
            if name not in known:
                raise KeyError(f"unknown GLM-5 simulation parameter: {key}")
            if name == "cudagraph_capture_sizes" and value is not None:
                value = tuple(int(v) for v in value)
            kwargs[name] = value
        return cls(**kwargs)

    @property
    def capture_sizes(self) -> tuple[int, ...]:
        """Capture sizes in effect: the explicit list or vLLM's default, capped like vLLM does."""
        sizes = self.cudagraph_capture_sizes
        if sizes is None:
            sizes = tuple(s for s in DEFAULT_CAPTURE_SIZES if s <= max(2 * self.max_num_seqs, 1))
            if self.performance_mode == "interactivity":
                sizes = (*range(1, min(32, sizes[-1]) + 1), *sizes)
        return tuple(sorted(set(sizes)))

    @property
    def graphs_on(self) -> bool:
        """Whether any CUDA graph is captured at all."""
        return not self.enforce_eager and self.cudagraph_mode != "NONE" and bool(self.capture_sizes)


@dataclass(frozen=True)
class StartupFailure:
    """Why the simulated server would not start: ``kind`` is oom / insufficient_kv / invalid."""

    kind: str
    message: str


def allreduce_us(config: Glm5Config, batch: int = 1) -> float:
    """Latency of one all-reduce replayed from a graph (no host cost), in microseconds."""
    base = _ALGO_BASE_US[config.NCCL_ALGO] * _PROTO_FACTOR[config.NCCL_PROTO]
    channels = config.NCCL_MIN_NCHANNELS
    if channels is None or 2 <= channels <= 4:
        chan = 1.0
    elif channels < 2:
        chan = 1.12
    else:
        chan = 1.0 + 0.0625 * math.log2(channels / 4)
    return base * chan * (1.0 + _PROTO_GROWTH[config.NCCL_PROTO] * (batch - 1))


def _graph_replayable(config: Glm5Config, batch: int) -> int | None:
    """The padded batch a graph would replay for ``batch``, or ``None`` when none fits."""
    if not config.graphs_on:
        return None
    for size in config.capture_sizes:
        if size >= batch:
            return size
    return None


def _async_off(config: Glm5Config) -> bool:
    """Async scheduling is off: asked for, or vLLM's default turned off by the n-gram proposer."""
    if config.async_scheduling is None:
        return config.speculative_method == "ngram"
    return not config.async_scheduling


def _forward_ms(config: Glm5Config, tokens: int) -> float:
    """One forward step over ``tokens`` tokens (sequences, or a sequence's verified drafts)."""
    padded = _graph_replayable(config, tokens)
    effective = padded or tokens
    kernels = GPU_KERNELS_MS * min(1.0 + 0.035 * (effective - 1), 4.0) + 0.02 * (effective - 1)
    if config.kv_cache_dtype.startswith("fp8") and effective > 1:
        kernels *= FP8_KV_KERNEL_FACTOR
    comm = N_ALLREDUCE * allreduce_us(config, effective) / 1000.0
    if config.fuse_allreduce_rms and not config.enforce_eager:
        comm -= (N_ALLREDUCE - 1) * ALLREDUCE_RMS_FUSION_US / 1000.0
    host = ASYNC_OFF_MS if _async_off(config) else 0.0
    if padded is None:
        launch = EAGER_LAUNCH_MS if config.enforce_eager else COMPILED_LAUNCH_MS
        comm += N_ALLREDUCE * EAGER_ALLREDUCE_HOST_US / 1000.0
        if config.mla_path == "direct_call":
            launch -= DIRECT_CALL_SAVING_MS
        return kernels + launch + comm + host
    launch = PIECEWISE_ATTENTION_MS if config.cudagraph_mode == "PIECEWISE" else 0.0
    total = kernels + launch + comm
    if config.mla_path == "direct_call":
        total *= BROKEN_GRAPH_SPEEDUP  # the captured attention writes to a dead buffer
    return total + host


def draft_tokens(config: Glm5Config) -> int:
    """Draft tokens proposed per step (0 without speculation)."""
    if config.speculative_method is None:
        return 0
    return max(1, min(config.num_speculative_tokens or 1, len(MTP_ACCEPTANCE)))


def tokens_per_step(config: Glm5Config) -> float:
    """Mean tokens one sequence emits per verification step (vLLM's mean accepted length)."""
    k = draft_tokens(config)
    rates = MTP_ACCEPTANCE if config.speculative_method == "mtp" else NGRAM_ACCEPTANCE
    return 1.0 + sum(rates[:k])


def step_time_ms(config: Glm5Config, batch: int = 1) -> float:
    """Noise-free time per emitted token of each of ``batch`` running sequences, in ms (capped
    by max_num_seqs): a decode step, or with speculation a verification step (``batch`` x
    (k+1) tokens) plus the drafting, divided by the tokens it yields on average.

    Tokens per second of one stream is ``1000 / step_time_ms(config)``.
    """
    batch = max(1, min(batch, config.max_num_seqs))
    k = draft_tokens(config)
    if k == 0:
        return _forward_ms(config, batch)
    if config.speculative_method == "mtp":
        # the MTP layer: one of 78 layers' kernels (x batch growth) plus its two all-reduces
        one = GPU_KERNELS_MS / N_LAYERS + 2 * allreduce_us(config, batch) / 1000.0
        if not config.graphs_on:
            one += 2 * EAGER_ALLREDUCE_HOST_US / 1000.0 + EAGER_LAUNCH_MS / N_LAYERS
        drafting = k * one
    else:
        drafting = NGRAM_DRAFT_MS
    return (_forward_ms(config, batch * (k + 1)) + drafting) / tokens_per_step(config)


def decode_tok_s(config: Glm5Config, batch: int = 1) -> float:
    """Noise-free aggregate decode tokens per second at ``batch`` concurrent sequences."""
    batch = max(1, min(batch, config.max_num_seqs))
    return 1000.0 * batch / step_time_ms(config, batch)


def prefill_ms(config: Glm5Config, prompt_tokens: int) -> float:
    """Rough prefill time of one prompt: one step plus compute-bound per-token work, chunked."""
    chunks = max(1, math.ceil(prompt_tokens / config.max_num_batched_tokens))
    return chunks * step_time_ms(config) + 0.08 * prompt_tokens


def is_correct(config: Glm5Config) -> bool:
    """False in the fast-but-wrong region: the MLA direct-call path under CUDA graph capture.

    Evaluated for batch 1; a batch beyond every capture size would run eagerly and be right,
    which is why autotune checks correctness under the benchmark's own batch shapes too.
    """
    return not (config.graphs_on and config.mla_path == "direct_call")


def startup_failure(config: Glm5Config) -> StartupFailure | None:
    """The error the simulated server dies with at start, or ``None`` when it starts."""
    if config.speculative_method == "mtp" and not MTP_IN_GGUF:
        return StartupFailure(
            "invalid", "ValueError: the checkpoint has no MTP (nextn) weights for method mtp"
        )
    if config.async_scheduling and config.speculative_method == "ngram":
        return StartupFailure(
            "invalid",
            "ValueError: Currently, async scheduling is only supported with EAGLE/MTP/Draft "
            "Model/NGram GPU/DSpark/DFlash kind of speculative decoding",
        )
    if config.max_num_batched_tokens < config.max_num_seqs:
        return StartupFailure(
            "invalid",
            f"ValueError: max_num_batched_tokens ({config.max_num_batched_tokens}) must be "
            f"greater than or equal to max_num_seqs ({config.max_num_seqs}).",
        )
    outside = OUTSIDE_BUDGET_GIB
    channels = config.NCCL_MIN_NCHANNELS or 2
    outside += NCCL_GIB_PER_EXTRA_CHANNEL * max(0, channels - 2)
    if config.graphs_on:
        outside += GRAPH_POOL_GIB_PER_SIZE * len(config.capture_sizes)
    budget = config.gpu_memory_utilization * GPU_TOTAL_GIB
    if budget + outside > GPU_TOTAL_GIB - DRIVER_RESERVE_GIB:
        free = max(0.0, GPU_TOTAL_GIB - budget - DRIVER_RESERVE_GIB)
        return StartupFailure(
            "oom",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            f"total capacity of {GPU_TOTAL_GIB:.2f} GiB of which {free:.2f} GiB is free.",
        )
    tokens = config.max_num_batched_tokens * (2 if config.performance_mode == "throughput" else 1)
    activations = ACTIVATION_GIB_PER_1K_TOKENS * tokens / 1024
    kv_cache = budget - WEIGHTS_GIB - activations
    if kv_cache < MIN_KV_CACHE_GIB:
        return StartupFailure(
            "insufficient_kv",
            f"ValueError: To serve at least one request with the model's max seq len, "
            f"{MIN_KV_CACHE_GIB:.2f} GiB KV cache is needed, which is larger than the available "
            f"KV cache memory ({max(kv_cache, 0.0):.2f} GiB). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
        )
    return None


@dataclass
class Glm5Sim:
    """The cost model with multiplicative measurement noise (seeded, so runs are repeatable).

    A real benchmark of one config varies run to run (5-20 % in users' reports); the noise
    is drawn per measurement as ``max(0.5, 1 + N(0, noise))``.
    """

    noise: float = 0.05
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def noise_factor(self) -> float:
        """One draw of the multiplicative noise factor applied to a step time."""
        if self.noise <= 0.0:
            return 1.0
        return max(0.5, 1.0 + self._rng.gauss(0.0, self.noise))

    def measure_step_ms(self, config: Glm5Config, batch: int = 1) -> float:
        """A noisy measurement of the decode step time."""
        return step_time_ms(config, batch) * self.noise_factor()

    def measure_tok_s(self, config: Glm5Config, batch: int = 1) -> float:
        """A noisy measurement of aggregate decode tokens per second."""
        batch = max(1, min(batch, config.max_num_seqs))
        return 1000.0 * batch / self.measure_step_ms(config, batch)


EAGER_BASELINE = Glm5Config(enforce_eager=True, mla_path="direct_call")
"""The case's starting point: eager, with the (unneeded) MLA direct-call patch applied."""

GRAPHS_DEFAULT = Glm5Config()
"""CUDA graphs on with vLLM's defaults and the upstream MLA custom op: about 43 tok/s."""

TUNED = Glm5Config(NCCL_PROTO="LL", NCCL_ALGO="Tree")
"""Graphs plus the best NCCL settings: about 57 tok/s."""

FAST_BUT_WRONG = Glm5Config(mla_path="direct_call")
"""Graphs with the MLA direct call: the fastest-looking config, and its output is whitespace."""
