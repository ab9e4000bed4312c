"""Memory-bandwidth roofline for single-request decode: how fast *could* this model decode here?

A tuner needs a ceiling to know when to stop and what kind of bottleneck remains. Decoding one
sequence is a matrix-*vector* product per weight: every weight the token touches is read from GPU
memory once and used for two flops, so the step time is bounded below by bytes / bandwidth, and
the tokens per second by its inverse. ``autotune inspect`` supplies the bytes
(:attr:`autotune.model.facts.ModelFacts.active_bytes_per_token` and the KV cache per token); this
module supplies the bandwidth and does the division. ``docs/guide/glm5.md`` works the GLM-5 case.

``autotune inspect MODEL --device D`` prints it for a model; :mod:`autotune.model.roofline_cli`
computes it from parameter counts alone (no model file), as ``docs/guide/glm5.md`` does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autotune.errors import SpecError
from autotune.model.facts import ModelFacts
from autotune.model.reader import inspect_model

__all__ = [
    "DEVICES",
    "DecodeBytes",
    "Device",
    "Roofline",
    "decode_roofline",
    "fraction_of_roofline",
    "get_device",
    "roofline_from_spec",
    "roofline_rows",
]


@dataclass(frozen=True)
class Device:
    """One accelerator: peak memory bandwidth in GB/s (10^9 bytes/s) as the vendor publishes it."""

    key: str
    name: str
    bandwidth_gbs: float
    memory_gb: float
    source: str


# Peak DRAM bandwidth per device, from the vendors' datasheets / product pages (the number every
# vendor quotes is the theoretical peak; measured streaming bandwidth is typically 80-92 % of it,
# which is what ``efficiency`` is for). Checked 2026 against the pages below; secondary pages that
# repeat the same figure are named where the vendor PDF was not directly retrievable.
DEVICES: dict[str, Device] = {
    d.key: d
    for d in (
        Device(
            "h200",
            "NVIDIA H200 (SXM / NVL, 141 GB HBM3e)",
            4800,
            141,
            "nvidia.com/en-us/data-center/h200 (4.8 TB/s); repeated by aiminingco.com/gpu/h200",
        ),
        Device(
            "h100-sxm",
            "NVIDIA H100 SXM5 (80 GB HBM3)",
            3350,
            80,
            "NVIDIA H100 datasheet (3.35 TB/s SXM); glennklockwood.com/garden/processors/h100",
        ),
        Device(
            "h100-pcie",
            "NVIDIA H100 PCIe (80 GB HBM2e)",
            2000,
            80,
            "NVIDIA H100 PCIe product brief PB-11133-001 ('greater than 2,000 GB/s'); "
            "datasheet 2 TB/s",
        ),
        Device(
            "a100-80gb-sxm",
            "NVIDIA A100 80GB SXM4 (HBM2e)",
            2039,
            80,
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (2,039 GB/s SXM)",
        ),
        Device(
            "rtx-pro-6000",
            "NVIDIA RTX PRO 6000 Blackwell (96 GB GDDR7, 512-bit)",
            1792,
            96,
            "NVIDIA RTX PRO 6000 Blackwell datasheet (1,792 GB/s = 512 bit x 28 Gbps / 8); "
            "same for Workstation, Max-Q and Server editions",
        ),
        Device(
            "l40s",
            "NVIDIA L40S (48 GB GDDR6)",
            864,
            48,
            "NVIDIA L40S datasheet (864 GB/s)",
        ),
        Device(
            "rtx-4090",
            "NVIDIA GeForce RTX 4090 (24 GB GDDR6X)",
            1008,
            24,
            "nvidia.com GeForce RTX 4090 specs (384 bit x 21 Gbps / 8 = 1,008 GB/s)",
        ),
        Device(
            "mi300x",
            "AMD Instinct MI300X (192 GB HBM3)",
            5300,
            192,
            "AMD Instinct MI300X data sheet (5.3 TB/s peak)",
        ),
    )
}

_ALIASES = {
    "rtx-pro-6000-blackwell": "rtx-pro-6000",
    "rtxpro6000": "rtx-pro-6000",
    "pro6000": "rtx-pro-6000",
    "h100": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "a100": "a100-80gb-sxm",
    "a100-80gb": "a100-80gb-sxm",
    "a100-sxm": "a100-80gb-sxm",
    "4090": "rtx-4090",
    "h200-sxm": "h200",
}


def get_device(name: str) -> Device:
    """Look up a device by key or a common alias (case, spaces and underscores ignored)."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = _ALIASES.get(key, key)
    if key not in DEVICES:
        known = ", ".join(sorted(DEVICES))
        raise KeyError(f"unknown device {name!r}; known: {known} (or pass bandwidth_gbs)")
    return DEVICES[key]


@dataclass(frozen=True)
class DecodeBytes:
    """The bytes one decode step reads, independent of the hardware.

    ``weight_bytes_per_token`` is the whole model's active weight bytes (all TP ranks together).
    ``kv_bytes_per_context_token`` is the KV cache one context token occupies over all layers, for
    the whole model. ``kv_split_ways`` is how many ways that cache can be split across TP ranks:
    the number of KV heads for MHA/GQA/MQA (vLLM replicates heads when TP exceeds them), and 1
    for MLA, whose single latent vector is shared by all heads and therefore stored and read
    whole on every rank.
    """

    label: str
    weight_bytes_per_token: float
    kv_bytes_per_context_token: float = 0.0
    kv_split_ways: int = 1

    @classmethod
    def from_facts(cls, facts: ModelFacts, *, kv_dtype_bytes: int | None = None) -> DecodeBytes:
        a = facts.attention
        per_layer = a.kv_elements_per_token_per_layer * (kv_dtype_bytes or a.kv_dtype_bytes)
        return cls(
            label=facts.name or facts.path,
            weight_bytes_per_token=float(facts.active_bytes_per_token),
            kv_bytes_per_context_token=float(per_layer * facts.num_layers),
            kv_split_ways=1 if a.kind == "MLA" else max(1, a.num_kv_heads),
        )

    @classmethod
    def from_params(
        cls,
        active_params: float,
        bits_per_weight: float,
        *,
        kv_bytes_per_context_token: float = 0.0,
        kv_split_ways: int = 1,
        label: str | None = None,
    ) -> DecodeBytes:
        """From a published active-parameter count and an average storage width in bits."""
        return cls(
            label=label or f"{active_params / 1e9:g}B active @ {bits_per_weight:g} bits",
            weight_bytes_per_token=active_params * bits_per_weight / 8.0,
            kv_bytes_per_context_token=kv_bytes_per_context_token,
            kv_split_ways=kv_split_ways,
        )


@dataclass(frozen=True)
class Roofline:
    """An upper bound on single-request decode speed, with every input kept for the report."""

    label: str
    device: str
    bandwidth_gbs: float  # per device, peak
    tp: int
    efficiency: float
    context_tokens: int
    weight_bytes_per_token: float  # all ranks
    weight_bytes_per_rank: float
    kv_bytes_per_rank: float  # at context_tokens
    bytes_per_rank: float
    seconds_per_token: float
    tokens_per_s: float
    assumptions: tuple[str, ...]

    @property
    def ms_per_token(self) -> float:
        return self.seconds_per_token * 1e3

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["assumptions"] = list(self.assumptions)
        d["ms_per_token"] = self.ms_per_token
        return d


ASSUMPTIONS = (
    "single sequence (batch 1): every active weight byte is read once per token",
    "weights split evenly over the TP ranks (column/row-parallel linears, vocab-parallel head, "
    "each routed expert sharded over ranks); every rank reads only its shard, all in parallel",
    "KV cache: GQA/MHA heads split over ranks (replicated when TP > KV heads); an MLA latent is "
    "read whole by every rank",
    "all-reduces, kernel launches, sampling and host overhead ignored -> an upper bound",
    "peak DRAM bandwidth x efficiency; caches do not hold the weights between tokens",
)


def decode_roofline(
    facts: ModelFacts | DecodeBytes,
    *,
    device: str | Device | None = None,
    bandwidth_gbs: float | None = None,
    tp: int = 1,
    context_tokens: int = 0,
    efficiency: float = 1.0,
) -> Roofline:
    """Upper bound on single-request decode tokens/s of ``facts`` on ``tp`` devices.

    ``tokens/s = bandwidth * efficiency / bytes read per rank per token``, where a rank reads
    ``weight_bytes / tp`` plus its share of the KV cache, ``context_tokens * kv_bytes_per_token /
    min(tp, kv_split_ways)``. With the KV cache split evenly this is exactly
    ``tp * bandwidth * efficiency / (active weight bytes + KV bytes at that context)``.

    Assumptions, each making the result an *upper* bound:

    * one sequence, so nothing is amortised over a batch: each active weight is read once per
      token (for MoE, only the ``experts_active`` routed experts plus dense and shared weights);
    * tensor parallelism splits the weights evenly and the ranks read their shards concurrently,
      so the step takes as long as one rank needs for ``1/tp`` of the bytes;
    * communication (the all-reduces after attention and MLP in every layer), kernel-launch gaps,
      sampling and Python overhead cost nothing, which is far from true over PCIe and is exactly
      the gap a tuner closes (CUDA graphs, NCCL settings);
    * the device sustains ``efficiency`` x its peak bandwidth (use ~0.8-0.9 for a realistic
      ceiling; 1.0 gives the hard physical limit).

    Give either ``device`` (a key of :data:`DEVICES` or a :class:`Device`) or ``bandwidth_gbs``
    (per device, GB/s); ``bandwidth_gbs`` wins when both are given.
    """
    if tp < 1:
        raise ValueError("tp must be >= 1")
    if not 0 < efficiency <= 1:
        raise ValueError("efficiency must be in (0, 1]")
    if context_tokens < 0:
        raise ValueError("context_tokens must be >= 0")
    dev = get_device(device) if isinstance(device, str) else device
    if bandwidth_gbs is None:
        if dev is None:
            raise ValueError("give device or bandwidth_gbs")
        bandwidth_gbs = dev.bandwidth_gbs
    if bandwidth_gbs <= 0:
        raise ValueError("bandwidth_gbs must be > 0")
    dev_name = dev.name if dev is not None else f"{bandwidth_gbs:g} GB/s device"
    db = facts if isinstance(facts, DecodeBytes) else DecodeBytes.from_facts(facts)

    w_rank = db.weight_bytes_per_token / tp
    kv_rank = context_tokens * db.kv_bytes_per_context_token / min(tp, db.kv_split_ways)
    total = w_rank + kv_rank
    if total <= 0:
        raise ValueError("nothing to read: zero active bytes")
    seconds = total / (bandwidth_gbs * 1e9 * efficiency)
    return Roofline(
        label=db.label,
        device=dev_name,
        bandwidth_gbs=float(bandwidth_gbs),
        tp=tp,
        efficiency=efficiency,
        context_tokens=context_tokens,
        weight_bytes_per_token=db.weight_bytes_per_token,
        weight_bytes_per_rank=w_rank,
        kv_bytes_per_rank=kv_rank,
        bytes_per_rank=total,
        seconds_per_token=seconds,
        tokens_per_s=1.0 / seconds,
        assumptions=ASSUMPTIONS,
    )


def fraction_of_roofline(measured_tok_s: float, roofline: Roofline) -> float:
    """Measured single-request decode tokens/s as a fraction of the bound (1.0 = at the bound)."""
    if measured_tok_s < 0:
        raise ValueError("measured_tok_s must be >= 0")
    return measured_tok_s / roofline.tokens_per_s


# ---------------------------------------------------------------------------------------------
# rows for the command lines


def _fmt_bytes(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:,.3f} {unit}"
    return f"{n:,.0f} B"


def roofline_from_spec(data: dict[str, Any], model_path: str | None = None) -> Roofline:
    """The decode roofline described by a study spec's ``roofline:`` section.

    Keys: ``device`` or ``bandwidth_gbs``, ``tp``, ``context``, ``efficiency``; the bytes come
    from ``active_params`` + ``bits`` (+ ``kv_bytes_per_token``, ``kv_split_ways``) or, when
    those are absent, from inspecting the spec's model (``inspect_model``).
    """
    if "active_params" in data and "bits" in data:
        db = DecodeBytes.from_params(
            float(data["active_params"]),
            float(data["bits"]),
            kv_bytes_per_context_token=float(data.get("kv_bytes_per_token", 0.0)),
            kv_split_ways=int(data.get("kv_split_ways", 1)),
        )
    else:
        if model_path is None:
            raise ValueError("roofline: give active_params and bits, or a model to inspect")
        db = DecodeBytes.from_facts(inspect_model(model_path))
    return decode_roofline(
        db,
        device=data.get("device"),
        bandwidth_gbs=data.get("bandwidth_gbs"),
        tp=int(data.get("tp", 1)),
        context_tokens=int(data.get("context", 0)),
        efficiency=float(data.get("efficiency", 1.0)),
    )


def roofline_rows(
    r: Roofline, measured: list[float] | tuple[float, ...] = ()
) -> list[tuple[str, str]]:
    """Label/value rows describing a roofline, for the CLIs."""
    rows = [
        ("model", r.label),
        ("device", f"{r.device}, {r.bandwidth_gbs:,.0f} GB/s x {r.efficiency:g} efficiency"),
        ("tensor parallel", str(r.tp)),
        ("active weight bytes / token", _fmt_bytes(r.weight_bytes_per_token)),
        ("weight bytes / rank / token", _fmt_bytes(r.weight_bytes_per_rank)),
        (
            "KV bytes / rank / token",
            f"{_fmt_bytes(r.kv_bytes_per_rank)} at context {r.context_tokens:,}",
        ),
        ("time / token (bound)", f"{r.ms_per_token:.3f} ms"),
        ("decode upper bound", f"{r.tokens_per_s:,.1f} tok/s"),
    ]
    for m in measured:
        gap_ms = 1e3 / m - r.ms_per_token if m > 0 else float("inf")
        rows.append(
            (
                f"measured {m:g} tok/s",
                f"{fraction_of_roofline(m, r):.1%} of bound "
                f"({gap_ms:.2f} ms/token not explained by "
                "bandwidth)",
            )
        )
    return rows


def roofline_rows_for(
    facts: ModelFacts,
    *,
    device: str | None,
    bandwidth_gbs: float | None,
    tp: int,
    context_tokens: int,
    measured: list[float] | tuple[float, ...] = (),
) -> list[tuple[str, str]]:
    """The rows of ``autotune inspect --device``: an unknown device (or one without a
    bandwidth) is the user's input, named as ``--device``."""
    try:
        roofline = decode_roofline(
            DecodeBytes.from_facts(facts),
            device=device,
            bandwidth_gbs=bandwidth_gbs,
            tp=tp,
            context_tokens=context_tokens,
        )
    except (KeyError, ValueError) as exc:
        raise SpecError(str(exc).strip("'\""), key="--device") from None
    return roofline_rows(roofline, measured)
