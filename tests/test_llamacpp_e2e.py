"""The real model on the real llama.cpp server, through autotune's own loop (issue #29).

SmolLM2-135M-Instruct as the GGUF Q4_1 file a registry package ships, served by the
llama-server ``make setup`` builds: the baseline records a reference whose capabilities say
token ids and top-2 logprobs are compared (read from llama.cpp's ``logprobs.content[]``), a
tuned config is launched, gated and measured, llama.cpp's ``/metrics`` is recorded as evidence,
and no server is left running. Skipped, saying why, where the binary or the model is missing.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import yaml

from autotune import names
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from tests.test_llamacpp_engine import GGUF, needs_real

SPACE = {
    "parameters": {
        "parallel": {
            "type": "categorical",
            "choices": [1, 2],
            "baseline": 1,
            "target": {"flag": "--parallel"},
        },
        "cache_type_k": {
            "type": "categorical",
            "choices": ["f16", "q8_0"],
            "target": {"flag": "--cache-type-k"},
        },
    }
}


def _spec(tmp_path: Path):
    spec = {
        "study": "smollm2-e2e",
        "engine": {"kind": "llamacpp", "args": ["--ctx-size", "2048"]},
        "model": {"path": str(GGUF), "served_name": "smollm2"},
        "search_space": "space.yaml",
        "check": {
            "prompts": ["The capital of France is", "One, two, three, four,"],
            "max_tokens": 12,
            "known_answers": [{"prompt": "The capital of France is", "expect": "Paris"}],
            "under_load_sample": 4,
        },
        "workload": {
            "prompts": ["Write a short poem about the sea.", "List three fruits."],
            "max_tokens": 16,
            "concurrency": 2,
            "num_requests": 4,
            "single_requests": 1,
            "warmup_requests": 1,
            "repeats": 1,
            "target_precision": 0,
            "request_timeout_s": 60,
        },
        "objective": {"metric": "output_tokens_per_s"},
        "timeouts": {"startup_s": 120},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(SPACE, sort_keys=False))
    path = tmp_path / "smollm2.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return load_spec(path)


@needs_real
def test_a_real_llamacpp_study_gates_measures_and_records_its_evidence(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    url = f"sqlite:///{tmp_path / 'e2e.db'}"
    study, created = open_study(spec, url)
    assert created
    study.enqueue_trial({"parallel": 2, "cache_type_k": "q8_0"})
    run_study(spec, RunOptions(trials=2, storage_url=url))
    study = optuna.load_study(study_name=spec.name, storage=url)
    baseline, tuned = study.trials[:2]

    assert baseline.user_attrs.get(names.FAIL_REASON) is None, baseline.user_attrs
    assert baseline.user_attrs[names.CORRECT] is True
    capabilities = study.user_attrs[names.REFERENCE]["capabilities"]
    assert capabilities["token_ids"] and capabilities["top_logprobs"], capabilities
    assert capabilities["token_logprobs"] and capabilities["teacher_forced"] is None
    assert baseline.user_attrs[names.METRICS]["output_tokens_per_s"] > 0
    evidence = baseline.user_attrs[names.SERVER_METRICS]
    assert evidence["available"] is True, evidence

    # the tuned config ran and was judged: measured, or refused by the gate with its reason
    assert tuned.params == {"parallel": 2, "cache_type_k": "q8_0"}
    reason = tuned.user_attrs.get(names.FAIL_REASON)
    assert reason in (None, "incorrect_output"), tuned.user_attrs.get(names.FAIL_DETAIL)
    server = tuned.user_attrs[names.SERVER]
    assert "--parallel" in server["argv"] and "--cache-type-k" in server["argv"]
    for trial in (baseline, tuned):
        assert trial.user_attrs[names.SERVER]["stopped_cleanly"] is True

    # show names the model (llama-server takes it as -m; the spec says it once)
    from typer.testing import CliRunner

    from autotune.cli.app import app

    shown = CliRunner().invoke(app, ["show", "--study", spec.name, "--storage", url])
    assert shown.exit_code == 0, shown.output
    assert f"model: {GGUF.resolve()} (served as smollm2)" in shown.output
