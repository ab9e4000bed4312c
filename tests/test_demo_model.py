"""The committed demo model (models/demo) loads with transformers and continues its patterns.

No server: this runs the bf16 weights with float32 compute on the CPU (a few seconds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"

# prompt -> the first three words the greedy continuation must produce
EXPECTED = {
    "one two three": ["four", "five", "six"],
    "17 18 19": ["20", "21", "22"],
    "d e f": ["g", "h", "i"],
    "red green blue red": ["green", "blue", "red"],
    "monday tuesday wednesday": ["thursday", "friday", "saturday"],
    "march april may": ["june", "july", "august"],
    "98 99 100": ["101", "102", "103"],
}


def test_demo_files_present():
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
    ):
        assert (DEMO / name).is_file(), name
    # small enough to commit
    assert (DEMO / "model.safetensors").stat().st_size < 2_000_000


def test_demo_config_is_vllm_cpu_friendly():
    cfg = json.loads((DEMO / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert head_dim >= 64  # vLLM's CPU attention rejects head_dim 16
    assert cfg["hidden_size"] == cfg["num_attention_heads"] * head_dim
    assert cfg["max_position_embeddings"] >= 512
    assert cfg["dtype"] == "bfloat16"
    tok_cfg = json.loads((DEMO / "tokenizer_config.json").read_text())
    assert tok_cfg["bos_token"] == "<s>"
    assert tok_cfg["eos_token"] == "</s>"


@pytest.fixture(scope="module")
def demo():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(DEMO))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(DEMO), dtype=torch.float32)
    model.eval()
    return tok, model


def test_demo_tokenizer_adds_bos(demo):
    tok, model = demo
    ids = tok("one two three").input_ids
    assert ids[0] == tok.bos_token_id == model.config.bos_token_id
    assert tok.eos_token_id == model.config.eos_token_id
    assert len(tok) == model.config.vocab_size


@pytest.mark.parametrize("prompt", list(EXPECTED))
def test_demo_greedy_continuation(demo, prompt):
    import torch

    tok, model = demo
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert text.startswith(" "), repr(text)
    assert text.split()[:3] == EXPECTED[prompt], repr(text)
