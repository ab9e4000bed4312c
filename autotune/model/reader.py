"""``autotune inspect``'s entry points: which reader a path needs, and the facts as table rows."""

from __future__ import annotations

from pathlib import Path

from autotune.model.facts import InspectError, ModelFacts
from autotune.model.gguf_reader import SPLIT_RE, inspect_gguf
from autotune.model.hf_reader import inspect_hf

__all__ = ["facts_as_rows", "inspect_model"]


def inspect_model(path: str | Path) -> ModelFacts:
    """Facts about the model at ``path``: a ``.gguf`` file (any part of a split one), a folder
    holding one GGUF model, or a Hugging Face folder (``config.json`` + safetensors)."""
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix == ".gguf":
            return inspect_gguf(p)
        if p.name == "config.json":
            return inspect_hf(p.parent)
        raise InspectError("not a .gguf file or a model folder", file=str(p))
    if p.is_dir():
        if (p / "config.json").is_file() and (
            (p / "model.safetensors.index.json").is_file() or any(p.glob("*.safetensors"))
        ):
            return inspect_hf(p)
        ggufs = sorted(p.glob("*.gguf"))
        stems = {
            (SPLIT_RE.match(g.name)["stem"] if SPLIT_RE.match(g.name) else g.stem) for g in ggufs
        }
        if len(stems) == 1:
            return inspect_gguf(ggufs[0])
        if len(stems) > 1:
            raise InspectError(
                f"folder holds several GGUF models ({', '.join(sorted(stems))}); name one file",
                file=str(p),
            )
        if (p / "config.json").is_file():
            return inspect_hf(p)  # raises the "no safetensors" error
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


def facts_as_rows(facts: ModelFacts, *, load_problem: str | None = None) -> list[tuple[str, str]]:
    """(label, value) pairs in display order, for a two-column table in the CLI.

    ``load_problem``: why the engine that fuses separate projections at load (vLLM) cannot
    load this file here; the fused rows then say the tensors stay separate on disk instead of
    promising a fusion that will not happen, and a note gives the reason."""
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
        if f.on_disk:
            where = "on disk"
        elif load_problem is None:
            where = "fused by vLLM at load"
        else:
            where = "separate on disk; this vLLM cannot load the file, see the note"
        rows.append((f"fused {f.kind}", f"{f.tensor} x{f.layers} [{shards}] ({where})"))
    rows.append(("tied embeddings", "yes" if facts.tied_embeddings else "no"))
    for n in facts.notes:
        rows.append(("note", n))
    if load_problem is not None:
        rows.append(("note", load_problem))
    return rows
