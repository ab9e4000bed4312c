"""Unit tests of autotune.study.loop: where a study is stored, how it is opened (once, with the
baseline queued first), how a trial is queued again, and the loop's own rules on the fake
server (the baseline runs first; a failed baseline stops the run). Multi-worker races and
crash recovery are the scenario files' (test_multiworker.py, test_resume_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune import names
from autotune.errors import PreflightError, SpecError
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, enqueue_retry, open_study, run_study, storage_url_for
from tests.builders import fake_spec, save_spec, write_fake_spec
from tests.helpers import measured_or_screened

SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [2, 8]
    baseline: 8
    target: {flag: --max-num-seqs}
"""


def test_storage_url_precedence(tmp_path: Path) -> None:
    spec = load_spec(write_fake_spec(tmp_path, SPACE, name="where"))
    assert storage_url_for(spec, None) == spec.default_storage()
    assert spec.default_storage().endswith(str(tmp_path / "where.db"))
    stored = fake_spec("stored", storage=f"sqlite:///{tmp_path / 'in-spec.db'}")
    spec = load_spec(save_spec(tmp_path, stored, SPACE, file="stored.yaml"))
    assert storage_url_for(spec, None) == f"sqlite:///{tmp_path / 'in-spec.db'}"
    assert storage_url_for(spec, "sqlite:///other.db") == "sqlite:///other.db"


def test_open_study_creates_it_once_with_the_baseline_queued(tmp_path: Path) -> None:
    spec = load_spec(write_fake_spec(tmp_path, SPACE, name="opened"))
    url = spec.default_storage()
    study, created = open_study(spec, url)
    assert created is True
    assert study.study_name == "opened"
    assert study.user_attrs[names.SPEC_PATH] == str(spec.path)
    assert study.metric_names == ["decode_tokens_per_s"]
    (baseline,) = study.get_trials(states=(TrialState.WAITING,))
    assert baseline.user_attrs[names.ROLE] == "baseline"
    assert baseline.system_attrs["fixed_params"] == {"max_num_seqs": 8}  # the space's baseline
    again, created = open_study(spec, url)
    assert created is False
    assert len(again.get_trials(states=(TrialState.WAITING,))) == 1  # not queued twice


def test_open_study_refuses_a_spec_with_other_directions(tmp_path: Path) -> None:
    spec = load_spec(write_fake_spec(tmp_path, SPACE, name="dirs"))
    open_study(spec, spec.default_storage())
    other = load_spec(
        write_fake_spec(tmp_path, SPACE, name="dirs", objective={"metric": "ttft_p95_ms"})
    )
    with pytest.raises(SpecError) as info:
        open_study(other, other.default_storage())
    assert info.value.key == "objective"
    assert "minimize" in str(info.value)


def test_a_resumed_study_whose_choices_changed_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """Optuna cannot continue a study whose categorical parameter changed its choices: the
    resumed run raised a ValueError traceback at its first ask, after opening the study."""
    spec = load_spec(write_fake_spec(tmp_path, SPACE, name="moved"))
    url = spec.default_storage()
    study, _created = open_study(spec, url)
    trial = study.ask()
    spec.space.suggest(trial)
    study.tell(trial, 1.0)
    before = (len(study.trials), study.user_attrs)
    grown = SPACE.replace("[2, 8]", "[2, 8, 16]")
    changed = load_spec(write_fake_spec(tmp_path, grown, name="moved"))
    with pytest.raises(SpecError) as info:
        open_study(changed, url)
    assert info.value.key == "parameters.max_num_seqs"
    assert info.value.file == str(tmp_path / "space.yaml")
    assert "new --study name" in str(info.value)
    again = optuna.load_study(study_name="moved", storage=url)
    assert (len(again.trials), again.user_attrs) == before


def test_a_resumed_study_may_move_numeric_bounds(tmp_path: Path) -> None:
    numeric = SPACE.replace(
        "type: categorical\n    choices: [2, 8]", "type: int\n    low: 2\n    high: 8"
    )
    spec = load_spec(write_fake_spec(tmp_path, numeric, name="bounds"))
    study, _created = open_study(spec, spec.default_storage())
    trial = study.ask()
    spec.space.suggest(trial)
    study.tell(trial, 1.0)
    wider_space = numeric.replace("high: 8", "high: 64")
    wider = load_spec(write_fake_spec(tmp_path, wider_space, name="bounds"))
    again, created = open_study(wider, wider.default_storage())
    assert created is False and len(again.trials) == 1


def test_enqueue_retry_keeps_the_config_and_its_pin(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'retry.db'}")
    distributions = {"max_num_seqs": optuna.distributions.CategoricalDistribution([2, 8])}
    pinned = optuna.trial.create_trial(
        params={"max_num_seqs": 2},
        distributions=distributions,
        state=TrialState.FAIL,
        user_attrs={names.ROLE: "ablation", names.PINNED: {"max_num_seqs": 2}, names.VARIANT: "v"},
    )
    baseline = optuna.trial.create_trial(
        params={"max_num_seqs": 8},
        distributions=distributions,
        state=TrialState.FAIL,
        user_attrs={names.ROLE: "baseline"},
    )
    study.add_trials([pinned, baseline])
    enqueue_retry(study, study.trials[0])
    enqueue_retry(study, study.trials[1])
    first, second = study.get_trials(states=(TrialState.WAITING,))
    assert first.user_attrs[names.ROLE] == "retry"
    assert first.user_attrs[names.RETRY_OF] == 0
    assert first.user_attrs[names.PINNED] == {"max_num_seqs": 2}
    assert first.user_attrs[names.VARIANT] == "v"
    assert first.system_attrs["fixed_params"] == {"max_num_seqs": 2}
    assert second.user_attrs[names.ROLE] == "baseline"  # a retried baseline is still the baseline
    assert second.user_attrs[names.RETRY_OF] == 1


def test_run_study_runs_the_baseline_first_then_searches(tmp_path: Path) -> None:
    spec = load_spec(write_fake_spec(tmp_path, SPACE, name="loop", args=("--decode-ms", "1")))
    summary = run_study(spec, RunOptions(trials=2, seed=0))
    assert summary.study_name == "loop"
    assert summary.stopped_because is None
    assert [o.role for o in summary.outcomes][0] == "baseline"
    assert all(o.verdict in ("correct", names.SCREENED) for o in summary.outcomes), summary.outcomes
    assert len(summary.outcomes) == 2
    study = optuna.load_study(study_name="loop", storage=summary.storage_url)
    assert study.user_attrs.get(names.REFERENCE) is not None
    assert all(measured_or_screened(t) for t in study.trials), [t.state for t in study.trials]


def test_a_failed_baseline_stops_the_run(tmp_path: Path) -> None:
    """Healthy, but every completion answers 500: nothing else can be judged without a
    reference, so the loop stops instead of launching the other trials."""
    spec = load_spec(
        write_fake_spec(tmp_path, SPACE, name="nobase", args=("--fault", "healthy_but_broken"))
    )
    with pytest.raises(PreflightError) as info:
        run_study(spec, RunOptions(trials=3, seed=0))
    assert "the baseline (trial 0) failed" in str(info.value)
    study = optuna.load_study(study_name="nobase", storage=spec.default_storage())
    assert len(study.trials) == 1
