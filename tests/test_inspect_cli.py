"""`autotune inspect` on the demo folder and on the demo model converted to GGUF (real GGUF
bytes written by the gguf package), and the GLM-5 spec's roofline worked example."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.model.roofline import roofline_from_spec
from autotune.spec.load import load_spec
from autotune.testing.make_gguf import hf_llama_to_gguf
from tests.builders import DEMO_MODEL, ROOT


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_inspect_demo_folder_with_roofline():
    out = invoke("inspect", str(DEMO_MODEL), "--bandwidth-gbs", "20", "--measured", "800")
    for fact in (
        "LlamaForCausalLM",
        "layers",
        "2 heads, 1 KV heads, head_dim 64",
        "BF16",
        "qkv_proj",
        "decode upper bound",
        "of bound",
    ):
        assert fact in out, fact


def test_inspect_demo_as_gguf(tmp_path):
    path = hf_llama_to_gguf(DEMO_MODEL, tmp_path / "demo-q8.gguf", qtype="Q8_0")
    out = invoke("inspect", str(path), "--device", "h200")
    assert "gguf" in out and "Q8_0" in out and "llama" in out.lower()
    assert "4,800 GB/s" in out


def test_inspect_errors_exit_2(tmp_path):
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "missing.gguf")])
    assert result.exit_code == 2
    result = CliRunner().invoke(app, ["inspect", str(DEMO_MODEL), "--device", "abacus"])
    assert result.exit_code == 2 and "abacus" in result.output


def test_glm5_spec_roofline_matches_the_worked_example():
    spec = load_spec(ROOT / "studies" / "glm5-8gpu.yaml")
    roofline = roofline_from_spec(spec.roofline, spec.model.path)
    # 40e9 x 4.8 bits = 24 GB/token over 8 x 1,792 GB/s -> 597 tok/s (docs/guide/glm5.md)
    assert roofline.tokens_per_s == pytest.approx(597.3, rel=0.01)
    assert roofline.tp == 8
