"""Model facts (what ``autotune inspect`` reports) and the counting rules both readers share.

The readers are :mod:`autotune.model.gguf_reader` and :mod:`autotune.model.hf_reader`; the entry
point that picks one is :func:`autotune.model.reader.inspect_model`.

``autotune inspect MODEL`` answers the questions one needs before tuning a server for a model:
how many bytes must every decoded token read (the quantity that bounds single-request decode, see
``autotune.model.roofline``), what kind of attention and KV cache it has, whether it is a mixture of
experts, which quantization types hold how many bytes, and which projections are *fused* (stored
or loaded as one matrix made of several shards). The last one is there because of the motivating
deployment: GLM-5 in GGUF produced garbage under vLLM until the shard order of a fused projection
was fixed, so a tool that tunes such a model should show the shard layout it can see.

Nothing here loads weights. A GGUF file is memory-mapped by ``gguf.GGUFReader`` and only its
header and tensor infos are touched; a safetensors file is read as its 8-byte little-endian header
length followed by the JSON header (dtype, shape, byte offsets of every tensor). A 400 GB model is
inspected in well under a second.

Counting rules (the reasons are in the docstrings of the functions that apply them):

* *total* parameters and bytes: every tensor in every file (split GGUF parts summed);
* *active* parameters and bytes per token: what one decode step of one sequence reads, namely
  every dense tensor, the shared experts, ``experts_active / experts_total`` of the routed expert
  tensors, one row of the input embedding table (a lookup, not a matmul) and the whole output head
  (for tied embeddings the table is the head and is read whole); multi-token-prediction (MTP /
  NextN) layers are excluded because plain decode never runs them;
* KV cache bytes per token per layer: ``(kv_lora_rank + qk_rope_head_dim) * dtype_bytes`` for MLA
  (one latent vector shared by all heads, plus the decoupled RoPE key), and
  ``2 * kv_heads * head_dim * dtype_bytes`` for MHA / GQA / MQA.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.errors import SpecError

__all__ = [
    "DEFAULT_KV_DTYPE_BYTES",
    "AttentionFacts",
    "Counts",
    "FusedProjection",
    "InspectError",
    "ModelFacts",
    "MoEFacts",
    "QuantStat",
    "Shard",
    "TensorInfo",
    "attention_facts",
    "count_tensors",
    "group_fused",
    "opt_int",
]

#: Bytes per KV-cache element assumed when the model does not say otherwise. vLLM's default
#: ``--kv-cache-dtype auto`` stores the cache in the model dtype, which is fp16/bf16 for GGUF
#: checkpoints and for nearly every released HF checkpoint.
DEFAULT_KV_DTYPE_BYTES = 2


class InspectError(SpecError):
    """The path is not a model autotune can read (missing parts, unreadable header, no config)."""


# ---------------------------------------------------------------------------------------------
# the facts


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class QuantStat:
    """How many tensors, parameters and bytes one storage type holds (``Q4_K``, ``BF16``, ...).

    ``bits_per_weight`` includes the per-block scales, which is what memory traffic pays for.
    """

    qtype: str
    tensors: int
    params: int
    bytes: int

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.bytes / self.params if self.params else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bits_per_weight": round(self.bits_per_weight, 4)}


@dataclass(frozen=True)
class AttentionFacts:
    """Attention geometry and the KV cache it implies.

    ``kind`` is ``MHA`` (kv heads == heads), ``GQA`` (1 < kv heads < heads), ``MQA`` (one kv head)
    or ``MLA`` (multi-head latent attention, DeepSeek-V2 style: the cache holds one compressed
    ``kv_lora_rank`` vector plus a ``qk_rope_head_dim`` RoPE key per token, shared by all heads).
    For MLA ``head_dim`` is the per-head query/key width ``qk_nope_head_dim + qk_rope_head_dim``
    and ``num_kv_heads`` is the logical head count (GGUF stores 1 for the absorbed form).
    """

    kind: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    #: DeepSeek-sparse-attention (GLM-5, DeepSeek-V3.2) indexer: key width and top-k tokens
    #: attended per query; None for dense attention.
    indexer_key_length: int | None = None
    indexer_top_k: int | None = None
    kv_dtype_bytes: int = DEFAULT_KV_DTYPE_BYTES
    kv_elements_per_token_per_layer: int = 0
    kv_bytes_per_token_per_layer: int = 0


@dataclass(frozen=True)
class MoEFacts:
    """Mixture-of-experts shape. Expert params/bytes are the *routed* experts over all layers."""

    experts_total: int
    experts_active: int
    shared_experts: int
    moe_layers: int
    routed_expert_params: int
    routed_expert_bytes: int

    @property
    def active_fraction(self) -> float:
        return self.experts_active / self.experts_total if self.experts_total else 0.0


@dataclass(frozen=True)
class Shard:
    """One shard of a fused projection: its name and its number of output rows."""

    name: str
    rows: int


@dataclass(frozen=True)
class FusedProjection:
    """A projection whose output rows are several logical matrices stacked in one tensor.

    ``shards`` are in stored order (for ``on_disk`` tensors) or in the order vLLM stacks them when
    it fuses separate tensors at load time (``on_disk=False``). A loader that concatenates the
    shards in another order produces a model that runs and emits garbage, which is exactly the
    GLM-5 GGUF bug this field exists to make visible. ``derivation`` says where the order came
    from: tensor shapes and head counts can prove the *sizes*; the *order* of equal-sized shards
    is a convention of the format, stated there.
    """

    tensor: str
    kind: str
    shape: tuple[int, ...]
    layers: int
    shards: tuple[Shard, ...]
    on_disk: bool
    derivation: str


@dataclass(frozen=True)
class ModelFacts:
    """Everything ``inspect_model`` learned, in units a roofline and a report can use directly."""

    path: str
    format: str  # "gguf" | "hf"
    files: tuple[str, ...]
    architecture: str
    name: str | None
    num_layers: int
    mtp_layers: int
    hidden_size: int
    vocab_size: int
    attention: AttentionFacts
    moe: MoEFacts | None
    quant_types: tuple[QuantStat, ...]
    quantization: str | None
    tensor_count: int
    total_params: int
    total_bytes: int
    active_params_per_token: int
    active_bytes_per_token: int
    fused_projections: tuple[FusedProjection, ...]
    tied_embeddings: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one context token occupies over all (non-MTP) layers."""
        return self.attention.kv_bytes_per_token_per_layer * self.num_layers

    @property
    def active_bits_per_weight(self) -> float:
        p = self.active_params_per_token
        return 8.0 * self.active_bytes_per_token / p if p else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists) for storing in a study's attributes."""
        d = asdict(self)
        d["quant_types"] = [q.to_dict() for q in self.quant_types]
        if self.moe is not None:
            d["moe"]["active_fraction"] = self.moe.active_fraction
        d["kv_bytes_per_token"] = self.kv_bytes_per_token
        d["active_bits_per_weight"] = round(self.active_bits_per_weight, 4)
        return _jsonable(d)


# ---------------------------------------------------------------------------------------------
# shared counting


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: str
    shape: tuple[int, ...]  # GGUF: ne order (fastest first); HF: torch order (rows first)
    params: int
    nbytes: int
    layer: int | None
    role: str  # embedding | output | routed_expert | mtp | dense


@dataclass(frozen=True)
class Counts:
    total_params: int
    total_bytes: int
    active_params: int
    active_bytes: int
    routed_params: int
    routed_bytes: int
    quant: tuple[QuantStat, ...]
    tied: bool

    def fact_fields(self) -> dict[str, Any]:
        """The ModelFacts fields both readers (GGUF, HF) take straight from the counts."""
        return {
            "quant_types": self.quant,
            "total_params": self.total_params,
            "total_bytes": self.total_bytes,
            "active_params_per_token": self.active_params,
            "active_bytes_per_token": self.active_bytes,
        }


def count_tensors(tensors: list[TensorInfo], *, active_fraction: float, vocab: int) -> Counts:
    """Totals and per-token active sums.

    The embedding table is a lookup: one row of it is read per token, so only ``bytes / vocab`` is
    counted, unless there is no separate output head (tied embeddings), in which case the head
    matmul reads the whole table anyway. Routed experts count ``active_fraction`` of their bytes:
    for a single sequence exactly ``experts_active`` experts run per layer, and experts of one
    layer have equal size. MTP layers are skipped (plain decode does not run them).
    """
    by_type: dict[str, list[int]] = {}
    total_p = total_b = act_p = act_b = routed_p = routed_b = 0
    has_output = any(t.role == "output" for t in tensors)
    act_pf = act_bf = 0.0
    for t in tensors:
        total_p += t.params
        total_b += t.nbytes
        s = by_type.setdefault(t.qtype, [0, 0, 0])
        s[0] += 1
        s[1] += t.params
        s[2] += t.nbytes
        if t.role == "embedding":
            if has_output:
                rows = max(vocab, 1)
                act_pf += t.params / rows
                act_bf += t.nbytes / rows
            else:
                act_p += t.params
                act_b += t.nbytes
        elif t.role == "routed_expert":
            routed_p += t.params
            routed_b += t.nbytes
            act_pf += t.params * active_fraction
            act_bf += t.nbytes * active_fraction
        elif t.role == "mtp":
            continue
        else:
            act_p += t.params
            act_b += t.nbytes
    quant = tuple(
        QuantStat(qtype=k, tensors=v[0], params=v[1], bytes=v[2])
        for k, v in sorted(by_type.items(), key=lambda kv: -kv[1][2])
    )
    return Counts(
        total_params=total_p,
        total_bytes=total_b,
        active_params=act_p + round(act_pf),
        active_bytes=act_b + round(act_bf),
        routed_params=routed_p,
        routed_bytes=routed_b,
        quant=quant,
        tied=not has_output,
    )


def attention_facts(
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    kv_lora_rank: int | None,
    q_lora_rank: int | None,
    qk_rope_head_dim: int | None,
    qk_nope_head_dim: int | None,
    mla: bool,
    kv_dtype_bytes: int,
    indexer_key_length: int | None = None,
    indexer_top_k: int | None = None,
) -> AttentionFacts:
    if mla:
        kind = "MLA"
        elems = (kv_lora_rank or 0) + (qk_rope_head_dim or 0)
    else:
        if num_kv_heads <= 1:
            kind = "MQA"
        elif num_kv_heads == num_heads:
            kind = "MHA"
        else:
            kind = "GQA"
        elems = num_kv_heads * (head_dim + v_head_dim)  # K and V; = 2*kv*head_dim usually
    return AttentionFacts(
        kind=kind,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        qk_nope_head_dim=qk_nope_head_dim,
        indexer_key_length=indexer_key_length,
        indexer_top_k=indexer_top_k,
        kv_dtype_bytes=kv_dtype_bytes,
        kv_elements_per_token_per_layer=elems,
        kv_bytes_per_token_per_layer=elems * kv_dtype_bytes,
    )


def group_fused(
    items: list[tuple[str, str, tuple[int, ...], tuple[Shard, ...], bool, str]],
) -> tuple[FusedProjection, ...]:
    """Collapse per-layer hits (``blk.3.attn_qkv.weight``) into one row per pattern and shape."""
    groups: dict[tuple, list[int]] = {}
    order: list[tuple] = []
    for pattern, kind, shape, shards, on_disk, derivation in items:
        key = (pattern, kind, shape, shards, on_disk, derivation)
        if key not in groups:
            groups[key] = [0]
            order.append(key)
        groups[key][0] += 1
    return tuple(
        FusedProjection(
            tensor=k[0],
            kind=k[1],
            shape=k[2],
            layers=groups[k][0],
            shards=k[3],
            on_disk=k[4],
            derivation=k[5],
        )
        for k in order
    )


def opt_int(v: Any) -> int | None:
    """A metadata count, or None where the file leaves it out or says 0."""
    return int(v) if v else None
