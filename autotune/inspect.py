"""Model facts from a GGUF file or a Hugging Face folder, read from metadata only.

``autotune inspect MODEL`` answers the questions one needs before tuning a server for a model:
how many bytes must every decoded token read (the quantity that bounds single-request decode, see
``autotune.roofline``), what kind of attention and KV cache it has, whether it is a mixture of
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

import json
import math
import re
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import SpecError

__all__ = [
    "AttentionFacts",
    "FusedProjection",
    "InspectError",
    "ModelFacts",
    "MoEFacts",
    "QuantStat",
    "Shard",
    "facts_as_rows",
    "inspect_model",
]

#: Bytes per KV-cache element assumed when the model does not say otherwise. vLLM's default
#: ``--kv-cache-dtype auto`` stores the cache in the model dtype, which is fp16/bf16 for GGUF
#: checkpoints and for nearly every released HF checkpoint.
DEFAULT_KV_DTYPE_BYTES = 2

_SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_GGUF_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
_HF_LAYER_RE = re.compile(r"\.(?:layers|h|blocks|layer)\.(\d+)\.")

# safetensors dtype -> bytes per element (bytes are taken from data_offsets anyway; this is only
# used to name the quantization "type" of an HF tensor and to derive the KV dtype).
_HF_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}
_TORCH_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


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
class _Tensor:
    name: str
    qtype: str
    shape: tuple[int, ...]  # GGUF: ne order (fastest first); HF: torch order (rows first)
    params: int
    nbytes: int
    layer: int | None
    role: str  # embedding | output | routed_expert | mtp | dense


@dataclass(frozen=True)
class _Counts:
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


def _count(tensors: list[_Tensor], *, active_fraction: float, vocab: int) -> _Counts:
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
    return _Counts(
        total_params=total_p,
        total_bytes=total_b,
        active_params=act_p + round(act_pf),
        active_bytes=act_b + round(act_bf),
        routed_params=routed_p,
        routed_bytes=routed_b,
        quant=quant,
        tied=not has_output,
    )


def _attention(
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


def _group_fused(
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


# ---------------------------------------------------------------------------------------------
# GGUF


def gguf_parts(path: str | Path) -> list[Path]:
    """All files of a (possibly split) GGUF model, in part order.

    ``model-00002-of-00005.gguf`` (any part) resolves to parts 1..5, which must all exist: a
    missing part would silently undercount the model, so it is an error instead.
    """
    p = Path(path)
    m = _SPLIT_RE.match(p.name)
    if not m:
        return [p]
    count = int(m["count"])
    parts = [p.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [q.name for q in parts if not q.is_file()]
    if missing:
        raise InspectError(f"split GGUF is missing part(s): {', '.join(missing)}", file=str(p))
    return parts


def _gguf_scalar(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        value = f.contents()
    except Exception:  # noqa: BLE001 - an odd field type must not stop the inspection
        return None
    if isinstance(value, list):  # per-layer arrays (e.g. head counts): take the largest
        nums = [v for v in value if isinstance(v, int | float)]
        return max(nums) if nums else None
    return value


def _gguf_array_len(reader: Any, key: str) -> int | None:
    f = reader.fields.get(key)
    return len(f.data) if f is not None else None


def _gguf_role(name: str, layer: int | None, n_main_layers: int) -> str:
    if layer is not None and layer >= n_main_layers:
        return "mtp"
    if name.startswith("token_embd."):
        return "embedding"
    if name.startswith("output.") and name.endswith("weight"):
        return "output"
    if "_exps." in name:
        return "routed_expert"
    return "dense"


def _inspect_gguf(path: Path) -> ModelFacts:
    from gguf import GGUFReader

    parts = gguf_parts(path)
    try:
        readers = [GGUFReader(str(p), "r") for p in parts]
    except Exception as exc:  # noqa: BLE001 - gguf raises ValueError/struct errors on bad files
        raise InspectError(f"cannot read GGUF header: {exc}", file=str(path)) from exc
    r0 = readers[0]
    arch = _gguf_scalar(r0, "general.architecture")
    if not arch:
        raise InspectError("GGUF has no general.architecture", file=str(parts[0]))

    def kv(suffix: str) -> Any:
        return _gguf_scalar(r0, f"{arch}.{suffix}")

    notes: list[str] = []
    expected = _gguf_scalar(r0, "split.tensors.count")
    raw = [t for r in readers for t in r.tensors]
    if expected is not None and int(expected) != len(raw):
        raise InspectError(
            f"split GGUF lists {expected} tensors but the parts hold {len(raw)}", file=str(parts[0])
        )

    block_count = int(kv("block_count") or 0)
    nextn = int(kv("nextn_predict_layers") or 0)
    n_layers = block_count - nextn
    if nextn:
        notes.append(f"{nextn} MTP/NextN layer(s) in blk.{n_layers}+ excluded from active bytes")

    tensors: list[_Tensor] = []
    for t in raw:
        m = _GGUF_LAYER_RE.match(t.name)
        layer = int(m.group(1)) if m else None
        tensors.append(
            _Tensor(
                name=t.name,
                qtype=t.tensor_type.name,
                shape=tuple(int(x) for x in t.shape),
                params=int(t.n_elements),
                nbytes=int(t.n_bytes),
                layer=layer,
                role=_gguf_role(t.name, layer, n_layers if block_count else 1 << 30),
            )
        )
    names = {t.name for t in tensors}

    hidden = int(kv("embedding_length") or 0)
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    vocab = kv("vocab_size") or _gguf_array_len(r0, "tokenizer.ggml.tokens")
    if not vocab and embd is not None and len(embd.shape) == 2:
        vocab = embd.shape[1]
    vocab = int(vocab or 0)

    # attention
    n_head = int(kv("attention.head_count") or 0)
    n_kv = kv("attention.head_count_kv")
    n_kv = int(n_kv) if n_kv is not None else n_head
    kv_lora = kv("attention.kv_lora_rank")
    q_lora = kv("attention.q_lora_rank")
    has_mqa_tensor = any(".attn_kv_a_mqa." in n for n in names)
    mla = bool(kv_lora) or has_mqa_tensor
    rope_dim = kv("rope.dimension_count")
    if mla:
        if not kv_lora:  # infer from the fused tensor: rows = kv_lora_rank + rope_dim
            t = next(t for t in tensors if ".attn_kv_a_mqa." in t.name)
            kv_lora = t.shape[1] - int(rope_dim or 0)
            notes.append("kv_lora_rank inferred from attn_kv_a_mqa shape")
        # Since llama.cpp's MLA rework the absorbed form stores key_length = kv_lora + rope and
        # head_count_kv = 1; the per-head widths then live in key_length_mla / value_length_mla.
        head_dim_mla = kv("attention.key_length_mla")
        head_dim = int(head_dim_mla or kv("attention.key_length") or 0)
        v_dim = int(kv("attention.value_length_mla") or kv("attention.value_length") or 0)
        if not head_dim_mla and head_dim == int(kv_lora) + int(rope_dim or 0):
            notes.append("per-head key width unknown (absorbed MLA without key_length_mla)")
        n_kv_logical = n_head
        nope = head_dim - int(rope_dim or 0) if head_dim else None
    else:
        head_dim = int(kv("attention.key_length") or (hidden // n_head if n_head else 0))
        v_dim = int(kv("attention.value_length") or head_dim)
        n_kv_logical = n_kv
        nope = None
    attention = _attention(
        num_heads=n_head,
        num_kv_heads=n_kv_logical,
        head_dim=head_dim,
        v_head_dim=v_dim,
        kv_lora_rank=int(kv_lora) if mla else None,
        q_lora_rank=int(q_lora) if q_lora else None,
        qk_rope_head_dim=int(rope_dim) if (mla and rope_dim) else None,
        qk_nope_head_dim=nope,
        mla=mla,
        kv_dtype_bytes=DEFAULT_KV_DTYPE_BYTES,
        indexer_key_length=_opt_int(kv("attention.indexer.key_length")),
        indexer_top_k=_opt_int(kv("attention.indexer.top_k")),
    )

    # experts
    exp_tensors = [t for t in tensors if t.role == "routed_expert"]
    n_exp = kv("expert_count")
    if not n_exp and exp_tensors:
        n_exp = max(t.shape[-1] for t in exp_tensors if len(t.shape) >= 3)
    n_used = kv("expert_used_count")
    n_exp, n_used = int(n_exp or 0), int(n_used or 0)
    if exp_tensors and not n_used:
        raise InspectError("GGUF has expert tensors but no expert_used_count", file=str(path))
    frac = n_used / n_exp if n_exp else 0.0
    counts = _count(tensors, active_fraction=frac, vocab=vocab)
    moe = None
    if n_exp:
        moe_layers = len({t.layer for t in exp_tensors if t.layer is not None and t.role != "mtp"})
        moe = MoEFacts(
            experts_total=n_exp,
            experts_active=n_used,
            shared_experts=int(kv("expert_shared_count") or 0),
            moe_layers=moe_layers,
            routed_expert_params=counts.routed_params,
            routed_expert_bytes=counts.routed_bytes,
        )

    fused = _gguf_fused(tensors, attention=attention, n_kv_stored=n_kv)
    file_type = _gguf_scalar(r0, "general.file_type")
    quantization = _ftype_name(file_type)
    return ModelFacts(
        path=str(path),
        format="gguf",
        files=tuple(str(p) for p in parts),
        architecture=str(arch),
        name=_gguf_scalar(r0, "general.name"),
        num_layers=n_layers,
        mtp_layers=nextn,
        hidden_size=hidden,
        vocab_size=vocab,
        attention=attention,
        moe=moe,
        quantization=quantization,
        tensor_count=len(tensors),
        **counts.fact_fields(),
        fused_projections=fused,
        tied_embeddings=counts.tied,
        notes=tuple(notes),
    )


def _opt_int(v: Any) -> int | None:
    return int(v) if v else None


def _ftype_name(file_type: Any) -> str | None:
    if file_type is None:
        return None
    try:
        from gguf import LlamaFileType

        return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return f"file_type={file_type}"


def _gguf_fused(
    tensors: list[_Tensor], *, attention: AttentionFacts, n_kv_stored: int
) -> tuple[FusedProjection, ...]:
    """Fused projections visible in a GGUF file, with shard sizes proven from shapes.

    GGUF shapes are in ggml order ``[in, out, (experts)]``; the shard split is along ``out``.
    """
    hits: list[tuple[str, str, tuple[int, ...], tuple[Shard, ...], bool, str]] = []
    a = attention
    names = {t.name for t in tensors}
    for t in tensors:
        if t.role == "mtp" or not t.name.endswith(".weight") or len(t.shape) < 2:
            continue
        pattern = _GGUF_LAYER_RE.sub("blk.*.", t.name)
        out = t.shape[1]
        if ".attn_qkv." in t.name:
            q, k = a.num_heads * a.head_dim, n_kv_stored * a.head_dim
            v = n_kv_stored * a.v_head_dim
            if q + k + v == out:
                shards = (Shard("q", q), Shard("k", k), Shard("v", v))
                how = "sizes from head_count/head_count_kv/key_length; order q,k,v is llama.cpp's"
            else:
                shards = ()
                how = f"rows {out} != q+k+v {q + k + v} from metadata; shard sizes unknown"
            hits.append((pattern, "qkv", t.shape, shards, True, how))
        elif ".attn_kv_a_mqa." in t.name:
            kvl, rope = a.kv_lora_rank or 0, a.qk_rope_head_dim or 0
            ok = kvl + rope == out
            shards = (Shard("kv_latent", kvl), Shard("k_rope", rope)) if ok else ()
            how = (
                "sizes from kv_lora_rank/rope.dimension_count; latent first, then RoPE key "
                "(DeepSeek-V2 kv_a_proj_with_mqa layout)"
                if ok
                else f"rows {out} != kv_lora_rank+rope {kvl + rope}"
            )
            hits.append((pattern, "kv_a_mqa (MLA latent + rope key)", t.shape, shards, True, how))
        elif "_gate_up_exps." in t.name or ".ffn_gate_up." in t.name:
            half = out // 2
            hits.append(
                (
                    pattern,
                    "gate_up",
                    t.shape,
                    (Shard("gate", half), Shard("up", half)),
                    True,
                    "two equal halves; gate first is llama.cpp's convention",
                )
            )
    # load-time fusions vLLM performs on separate GGUF tensors (order = vLLM's shard ids)
    for t in tensors:
        if t.role == "mtp" or not t.name.endswith(".attn_q_a.weight"):
            continue
        prefix = t.name.removesuffix("attn_q_a.weight")
        mqa = next((u for u in tensors if u.name == prefix + "attn_kv_a_mqa.weight"), None)
        if mqa is None:
            continue
        shards = (Shard("q_a", t.shape[1]), Shard("kv_a_mqa", mqa.shape[1]))
        hits.append(
            (
                "blk.*.attn_q_a + blk.*.attn_kv_a_mqa -> fused_qkv_a_proj",
                "q_a + kv_a (load time)",
                (t.shape[0], t.shape[1] + mqa.shape[1]),
                shards,
                False,
                "vLLM's DeepSeek-V2/GLM MLA stacks q_a_proj then kv_a_proj_with_mqa; the "
                "loader must place GGUF shards in this order (the GLM-5 garbage-output bug)",
            )
        )
    for t in tensors:
        if t.role == "mtp" or not t.name.endswith(".attn_q.weight"):
            continue
        prefix = t.name.removesuffix("attn_q.weight")
        k, v = prefix + "attn_k.weight", prefix + "attn_v.weight"
        if k in names and v in names:
            kt = next(u for u in tensors if u.name == k)
            vt = next(u for u in tensors if u.name == v)
            shards = (Shard("q", t.shape[1]), Shard("k", kt.shape[1]), Shard("v", vt.shape[1]))
            hits.append(
                (
                    "blk.*.attn_q/k/v -> qkv_proj",
                    "qkv (load time)",
                    (t.shape[0], sum(s.rows for s in shards)),
                    shards,
                    False,
                    "vLLM QKVParallelLinear stacks q, k, v",
                )
            )
    return _group_fused(hits)


# ---------------------------------------------------------------------------------------------
# Hugging Face folder


def read_safetensors_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a safetensors file: ``{name: {dtype, shape, data_offsets}, ...}``.

    Format: 8 bytes little-endian u64 header length N, then N bytes of JSON. Tensor data is never
    read, so this is fast even for multi-GB shards.
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise InspectError("safetensors file shorter than its 8-byte header", file=str(p))
            (n,) = struct.unpack("<Q", head)
            if n > 100_000_000:
                raise InspectError(f"implausible safetensors header length {n}", file=str(p))
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as exc:
        raise InspectError(f"cannot read safetensors header: {exc}", file=str(p)) from exc
    header.pop("__metadata__", None)
    return header


def _hf_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise InspectError(f"bad safetensors index: {exc}", file=str(index)) from exc
        files = [folder / f for f in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise InspectError(
                f"index names missing shard(s): {', '.join(missing)}", file=str(index)
            )
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InspectError(
            "no *.safetensors files (only safetensors checkpoints are read)", file=str(folder)
        )
    return files


def _cfg_get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    """First present, non-null key; nested ``text_config`` (multimodal models) as a fallback."""
    for source in (cfg, cfg.get("text_config") or {}):
        for k in keys:
            v = source.get(k)
            if v is not None:
                return v
    return default


def _hf_role(name: str, layer: int | None, n_layers: int) -> str:
    if layer is not None and layer >= n_layers:
        return "mtp"
    if name.endswith(("embed_tokens.weight", "wte.weight", "word_embeddings.weight")):
        return "embedding"
    if name.endswith(("lm_head.weight", "embed_out.weight")):
        return "output"
    if (".experts." in name or name.startswith("experts.")) and "e_score_correction" not in name:
        return "routed_expert"
    return "dense"


def _inspect_hf(folder: Path) -> ModelFacts:
    cfg_path = folder / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise InspectError(f"cannot read config.json: {exc}", file=str(cfg_path)) from exc
    files = _hf_files(folder)
    notes: list[str] = []

    archs = cfg.get("architectures") or [cfg.get("model_type") or "unknown"]
    n_layers = int(_cfg_get(cfg, "num_hidden_layers", "n_layer", "num_layers", default=0))
    hidden = int(_cfg_get(cfg, "hidden_size", "n_embd", "d_model", default=0))
    vocab = int(_cfg_get(cfg, "vocab_size", default=0))

    tensors: list[_Tensor] = []
    for f in files:
        for name, info in read_safetensors_header(f).items():
            shape = tuple(int(x) for x in info["shape"])
            b, e = info["data_offsets"]
            m = _HF_LAYER_RE.search(name)
            layer = int(m.group(1)) if m else None
            tensors.append(
                _Tensor(
                    name=name,
                    qtype=str(info["dtype"]),
                    shape=shape,
                    params=math.prod(shape),
                    nbytes=int(e) - int(b),
                    layer=layer,
                    role=_hf_role(name, layer, n_layers or 1 << 30),
                )
            )
    names = {t.name for t in tensors}
    mtp = sorted({t.layer for t in tensors if t.role == "mtp" and t.layer is not None})
    if mtp:
        notes.append(f"{len(mtp)} MTP layer(s) (layers.{mtp[0]}+) excluded from active bytes")
    if not vocab:
        emb = next((t for t in tensors if t.role == "embedding"), None)
        vocab = emb.shape[0] if emb is not None else 0

    dtype = str(_cfg_get(cfg, "torch_dtype", "dtype", default="bfloat16"))
    kv_bytes = _TORCH_DTYPE_BYTES.get(dtype.removeprefix("torch."), DEFAULT_KV_DTYPE_BYTES)

    n_head = int(_cfg_get(cfg, "num_attention_heads", "n_head", default=0))
    n_kv = int(_cfg_get(cfg, "num_key_value_heads", "num_kv_heads", default=n_head) or n_head)
    if _cfg_get(cfg, "multi_query", default=False):
        n_kv = 1
    kv_lora = _cfg_get(cfg, "kv_lora_rank")
    mla = bool(kv_lora) or any("kv_a_proj_with_mqa" in n for n in names)
    if mla:
        rope = int(_cfg_get(cfg, "qk_rope_head_dim", default=0))
        nope = int(_cfg_get(cfg, "qk_nope_head_dim", default=0))
        v_dim = int(_cfg_get(cfg, "v_head_dim", default=nope))
        if not kv_lora:
            t = next(t for t in tensors if "kv_a_proj_with_mqa" in t.name)
            kv_lora = t.shape[0] - rope
        attention = _attention(
            num_heads=n_head,
            num_kv_heads=n_head,
            head_dim=nope + rope,
            v_head_dim=v_dim,
            kv_lora_rank=int(kv_lora),
            q_lora_rank=_opt_int(_cfg_get(cfg, "q_lora_rank")),
            qk_rope_head_dim=rope,
            qk_nope_head_dim=nope,
            mla=True,
            kv_dtype_bytes=kv_bytes,
            indexer_key_length=_opt_int(_cfg_get(cfg, "index_head_dim")),
            indexer_top_k=_opt_int(_cfg_get(cfg, "index_topk")),
        )
    else:
        head_dim = int(_cfg_get(cfg, "head_dim", default=0) or (hidden // n_head if n_head else 0))
        attention = _attention(
            num_heads=n_head,
            num_kv_heads=n_kv,
            head_dim=head_dim,
            v_head_dim=head_dim,
            kv_lora_rank=None,
            q_lora_rank=None,
            qk_rope_head_dim=None,
            qk_nope_head_dim=None,
            mla=False,
            kv_dtype_bytes=kv_bytes,
        )

    n_exp = int(
        _cfg_get(
            cfg,
            "n_routed_experts",
            "num_local_experts",
            "num_experts",
            "moe_num_experts",
            default=0,
        )
        or 0
    )
    n_used = int(
        _cfg_get(
            cfg, "num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", default=0
        )
        or 0
    )
    exp_tensors = [t for t in tensors if t.role == "routed_expert"]
    if exp_tensors and not (n_exp and n_used):
        raise InspectError(
            "expert tensors present but config.json lacks expert counts", file=str(cfg_path)
        )
    counts = _count(tensors, active_fraction=n_used / n_exp if n_exp else 0.0, vocab=vocab)
    moe = None
    if n_exp:
        shared = int(_cfg_get(cfg, "n_shared_experts", default=0) or 0)
        if not shared and _cfg_get(cfg, "shared_expert_intermediate_size"):
            shared = 1
        moe = MoEFacts(
            experts_total=n_exp,
            experts_active=n_used,
            shared_experts=shared,
            moe_layers=len({t.layer for t in exp_tensors if t.role != "mtp"}),
            routed_expert_params=counts.routed_params,
            routed_expert_bytes=counts.routed_bytes,
        )
    qcfg = cfg.get("quantization_config") or {}
    quantization = qcfg.get("quant_method") if isinstance(qcfg, dict) else None
    if quantization:
        notes.append(f"{quantization}: packed tensors count storage elements, not logical weights")
    return ModelFacts(
        path=str(folder),
        format="hf",
        files=tuple(str(f) for f in files),
        architecture=str(archs[0]),
        name=cfg.get("_name_or_path") or folder.name,
        num_layers=n_layers,
        mtp_layers=len(mtp),
        hidden_size=hidden,
        vocab_size=vocab,
        attention=attention,
        moe=moe,
        quantization=quantization,
        tensor_count=len(tensors),
        **counts.fact_fields(),
        fused_projections=_hf_fused(tensors, attention),
        tied_embeddings=counts.tied,
        notes=tuple(notes),
    )


_HF_QKV_SUFFIXES = (
    "qkv_proj.weight",
    "query_key_value.weight",
    "c_attn.weight",
    "W_pack.weight",
    "Wqkv.weight",
    "qkv.weight",
)


def _hf_fused(tensors: list[_Tensor], a: AttentionFacts) -> tuple[FusedProjection, ...]:
    """Fused projections in an HF checkpoint. HF Linear weights are ``[out, in]``."""
    hits: list[tuple[str, str, tuple[int, ...], tuple[Shard, ...], bool, str]] = []
    by_name = {t.name: t for t in tensors}
    for t in tensors:
        if t.role == "mtp" or len(t.shape) < 2:
            continue
        pattern = _HF_LAYER_RE.sub(lambda m: m.group(0).replace(m.group(1), "*"), t.name)
        if t.name.endswith(_HF_QKV_SUFFIXES):
            # GPT-2's Conv1D c_attn is stored [in, out]
            out = t.shape[1] if t.name.endswith("c_attn.weight") else t.shape[0]
            q = a.num_heads * a.head_dim
            k = v = a.num_kv_heads * a.head_dim
            if q + k + v == out:
                shards = (Shard("q", q), Shard("k", k), Shard("v", v))
                how = "sizes from config head counts; q,k,v order is the checkpoint convention"
                if t.name.endswith("query_key_value.weight"):
                    how += " (GPT-NeoX/Falcon interleave q,k,v per head group)"
            else:
                shards, how = (), f"rows {out} != q+k+v {q + k + v} from config"
            hits.append((pattern, "qkv", t.shape, shards, True, how))
        elif t.name.endswith("kv_a_proj_with_mqa.weight"):
            kvl, rope = a.kv_lora_rank or 0, a.qk_rope_head_dim or 0
            ok = kvl + rope == t.shape[0]
            hits.append(
                (
                    pattern,
                    "kv_a_mqa (MLA latent + rope key)",
                    t.shape,
                    (Shard("kv_latent", kvl), Shard("k_rope", rope)) if ok else (),
                    True,
                    "sizes from kv_lora_rank/qk_rope_head_dim; latent first, then RoPE key",
                )
            )
            q_a = by_name.get(t.name.replace("kv_a_proj_with_mqa", "q_a_proj"))
            if q_a is not None:
                hits.append(
                    (
                        _HF_LAYER_RE.sub(".layers.*.", t.name).replace(
                            "kv_a_proj_with_mqa.weight",
                            "{q_a_proj,kv_a_proj_with_mqa} -> fused_qkv_a_proj",
                        ),
                        "q_a + kv_a (load time)",
                        (q_a.shape[0] + t.shape[0], t.shape[1]),
                        (Shard("q_a", q_a.shape[0]), Shard("kv_a_mqa", t.shape[0])),
                        False,
                        "vLLM's DeepSeek-V2/GLM MLA stacks q_a_proj then kv_a_proj_with_mqa",
                    )
                )
        elif t.name.endswith("fused_qkv_a_proj.weight"):
            kva = (a.kv_lora_rank or 0) + (a.qk_rope_head_dim or 0)
            qa = t.shape[0] - kva
            hits.append(
                (
                    pattern,
                    "q_a + kv_a",
                    t.shape,
                    (Shard("q_a", qa), Shard("kv_a_mqa", kva)),
                    True,
                    "q_lora part first, then kv_lora_rank + rope (vLLM order)",
                )
            )
        elif t.name.endswith("gate_up_proj.weight") or t.name.endswith("gate_up_proj"):
            rows = t.shape[-2] if len(t.shape) == 3 else t.shape[0]
            hits.append(
                (
                    pattern,
                    "gate_up",
                    t.shape,
                    (Shard("gate", rows // 2), Shard("up", rows // 2)),
                    True,
                    "two equal halves; gate first is the transformers/vLLM convention",
                )
            )
    for t in tensors:  # separate q/k/v that vLLM stacks into qkv_proj at load time
        if t.role == "mtp" or not t.name.endswith("self_attn.q_proj.weight"):
            continue
        k = by_name.get(t.name.replace("q_proj", "k_proj"))
        v = by_name.get(t.name.replace("q_proj", "v_proj"))
        if k is not None and v is not None:
            shards = (Shard("q", t.shape[0]), Shard("k", k.shape[0]), Shard("v", v.shape[0]))
            hits.append(
                (
                    _HF_LAYER_RE.sub(".layers.*.", t.name).replace("q_proj.weight", "{q,k,v}_proj")
                    + " -> qkv_proj",
                    "qkv (load time)",
                    (sum(s.rows for s in shards), t.shape[1]),
                    shards,
                    False,
                    "vLLM QKVParallelLinear stacks q, k, v",
                )
            )
    return _group_fused(hits)


# ---------------------------------------------------------------------------------------------
# entry points


def inspect_model(path: str | Path) -> ModelFacts:
    """Facts about the model at ``path``: a ``.gguf`` file (any part of a split one), a folder
    holding one GGUF model, or a Hugging Face folder (``config.json`` + safetensors)."""
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix == ".gguf":
            return _inspect_gguf(p)
        if p.name == "config.json":
            return _inspect_hf(p.parent)
        raise InspectError("not a .gguf file or a model folder", file=str(p))
    if p.is_dir():
        if (p / "config.json").is_file() and (
            (p / "model.safetensors.index.json").is_file() or any(p.glob("*.safetensors"))
        ):
            return _inspect_hf(p)
        ggufs = sorted(p.glob("*.gguf"))
        stems = {
            (_SPLIT_RE.match(g.name)["stem"] if _SPLIT_RE.match(g.name) else g.stem) for g in ggufs
        }
        if len(stems) == 1:
            return _inspect_gguf(ggufs[0])
        if len(stems) > 1:
            raise InspectError(
                f"folder holds several GGUF models ({', '.join(sorted(stems))}); name one file",
                file=str(p),
            )
        if (p / "config.json").is_file():
            return _inspect_hf(p)  # raises the "no safetensors" error
        raise InspectError("no config.json, safetensors or .gguf files here", file=str(p))
    raise InspectError("no such file or folder", file=str(p))


def _gb(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:,.3f} {unit}"
    return f"{n:,.0f} B"


def _count_str(n: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:,.2f}{unit}"
    return f"{n:,.0f}"


def facts_as_rows(facts: ModelFacts) -> list[tuple[str, str]]:
    """(label, value) pairs in display order, for a two-column table in the CLI."""
    a = facts.attention
    rows: list[tuple[str, str]] = [
        ("path", facts.path),
        ("format", facts.format + (f" ({len(facts.files)} parts)" if len(facts.files) > 1 else "")),
        ("architecture", facts.architecture),
    ]
    if facts.name:
        rows.append(("name", str(facts.name)))
    rows += [
        (
            "layers",
            str(facts.num_layers) + (f" (+{facts.mtp_layers} MTP)" if facts.mtp_layers else ""),
        ),
        ("hidden size", str(facts.hidden_size)),
        ("vocab", str(facts.vocab_size)),
    ]
    att = f"{a.kind}, {a.num_heads} heads"
    if a.kind == "MLA":
        att += (
            f", kv_lora_rank {a.kv_lora_rank}, rope {a.qk_rope_head_dim}, "
            f"q_lora_rank {a.q_lora_rank}, head_dim {a.head_dim}, v_head_dim {a.v_head_dim}"
        )
    else:
        att += f", {a.num_kv_heads} KV heads, head_dim {a.head_dim}"
    rows.append(("attention", att))
    if a.indexer_key_length:
        rows.append(
            ("sparse-attention indexer", f"key {a.indexer_key_length}, top-k {a.indexer_top_k}")
        )
    rows.append(
        (
            "KV cache / token",
            f"{a.kv_bytes_per_token_per_layer:,} B per layer "
            f"({a.kv_elements_per_token_per_layer} elems x {a.kv_dtype_bytes} B), "
            f"{facts.kv_bytes_per_token:,} B all layers",
        )
    )
    if facts.moe:
        m = facts.moe
        rows.append(
            (
                "experts",
                f"{m.experts_active} of {m.experts_total} routed active, "
                f"{m.shared_experts} shared, {m.moe_layers} MoE layers",
            )
        )
    rows += [
        ("tensors", str(facts.tensor_count)),
        (
            "parameters",
            f"{_count_str(facts.total_params)} total, "
            f"{_count_str(facts.active_params_per_token)} active per token",
        ),
        (
            "bytes",
            f"{_gb(facts.total_bytes)} total, {_gb(facts.active_bytes_per_token)} "
            f"active per token ({facts.active_bits_per_weight:.2f} bits/weight)",
        ),
    ]
    if facts.quantization:
        rows.append(("quantization", facts.quantization))
    for q in facts.quant_types:
        rows.append(
            (
                f"  {q.qtype}",
                f"{q.tensors} tensors, {_count_str(q.params)} params, "
                f"{_gb(q.bytes)} ({q.bits_per_weight:.2f} bits/weight)",
            )
        )
    for f in facts.fused_projections:
        shards = " | ".join(f"{s.name}:{s.rows}" for s in f.shards) or "unknown"
        where = "on disk" if f.on_disk else "fused by vLLM at load"
        rows.append((f"fused {f.kind}", f"{f.tensor} x{f.layers} [{shards}] ({where})"))
    rows.append(("tied embeddings", "yes" if facts.tied_embeddings else "no"))
    for n in facts.notes:
        rows.append(("note", n))
    return rows
