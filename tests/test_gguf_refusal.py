"""A GGUF model on a vLLM that cannot load it is refused at preflight (exit 3, saying what to
install on a GPU machine and how to serve it here), before a trial, a baseline or the study's
storage is spent; ``autotune inspect`` no longer promises a fusion at load that cannot happen.

vLLM 0.32 has no GGUF loader of its own and its CPU build cannot run vllm-gguf-plugin's Triton
kernels (``autotune/engines/vllm/gguf.py``). The rule is tested on its facts (pure), the
refusal through the real CLI with the installed vLLM, on real GGUF bytes (the demo model
converted by ``autotune.testing.make_gguf``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.engines.vllm import gguf
from autotune.engines.vllm.engine import VllmEngine
from autotune.errors import PreflightError
from autotune.model.gguf_reader import gguf_model_file
from autotune.model.reader import facts_as_rows, inspect_model
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, run_study
from autotune.testing.make_gguf import hf_llama_to_gguf
from tests.builders import DEMO_MODEL, ROOT

LOADER_PROBLEM = gguf.probe_gguf_load_problem()
needs_unloadable_gguf = pytest.mark.skipif(
    LOADER_PROBLEM is None,
    reason="the vLLM installed here can load GGUF (or there is none): nothing to refuse",
)


@pytest.fixture(scope="module")
def demo_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model as a real Q8_0 GGUF file (q, k and v stored as separate tensors)."""
    return hf_llama_to_gguf(DEMO_MODEL, tmp_path_factory.mktemp("gguf") / "demo-q8.gguf")


# --- the rule, on its facts ----------------------------------------------------------------


def test_vllm_without_the_plugin_cannot_load_gguf() -> None:
    problem = gguf.gguf_load_problem("0.32.0", plugin_installed=False, cpu_build=False)
    assert problem is not None and "vllm-gguf-plugin is not installed" in problem


def test_the_plugin_on_the_cpu_build_cannot_run_its_kernels() -> None:
    problem = gguf.gguf_load_problem("0.32.0", plugin_installed=True, cpu_build=True)
    assert problem is not None and "CUDA" in problem and "CPU build" in problem


def test_the_plugin_on_a_gpu_build_and_an_old_vllm_load_gguf() -> None:
    assert gguf.gguf_load_problem("0.32.0", plugin_installed=True, cpu_build=False) is None
    # before 0.24 vLLM had its own loader
    assert gguf.gguf_load_problem("0.23.1", plugin_installed=False, cpu_build=False) is None
    # no vLLM at all is the preflight's "not installed", not a GGUF problem
    assert gguf.gguf_load_problem(None, plugin_installed=False, cpu_build=True) is None


def test_a_gguf_model_is_found_by_suffix_magic_or_folder(tmp_path: Path, demo_gguf: Path) -> None:
    renamed = tmp_path / "model.bin"
    shutil.copy(demo_gguf, renamed)  # no .gguf suffix: the magic says what it is
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(demo_gguf, folder / demo_gguf.name)
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"\x00" * 64)
    assert gguf_model_file(demo_gguf) == demo_gguf
    assert gguf_model_file(renamed) == renamed
    assert gguf_model_file(folder) == folder / demo_gguf.name
    assert gguf_model_file(not_gguf) is None
    assert gguf_model_file(DEMO_MODEL) is None  # a Hugging Face folder
    assert gguf_model_file(tmp_path / "absent.gguf") is None


def test_the_message_names_both_ways_out(demo_gguf: Path) -> None:
    problem = "vLLM 0.32.0 has no GGUF loader"
    message = gguf.model_problem(str(demo_gguf), problem)
    assert message is not None
    assert problem in message
    assert "pip install vllm-gguf-plugin" in message
    assert f"python -m autotune.model.dequantize {demo_gguf} OUTDIR" in message
    assert gguf.model_problem(str(DEMO_MODEL), problem) is None


# --- the preflight, with the installed vLLM -------------------------------------------------


def _gguf_spec(tmp_path: Path, model: Path) -> Path:
    """studies/demo.yaml with ``model.path`` set to ``model`` and its storage in ``tmp_path``."""
    spec = yaml.safe_load((ROOT / "studies" / "demo.yaml").read_text())
    spec["model"]["path"] = str(model)
    spec["engine"]["patch_dirs"] = [str(ROOT / "patches")]
    spec["search_space"] = str(ROOT / "search_spaces" / "cpu-demo.yaml")
    spec["storage"] = f"sqlite:///{tmp_path / 'gguf.db'}"
    path = tmp_path / "gguf.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@needs_unloadable_gguf
def test_run_refuses_a_gguf_before_anything_is_spent(tmp_path: Path, demo_gguf: Path) -> None:
    spec_path = _gguf_spec(tmp_path, demo_gguf)
    result = CliRunner().invoke(
        app, ["run", "--trials", "1", "--spec", str(spec_path)], env={"COLUMNS": "400"}
    )
    assert result.exit_code == 3, result.output
    text = " ".join(result.output.split())
    assert "pip install vllm-gguf-plugin" in text
    assert "python -m autotune.model.dequantize" in text
    # no study storage, no artifacts: nothing was started
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gguf.yaml"]


@needs_unloadable_gguf
def test_a_renamed_gguf_is_refused_too(tmp_path: Path, demo_gguf: Path) -> None:
    renamed = tmp_path / "model.bin"
    shutil.copy(demo_gguf, renamed)
    spec = load_spec(_gguf_spec(tmp_path, renamed))
    with pytest.raises(PreflightError, match="is a GGUF model"):
        run_study(spec, RunOptions(trials=1))
    assert not (tmp_path / "gguf.db").exists()


def test_a_hugging_face_folder_has_no_model_problem() -> None:
    spec = load_spec(ROOT / "studies" / "demo.yaml")
    assert VllmEngine(spec.engine, spec.model).model_problem() is None


# --- inspect --------------------------------------------------------------------------------


def test_inspect_says_what_happens_to_separate_projections(demo_gguf: Path) -> None:
    facts = inspect_model(demo_gguf)
    assert any(not f.on_disk for f in facts.fused_projections)
    plain = dict(facts_as_rows(facts))
    assert "fused by vLLM at load" in plain["fused qkv (load time)"]
    rows = facts_as_rows(facts, load_problem="vLLM here has no GGUF loader")
    fused = dict(rows)["fused qkv (load time)"]
    assert "fused by vLLM at load" not in fused and "separate on disk" in fused
    assert ("note", "vLLM here has no GGUF loader") in rows


@needs_unloadable_gguf
def test_inspect_cli_on_this_vllm(demo_gguf: Path) -> None:
    result = CliRunner().invoke(app, ["inspect", str(demo_gguf)], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "fused by vLLM at load" not in result.output
    assert "pip install vllm-gguf-plugin" in result.output


@needs_unloadable_gguf
def test_validate_checks_the_parameters_and_notes_the_refusal(
    tmp_path: Path, demo_gguf: Path
) -> None:
    """``validate`` judges the parameters (exit 0 here) and says that ``run`` will refuse the
    model on this machine, rather than letting "all valid" read as "ready to run"."""
    result = CliRunner().invoke(
        app, ["validate", str(_gguf_spec(tmp_path, demo_gguf))], env={"COLUMNS": "400"}
    )
    assert result.exit_code == 0, result.output
    assert "parameters valid" in result.stdout
    assert "autotune run will refuse this spec" in result.stderr
    assert "pip install vllm-gguf-plugin" in " ".join(result.stderr.split())
