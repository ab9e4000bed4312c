"""The real model on vLLM's CPU build, through the real command line (issue #29; about 4 min).

``studies/smollm2-vllm.yaml`` as shipped (its check prompts, known answers, workload and search
space), SmolLM2-135M-Instruct dequantized to bf16 by ``make smollm2``: the baseline records a
reference whose capabilities say token ids and teacher-forced logprobs are compared, one more
config is launched, gated and measured, vLLM's ``/metrics`` is recorded as evidence, ``show``
names the model, a bad flag is exit 2 at ``validate``, ``export`` writes vLLM's ``--config``
YAML, and no server is left running. Skipped, saying why, where vLLM or the model is missing.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from autotune import names
from autotune.spec.load import load_spec
from autotune.study.loop import open_study
from tests.helpers import (
    export_unconfirmed,
    missing,
    processes_matching,
    run_autotune,
    run_unconfirmed,
    show_wide,
)

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "smollm2-vllm.yaml"
BF16 = ROOT / "models" / "smollm2" / "bf16"


def _copy_spec(directory: Path) -> Path:
    """The shipped spec with absolute paths and its storage in ``directory``."""
    spec = yaml.safe_load(STUDY.read_text(encoding="utf-8"))
    spec["model"]["path"] = str(BF16)
    spec["search_space"] = str(ROOT / "search_spaces" / "smollm2-vllm.yaml")
    spec["engine"]["patch_dirs"] = [str(ROOT / "patches")]
    path = directory / "smollm2-vllm.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        missing("no vLLM (make setup)")
    if not (BF16 / "config.json").is_file():
        missing(f"no SmolLM2 bf16 copy at {BF16} (make smollm2)")
    directory = tmp_path_factory.mktemp("smollm2-vllm")
    spec_path = _copy_spec(directory)
    spec = load_spec(spec_path)
    study, created = open_study(spec, spec.default_storage())
    assert created
    # the baseline's values but 16 sequences, every other knob pinned to a value that keeps the
    # output and meets the space's constraints (a partial enqueue lets the sampler draw the rest,
    # which once drew a step budget of 256 without chunked prefill: pruned, never launched)
    tuned = {
        **spec.space.baseline_values(),
        "max_num_seqs": 16,
        "max_num_batched_tokens": 2048,
        "block_size": 128,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": False,
        "async_scheduling": False,
        "VLLM_CPU_OMP_THREADS_BIND": "auto",
    }
    assert not spec.space.violated(tuned), spec.space.violated(tuned)
    study.enqueue_trial(spec.space.to_optuna_params(tuned))
    run_unconfirmed(spec_path, 2, cwd=directory, timeout=1500)
    return directory, spec_path, spec


def test_the_real_model_is_gated_measured_and_its_evidence_recorded(study_dir):
    _, _, spec = study_dir
    study = optuna.load_study(study_name=spec.name, storage=spec.default_storage())
    baseline, tuned = study.trials[:2]
    assert baseline.user_attrs[names.ROLE] == "baseline"
    assert baseline.user_attrs[names.CORRECT] is True, baseline.user_attrs.get(names.FAIL_DETAIL)
    reference = study.user_attrs[names.REFERENCE]
    capabilities = reference["capabilities"]
    assert capabilities["token_ids"] and capabilities["teacher_forced"], capabilities
    assert baseline.user_attrs[names.METRICS]["output_tokens_per_s"] > 0
    assert baseline.user_attrs[names.SERVER_METRICS]["available"] is True

    assert tuned.params["max_num_seqs"] == 16
    assert tuned.user_attrs.get(names.FAIL_REASON) is None, tuned.user_attrs.get(names.FAIL_DETAIL)
    assert tuned.user_attrs[names.CORRECT] is True
    assert "--max-num-seqs" in tuned.user_attrs[names.SERVER]["argv"]
    for trial in (baseline, tuned):
        assert trial.user_attrs[names.SERVER]["stopped_cleanly"] is True
    # the launch names the model by its resolved path (models/smollm2 is a link into the cache)
    assert not processes_matching(str(BF16)) and not processes_matching(str(BF16.resolve()))


def test_show_names_the_model(study_dir):
    directory, spec_path, _ = study_dir
    shown = show_wide(spec_path, cwd=directory)
    assert f"model: {BF16.resolve()} (served as smollm2)" in shown, shown


def test_export_writes_vllm_s_own_config(study_dir, tmp_path):
    directory, spec_path, _ = study_dir
    out = tmp_path / "best.yaml"
    config = yaml.safe_load(export_unconfirmed(spec_path, out, cwd=directory))
    assert config["model"] == str(BF16.resolve())
    assert config["max-model-len"] in (1024, "1024")


def test_a_bad_flag_is_exit_2_at_validate(study_dir, tmp_path):
    _, spec_path, _ = study_dir
    space = yaml.safe_load((ROOT / "search_spaces" / "smollm2-vllm.yaml").read_text())
    space["parameters"]["max_num_seqs"]["target"] = {"flag": "--max-num-seqz"}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    spec = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    spec["search_space"] = "space.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = run_autotune("validate", str(bad), timeout=300, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--max-num-seqz" in result.stdout + result.stderr
