"""``autotune profile``: the table and the stored result on real vLLM (CPU build), and the
table's arithmetic on stored results.

The real-server test runs a two-trial study (baseline: eager with 4 sequences; one search trial
with 64), then profiles both: ms per output token by category, side by side, stored in the
study and shown by ``autotune show``. Its coverage (trace window per token over the client's
measured time per token for the same request) is asserted only loosely here, because it is a
ratio of two timings on a busy machine; the figure itself is printed and stored.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune import names
from autotune.analysis.profile import default_trials, sort_profiles, table_rows
from autotune.cli.app import app
from autotune.errors import PreflightError
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from autotune.study.results import best_trials
from tests.builders import write_demo_spec, write_fake_spec

SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [4, 64]
    baseline: 4
    target: {flag: --max-num-seqs}
"""


FAKE_SPACE = """
parameters:
  decode_ms:
    type: categorical
    choices: [10, 2, 30]
    baseline: 10
    target: {flag: --decode-ms}
"""


def _stored(trial: int, role: str, **overrides) -> dict:
    profile = {
        "trial": trial,
        "role": role,
        "tokens": 65,
        "unprofiled_ms_per_token": 2.0,
        "profiled_ms_per_token": 2.2,
        "per_token_ms": {"model compute": 0.5, "python in step": 0.9, "between steps": 0.8},
        "coverage": 1.0,
        "consistent": True,
        "breakdown": {"device": "cpu"},
        "collective_calls_per_token": 0.0,
    }
    profile.update(overrides)
    return profile


def test_table_puts_baseline_first_and_flags_low_coverage() -> None:
    stored = {
        "5": _stored(
            5,
            "search",
            coverage=0.7,
            consistent=False,
            cpu_s_by_process={"VLLM::EngineCore": 0.065},
        ),
        "0": _stored(0, "baseline", cpu_s_by_process={"VLLM::Worker": 0.13}),
    }
    header, rows = table_rows(sort_profiles(stored))
    assert header == ["ms / output token", "trial 0 (baseline)", "trial 5 (search)"]
    by_name = {row[0]: row[1:] for row in rows}
    assert by_name["model compute"] == ["0.500", "0.500"]
    assert by_name["sum (trace)"] == ["2.200", "2.200"]
    assert by_name["client per token, unprofiled"] == ["2.000", "2.000"]
    assert by_name["coverage (trace / measured)"] == ["1.00", "0.70 !"]
    assert "collective calls / token" not in by_name  # CPU: no collectives row
    # CPU charged per process, per token (65 tokens): a process one profile lacks shows "-"
    assert by_name["CPU ms / token, VLLM::Worker"] == ["2.000", "-"]
    assert by_name["CPU ms / token, VLLM::EngineCore"] == ["-", "1.000"]


@pytest.mark.e2e
def test_profile_baseline_and_best_on_real_vllm(tmp_path: Path) -> None:
    spec_path = write_demo_spec(tmp_path, SPACE, name="prof")
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    study.enqueue_trial({"max_num_seqs": 64}, user_attrs={names.ROLE: names.SEARCH})
    summary = run_study(spec, RunOptions(trials=2, seed=0, validate=False))
    assert summary.stopped_because is None, summary.stopped_because

    # both trials by number: which of them is best depends on a timing at concurrency 4 (the
    # default choice, baseline and best, is tested without a launch below)
    ran = CliRunner().invoke(
        app,
        ["profile", "--spec", str(spec_path), "--tokens", "64", "--trial", "0", "--trial", "1"],
    )
    assert ran.exit_code == 0, ran.output
    assert "Where the step time goes" in ran.output

    study = optuna.load_study(study_name="prof", storage=spec.default_storage())
    profiles = study.user_attrs[names.PROFILES]
    assert set(profiles) == {"0", "1"}
    assert profiles["0"]["role"] == "baseline"
    for profile in profiles.values():
        assert profile["breakdown"]["device"] == "cpu"
        assert profile["tokens"] == 64
        parts = profile["per_token_ms"]
        assert set(parts) == {"model compute", "python in step", "between steps"}
        assert all(v >= 0 for v in parts.values()) and parts["model compute"] > 0
        window = profile["breakdown"]["window_ms"] / (profile["tokens"] - 1)
        assert sum(parts.values()) == pytest.approx(window, rel=1e-3)
        assert 0.5 < profile["coverage"] < 2.0, profile  # a gross mismatch is a bug
        assert profile["unprofiled_ms_per_token"] > 0
        assert profile["cpu_s_by_process"], "the OS's CPU time per server process is kept"
        assert all(Path(f).is_file() for f in profile["trace_files"])

    shown = CliRunner().invoke(app, ["show", "--spec", str(spec_path)])
    assert shown.exit_code == 0, shown.output
    assert "trial 0 (baseline)" in shown.output and "trial 1 (search)" in shown.output


def test_default_choice_is_the_baseline_and_the_best(tmp_path: Path) -> None:
    """Without --trial: the verified baseline and the best correct trial; one when the best
    is the baseline; a study with neither is refused (fake server: no launch needed)."""
    spec_path = write_fake_spec(tmp_path, FAKE_SPACE, name="pick")
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    with pytest.raises(PreflightError, match="no verified baseline"):
        default_trials(study)
    study.enqueue_trial({"decode_ms": 2}, user_attrs={names.ROLE: "search"})
    study.enqueue_trial({"decode_ms": 30}, user_attrs={names.ROLE: "search"})
    summary = run_study(spec, RunOptions(trials=3, seed=0, validate=False))
    assert summary.stopped_because is None, summary.stopped_because
    study = optuna.load_study(study_name="pick", storage=spec.default_storage())
    best = best_trials(study)[0].number
    chosen = default_trials(study)
    assert chosen[0] == (0, "baseline")
    assert chosen[1:] == ([] if best == 0 else [(best, "best")])
    assert best != 2  # 30 ms per token is never the fastest


def test_profile_refuses_unknown_trial_with_exit_2(tmp_path: Path) -> None:
    spec_path = write_demo_spec(tmp_path, SPACE, name="prof")
    spec = load_spec(spec_path)
    open_study(spec, spec.default_storage())
    ran = CliRunner().invoke(app, ["profile", "--spec", str(spec_path), "--trial", "7"])
    assert ran.exit_code == 2, ran.output
    assert "no trial 7" in ran.output


def test_an_engine_without_a_profiler_is_refused_with_exit_3(tmp_path: Path) -> None:
    """The command engine (any OpenAI-compatible server) has no profiler autotune can drive:
    one line, exit 3, nothing launched and nothing stored."""
    spec_path = write_fake_spec(tmp_path, FAKE_SPACE, name="noprof")
    spec = load_spec(spec_path)
    summary = run_study(spec, RunOptions(trials=1, seed=0, validate=False))
    assert summary.stopped_because is None, summary.stopped_because
    ran = CliRunner().invoke(app, ["profile", "--spec", str(spec_path)])
    assert ran.exit_code == 3, ran.output
    assert "has no profiler" in ran.output
    study = optuna.load_study(study_name="noprof", storage=spec.default_storage())
    assert names.PROFILES not in study.user_attrs
    assert not list(tmp_path.rglob("profiles")), "no trace folder for a refused profile"
