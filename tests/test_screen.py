"""study/screen.py: one round, then on only if the config may be the best.

The rule on made-up trials (no server), then the whole trial on the fake server (command
engine), where ``--decode-ms`` really sets its step time: 40 ms against 6 ms is a config about
6x slower, far outside any round-to-round noise, so the test depends on no timing margin."""

from __future__ import annotations

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial
from typer.testing import CliRunner

from autotune import names
from autotune.cli.app import app
from autotune.spec.load import load_spec
from autotune.spec.model import ObjectiveSpec
from autotune.study.loop import RunOptions, open_study, run_study
from autotune.study.results import best_trials, is_verified_feasible
from autotune.study.screen import MIN_HALF_WIDTH, Leader, judge, leader_of, screen_for
from tests.builders import write_fake_spec

METRIC = "decode_tokens_per_s"


def _measured(value: float, rounds: list[float], role: str = names.SEARCH, **attrs):
    return create_trial(
        state=TrialState.COMPLETE,
        value=value,
        params={"x": value},
        distributions={"x": FloatDistribution(0, 1000)},
        user_attrs={
            names.ROLE: role,
            names.CORRECT: True,
            names.BENCH: {"repeats": [{METRIC: r} for r in rounds]},
            **attrs,
        },
        system_attrs={names.constraint_attr(names.CORRECTNESS_CONSTRAINT): 0.0},
    )


def test_the_leader_is_the_best_verified_search_trial_with_rounds() -> None:
    trials = [
        _measured(100.0, [99.0, 100.0, 101.0], role=names.BASELINE),
        _measured(120.0, [119.0, 120.0, 121.0]),
        _measured(500.0, [500.0, 500.0], role=names.CONFIRM),  # not the search's
        _measured(300.0, [300.0]),  # one round: no spread to judge by
        _measured(400.0, [399.0, 401.0], **{names.CORRECT: None}),  # never verified
    ]
    leader = leader_of(trials, METRIC, 1.0)
    assert leader is not None and leader.number == trials[1].number
    assert leader.rounds == (119.0, 120.0, 121.0)
    # minimizing, the lowest value leads
    assert leader_of(trials, METRIC, -1.0).rounds == (99.0, 100.0, 101.0)
    assert leader_of(trials[2:], METRIC, 1.0) is None


def test_clearly_worse_is_screened_and_close_is_measured_on() -> None:
    leader = Leader(number=3, rounds=(100.0, 102.0, 98.0, 101.0, 99.0))
    low, high = leader.interval
    assert low < 100.0 < high
    slow = judge(50.0, leader, METRIC, 1.0)
    assert slow.screened and slow.interval[1] < low and slow.leader == 3
    close = judge(97.0, leader, METRIC, 1.0)  # within the leader's noise
    assert not close.screened
    faster = judge(150.0, leader, METRIC, 1.0)
    assert not faster.screened
    # a latency (less is better): twice the leader's is clearly worse, half is not
    assert judge(200.0, leader, "ttft_p95_ms", -1.0).screened
    assert not judge(50.0, leader, "ttft_p95_ms", -1.0).screened


def test_a_quiet_leader_still_leaves_a_close_config_its_full_measurement() -> None:
    quiet = Leader(number=0, rounds=(100.0, 100.0, 100.0))  # no spread at all
    assert quiet.one_round_half_width() == MIN_HALF_WIDTH
    assert not judge(100.0 / (1 + MIN_HALF_WIDTH) + 0.5, quiet, METRIC, 1.0).screened
    assert judge(90.0, quiet, METRIC, 1.0).screened


def test_a_noisy_leader_widens_the_one_round_interval() -> None:
    noisy = Leader(number=0, rounds=(80.0, 120.0, 100.0))
    assert noisy.one_round_half_width() > 0.5  # t(2) = 4.3 times a 20% spread
    assert not judge(60.0, noisy, METRIC, 1.0).screened


def test_only_search_trials_of_a_single_round_metric_are_screened() -> None:
    study = optuna.create_study()
    single = ObjectiveSpec((METRIC,))
    assert screen_for(study, single, names.SEARCH) is not None
    assert screen_for(study, single, names.RETRY) is not None
    for role in (names.BASELINE, names.CONFIRM, names.ABLATION, names.COMPARE):
        assert screen_for(study, single, role) is None
    assert screen_for(None, single, names.SEARCH) is None
    assert screen_for(study, ObjectiveSpec(("goodput",)), names.SEARCH) is None
    assert screen_for(study, ObjectiveSpec((METRIC, "itl_p50_ms")), names.SEARCH) is None


SPACE = """
parameters:
  decode_ms:
    type: categorical
    choices: [6, 40]
    baseline: 40
    target: {flag: --decode-ms}
"""


def test_a_clearly_slower_config_is_measured_for_one_round_only(tmp_path) -> None:
    """Baseline slow, then fast (better than the leader: measured to full precision, the new
    leader), then slow again (clearly worse than it: one round, PRUNED ``screened``)."""
    spec_path = write_fake_spec(
        tmp_path, SPACE, name="screen", workload={"repeats": 4, "num_requests": 4}
    )
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    for value in (6, 40):
        study.enqueue_trial({"decode_ms": value})
    run_study(spec, RunOptions(trials=3, validate=False))
    study = optuna.load_study(study_name=spec.name, storage=spec.default_storage())
    baseline, fast, slow = study.trials

    assert baseline.state == fast.state == TrialState.COMPLETE
    assert len(fast.user_attrs[names.BENCH]["repeats"]) == 4  # full precision
    assert fast.user_attrs[names.SCREEN]["verdict"] == "measured on"
    assert fast.user_attrs[names.SCREEN]["leader"] == baseline.number
    assert names.SCREEN not in baseline.user_attrs  # the baseline is never screened

    assert slow.params == {"decode_ms": 40}
    assert slow.state == TrialState.PRUNED
    assert slow.user_attrs[names.FAIL_REASON] == names.SCREENED
    assert slow.user_attrs[names.CORRECT] is True  # it passed the gate
    assert slow.user_attrs[names.BENCH]["stopped_by"] == names.SCREENED
    assert len(slow.user_attrs[names.BENCH]["repeats"]) == 1  # one round, three saved
    assert list(slow.intermediate_values) == [0]
    assert slow.user_attrs[names.METRICS][METRIC] > 0  # its one round's numbers are kept
    screen = slow.user_attrs[names.SCREEN]
    assert screen["leader"] == fast.number and screen["interval"][1] < screen["leader_interval"][0]
    assert f"trial {fast.number}" in slow.user_attrs[names.FAIL_DETAIL]
    assert not is_verified_feasible(slow)
    assert [t.number for t in best_trials(study)] == [fast.number]
    # every launched trial carries its phases' seconds
    for trial in study.trials:
        spent = trial.user_attrs[names.TIME_S]
        assert {"startup", "gate", "measurement", "teardown"} <= spent.keys()
        assert trial.user_attrs[names.SERVER]["startup_parts"] == {}  # the double says none
    # show says which trial was screened and where the study's time went
    shown = CliRunner().invoke(app, ["show", "--spec", str(spec_path)])
    assert shown.exit_code == 0, shown.output
    screened_line = "screened after one round (clearly slower than the leader, not measured on)"
    assert f"{screened_line}: trial {slow.number}" in shown.output
    assert "where the time went:" in shown.output
    assert "measurement:" in shown.output and "over 3 trial(s), 1 of them screened" in shown.output
    assert "failure details" not in shown.output  # slower is not a failure
