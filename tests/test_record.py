"""record.py: what a verdict writes into Optuna, checked on an in-memory study (no server)."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from autotune import names
from autotune.errors import CandidateError, InfrastructureError
from autotune.spec.model import ObjectiveSpec, SloSpec
from autotune.study.record import (
    record_duplicate,
    record_failure,
    record_measured,
    record_screened,
    running_duplicate,
    trim,
)
from autotune.study.results import best_trials, is_verified_feasible, report_of
from autotune.study.screen import ScreenResult


@pytest.fixture
def study() -> optuna.Study:
    return optuna.create_study(
        sampler=optuna.samplers.RandomSampler(seed=0),
        directions=["maximize"],
    )


def _constraint(trial: optuna.trial.FrozenTrial, name: str) -> float | None:
    return trial.system_attrs.get(names.constraint_attr(name))


def test_a_measured_trial_keeps_metrics_constraints_and_values(study) -> None:
    objective = ObjectiveSpec(
        metrics=("output_tokens_per_s",), slos=(SloSpec("ttft_p95_ms", "<=", 100.0),)
    )
    trial = study.ask()
    outcome = record_measured(
        trial, names.SEARCH, objective, {"output_tokens_per_s": 50.123456, "ttft_p95_ms": 130.0}
    )
    study.tell(trial, list(outcome.values))
    frozen = study.trials[0]
    assert outcome.verdict == names.CORRECT_VERDICT and outcome.values == (50.123456,)
    assert frozen.user_attrs[names.METRICS]["output_tokens_per_s"] == 50.1235
    assert frozen.user_attrs[names.CORRECT] is True
    assert _constraint(frozen, names.CORRECTNESS_CONSTRAINT) == 0.0
    assert _constraint(frozen, names.slo_constraint("ttft_p95_ms")) == pytest.approx(30.0)


def test_a_missing_objective_metric_is_request_errors_with_no_values(study) -> None:
    trial = study.ask()
    outcome = record_measured(
        trial, names.SEARCH, ObjectiveSpec(metrics=("requests_per_s",)), {"ttft_p50_ms": 1.0}
    )
    assert outcome.verdict == "request_errors" and outcome.values is None
    assert trial.user_attrs[names.FAIL_REASON] == "request_errors"


def test_a_configuration_fault_is_never_feasible(study) -> None:
    trial = study.ask()
    exc = CandidateError("incorrect_output", "diverged", evidence={"log_tail": "x" * 10_000})
    outcome = record_failure(trial, names.BASELINE, exc)
    study.tell(trial, state=TrialState.PRUNED)
    frozen = study.trials[0]
    assert outcome.verdict == "incorrect_output" and not outcome.infrastructure
    assert frozen.user_attrs[names.CORRECT] is False
    assert len(frozen.user_attrs[names.EVIDENCE]["log_tail"]) <= 4003  # trimmed, tail kept
    assert _constraint(frozen, names.CORRECTNESS_CONSTRAINT) == 1.0


def test_an_infrastructure_fault_sets_no_constraint(study) -> None:
    trial = study.ask()
    outcome = record_failure(trial, names.SEARCH, InfrastructureError("port_taken", "busy"))
    study.tell(trial, state=TrialState.FAIL)
    assert outcome.infrastructure
    assert _constraint(study.trials[0], names.CORRECTNESS_CONSTRAINT) is None


def test_a_screened_trial_is_correct_but_pruned_and_never_best(study) -> None:
    leader = study.ask()
    record_measured(
        leader, names.SEARCH, ObjectiveSpec(("decode_tokens_per_s",)), {"decode_tokens_per_s": 10.0}
    )
    study.tell(leader, 10.0)
    trial = study.ask()
    screen = ScreenResult("decode_tokens_per_s", 3.0, (2.8, 3.2), 0, (9.5, 10.5), True)
    outcome = record_screened(trial, names.SEARCH, {"decode_tokens_per_s": 3.0}, screen)
    # PRUNED, as trial.py ends it: never feasible, never best, not counted as a failure
    study.tell(trial, state=TrialState.PRUNED)
    frozen = study.trials[trial.number]
    assert outcome.verdict == names.SCREENED and not outcome.infrastructure
    assert frozen.user_attrs[names.CORRECT] is True
    assert frozen.user_attrs[names.FAIL_REASON] == names.SCREENED
    assert frozen.user_attrs[names.METRICS] == {"decode_tokens_per_s": 3.0}
    assert frozen.user_attrs[names.SCREEN]["leader"] == 0
    assert frozen.user_attrs[names.SCREEN]["verdict"] == names.SCREENED
    assert "trial 0" in frozen.user_attrs[names.FAIL_DETAIL]
    assert _constraint(frozen, names.CORRECTNESS_CONSTRAINT) == 0.0
    assert not is_verified_feasible(frozen)
    assert [t.number for t in best_trials(study)] == [leader.number]
    assert report_of(study).failures_by_reason == {}  # slower is not a failure


def test_a_duplicate_takes_its_holders_verdict_and_constraint(study) -> None:
    holder = study.ask()
    holder.set_user_attr(names.PARAMS_RESOLVED, {"x": 1})
    waiter = study.ask()
    assert running_duplicate(waiter, {"x": 1}).number == holder.number
    assert running_duplicate(waiter, {"x": 2}) is None
    record_failure(holder, names.SEARCH, CandidateError("oom", "out of memory"))
    study.tell(holder, state=TrialState.PRUNED)
    outcome, why = record_duplicate(waiter, names.SEARCH, study.trials[holder.number])
    assert outcome.verdict == "duplicate" and why == f"duplicate of trial {holder.number}: oom"
    assert waiter.user_attrs[names.EVIDENCE]["outcome"] == "oom"
    study.tell(waiter, state=TrialState.PRUNED)
    assert _constraint(study.trials[waiter.number], names.CORRECTNESS_CONSTRAINT) == 1.0


def test_trim_keeps_tails() -> None:
    assert trim("abc", limit=2) == "...bc"
    assert trim({"a": ["xyz"]}, limit=1) == {"a": ["...z"]}
