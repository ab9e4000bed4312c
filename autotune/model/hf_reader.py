"""Hugging Face model folders: facts from ``config.json`` and the safetensors headers.

A safetensors file is read as its 8-byte little-endian header length followed by the JSON header
(dtype, shape, byte offsets of every tensor); tensor data is never read. The counting rules are
:mod:`autotune.model.facts`'; this module maps transformers' names (``model.layers.N.``,
``mlp.experts.E.``, ``q_proj``/``k_proj``/``v_proj``) and config keys onto them.
"""

from __future__ import annotations

import json
import math
import re
import struct
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

_HF_LAYER_RE = re.compile(r"\.(?:layers|h|blocks|layer)\.(\d+)\.")
_TORCH_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


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


def inspect_hf(folder: Path) -> ModelFacts:
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

    tensors: list[TensorInfo] = []
    for f in files:
        for name, info in read_safetensors_header(f).items():
            shape = tuple(int(x) for x in info["shape"])
            b, e = info["data_offsets"]
            m = _HF_LAYER_RE.search(name)
            layer = int(m.group(1)) if m else None
            tensors.append(
                TensorInfo(
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
        attention = attention_facts(
            num_heads=n_head,
            num_kv_heads=n_head,
            head_dim=nope + rope,
            v_head_dim=v_dim,
            kv_lora_rank=int(kv_lora),
            q_lora_rank=opt_int(_cfg_get(cfg, "q_lora_rank")),
            qk_rope_head_dim=rope,
            qk_nope_head_dim=nope,
            mla=True,
            kv_dtype_bytes=kv_bytes,
            indexer_key_length=opt_int(_cfg_get(cfg, "index_head_dim")),
            indexer_top_k=opt_int(_cfg_get(cfg, "index_topk")),
        )
    else:
        head_dim = int(_cfg_get(cfg, "head_dim", default=0) or (hidden // n_head if n_head else 0))
        attention = attention_facts(
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
    counts = count_tensors(tensors, active_fraction=n_used / n_exp if n_exp else 0.0, vocab=vocab)
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


def _hf_fused(tensors: list[TensorInfo], a: AttentionFacts) -> tuple[FusedProjection, ...]:
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
    return group_fused(hits)
