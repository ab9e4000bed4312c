"""``--trials N`` is the run's launches in all (``study/budget.py``), and the confirmation is a
race that stops once its verdict is settled (``analysis/confirm.race_step``).

The plan's cases are pure arithmetic; the CLI's are driven against the fault-injecting fake
server (a test double), and launches are counted from the study database, not from output."""

from __future__ import annotations

import re

import optuna
import pytest
from typer.testing import CliRunner

from autotune import names
from autotune.analysis.confirm import ALL_ELIMINATED, BUDGET, SETTLED, race_step
from autotune.cli.app import app
from autotune.errors import SpecError
from autotune.spec.load import load_spec
from autotune.storage import sqlite_file
from autotune.study.budget import (
    MIN_ROUNDS,
    PLAN_MAX_ROUNDS,
    ROUNDS_PER_CANDIDATE,
    launches_made,
    plan_budget,
)
from autotune.study.loop import open_study
from tests.builders import write_fake_spec

# --- the plan ----------------------------------------------------------------------------------


def test_three_launches_hold_no_confirmation():
    plan = plan_budget(3)
    assert (plan.search, plan.confirm, plan.rounds) == (3, 0, 0)
    assert "no confirmation fits in 3 launches" in plan.describe()
    assert plan.describe().startswith("budget: 3 launches = 1 baseline + 2 search")


def test_twelve_launches_spend_at_most_a_fifth_on_the_confirmation():
    plan = plan_budget(12)
    # two rounds of even one candidate (4 launches) are more than a fifth of 12
    assert plan.confirm <= 12 // 5
    assert plan.search + plan.confirm == 12
    assert not plan.confirms


def test_twenty_launches_confirm_one_candidate_in_two_rounds():
    plan = plan_budget(20)
    # top 2 would need 2 x 3 = 6 > 20 // 5: the plan drops to one candidate before giving up
    assert (plan.top_k, plan.rounds, plan.confirm, plan.search) == (1, MIN_ROUNDS, 4, 16)
    assert "1 baseline + 15 search + 2 rounds x (baseline + 1) confirmation" in plan.describe()


def test_rounds_come_before_candidates_within_a_fifth():
    """Two rounds settle only a gain above about 20 % at 5 % noise: a second candidate is
    raced only where each variant still gets ROUNDS_PER_CANDIDATE rounds."""
    plan = plan_budget(50)
    assert (plan.top_k, plan.rounds, plan.confirm, plan.search) == (1, 5, 10, 40)
    assert plan.confirm <= 50 // 5
    assert (plan_budget(30).top_k, plan_budget(30).rounds) == (1, 3)  # not 2 x (1 + 2)
    sixty = plan_budget(60)
    assert (sixty.top_k, sixty.rounds, sixty.confirm) == (2, ROUNDS_PER_CANDIDATE, 12)
    big = plan_budget(500)
    assert big.rounds == PLAN_MAX_ROUNDS and big.confirm == PLAN_MAX_ROUNDS * 3


def test_a_resumed_study_counts_its_launches():
    plan = plan_budget(50, done_launches=30)
    assert plan.search + plan.confirm == 20 and plan.confirm <= 10
    assert "30 already made" in plan.describe() and "baseline +" in plan.describe()
    spent = plan_budget(50, done_launches=50)
    assert (spent.search, spent.confirm) == (0, 0)
    over = plan_budget(50, done_launches=60)  # never a negative budget
    assert (over.search, over.confirm) == (0, 0)


def test_explicit_repeats_are_planned_or_refused():
    plan = plan_budget(12, confirm_repeats=2)
    assert (plan.top_k, plan.rounds, plan.confirm, plan.search) == (2, 2, 6, 6)
    with pytest.raises(SpecError) as info:
        plan_budget(6, confirm_repeats=2)  # 6 confirmation launches leave no baseline
    assert info.value.key == "--confirm-repeats"
    assert "--trials to at least 8" in str(info.value)
    assert plan_budget(8, confirm_repeats=2).search == 2


def test_confirm_top_zero_plans_the_whole_budget_for_the_search():
    plan = plan_budget(50, confirm_top=0)
    assert (plan.search, plan.confirm) == (50, 0)
    assert "--confirm-top 0" in plan.describe()


def test_launches_made_counts_only_started_servers():
    study = optuna.create_study()

    def add(state, role, reason=None):
        attrs = {names.ROLE: role, **({names.FAIL_REASON: reason} if reason else {})}
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                values=[1.0] if state.is_finished() and state.name == "COMPLETE" else None,
                user_attrs=attrs,
            )
        )

    S = optuna.trial.TrialState  # noqa: N806
    add(S.COMPLETE, names.BASELINE)
    add(S.COMPLETE, names.SEARCH)
    add(S.PRUNED, names.SEARCH, "incorrect_output")  # launched, then wrong: counted
    add(S.PRUNED, names.SEARCH, "constraint_violated")  # never launched
    add(S.PRUNED, names.SEARCH, "duplicate")  # another worker's
    add(S.FAIL, names.SEARCH, "port_taken")  # infrastructure: retried, not counted
    add(S.COMPLETE, names.CONFIRM)
    add(S.COMPLETE, names.ABLATION)  # `autotune ablate`, not the run
    add(S.WAITING, names.SEARCH)
    assert launches_made(study.get_trials(deepcopy=False)) == 4


# --- the race ----------------------------------------------------------------------------------


def test_race_stops_early_on_a_settled_ranking():
    # the leader is 30 % above the baseline, round after round, with 1 % noise; the other
    # candidate is clearly below it
    base = [100.0, 101.0]
    candidates = {"trial 3": [130.0, 131.0], "trial 5": [99.0, 100.0]}
    step = race_step(candidates, base, 1.0, rounds=2, max_rounds=4)
    assert step.stop == SETTLED
    assert step.keep == ("trial 3",)
    # a confirmed loss settles it too (lower is better here: the leader is slower)
    lower = race_step({"trial 3": [130.0, 131.0]}, base, -1.0, rounds=2, max_rounds=4)
    assert lower.stop == SETTLED


def test_race_goes_on_while_the_ranking_is_open():
    base = [100.0, 140.0]
    candidates = {"trial 3": [105.0, 150.0], "trial 5": [98.0, 145.0]}
    step = race_step(candidates, base, 1.0, rounds=2, max_rounds=4)
    assert step.stop is None and set(step.keep) == {"trial 3", "trial 5"}
    assert race_step(candidates, base, 1.0, rounds=4, max_rounds=4).stop == BUDGET
    # one round proves nothing: the race never decides before MIN_ROUNDS
    assert race_step({"trial 3": [130.0]}, [100.0], 1.0, rounds=1, max_rounds=4).stop is None
    assert race_step({}, base, 1.0, rounds=2, max_rounds=4).stop == ALL_ELIMINATED


def test_the_confirmations_rounds_leave_a_dropped_candidate_out():
    """What ``measure_variants`` is asked to launch round by round (``confirm.Race``): every
    variant first, then the baseline and the candidates still racing, then nothing."""
    from autotune.analysis.confirm import Race
    from autotune.analysis.remeasure import Variant, VariantMeasurements
    from autotune.study.record import TrialOutcome

    def measured(label, *values):
        m = VariantMeasurements(Variant(label, {}))
        m.outcomes = [TrialOutcome(0, "confirm", "correct", (v,)) for v in values]
        return m

    race = Race(1.0, 4 * 3, 0.0)  # 4 rounds x (baseline + 2): 12 launches
    labels = ["baseline", "trial 3", "trial 5"]
    assert race.next_round({k: measured(k) for k in labels}, 0) == labels
    # after two rounds trial 5 is clearly below trial 3, and trial 3's gain is still open
    results = {
        "baseline": measured("baseline", 100.0, 160.0),
        "trial 3": measured("trial 3", 150.0, 151.0),
        "trial 5": measured("trial 5", 90.0, 91.0),
    }
    assert race.next_round(results, 2) == ["baseline", "trial 3"]
    assert race.eliminated == ["trial 5"] and race.stopped_by is None
    results["baseline"] = measured("baseline", 100.0, 160.0, 101.0, 99.0)
    results["trial 3"] = measured("trial 3", 150.0, 151.0, 150.5, 150.2)
    # 10 launches made: trial 5's two unspent launches buy trial 3 a fifth round
    assert race.next_round(results, 4) == ["baseline", "trial 3"]
    results["baseline"] = measured("baseline", 100.0, 160.0, 101.0, 99.0, 130.0)
    results["trial 3"] = measured("trial 3", 150.0, 151.0, 150.5, 150.2, 150.3)
    assert race.next_round(results, 5) == []
    assert race.stopped_by == BUDGET  # its 12 launches spent, the gain still open


# --- the CLI against the fake server -----------------------------------------------------------

SPACE = """
parameters:
  decode_ms:
    type: categorical
    choices: [2, 20]
    baseline: 20
    target: {flag: --decode-ms}
  fault:
    type: categorical
    choices: [null, wrong_text]
    baseline: null
    target: {flag: --fault}
"""


def test_run_with_three_trials_launches_at_most_three_servers(tmp_path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="budget3")
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    study.enqueue_trial({"decode_ms": 2, "fault": None})  # ten times as fast: it measures better
    ran = CliRunner().invoke(app, ["run", "--spec", str(spec_path), "--trials", "3"])
    assert ran.exit_code == 0, ran.output
    assert "budget: 3 launches = 1 baseline + 2 search; no confirmation fits" in ran.output
    trials = study.get_trials(deepcopy=False)
    started = [t for t in trials if t.user_attrs.get(names.SERVER)]
    assert len(started) == launches_made(trials) <= 3
    assert not [t for t in trials if t.user_attrs.get(names.ROLE) == names.CONFIRM]
    assert (
        names.CONFIRMATION
        not in optuna.load_study(study_name="budget3", storage=spec.default_storage()).user_attrs
    )
    # the fast trial measured better once: the verdict still says nothing is confirmed
    assert trials[1].values[0] > trials[0].values[0]
    said = " ".join(ran.output.split())
    assert "no confirmed winner: the baseline stands" in said
    # the enqueued fast config, or the sampler's draw of it again
    assert re.search(r"the best unconfirmed config is trial [12], \+\d", said), said
    # export follows the verdict: the baseline, saying why (so `make demo TRIALS=3` ends well)
    exported = CliRunner().invoke(
        app, ["export", "--spec", str(spec_path), "-o", str(tmp_path / "b.yaml")]
    )
    assert exported.exit_code == 0, exported.output
    header = (tmp_path / "b.yaml").read_text()
    assert f"the BASELINE (trial {trials[0].number}): no confirmed winner" in header
    assert "no confirmation fits in 3 launches" in " ".join(header.split())
    assert re.search(r"^decode-ms: 20$", header, re.M), header  # the baseline's value, not 2
    said = " ".join(exported.output.split())
    assert "the baseline (trial 0; no confirmed winner: the baseline stands" in said, said
    # and --allow-unconfirmed writes the best measured trial, saying it is not confirmed
    unconfirmed = CliRunner().invoke(
        app,
        ["export", "--spec", str(spec_path), "-o", str(tmp_path / "u.yaml"), "--allow-unconfirmed"],
    )
    assert unconfirmed.exit_code == 0, unconfirmed.output
    assert "NOT a confirmed gain" in (tmp_path / "u.yaml").read_text()
    # resuming with the same budget launches nothing more
    again = CliRunner().invoke(app, ["run", "--spec", str(spec_path), "--trials", "3"])
    assert again.exit_code == 0, again.output
    assert launches_made(study.get_trials(deepcopy=False)) == launches_made(trials)
    # a larger budget that holds a confirmation: the earlier "none fitted" no longer stands
    more = CliRunner().invoke(
        app,
        ["run", "--spec", str(spec_path), "--trials", "8", "--confirm-top", "1"]
        + ["--confirm-repeats", "2"],
    )
    assert more.exit_code == 0, more.output
    attrs = optuna.load_study(study_name="budget3", storage=spec.default_storage()).user_attrs
    assert attrs[names.CONFIRMATION_SKIPPED] is None
    assert attrs[names.CONFIRMATION]["launches"] >= 2


def test_explicit_repeats_that_do_not_fit_exit_2_before_anything_is_written(tmp_path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="budgetbad")
    spec = load_spec(spec_path)
    ran = CliRunner().invoke(
        app, ["run", "--spec", str(spec_path), "--trials", "5", "--confirm-repeats", "3"]
    )
    assert ran.exit_code == 2, ran.output
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--confirm-repeats" in lines[0], ran.stderr
    assert "--trials to at least 11" in " ".join(ran.stderr.split())
    assert not sqlite_file(spec.default_storage()).exists()


def test_the_confirmation_is_raced_inside_the_budget(tmp_path):
    """--trials 8 with two rounds asked: the baseline and three search trials, then at most
    2 x (baseline + 1) confirmation launches; the study records how the race stopped."""
    spec_path = write_fake_spec(tmp_path, SPACE, name="budget8")
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    study.enqueue_trial({"decode_ms": 2, "fault": None})
    ran = CliRunner().invoke(
        app,
        ["run", "--spec", str(spec_path), "--trials", "8", "--confirm-top", "1",
         "--confirm-repeats", "2"],
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    said = " ".join(ran.output.split())
    assert "budget: 8 launches = 1 baseline + 3 search + 2 rounds x (baseline + 1)" in said
    trials = study.get_trials(deepcopy=False)
    assert len([t for t in trials if t.user_attrs.get(names.SERVER)]) == launches_made(trials)
    assert launches_made(trials) <= 8
    confirm = [t for t in trials if t.user_attrs.get(names.ROLE) == names.CONFIRM]
    stored = optuna.load_study(study_name="budget8", storage=spec.default_storage())
    record = stored.user_attrs[names.CONFIRMATION]
    assert record["planned_launches"] == 4
    assert record["launches"] == len(confirm) <= 4
    assert record["stopped_by"] in {"settled", "precise", "budget"}
    assert f"the race stopped after {record['repeats']} rounds ({record['stopped_by']})" in said
