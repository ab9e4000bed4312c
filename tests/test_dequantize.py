"""``python -m autotune.model.dequantize GGUF OUTDIR``: bad arguments are refused before any
weight is loaded (exit 2, one line naming the path, nothing written), and a real GGUF (the demo
model converted to Q8_0) comes back as a bf16 Hugging Face folder with the model class named
and the weights the GGUF holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.model.dequantize import main
from autotune.testing.make_gguf import hf_llama_to_gguf
from tests.builders import DEMO_MODEL


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for needle in needles:
        assert needle in err[0], (needle, err[0])


def test_missing_arguments_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "OUTDIR" in capsys.readouterr().err


def test_a_missing_gguf_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "absent.gguf"
    _refused(capsys, [str(missing), str(tmp_path / "out")], str(missing), "no such GGUF file")
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_gguf_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("not a model")
    _refused(capsys, [str(fake), str(tmp_path / "out")], str(fake), "GGUF magic")
    assert not (tmp_path / "out").exists()


def test_an_output_folder_with_files_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = hf_llama_to_gguf(DEMO_MODEL, tmp_path / "demo.gguf")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _refused(capsys, [str(gguf), str(out)], str(out), "not an empty folder")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    _refused(capsys, [str(gguf), str(a_file)], str(a_file), "not an empty folder")


def test_the_demo_gguf_round_trips_to_bf16(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Q8_0 blocks dequantize to within one quantization step of the original weights."""
    pytest.importorskip("transformers")
    import torch
    from safetensors.torch import load_file

    gguf = hf_llama_to_gguf(DEMO_MODEL, tmp_path / "demo.gguf", qtype="Q8_0")
    out = tmp_path / "bf16"
    assert main([str(gguf), str(out)]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (out / "tokenizer.json").is_file()
    assert not out.with_name("bf16.tmp").exists()
    got = load_file(str(out / "model.safetensors"))
    want = load_file(str(DEMO_MODEL / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in got.values())
    name = "model.layers.0.mlp.down_proj.weight"
    step = want[name].float().abs().amax(dim=1, keepdim=True) / 127  # Q8_0: 1/127 of a block max
    error = (got[name].float() - want[name].float()).abs()
    assert bool((error <= step + 1e-2 * want[name].float().abs() + 1e-6).all())
