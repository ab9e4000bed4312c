"""GGUF model files: facts from the header and tensor infos, never the weights.

``gguf.GGUFReader`` memory-maps the file and only its header and tensor infos are touched, so a
400 GB split model is read in well under a second. The counting rules are
:mod:`autotune.model.facts`'; this module maps GGUF's names (``blk.N.``, ``ffn_*_exps``,
``attn_kv_a_mqa``) and metadata keys (``ARCH.expert_count``...) onto them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from autotune.model.facts import (
    DEFAULT_KV_DTYPE_BYTES,
    AttentionFacts,
    FusedProjection,
    InspectError,
    ModelFacts,
    MoEFacts,
    Shard,
    TensorInfo,
    attention_facts,
    count_tensors,
    group_fused,
    opt_int,
)

#: one part of a split GGUF model: ``NAME-00002-of-00005.gguf``
SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_GGUF_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


#: the first four bytes of every GGUF file
GGUF_MAGIC = b"GGUF"


def has_gguf_magic(path: str | Path) -> bool:
    """Whether the file at ``path`` starts with :data:`GGUF_MAGIC` (False when unreadable)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def gguf_model_file(path: str | Path) -> Path | None:
    """The GGUF file a model path names, or None when it names no GGUF model: a ``.gguf`` file
    or any file that starts with the GGUF magic (a renamed or extensionless download), or a
    folder without ``config.json`` that holds ``.gguf`` files (its first one)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p if p.suffix == ".gguf" or has_gguf_magic(p) else None
    if p.is_dir() and not (p / "config.json").is_file():
        found = sorted(p.glob("*.gguf"))
        return found[0] if found else None
    return None


def gguf_parts(path: str | Path) -> list[Path]:
    """All files of a (possibly split) GGUF model, in part order.

    ``model-00002-of-00005.gguf`` (any part) resolves to parts 1..5, which must all exist: a
    missing part would silently undercount the model, so it is an error instead.
    """
    p = Path(path)
    m = SPLIT_RE.match(p.name)
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


def inspect_gguf(path: Path) -> ModelFacts:
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

    tensors: list[TensorInfo] = []
    for t in raw:
        m = _GGUF_LAYER_RE.match(t.name)
        layer = int(m.group(1)) if m else None
        tensors.append(
            TensorInfo(
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
    attention = attention_facts(
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
        indexer_key_length=opt_int(kv("attention.indexer.key_length")),
        indexer_top_k=opt_int(kv("attention.indexer.top_k")),
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
    counts = count_tensors(tensors, active_fraction=frac, vocab=vocab)
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


def _ftype_name(file_type: Any) -> str | None:
    if file_type is None:
        return None
    try:
        from gguf import LlamaFileType

        return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return f"file_type={file_type}"


def _gguf_fused(
    tensors: list[TensorInfo], *, attention: AttentionFacts, n_kv_stored: int
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
    return group_fused(hits)
