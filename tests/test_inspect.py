"""Tests for autotune.model (GGUF and HF model facts, the decode roofline and its CLI).

Models are written into tmp_path by autotune.testing.make_gguf and safetensors.numpy, so every
expected number is derived here from the shapes the test chose, not read back from the code under
test.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from autotune.model.facts import InspectError
from autotune.model.hf_reader import read_safetensors_header
from autotune.model.reader import facts_as_rows, inspect_model
from autotune.model.roofline import (
    DEVICES,
    DecodeBytes,
    decode_roofline,
    fraction_of_roofline,
    get_device,
)
from autotune.model.roofline_cli import main
from autotune.testing.make_gguf import write_llama_gguf, write_mla_moe_gguf


def _block_bytes(qtype: str, params: int) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    assert params % block == 0
    return params // block * size


# ---------------------------------------------------------------------------------------------
# GGUF: MLA + MoE


@pytest.fixture(scope="module")
def mla_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("mla")
    (path,) = write_mla_moe_gguf(d / "tiny.gguf", nextn_layers=1)
    return path


def test_mla_moe_gguf_structure(mla_path):
    f = inspect_model(mla_path)
    assert f.format == "gguf"
    assert f.architecture == "deepseek2"
    assert f.num_layers == 3 and f.mtp_layers == 1
    assert f.hidden_size == 256 and f.vocab_size == 64
    a = f.attention
    assert a.kind == "MLA"
    assert (a.num_heads, a.kv_lora_rank, a.q_lora_rank, a.qk_rope_head_dim) == (4, 64, 64, 32)
    assert (a.head_dim, a.qk_nope_head_dim, a.v_head_dim) == (128, 96, 64)
    # MLA cache: latent + rope key, 2 bytes each
    assert a.kv_bytes_per_token_per_layer == (64 + 32) * 2 == 192
    assert f.kv_bytes_per_token == 192 * 3
    m = f.moe
    assert m is not None
    assert (m.experts_total, m.experts_active, m.shared_experts, m.moe_layers) == (8, 2, 1, 2)
    assert m.active_fraction == 0.25
    assert not f.tied_embeddings
    assert any("MTP" in n for n in f.notes)


def test_mla_moe_gguf_quant_bytes_match_block_sizes(mla_path):
    f = inspect_model(mla_path)
    q = {s.qtype: s for s in f.quant_types}
    assert set(q) == {"F32", "F16", "Q8_0", "Q4_0", "Q4_K"}
    for s in f.quant_types:
        if s.qtype in ("F32", "F16"):
            assert s.bytes == s.params * (4 if s.qtype == "F32" else 2)
        else:
            assert s.bytes == _block_bytes(s.qtype, s.params)
    # Q4_K: dense ffn_gate/up in block 0 (2 x 128x256) and routed gate/up experts in blocks 1-3
    # (block 3 is the NextN block; 3 blocks x 2 tensors x 8 experts x 64 x 256)
    q4k_params = 2 * 128 * 256 + 3 * 2 * 8 * 64 * 256
    assert q["Q4_K"].params == q4k_params
    assert q["Q4_K"].tensors == 2 + 3 * 2
    assert q["Q4_K"].bytes == q4k_params // 256 * 144 == 479_232
    assert q["Q4_K"].bits_per_weight == pytest.approx(4.5)
    assert q["Q8_0"].bits_per_weight == pytest.approx(8.5)
    assert f.total_bytes == sum(s.bytes for s in f.quant_types)
    assert f.total_params == sum(s.params for s in f.quant_types)


def test_mla_moe_gguf_active_bytes(mla_path):
    f = inspect_model(mla_path)
    # recompute independently from the raw tensor list
    reader = GGUFReader(str(mla_path))
    dense = routed = embd = 0
    for t in reader.tensors:
        if t.name.startswith("blk.3."):  # NextN block: not run by plain decode
            continue
        if t.name == "token_embd.weight":
            embd = int(t.n_bytes)
        elif "_exps." in t.name:
            routed += int(t.n_bytes)
        else:
            dense += int(t.n_bytes)
    expected = dense + round(routed * 2 / 8 + embd / 64)
    assert f.active_bytes_per_token == expected
    assert f.moe.routed_expert_bytes == routed
    assert f.active_bytes_per_token < f.total_bytes
    assert f.total_bytes == sum(int(t.n_bytes) for t in reader.tensors)


def test_mla_fused_projections(mla_path):
    f = inspect_model(mla_path)
    fused = {p.kind: p for p in f.fused_projections}
    kv = fused["kv_a_mqa (MLA latent + rope key)"]
    assert kv.on_disk and kv.layers == 3  # NextN block excluded
    assert kv.tensor == "blk.*.attn_kv_a_mqa.weight"
    assert [(s.name, s.rows) for s in kv.shards] == [("kv_latent", 64), ("k_rope", 32)]
    assert kv.shape == (256, 96)
    qa = fused["q_a + kv_a (load time)"]
    assert not qa.on_disk
    assert [(s.name, s.rows) for s in qa.shards] == [("q_a", 64), ("kv_a_mqa", 96)]


def test_split_gguf_sums_all_parts(tmp_path, mla_path):
    parts = write_mla_moe_gguf(tmp_path / "split.gguf", nextn_layers=1, split_max_tensors=25)
    assert [p.name for p in parts] == [f"split-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    whole = inspect_model(mla_path)
    for part in parts:  # any part names the whole model
        f = inspect_model(part)
        assert f.files == tuple(str(p) for p in parts)
        assert f.tensor_count == whole.tensor_count
        assert f.total_bytes == whole.total_bytes
        assert f.active_bytes_per_token == whole.active_bytes_per_token
        assert f.quant_types == whole.quant_types
    assert inspect_model(tmp_path).files == tuple(str(p) for p in parts)  # folder of one model
    parts[1].unlink()
    with pytest.raises(InspectError, match="missing part"):
        inspect_model(parts[0])


# ---------------------------------------------------------------------------------------------
# GGUF: llama with fused qkv


def test_llama_fused_qkv_gguf(tmp_path):
    f = inspect_model(write_llama_gguf(tmp_path / "l.gguf", hidden=128, n_head=4, n_kv_head=2))
    assert f.architecture == "llama"
    a = f.attention
    assert (a.kind, a.num_heads, a.num_kv_heads, a.head_dim) == ("GQA", 4, 2, 32)
    assert a.kv_bytes_per_token_per_layer == 2 * 2 * 32 * 2
    assert f.moe is None
    (qkv,) = f.fused_projections
    assert qkv.kind == "qkv" and qkv.layers == 2 and qkv.on_disk
    assert [(s.name, s.rows) for s in qkv.shards] == [("q", 128), ("k", 64), ("v", 64)]
    # tied embeddings: the table is the head, read whole; nothing else is skipped
    assert f.tied_embeddings
    assert f.active_bytes_per_token == f.total_bytes
    assert f.active_params_per_token == f.total_params


def test_inspect_errors(tmp_path):
    with pytest.raises(InspectError):
        inspect_model(tmp_path / "nope.gguf")
    with pytest.raises(InspectError):
        inspect_model(tmp_path)  # empty folder
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(InspectError):
        inspect_model(bad)


# ---------------------------------------------------------------------------------------------
# Hugging Face folders


def _save(path, tensors):
    from safetensors.numpy import save_file

    save_file({k: np.zeros(s, dtype=np.float16) for k, s in tensors.items()}, str(path))


def test_hf_llama_sharded(tmp_path):
    hidden, heads, kv, hd, ff, vocab, layers = 64, 4, 2, 16, 96, 100, 2
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": layers,
        "intermediate_size": ff,
        "vocab_size": vocab,
        "torch_dtype": "float16",
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shard1 = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    shard2 = {"lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        layer = {
            p + "self_attn.q_proj.weight": (heads * hd, hidden),
            p + "self_attn.k_proj.weight": (kv * hd, hidden),
            p + "self_attn.v_proj.weight": (kv * hd, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * hd),
            p + "mlp.gate_up_proj.weight": (2 * ff, hidden),
            p + "mlp.down_proj.weight": (hidden, ff),
            p + "input_layernorm.weight": (hidden,),
        }
        (shard1 if i == 0 else shard2).update(layer)
    _save(tmp_path / "model-00001-of-00002.safetensors", shard1)
    _save(tmp_path / "model-00002-of-00002.safetensors", shard2)
    weight_map = {k: "model-00001-of-00002.safetensors" for k in shard1}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in shard2}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    f = inspect_model(tmp_path)
    assert f.format == "hf" and len(f.files) == 2
    assert f.architecture == "LlamaForCausalLM"
    assert (f.num_layers, f.hidden_size, f.vocab_size) == (layers, hidden, vocab)
    assert f.attention.kind == "GQA"
    assert f.attention.kv_bytes_per_token_per_layer == 2 * kv * hd * 2
    total_params = sum(math.prod(s) for s in (shard1 | shard2).values())
    assert f.total_params == total_params
    assert f.total_bytes == 2 * total_params
    assert [q.qtype for q in f.quant_types] == ["F16"]
    embd_bytes = vocab * hidden * 2
    assert f.active_bytes_per_token == f.total_bytes - embd_bytes + embd_bytes // vocab
    gate_up, qkv = f.fused_projections
    assert qkv.kind == "qkv (load time)" and not qkv.on_disk
    assert [(s.name, s.rows) for s in qkv.shards] == [
        ("q", heads * hd),
        ("k", kv * hd),
        ("v", kv * hd),
    ]
    assert gate_up.kind == "gate_up" and gate_up.layers == 2
    assert gate_up.tensor == "model.layers.*.mlp.gate_up_proj.weight"
    assert [(s.name, s.rows) for s in gate_up.shards] == [("gate", ff), ("up", ff)]
    header = read_safetensors_header(tmp_path / "model-00002-of-00002.safetensors")
    assert header["lm_head.weight"]["shape"] == [vocab, hidden]


def test_hf_mla_moe_with_mtp_layer(tmp_path):
    h, layers, n_exp, eff, vocab = 32, 2, 4, 16, 50
    qr, kvr, rope, nope, vd, heads = 24, 16, 8, 16, 16, 2
    cfg = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "hidden_size": h,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "vocab_size": vocab,
        "q_lora_rank": qr,
        "kv_lora_rank": kvr,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": nope,
        "v_head_dim": vd,
        "n_routed_experts": n_exp,
        "num_experts_per_tok": 1,
        "n_shared_experts": 1,
        "moe_intermediate_size": eff,
        "torch_dtype": "bfloat16",
        "index_head_dim": 8,
        "index_topk": 4,
        "num_nextn_predict_layers": 1,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    t = {"model.embed_tokens.weight": (vocab, h), "lm_head.weight": (vocab, h)}
    for i in range(layers + 1):  # layer 2 is the MTP layer
        p = f"model.layers.{i}."
        t |= {
            p + "self_attn.q_a_proj.weight": (qr, h),
            p + "self_attn.q_b_proj.weight": (heads * (nope + rope), qr),
            p + "self_attn.kv_a_proj_with_mqa.weight": (kvr + rope, h),
            p + "self_attn.kv_b_proj.weight": (heads * (nope + vd), kvr),
            p + "self_attn.o_proj.weight": (h, heads * vd),
            p + "mlp.gate.weight": (n_exp, h),
            p + "mlp.shared_experts.down_proj.weight": (h, eff),
        }
        for e in range(n_exp):
            t[p + f"mlp.experts.{e}.down_proj.weight"] = (h, eff)
    _save(tmp_path / "model.safetensors", t)

    f = inspect_model(tmp_path / "config.json")
    a = f.attention
    assert a.kind == "MLA"
    assert a.kv_bytes_per_token_per_layer == (kvr + rope) * 2  # bf16 per config
    assert (a.head_dim, a.v_head_dim, a.indexer_key_length, a.indexer_top_k) == (24, 16, 8, 4)
    assert f.mtp_layers == 1
    m = f.moe
    assert (m.experts_total, m.experts_active, m.shared_experts, m.moe_layers) == (4, 1, 1, 2)
    expert = h * eff * 2
    assert m.routed_expert_bytes == layers * n_exp * expert
    p = {k: math.prod(s) * 2 for k, s in t.items()}
    dense = sum(
        v
        for k, v in p.items()
        if not k.startswith("model.layers.2.") and ".experts." not in k and "embed_tokens" not in k
    )
    assert f.active_bytes_per_token == dense + layers * expert + round(vocab * h * 2 / vocab)
    kinds = {fp.kind: fp for fp in f.fused_projections}
    assert [(s.name, s.rows) for s in kinds["kv_a_mqa (MLA latent + rope key)"].shards] == [
        ("kv_latent", kvr),
        ("k_rope", rope),
    ]
    qa = kinds["q_a + kv_a (load time)"]
    assert qa.layers == layers and not qa.on_disk
    assert [(s.name, s.rows) for s in qa.shards] == [("q_a", qr), ("kv_a_mqa", kvr + rope)]


# ---------------------------------------------------------------------------------------------
# display and storage


def test_rows_and_dict_are_displayable_and_json(mla_path):
    f = inspect_model(mla_path)
    rows = facts_as_rows(f)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in rows)
    labels = dict(rows)
    assert labels["layers"] == "3 (+1 MTP)"
    assert labels["attention"].startswith("MLA")
    d = json.loads(json.dumps(f.to_dict()))
    assert d["attention"]["kind"] == "MLA"
    assert d["moe"]["active_fraction"] == 0.25
    assert d["kv_bytes_per_token"] == 576
    assert {q["qtype"] for q in d["quant_types"]} == {"F32", "F16", "Q8_0", "Q4_0", "Q4_K"}


# ---------------------------------------------------------------------------------------------
# roofline


def test_roofline_hand_computed():
    db = DecodeBytes.from_params(40e9, 4.8, kv_bytes_per_context_token=89_856)
    assert db.weight_bytes_per_token == 24e9
    r = decode_roofline(db, device="rtx-pro-6000", tp=8)
    # each rank reads 24e9 / 8 = 3e9 bytes at 1792e9 B/s
    assert r.weight_bytes_per_rank == 3e9
    assert r.tokens_per_s == pytest.approx(1792 / 3)  # 597.33
    assert r.ms_per_token == pytest.approx(3e9 / 1792e9 * 1e3)
    assert fraction_of_roofline(57, r) == pytest.approx(57 / (1792 / 3))
    # MLA latent is read whole by every rank: 1000 tokens x 89,856 B on each of the 8 ranks
    r = decode_roofline(db, device="rtx-pro-6000", tp=8, context_tokens=1000, efficiency=0.5)
    assert r.kv_bytes_per_rank == 89_856_000
    assert r.tokens_per_s == pytest.approx(0.5 * 1792e9 / (3e9 + 89_856_000))


def test_roofline_gqa_kv_split_and_user_bandwidth(tmp_path):
    db = DecodeBytes("x", 8e9, kv_bytes_per_context_token=1000, kv_split_ways=2)
    r = decode_roofline(db, bandwidth_gbs=1000, tp=4, context_tokens=2000)
    # 2 KV heads over 4 ranks: each rank holds one head, half the cache
    assert r.kv_bytes_per_rank == 2000 * 1000 / 2
    assert r.tokens_per_s == pytest.approx(1000e9 / (2e9 + 1e6))
    assert r.device == "1000 GB/s device"
    f = inspect_model(write_llama_gguf(tmp_path / "l.gguf"))
    r = decode_roofline(f, device="H200")
    assert r.tokens_per_s == pytest.approx(4800e9 / f.active_bytes_per_token)
    assert json.loads(json.dumps(r.to_dict()))["tp"] == 1


def test_device_table_and_errors():
    assert {k: d.bandwidth_gbs for k, d in DEVICES.items()} == {
        "h200": 4800,
        "h100-sxm": 3350,
        "h100-pcie": 2000,
        "a100-80gb-sxm": 2039,
        "rtx-pro-6000": 1792,
        "l40s": 864,
        "rtx-4090": 1008,
        "mi300x": 5300,
    }
    assert all(d.source for d in DEVICES.values())
    assert get_device("RTX PRO 6000 Blackwell").key == "rtx-pro-6000"
    db = DecodeBytes("x", 1e9)
    with pytest.raises(KeyError):
        decode_roofline(db, device="tpu-v9")
    with pytest.raises(ValueError):
        decode_roofline(db)
    with pytest.raises(ValueError):
        decode_roofline(db, device="h200", tp=0)
    with pytest.raises(ValueError):
        decode_roofline(db, device="h200", efficiency=1.5)


def test_roofline_cli(capsys, mla_path):
    assert (
        main(
            [
                "--active-params",
                "40e9",
                "--bits",
                "4.8",
                "--device",
                "rtx-pro-6000",
                "--tp",
                "8",
                "--measured",
                "57",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "597.3 tok/s" in out and "9.5% of bound" in out
    assert main([str(mla_path), "--bandwidth-gbs", "100"]) == 0
    assert "decode upper bound" in capsys.readouterr().out
    assert main(["--list-devices"]) == 0
    assert main(["--device", "h200"]) == 2


def test_hf_llama_to_gguf_conversion(tmp_path):
    from gguf import quants
    from safetensors.numpy import save_file

    from autotune.testing.make_gguf import _permute_qk, hf_llama_to_gguf

    hidden, heads, kv, ff, vocab = 64, 2, 1, 40, 8
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": ff,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "dtype": "float32",
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_theta": 10000.0},
        "bos_token_id": 0,
        "eos_token_id": 1,
    }
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    hd = hidden // heads
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "model.layers.0.input_layernorm.weight": (hidden,),
        "model.layers.0.post_attention_layernorm.weight": (hidden,),
        "model.layers.0.self_attn.q_proj.weight": (heads * hd, hidden),
        "model.layers.0.self_attn.k_proj.weight": (kv * hd, hidden),
        "model.layers.0.self_attn.v_proj.weight": (kv * hd, hidden),
        "model.layers.0.self_attn.o_proj.weight": (hidden, heads * hd),
        "model.layers.0.mlp.gate_proj.weight": (ff, hidden),
        "model.layers.0.mlp.up_proj.weight": (ff, hidden),
        "model.layers.0.mlp.down_proj.weight": (hidden, ff),  # rows of 40: not Q8_0-able
    }
    weights = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    save_file(weights, str(src / "model.safetensors"))
    tok = {
        "model": {"vocab": {"a": 2, "b": 3, "ab": 4}, "merges": [["a", "b"]]},
        "added_tokens": [
            {"id": 0, "content": "<s>", "special": True},
            {"id": 1, "content": "</s>", "special": True},
        ],
    }
    (src / "tokenizer.json").write_text(json.dumps(tok))

    out = hf_llama_to_gguf(src, tmp_path / "demo.gguf")
    f = inspect_model(out)
    assert (f.architecture, f.num_layers, f.vocab_size, f.attention.kind) == ("llama", 1, 8, "MQA")
    assert {q.qtype for q in f.quant_types} == {"Q8_0", "F16", "F32"}
    reader = GGUFReader(str(out))
    t = {x.name: x for x in reader.tensors}
    assert "output.weight" not in t and t["blk.0.ffn_down.weight"].tensor_type.name == "F16"
    q = quants.dequantize(t["blk.0.attn_q.weight"].data, t["blk.0.attn_q.weight"].tensor_type)
    expected = _permute_qk(weights["model.layers.0.self_attn.q_proj.weight"], heads)
    assert np.abs(q - expected).max() < 0.05
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert tokens[:5] == ["<s>", "</s>", "a", "b", "ab"]
