"""Small but structurally real GGUF files for tests, written with the ``gguf`` package's writer.

Why: ``autotune inspect`` must be right about the GGUF files people actually deploy (MLA, MoE,
K-quants, fused projections, split files), and a 400 GB GLM-5 download is not a test fixture. The
files written here carry the same metadata keys, tensor names, quantization block layouts and
split-file convention as llama.cpp's converter output, with tiny dimensions:

* :func:`write_mla_moe_gguf` - a ``deepseek2``-architecture model (the GGUF family GLM-5's MLA
  belongs to): MLA tensors (``attn_q_a``, ``attn_q_b``, the fused ``attn_kv_a_mqa``, ``attn_kv_b``),
  a leading dense layer, MoE layers with routed (``ffn_*_exps``) and shared (``ffn_*_shexp``)
  experts, an optional NextN/MTP layer, and a gpt2-style tokenizer. Types: F32 norms, F16, Q8_0
  and Q4_0 quantized by ``gguf.quants``, and Q4_K (``gguf.quants`` cannot quantize K-quants, so the
  Q4_K tensors are well-formed 144-byte super-blocks with random scales and nibbles: the layout is
  real, the numbers mean nothing). ``split_max_tensors`` writes ``-0000i-of-0000N.gguf`` parts.
* :func:`write_llama_gguf` - a GQA ``llama`` model with a fused ``attn_qkv`` tensor.
* :func:`hf_llama_to_gguf` - converts a Llama Hugging Face folder (``config.json``, safetensors,
  ``tokenizer.json``) such as the demo model in ``models/demo/`` into a llama GGUF the way
  llama.cpp's converter does (names mapped, q/k rows permuted for ggml's RoPE, Q8_0 where the row
  length allows, F16 otherwise, F32 norms).

None of these are meant to produce a model with useful outputs except the HF conversion.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "hf_llama_to_gguf",
    "q4_k_blocks",
    "write_llama_gguf",
    "write_mla_moe_gguf",
]

Q4_K_BLOCK = 256  # elements per Q4_K super-block
Q4_K_BYTES = 144  # 2 (d) + 2 (dmin) + 12 (6-bit scales/mins) + 128 (4-bit quants)


def q4_k_blocks(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Raw Q4_K bytes for a tensor of numpy ``shape`` (last axis a multiple of 256).

    Each super-block is laid out as ggml's ``block_q4_K``: fp16 ``d``, fp16 ``dmin``, 12 bytes of
    packed 6-bit scales and mins, 128 bytes of 4-bit quants. Values are random, so the tensor
    dequantizes to noise; only the byte layout (what inspection and loaders rely on) is real.
    """
    if shape[-1] % Q4_K_BLOCK:
        raise ValueError(f"Q4_K needs the last axis to be a multiple of 256, got {shape}")
    n_blocks = math.prod(shape) // Q4_K_BLOCK
    blocks = np.empty((n_blocks, Q4_K_BYTES), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    blocks[:, 2:4] = np.frombuffer(np.float16(0.005).tobytes(), dtype=np.uint8)
    blocks[:, 4:16] = rng.integers(0, 64, size=(n_blocks, 12), dtype=np.uint8)
    blocks[:, 16:] = rng.integers(0, 256, size=(n_blocks, 128), dtype=np.uint8)
    return blocks.reshape(*shape[:-1], shape[-1] // Q4_K_BLOCK * Q4_K_BYTES)


def _add(
    writer: Any, name: str, shape: tuple[int, ...], qtype: str, rng: np.random.Generator
) -> None:
    """Add tensor ``name`` of numpy ``shape`` (ggml order reversed) stored as ``qtype``."""
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    if qtype == "F32":
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))
    elif qtype == "F16":
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float16))
    elif qtype == "Q4_K":
        writer.add_tensor(name, q4_k_blocks(shape, rng), raw_dtype=T.Q4_K)
    else:
        t = T[qtype]
        data = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        writer.add_tensor(name, quants.quantize(data, t), raw_dtype=t)


def _add_tokenizer(writer: Any, vocab: int) -> None:
    """A gpt2-style (byte-level BPE) vocabulary: BOS, EOS, then single characters and pairs."""
    from gguf import TokenType

    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ċ", "0", "1", "2", "3"]
    tokens = ["<s>", "</s>"] + chars
    while len(tokens) < vocab:
        tokens.append("Ġ" + chars[len(tokens) % len(chars)] + str(len(tokens)))
    tokens = tokens[:vocab]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [TokenType.CONTROL, TokenType.CONTROL] + [TokenType.NORMAL] * (vocab - 2)
    )
    writer.add_token_merges(["Ġ a", "Ġ b"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _written(path: Path, split_max_tensors: int) -> list[Path]:
    if not split_max_tensors:
        return [path]
    parts = sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf"))
    return parts or [path]


def write_mla_moe_gguf(
    path: str | Path,
    *,
    n_layers: int = 3,
    leading_dense: int = 1,
    hidden: int = 256,
    n_head: int = 4,
    q_lora_rank: int = 64,
    kv_lora_rank: int = 64,
    rope_dim: int = 32,
    nope_dim: int = 96,
    v_dim: int = 64,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_shared: int = 1,
    expert_ff: int = 64,
    dense_ff: int = 128,
    vocab: int = 64,
    nextn_layers: int = 0,
    split_max_tensors: int = 0,
    seed: int = 0,
) -> list[Path]:
    """Write a DeepSeek-V2-style MLA + MoE GGUF; return the written file(s) in part order.

    ``hidden`` must be a multiple of 256 (Q4_K rows), the other widths multiples of 32 (Q8_0 and
    Q4_0 rows). Block ``i < leading_dense`` has a dense FFN, the others are MoE. With
    ``nextn_layers`` the GGUF ``block_count`` includes extra NextN (MTP) blocks after the main
    ones, as llama.cpp writes GLM-4.5/GLM-5. Storage types, chosen to exercise every kind of
    block: token_embd/output/attn_q_a/attn_kv_a_mqa/ffn_down*/shexp Q8_0, attn_q_b Q4_0, attn_kv_b
    and attn_output F16, ffn_gate/up (dense and routed experts) Q4_K, norms and router F32.
    """
    import gguf

    rng = np.random.default_rng(seed)
    path = Path(path)
    arch = "deepseek2"
    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    total_blocks = n_layers + nextn_layers
    w.add_name("tiny-mla-moe")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(total_blocks)
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(dense_ff)
    w.add_head_count(n_head)
    # llama.cpp's absorbed-MLA layout: one "KV head" whose key is the latent + rope key
    w.add_head_count_kv(1)
    w.add_key_length(kv_lora_rank + rope_dim)
    w.add_value_length(kv_lora_rank)
    w.add_key_length_mla(nope_dim + rope_dim)
    w.add_value_length_mla(v_dim)
    w.add_q_lora_rank(q_lora_rank)
    w.add_kv_lora_rank(kv_lora_rank)
    w.add_rope_dimension_count(rope_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_leading_dense_block_count(leading_dense)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    w.add_expert_shared_count(n_shared)
    w.add_expert_feed_forward_length(expert_ff)
    w.add_vocab_size(vocab)
    if nextn_layers:
        w.add_nextn_predict_layers(nextn_layers)
    _add_tokenizer(w, vocab)

    _add(w, "token_embd.weight", (vocab, hidden), "Q8_0", rng)
    for i in range(total_blocks):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", (hidden,), "F32", rng)
        _add(w, p + "attn_q_a.weight", (q_lora_rank, hidden), "Q8_0", rng)
        _add(w, p + "attn_q_a_norm.weight", (q_lora_rank,), "F32", rng)
        _add(w, p + "attn_q_b.weight", (n_head * (nope_dim + rope_dim), q_lora_rank), "Q4_0", rng)
        _add(w, p + "attn_kv_a_mqa.weight", (kv_lora_rank + rope_dim, hidden), "Q8_0", rng)
        _add(w, p + "attn_kv_a_norm.weight", (kv_lora_rank,), "F32", rng)
        _add(w, p + "attn_kv_b.weight", (n_head * (nope_dim + v_dim), kv_lora_rank), "F16", rng)
        _add(w, p + "attn_output.weight", (hidden, n_head * v_dim), "F16", rng)
        _add(w, p + "ffn_norm.weight", (hidden,), "F32", rng)
        if i < leading_dense:
            _add(w, p + "ffn_gate.weight", (dense_ff, hidden), "Q4_K", rng)
            _add(w, p + "ffn_up.weight", (dense_ff, hidden), "Q4_K", rng)
            _add(w, p + "ffn_down.weight", (hidden, dense_ff), "Q8_0", rng)
        else:
            _add(w, p + "ffn_gate_inp.weight", (n_expert, hidden), "F32", rng)
            _add(w, p + "exp_probs_b.bias", (n_expert,), "F32", rng)
            _add(w, p + "ffn_gate_exps.weight", (n_expert, expert_ff, hidden), "Q4_K", rng)
            _add(w, p + "ffn_up_exps.weight", (n_expert, expert_ff, hidden), "Q4_K", rng)
            _add(w, p + "ffn_down_exps.weight", (n_expert, hidden, expert_ff), "Q8_0", rng)
            sh = expert_ff * n_shared
            _add(w, p + "ffn_gate_shexp.weight", (sh, hidden), "Q8_0", rng)
            _add(w, p + "ffn_up_shexp.weight", (sh, hidden), "Q8_0", rng)
            _add(w, p + "ffn_down_shexp.weight", (hidden, sh), "Q8_0", rng)
        if i >= n_layers:  # NextN/MTP block extras
            _add(w, p + "nextn.eh_proj.weight", (hidden, 2 * hidden), "F16", rng)
            _add(w, p + "nextn.enorm.weight", (hidden,), "F32", rng)
            _add(w, p + "nextn.hnorm.weight", (hidden,), "F32", rng)
    _add(w, "output_norm.weight", (hidden,), "F32", rng)
    _add(w, "output.weight", (vocab, hidden), "Q8_0", rng)
    _finish(w)
    return _written(path, split_max_tensors)


def write_llama_gguf(
    path: str | Path,
    *,
    n_layers: int = 2,
    hidden: int = 128,
    n_head: int = 4,
    n_kv_head: int = 2,
    ff: int = 256,
    vocab: int = 64,
    tied: bool = True,
    seed: int = 0,
) -> Path:
    """Write a GQA llama GGUF whose attention projection is one fused ``attn_qkv`` tensor.

    Rows of ``attn_qkv`` are ``[q (n_head*head_dim) | k (n_kv*head_dim) | v (n_kv*head_dim)]``.
    With ``tied`` there is no ``output.weight`` and the embedding table doubles as the head.
    """
    import gguf

    rng = np.random.default_rng(seed)
    path = Path(path)
    head_dim = hidden // n_head
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama-fused-qkv")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_block_count(n_layers)
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv_head)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    _add_tokenizer(w, vocab)
    _add(w, "token_embd.weight", (vocab, hidden), "Q8_0", rng)
    for i in range(n_layers):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", (hidden,), "F32", rng)
        _add(w, p + "attn_qkv.weight", ((n_head + 2 * n_kv_head) * head_dim, hidden), "Q8_0", rng)
        _add(w, p + "attn_output.weight", (hidden, n_head * head_dim), "Q8_0", rng)
        _add(w, p + "ffn_norm.weight", (hidden,), "F32", rng)
        _add(w, p + "ffn_gate.weight", (ff, hidden), "Q4_0", rng)
        _add(w, p + "ffn_up.weight", (ff, hidden), "Q4_0", rng)
        _add(w, p + "ffn_down.weight", (hidden, ff), "Q8_0", rng)
    _add(w, "output_norm.weight", (hidden,), "F32", rng)
    if not tied:
        _add(w, "output.weight", (vocab, hidden), "Q8_0", rng)
    _finish(w)
    return path


# ---------------------------------------------------------------------------------------------
# Hugging Face Llama -> GGUF

_NP_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "I8": np.int8,
    "U8": np.uint8,
}


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read every tensor of a safetensors file as float32/native numpy, BF16 included.

    Parsed by hand (8-byte header length, JSON header, raw little-endian data) so that BF16
    checkpoints work without torch.
    """
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        buf = raw[base + b : base + e]
        shape = tuple(info["shape"])
        if info["dtype"] == "BF16":
            u16 = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32)
        else:
            arr = np.frombuffer(buf, dtype=np.dtype(_NP_DTYPES[info["dtype"]]).newbyteorder("<"))
        out[name] = arr.reshape(shape)
    return out


def _permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter reorders q/k rows from HF's rotate-half RoPE layout to ggml's
    interleaved one; vLLM's GGUF loader undoes exactly this for llama, so it must be done."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_llama_to_gguf(src: str | Path, dst: str | Path, *, qtype: str = "Q8_0") -> Path:
    """Convert a Llama HF folder (e.g. ``models/demo``) into a single-file llama GGUF.

    2-D weights whose row length is a multiple of the block size are stored as ``qtype`` (Q8_0 or
    Q4_0), other 2-D weights as F16, 1-D tensors (norms) as F32. The tokenizer comes from
    ``tokenizer.json`` (a byte-level BPE: vocab + merges); special tokens are typed CONTROL.
    """
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    src, dst = Path(src), Path(dst)
    cfg = json.loads((src / "config.json").read_text())
    n_head = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_head)
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // n_head)
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(_load_safetensors(f))

    w = gguf.GGUFWriter(dst, "llama")
    w.add_name(cfg.get("_name_or_path") or src.name)
    w.add_file_type(
        gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "Q8_0" else gguf.LlamaFileType.MOSTLY_Q4_0
    )
    w.add_block_count(int(cfg["num_hidden_layers"]))
    w.add_context_length(int(cfg.get("max_position_embeddings", 2048)))
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    w.add_rope_freq_base(float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(int(cfg["vocab_size"]))

    tok_path = src / "tokenizer.json"
    if tok_path.is_file():
        tok = json.loads(tok_path.read_text())
        vocab_map: dict[str, int] = dict(tok["model"]["vocab"])
        for added in tok.get("added_tokens", []):
            vocab_map[added["content"]] = added["id"]
        size = max(int(cfg["vocab_size"]), max(vocab_map.values()) + 1)
        tokens = [f"[PAD{i}]" for i in range(size)]
        types = [gguf.TokenType.UNUSED] * size
        for text, idx in vocab_map.items():
            tokens[idx] = text
            types[idx] = gguf.TokenType.NORMAL
        for added in tok.get("added_tokens", []):
            if added.get("special"):
                types[added["id"]] = gguf.TokenType.CONTROL
        merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
        w.add_tokenizer_model("gpt2")
        # a ByteLevel pre-tokenizer with GPT-2's regex: llama.cpp's "gpt-2" splits as it does
        # ("default" cut "17 18" into "1" "7" " " "1" "8", and the model saw text it never had)
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        if merges:
            w.add_token_merges(merges)
        if cfg.get("bos_token_id") is not None:
            w.add_bos_token_id(int(cfg["bos_token_id"]))
            # every encoding starts with BOS, as transformers' tokenizer does for this model
            w.add_add_bos_token(True)
        if cfg.get("eos_token_id") is not None:
            eos = cfg["eos_token_id"]
            w.add_eos_token_id(int(eos[0] if isinstance(eos, list) else eos))

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    block = gguf.GGML_QUANT_SIZES[T[qtype]][0]
    for name, arr in tensors.items():
        if name in names:
            out = names[name]
        else:
            parts = name.split(".")
            if len(parts) < 4 or parts[:2] != ["model", "layers"]:
                continue  # rotary caches and other non-weights
            suffix = ".".join(parts[3:])
            if suffix not in per_layer:
                continue
            out = f"blk.{parts[2]}.{per_layer[suffix]}"
        data = np.ascontiguousarray(arr, dtype=np.float32)
        if out.endswith("attn_q.weight"):
            data = _permute_qk(data, n_head)
        elif out.endswith("attn_k.weight"):
            data = _permute_qk(data, n_kv)
        if data.ndim == 1:
            w.add_tensor(out, data)
        elif data.shape[-1] % block == 0:
            w.add_tensor(out, quants.quantize(data, T[qtype]), raw_dtype=T[qtype])
        else:
            w.add_tensor(out, data.astype(np.float16))
    _finish(w)
    return dst
