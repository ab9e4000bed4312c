"""The search strategy (autotune/search/strategy.py) and its benchmark harness.

* the default strategy is recorded in the study, kept on resume, replaced when asked for;
* ``--sampler`` with an unknown name is bad input (exit code 2);
* ``AutoSampler`` never asks for a constraint-violating or already launched config, plans
  its first trials from a balanced design, then the model; it learns a wrong region;
* ``--warm-start``: the source's best verified configs are queued first, pinned, once;
* the harness runs a landscape it has never seen (written here) and writes the JSON names,
  and counts the simulated confirmation's launches;
* the search model ranks by posterior mean (one lucky draw does not win), its feasibility
  model learns where configs fail; confirmation candidates come from that ranking.
"""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial
from typer.testing import CliRunner

from autotune import names
from autotune.analysis.confirm import gain_with_ci, rank_candidates
from autotune.cli.app import app
from autotune.errors import SpecError
from autotune.search.model import Encoder, Feasibility, fit_speed, rank_by_posterior
from autotune.search.strategy import (
    N_DESIGN,
    SAMPLER_ATTR,
    AutoSampler,
    build_sampler,
    config_key,
    risky_choices,
)
from autotune.space.load import load_space
from autotune.spec.load import load_spec
from autotune.study.loop import open_study
from autotune.study.warm_start import WARM_START_FROM, warm_start
from benchmarks.search import ROOT
from benchmarks.search.cli import main as harness_main
from benchmarks.search.landscape import DEFAULT_COST, Landscape, load_landscape
from benchmarks.search.run import RunResult, reports_winner, run_strategy
from benchmarks.search.stats import summarize
from benchmarks.search.suite import LANDSCAPES
from benchmarks.search.truth import true_best
from tests.builders import write_fake_spec

SPACE = """
parameters:
  decode_ms:
    type: categorical
    choices: [20, 10, 5]
    baseline: 20
    target: {flag: --decode-ms}
  fault:
    type: categorical
    choices: [null, corrupt_words]
    baseline: null
    target: {flag: --fault}
"""

TOY_SPACE = """
parameters:
  mode:
    type: categorical
    choices: [slow, fast, broken]
    baseline: slow
    target: {flag: --mode}
  size:
    type: int
    low: 1
    high: 64
    log: true
    target: {flag: --size}
  frac:
    type: float
    low: 0.5
    high: 1.0
    step: 0.05
    target: {flag: --frac}
  flag:
    type: bool
    target: {flag: --flag}
constraints:
  - size * frac <= 60
"""

#: a landscape the project has never seen: "broken" is fast and wrong, frac above 0.9 does not
#: start, size has an interior optimum near 16
TOY_LANDSCAPE = """
import math

def f(params):
    mode = params.get("mode", "slow")
    size = params.get("size", 4)
    frac = params.get("frac", 0.7)
    if frac > 0.9:
        return {"failure": "oom"}
    speed = {"slow": 10.0, "fast": 20.0, "broken": 30.0}[mode]
    speed *= 1.0 - 0.1 * math.log2(size / 16.0) ** 2 / 4
    speed *= 1.0 + frac - 0.5 + (0.05 if params.get("flag") else 0.0)
    out = {"tok_s": max(speed, 0.1)}
    if mode == "broken":
        out["correct"] = False
    return out
"""


def _toy(tmp_path):
    space_path = tmp_path / "toy.yaml"
    space_path.write_text(textwrap.dedent(TOY_SPACE))
    land_path = tmp_path / "toy_landscape.py"
    land_path.write_text(TOY_LANDSCAPE)
    return space_path, land_path


# --- the study records its strategy -------------------------------------------------------


def test_default_strategy_is_recorded_kept_on_resume_and_replaced_when_asked(tmp_path):
    spec = load_spec(write_fake_spec(tmp_path, SPACE, name="strat"))
    url = spec.default_storage()
    study, created = open_study(spec, url)
    assert created
    assert study.user_attrs[SAMPLER_ATTR] == "auto"
    assert isinstance(study.sampler, AutoSampler)

    study, created = open_study(spec, url, sampler_name="random")
    assert not created
    assert study.user_attrs[SAMPLER_ATTR] == "random"
    assert isinstance(study.sampler, optuna.samplers.RandomSampler)

    # resumed without --sampler: the study's own (recorded) strategy, not the default
    study, _ = open_study(spec, url)
    assert study.user_attrs[SAMPLER_ATTR] == "random"
    assert isinstance(study.sampler, optuna.samplers.RandomSampler)


def test_unknown_sampler_is_bad_input(tmp_path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="badsampler")
    ran = CliRunner().invoke(
        app, ["run", "--spec", str(spec_path), "--trials", "1", "--sampler", "bayes"]
    )
    assert ran.exit_code == 2, ran.output
    assert "--sampler" in ran.output and "bayes" in ran.output
    assert not list(tmp_path.glob("*.db")), "nothing may be created on bad input"
    with pytest.raises(SpecError):
        build_sampler("bayes", load_spec(spec_path).space, 0)


# --- AutoSampler on its own ---------------------------------------------------------------


def _drive(space, land, sampler, launches):
    """The harness's loop, without noise: (config, outcome) per launch, plus the study."""
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(space.baseline_optuna_params(), user_attrs={names.ROLE: "baseline"})
    seen = []
    while len(seen) < launches:
        trial = study.ask()
        role = trial.user_attrs.get(names.ROLE, "search")
        values = (
            space.suggest(trial, only=space.baseline_names())
            if role == "baseline"
            else space.suggest(trial)
        )
        assert not space.violated(values), f"asked for a constraint-violating config {values}"
        out = land(values)
        seen.append((dict(trial.params), out))
        if not out.started or not out.correct:
            trial.set_user_attr(names.CORRECT, out.started and out.correct)
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
        else:
            trial.set_user_attr(names.CORRECT, True)
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 0.0)
            study.tell(trial, out.true)
    return seen, study


def test_auto_sampler_designs_first_never_repeats_and_learns_the_wrong_region(tmp_path):
    space_path, land_path = _toy(tmp_path)
    space = load_space(space_path)
    land = load_landscape(f"{land_path}:f", noise=0.0)
    sampler = AutoSampler(space, seed=3)
    seen, _study = _drive(space, land, sampler, 30)
    keys_seen = [config_key(params) for params, _ in seen]
    assert len(set(keys_seen)) == len(keys_seen), "a launched config was asked for again"
    phases = [sampler.phase_of[n] for n in sorted(sampler.phase_of)]
    assert phases[:N_DESIGN] == ["design"] * N_DESIGN
    assert set(phases[N_DESIGN:]) <= {"sweep", "model", "check"} and "sweep" in phases
    assert len(sampler.ask_seconds) == len(phases) - N_DESIGN
    # the balanced design: each mode value within one of an equal share
    modes = [params["mode"] for params, _ in seen[1 : 1 + N_DESIGN]]
    assert max(modes.count(m) for m in ("slow", "fast", "broken")) <= math.ceil(N_DESIGN / 3)
    # the wrong region ("broken", fastest of all) and the OOM cliff are learned as bad: the
    # model phase's last ten launches avoid them far more than a uniform draw would (1/3)
    late = [params for params, _ in seen[-10:]]
    assert sum(p["mode"] == "broken" for p in late) <= 2
    assert sum(p["frac"] > 0.9 for p in late) <= 2


def test_risky_choices_stay_out_of_the_design_and_are_tried_once_the_safe_ones_are_known(
    tmp_path,
):
    space_path, land_path = _toy(tmp_path)
    space = load_space(space_path)
    land = load_landscape(f"{land_path}:f", noise=0.0)
    for seed in range(4):
        sampler = AutoSampler(space, seed=seed, risky={"mode": ["broken"]})
        seen, _study = _drive(space, land, sampler, 20)
        modes = [params.get("mode") for params, _ in seen]
        design = modes[1 : 1 + N_DESIGN]
        assert "broken" not in design, f"seed {seed}: a risky choice in the design {design}"
        assert {"slow", "fast"} <= set(design)
        # the penalty is a prior, not a ban: the model still tries it once the rest is known
        assert "broken" in modes[1 + N_DESIGN :], f"seed {seed}: risky choice never tried"
        # and learns it is wrong: tried at most twice in 20 launches
        assert modes.count("broken") <= 2


def test_risky_choices_come_from_patch_kinds_and_the_engines_lossy_choices():
    space = load_space_text(
        """
        parameters:
          shard_swap:
            type: categorical
            choices: [none, swap]
            target: {patch: shard_swap}
          fast_path:
            type: bool
            target: {patch: fast_path}
          kv:
            type: categorical
            choices: [auto, fp8, fp8_e5m2]
            target: {flag: --kv-cache-dtype}
          seqs:
            type: int
            low: 1
            high: 8
            target: {flag: --max-num-seqs}
        """
    )
    patches = {"shard_swap": ("fault", "none"), "fast_path": ("optimization", False)}

    def lossy(target, value):
        return "changes numerics" if target == "--kv-cache-dtype" and value != "auto" else None

    assert risky_choices(space, patches, lossy) == {
        "shard_swap": ("swap",),
        "kv": ("fp8", "fp8_e5m2"),
    }
    experimental = {"shard_swap": ("experimental", "none"), "fast_path": ("experimental", False)}
    assert risky_choices(space, experimental) == {"shard_swap": ("swap",), "fast_path": (True,)}
    assert risky_choices(space) == {}


#: a separable landscape with one interaction and a wrong region: eight choice dimensions of
#: three values (6,561 configs), each worth 5-40 %; "c=2" is fast only with "d=1" and wrong
#: with "e=0"; the best is all 2s but d=1 (1 of 6,561 configs)
SEPARABLE_SPACE = "parameters:\n" + "".join(
    f"  {n}:\n    type: categorical\n    choices: [0, 1, 2]\n    target: {{flag: --{n}}}\n"
    for n in "abcdefgh"
)
SEPARABLE_GAIN = {
    "a": 0.4,
    "b": 0.3,
    "c": 0.2,
    "d": 0.15,
    "e": 0.1,
    "f": 0.08,
    "g": 0.05,
    "h": 0.05,
}


def _separable(params):
    if params.get("c") == 2 and params.get("e") == 0:
        return {"tok_s": 500.0, "correct": False}
    value = 100.0
    for name, gain in SEPARABLE_GAIN.items():
        level = params.get(name, 0)
        if name == "d":
            level = {0: 0, 1: 2, 2: 1}[level]
        value *= 1.0 + gain * level / 2
    if params.get("c") == 2 and params.get("d") != 1:
        value *= 0.8
    return {"tok_s": value}


def test_auto_sampler_finds_the_best_of_a_separable_landscape_within_40_launches(tmp_path):
    space_path = tmp_path / "separable.yaml"
    space_path.write_text(SEPARABLE_SPACE)
    space = load_space(space_path)
    land = Landscape(_separable, "separable", 0.0, (), dict(DEFAULT_COST))
    best = _separable({n: 2 for n in "abcdefgh"} | {"d": 1})["tok_s"]
    for seed in range(3):
        seen, _study = _drive(space, land, AutoSampler(space, seed=seed), 40)
        values = [out.true for _, out in seen if out.started and out.correct]
        assert max(values) >= 0.95 * best, f"seed {seed}: best {max(values):.1f} of {best:.1f}"
        assert sum(not out.correct for _, out in seen) <= 4, "the wrong region not learned"


def test_auto_sampler_leaves_enqueued_trials_alone():
    space = load_space_text(TOY_SPACE)
    study = optuna.create_study(direction="maximize", sampler=AutoSampler(space, seed=0))
    study.enqueue_trial({"mode": "fast", "size": 7, "frac": 0.55, "flag": True})
    trial = study.ask()
    assert space.suggest(trial) == {"mode": "fast", "size": 7, "frac": 0.55, "flag": True}


def load_space_text(text, _cache={}):  # noqa: B006 - a tiny memo for the tests
    import tempfile
    from pathlib import Path

    if text not in _cache:
        with tempfile.TemporaryDirectory() as folder:  # read at load: nothing is left in /tmp
            path = Path(folder) / "space.yaml"
            path.write_text(textwrap.dedent(text))
            _cache[text] = load_space(path)
    return _cache[text]


# --- warm start ---------------------------------------------------------------------------


def _source_study(storage, name):
    source = optuna.create_study(storage=storage, study_name=name, direction="maximize")
    dists = {
        "mode": CategoricalDistribution(["slow", "fast", "broken"]),
        "frac": FloatDistribution(0.5, 1.0, step=0.05),
    }

    def add(params, value, correct, role="search"):
        trial = create_trial(
            params=params,
            distributions={k: dists[k] for k in params},
            value=value if correct else None,
            state=TrialState.COMPLETE if correct else TrialState.PRUNED,
            user_attrs={names.CORRECT: correct, names.ROLE: role, names.PARAMS_RESOLVED: params},
            system_attrs={f"constraints:{names.CORRECTNESS_CONSTRAINT}": 0.0 if correct else 1.0},
        )
        source.add_trial(trial)

    add({"mode": "slow"}, 10.0, True, role="baseline")
    add({"mode": "broken", "frac": 0.9}, None, False)  # wrong: never warm-starts anything
    add({"mode": "fast", "frac": 0.6}, 20.0, True)
    add({"mode": "fast", "frac": 0.8}, 25.0, True)
    add({"mode": "slow", "frac": 0.8}, 12.0, True)
    return source


def test_warm_start_queues_the_sources_best_verified_configs_once(tmp_path):
    storage = f"sqlite:///{tmp_path / 'ws.db'}"
    space = load_space_text(TOY_SPACE)
    source = _source_study(storage, "older-vllm")
    study = optuna.create_study(storage=storage, study_name="new", direction="maximize")
    lines = warm_start(study, source, space, top=2)
    assert lines == ["warm start: queued older-vllm#3", "warm start: queued older-vllm#2"]
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs[names.PINNED] for t in waiting] == [
        {"mode": "fast", "frac": 0.8},
        {"mode": "fast", "frac": 0.6},
    ]
    assert all(t.user_attrs[names.ROLE] == "search" for t in waiting)
    assert study.user_attrs[WARM_START_FROM] == "older-vllm"
    assert warm_start(study, source, space) == []  # once per study
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2


def test_warm_start_from_a_missing_study_is_bad_input(tmp_path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="wsmissing")
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    from autotune.study.warm_start import warm_start_from

    with pytest.raises(SpecError, match="no study named 'nope'"):
        warm_start_from(study, spec, spec.default_storage(), "nope")


# --- the harness on a landscape it has never seen -----------------------------------------


def test_harness_runs_an_unseen_landscape_and_writes_the_keys(tmp_path, capsys):
    space_path, land_path = _toy(tmp_path)
    out = tmp_path / "result.json"
    code = harness_main(
        [
            "--space",
            str(space_path),
            "--landscape",
            f"{land_path}:f",
            "--noise",
            "0.05",
            "--seeds",
            "3",
            "--seed-sets",
            "2",
            "--budget",
            "12",
            "--strategies",
            "auto,random,grid-random,grid-sweep-nogate",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    result = json.loads(out.read_text())
    # the true best: "fast", size 16, frac 0.9, flag on (exhaustive over the small dims, then
    # polished); "broken" is faster but wrong and never the best
    assert result["true_best_config"]["mode"] == "fast"
    assert result["true_best"] == pytest.approx(20.0 * (1 + 0.9 - 0.5 + 0.05))
    assert len(result["seed_sets"]) == 2
    assert result["seed_sets"][1]["seeds"] == "100-102"
    for name in ("auto", "random", "grid-random", "grid-sweep-nogate"):
        figures = result["strategies"][name]
        assert "trials_to_95pct_median" in figures
        assert "not_reached_within_budget" in figures
        assert figures["incorrect_reported_as_best"] == 0 or name.endswith("nogate")
    assert "p_mann_whitney_vs_random" in result["strategies"]["auto"]
    assert result["strategies"]["auto"]["ask_ms"]["n"] > 0
    assert "auto" in capsys.readouterr().out


NEEDLE_SPACE = """
parameters:
  x:
    type: categorical
    choices: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    target: {flag: --x}
"""


def test_harness_measures_the_reference_median_past_the_budget(tmp_path, capsys):
    """Random search finds one good choice of 20 in about 14 draws, then confirms it (6
    launches without noise): its median is about 20, far past a budget of 5. Capped at budget
    + 1 it read 6, and the ratio to it was 1.0 for a strategy that misses every run; the
    reference strategies run on to --reference-budget, misses still count within --budget."""
    space = tmp_path / "needle.yaml"
    space.write_text(textwrap.dedent(NEEDLE_SPACE))
    land = tmp_path / "needle.py"
    land.write_text("def f(params):\n    return {'tok_s': 10.0 if params.get('x') == 7 else 1.0}\n")
    out = tmp_path / "r.json"
    args = ["--space", str(space), "--landscape", f"{land}:f", "--noise", "0", "--seeds", "8",
            "--seed-sets", "1", "--budget", "5", "--strategies", "random,grid-random",
            "--reference-budget", "60", "--out", str(out)]  # fmt: skip
    assert harness_main(args) == 0
    figures = json.loads(out.read_text())["strategies"]
    random_runs = figures["random"]
    assert random_runs["budget_launches"] == 60
    per_seed = random_runs["trials_to_95pct_per_seed"]
    assert max(per_seed) > 6  # measured past --budget + 1
    assert random_runs["trials_to_95pct_median"] > 6
    assert not random_runs["median_is_lower_bound"]
    assert random_runs["not_reached_within_budget"] == sum(h > 5 for h in per_seed)
    found = random_runs["found_95pct_per_seed"]
    assert all(f <= h for f, h in zip(found, per_seed, strict=True))
    assert random_runs["missed_after_launching_target"] == sum(
        h > 5 and f <= 5 for f, h in zip(found, per_seed, strict=True)
    )
    grid = figures["grid-random"]
    assert grid["ratio_to_random_median"] == pytest.approx(
        grid["trials_to_95pct_median"] / random_runs["trials_to_95pct_median"], abs=1e-3
    )
    assert grid["ratio_is_upper_bound"] is False
    assert "reference strategies run to 60" in capsys.readouterr().out

    # a reference budget too short for half of random's runs: its median is a lower bound,
    # printed as such, and every ratio to it an upper bound
    assert harness_main([*args[:-4], "--reference-budget", "5", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["strategies"]
    assert figures["random"]["median_is_lower_bound"]
    assert ">5" in capsys.readouterr().out


def test_harness_tells_misses_of_the_search_from_misses_of_the_report(tmp_path):
    """The grid in declaration order launches the needle (x = 7) at launch 9, after the
    baseline and x = 0..6. No budget confirms before its search has made 16 launches (a fifth
    of 20 holds 2 rounds x (baseline + 1)); without noise that confirmation settles in its 2
    rounds. Within 12 launches no report can fit (16 + 4 = 20): a miss of the search, said so;
    within 20 the same run reaches the target."""
    space = tmp_path / "needle.yaml"
    space.write_text(textwrap.dedent(NEEDLE_SPACE))
    land = tmp_path / "needle.py"
    land.write_text("def f(params):\n    return {'tok_s': 10.0 if params.get('x') == 7 else 1.0}\n")
    out = tmp_path / "r.json"

    def figures(budget: int) -> dict:
        args = ["--space", str(space), "--landscape", f"{land}:f", "--noise", "0", "--seeds", "3",
                "--seed-sets", "1", "--budget", str(budget), "--reference-budget", str(budget),
                "--strategies", "grid-sweep", "--out", str(out)]  # fmt: skip
        assert harness_main(args) == 0
        return json.loads(out.read_text())["strategies"]["grid-sweep"]

    short = figures(12)
    assert short["found_95pct_per_seed"] == [9, 9, 9]
    assert short["not_reached_within_budget"] == 3
    assert short["missed_after_launching_target"] == 3  # launched within 12 ...
    assert short["missed_even_with_a_perfect_report"] == 3  # ... but too late to confirm
    enough = figures(20)
    assert enough["trials_to_95pct_per_seed"] == [20, 20, 20]
    assert enough["missed_even_with_a_perfect_report"] == 0


def _synthetic_run(budget: int, reached_at: int | None, confirm: int = 6) -> RunResult:
    """A run of ``budget`` launches whose report reaches the target (1.0) at ``reached_at``."""
    run = RunResult("x", 0, budget=budget)
    for i in range(1, budget + 1):
        hit = reached_at is not None and i >= reached_at
        run.best_true_after.append(1.0 if hit else 0.5)
        run.best_correct_after.append(True)
        run.minutes_after.append(float(i))
        run.confirm_launches_after.append(confirm)
    return run


@pytest.mark.parametrize(
    ("strategy", "reference", "ratio", "bound"),
    [
        # both measured: the plain ratio of medians (10 + 6 over 40 + 6)
        ((10, 10, 10), (40, 40, 40), 16 / 46, None),
        # random's median past its budget: the ratio is at most 16 / 201
        ((10, 10, 10), (None, None, 40), 16 / 201, "upper"),
        # this strategy's past its own: at least 61 / 46
        ((None, None, 10), (40, 40, 40), 61 / 46, "lower"),
        # both past their budgets: no ratio at all (61 / 201 bounds nothing)
        ((None, None, 10), (None, None, 40), None, None),
    ],
)
def test_ratio_to_random_is_a_bound_only_where_one_median_is(strategy, reference, ratio, bound):
    runs = [_synthetic_run(60, r) for r in strategy]
    random_runs = [_synthetic_run(200, r) for r in reference]
    cost = dict(DEFAULT_COST)
    hits = summarize(random_runs, 1.0, 60, None, cost)
    out = summarize(
        runs,
        1.0,
        60,
        hits["trials_to_95pct_per_seed"],
        cost,
        reference_censored=hits["median_is_lower_bound"],
    )
    assert out["ratio_to_random_median"] == (
        None if ratio is None else pytest.approx(ratio, abs=1e-3)
    )
    assert out["ratio_is_upper_bound"] is (bound == "upper")
    assert out["ratio_is_lower_bound"] is (bound == "lower")
    # misses count within 60 for both, whatever their own budgets
    assert hits["not_reached_within_budget"] == sum(r is None or r + 6 > 60 for r in reference)


def test_ranking_benchmark_compares_the_posterior_with_measurements_and_the_truth(tmp_path):
    """benchmarks/ranking.py: the oracle's top 2 holds a config within 5 % whenever one was
    measured, no ranking does better than it, and the file has the figures per snapshot."""
    from benchmarks import ranking

    space_path, land_path = _toy(tmp_path)
    out = tmp_path / "rank.json"
    args = ["--space", str(space_path), "--landscape", f"{land_path}:f", "--noise", "0.05",
            "--seeds", "3", "--budget", "16", "--snapshots", "8,16", "--out", str(out)]  # fmt: skip
    assert ranking.main(args) == 0
    result = json.loads(out.read_text())
    for n in ("8", "16"):
        row = result["snapshots"][n]
        assert row["oracle"]["top2_hit"] == row["target_measured"]
        assert row["oracle"]["top2_regret"] == 0
        for name in ("posterior", "measurement", "evidence", "local"):
            assert row[name]["top2_hit"] <= row["oracle"]["top2_hit"]
            assert row[name]["top2_regret"] >= 0
    assert ranking.main([*args[:-4], "--snapshots", "99", "--out", str(out)]) == 2


def test_harness_rejects_a_landscape_that_breaks_the_protocol(tmp_path, capsys):
    space_path, _ = _toy(tmp_path)
    bad = tmp_path / "bad_landscape.py"
    bad.write_text("def f(params):\n    return 3.0\n")
    code = harness_main(
        ["--space", str(space_path), "--landscape", f"{bad}:f", "--seeds", "1",
         "--seed-sets", "1", "--out", str(tmp_path / "r.json")]
    )  # fmt: skip
    assert code == 2
    assert "bad_landscape.py:f" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
    assert harness_main(["--landscape", f"{tmp_path / 'none.py'}:f"]) == 2


# --- the search model: ranking by posterior mean, and where configs fail --------------------

RANK_SPACE = """
parameters:
  mode:
    type: categorical
    choices: [good, bad]
    target: {flag: --mode}
  knob:
    type: categorical
    choices: [a, b, c, d]
    target: {flag: --knob}
"""


#: the search benchmark's numeric landscape (results/search_efficiency_numeric.json)
NUMERIC_SPACE = ROOT / "search_spaces" / "numeric-sim.yaml"
NUMERIC_LANDSCAPE = "benchmarks/landscapes/numeric.py:landscape"


def test_auto_sampler_finds_an_interior_peak_of_numeric_values():
    """Main effects and pairs alone extrapolate a peak to the domain's corners: the search
    launched (1.0, 1000) and its neighbours over and over and missed the benchmark's target in
    25-28 of 30 runs. The local term, chosen by evidence (``search.model.fit_speed``), finds it
    in every run (``benchmarks/results/search_efficiency_numeric.json``)."""
    space = load_space(NUMERIC_SPACE)
    land = load_landscape(NUMERIC_LANDSCAPE, None)
    best, _, _ = true_best(space, land)
    for seed in range(6):
        run = run_strategy("auto", space, land, seed, 30, 0.95 * best, True)
        assert run.found_at is not None, f"seed {seed}: no launch within 5 % of the peak in 30"


def test_auto_sampler_checks_a_choice_its_model_wrote_off_from_far_away_measurements():
    """On the ``offload`` landscape the best config needs CUDA graphs (``enforce_eager``
    False) at a memory fraction just under the cliff. Early launches with eager off were slow
    or failed for other reasons (CPU offload, a fraction past the cliff), the model wrote
    eager off, and the sweep then walked the plateau with eager on until the budget ran out:
    4 of these 12 seeds never launched a config within 5 % in 60. Checks of written-off
    choices once the sweep stalls (``AutoSampler._check_point``) find it in every one."""
    entry = LANDSCAPES["offload"]
    space = load_space(ROOT / entry.space)
    land = load_landscape(entry.landscape, None)
    best, _, _ = true_best(space, land)
    for seed in range(12):
        run = run_strategy("auto", space, land, seed, 60, 0.95 * best, True)
        assert run.found_at is not None, f"seed {seed}: no launch within 5 % of the best in 60"


def test_the_speed_model_adds_its_local_term_only_where_the_data_need_it():
    enc = Encoder(load_space(NUMERIC_SPACE))
    land = load_landscape(NUMERIC_LANDSCAPE, 0.0)
    rng = np.random.default_rng(0)
    configs = [
        {"fraction": float(u), "tokens": int(v)}
        for u, v in zip(rng.random(20), rng.integers(1, 1000, 20), strict=True)
    ]
    x = np.array([enc.row(c) for c in configs])
    peaked = np.array([math.log(land(c).true) for c in configs])
    assert fit_speed(enc, x, peaked).local_sd > 0
    flat = np.array([0.01 * c["fraction"] for c in configs]) + rng.normal(0, 0.05, 20)
    assert fit_speed(enc, x, flat).local_sd == 0
    # a space without numeric dimensions has no local term to add
    cats = Encoder(load_space_text(RANK_SPACE))
    rows = np.array([cats.row({"mode": m, "knob": k}) for m in ("good", "bad") for k in "abcd"])
    assert fit_speed(cats, rows, np.arange(8) * 0.1).local_sd == 0


def test_ranking_by_posterior_mean_is_not_fooled_by_one_lucky_measurement():
    space = load_space_text(RANK_SPACE)
    # every "good" config measures about 100, every "bad" one about 60; one "bad" config had
    # a lucky draw of 104: the highest single measurement, but its setting is known to be slow
    good = {"a": 100, "b": 101, "c": 99, "d": 100}
    observations = [({"mode": "good", "knob": k}, math.log(v)) for k, v in good.items()]
    observations += [({"mode": "bad", "knob": k}, math.log(60)) for k in "abc"]
    observations.append(({"mode": "bad", "knob": "d"}, math.log(104)))
    order = rank_by_posterior(space, observations)
    assert max(range(len(observations)), key=lambda i: observations[i][1]) == 7  # the lucky one
    assert [observations[i][0]["mode"] for i in order[:2]] == ["good", "good"]
    assert order[0] != 7 and order[1] != 7
    # too few observations to model: their own measurements rank them
    assert rank_by_posterior(space, observations[5:8]) == [2, 0, 1]


def test_ranking_benchmarks_alternative_models_are_not_fooled_by_one_lucky_measurement():
    """benchmarks/ranking.py's two alternative models (scales by evidence; a GP over how many
    settings two configs share) pool a lucky draw with its neighbours as the product's does."""
    from benchmarks import ranking

    space = load_space_text(RANK_SPACE)
    good = {"a": 100, "b": 101, "c": 99, "d": 100}
    observations = [({"mode": "good", "knob": k}, math.log(v)) for k, v in good.items()]
    observations += [({"mode": "bad", "knob": k}, math.log(60)) for k in "abc"]
    observations.append(({"mode": "bad", "knob": "d"}, math.log(104)))
    encoder = Encoder(space)
    x = np.array([encoder.row(c) for c, _ in observations])
    y = np.array([v for _, v in observations])
    for means in (ranking.evidence_means, ranking.local_means):
        mean = means(encoder, x, y)
        assert mean[7] < min(mean[:4]), means.__name__  # the lucky "bad" config is not on top
        assert mean[7] > max(mean[4:7]), means.__name__  # nor as slow as its measured twins


def test_feasibility_learns_the_failing_region_and_leaves_untried_choices_alone():
    space = load_space_text(TOY_SPACE)
    enc = Encoder(space)

    def row(mode, frac, size=16, flag=False):
        return enc.row({"mode": mode, "size": size, "frac": frac, "flag": flag})

    ok = np.array([row(m, f) for m in ("slow", "fast") for f in (0.5, 0.6, 0.7, 0.8)])
    bad = np.array([row(m, 1.0) for m in ("slow", "fast")] + [row("fast", 0.95)])
    feasible = Feasibility.fit(ok, bad, len(enc.dims))
    p_fail_region = math.exp(feasible.log_probability(np.array([row("slow", 0.95)]))[0])
    p_ok_region = math.exp(feasible.log_probability(np.array([row("slow", 0.6)]))[0])
    p_untried = math.exp(feasible.log_probability(np.array([row("broken", 0.6)]))[0])
    assert p_fail_region < 0.5 < p_ok_region
    assert p_untried > 0.8, "a choice never tried is not made to look risky"
    assert Feasibility.fit(ok, np.empty((0, enc.width)), len(enc.dims)).model is None


def test_confirmation_candidates_are_ranked_by_the_model_one_per_config_without_the_baseline():
    space = load_space_text(RANK_SPACE)
    dists = {
        "mode": CategoricalDistribution(["good", "bad"]),
        "knob": CategoricalDistribution(list("abcd")),
    }

    def trial(number, params, value, role="search"):
        return create_trial(
            params=params,
            distributions={k: dists[k] for k in params},
            value=value,
            user_attrs={names.ROLE: role, names.CORRECT: True, names.PARAMS_RESOLVED: params},
            system_attrs={"constraints": [0.0]},
        )

    trials = [trial(0, {}, 80.0, role="baseline")]
    trials += [trial(i, {"mode": "good", "knob": k}, 100.0 + i) for i, k in enumerate("abcd", 1)]
    trials += [trial(5 + i, {"mode": "bad", "knob": k}, 60.0) for i, k in enumerate("abc")]
    trials.append(trial(8, {"mode": "bad", "knob": "d"}, 106.0))  # the luckiest draw
    trials.append(trial(9, {"mode": "good", "knob": "d"}, 103.0))  # a repeat of a config
    picked = rank_candidates(space, trials, 1.0, 3)
    configs = [t.user_attrs[names.PARAMS_RESOLVED] for t in picked]
    assert all(c["mode"] == "good" for c in configs), configs
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == 3
    assert all(t.user_attrs[names.ROLE] != "baseline" for t in picked)


def test_harness_counts_the_confirmations_launches(tmp_path):
    """The harness plans and races the confirmation with the product's own functions
    (``study.budget.plan_budget``, ``analysis.confirm.race_step``): nothing is reported
    confirmed before a budget holds a confirmation (20 launches), and the launches it counts
    are those ``autotune run`` would make."""
    space_path, land_path = _toy(tmp_path)
    args = ["--space", str(space_path), "--landscape", f"{land_path}:f", "--noise", "0.0",
            "--seeds", "2", "--seed-sets", "1", "--budget", "30",
            "--strategies", "auto,random"]  # fmt: skip
    assert harness_main([*args, "--out", str(tmp_path / "c.json")]) == 0
    assert harness_main([*args, "--confirm-top", "0", "--out", str(tmp_path / "n.json")]) == 0
    confirmed = json.loads((tmp_path / "c.json").read_text())
    unconfirmed = json.loads((tmp_path / "n.json").read_text())
    assert confirmed["confirmation"]["top"] == 2 and confirmed["confirmation"]["repeats"] is None
    # without noise the race settles after its first two rounds: 2 x (baseline + 1) launches
    # where the plan holds one candidate (16-25 search launches), 2 x (baseline + 2) beyond
    assert confirmed["strategies"]["random"]["not_reached_within_budget"] < 2
    assert 4 <= confirmed["strategies"]["random"]["confirmation_launches_median"] <= 6
    assert isinstance(unconfirmed["confirmation"], str)
    assert unconfirmed["strategies"]["random"]["confirmation_launches_median"] == 0
    # with 30 % noise two rounds settle less: the race goes on, within its plan (4 x 3 at most)
    noisy = [a if a != "0.0" else "0.3" for a in args]
    assert harness_main([*noisy, "--out", str(tmp_path / "z.json")]) == 0
    noisy_result = json.loads((tmp_path / "z.json").read_text())
    assert 6 < noisy_result["strategies"]["random"]["confirmation_launches_median"] <= 4 * 3
    for name in ("auto", "random"):
        with_c = confirmed["strategies"][name]["trials_to_95pct_per_seed"]
        without = unconfirmed["strategies"][name]["trials_to_95pct_per_seed"]
        found = confirmed["strategies"][name]["found_95pct_median"]
        assert found <= confirmed["strategies"][name]["search_launches_to_95pct_median"]
        missed = confirmed["strategies"][name]["budget_launches"] + 1
        for a, b in zip(with_c, without, strict=True):
            # no budget below 20 confirms (the baseline stands); without noise the race
            # reports a config the search had found, at least four launches later
            assert a == missed or a >= max(b, 16) + 4


def test_the_harness_reports_a_confirmed_winner_only_when_the_product_would():
    """A point gain whose 95 % interval includes no change is "no confirmed winner: the
    baseline stands" in ``autotune run`` (``study.results.unconfirmed_gain``), so the harness
    must report the baseline there too, not the winner: a looser rule would count as reached
    what the product never reports."""
    clear = ((110.0, 111.0, 109.0), (100.0, 101.0, 99.0))  # +10 %, interval above zero
    assert gain_with_ci(*clear, 1.0)[1][0] > 0 and reports_winner(*clear)
    assert not reports_winner((90.0, 91.0), (100.0, 101.0))  # a confirmed loss
    lucky = ((120.0, 95.0), (100.0, 100.5))  # point gain +7 %, interval -76 % .. +368 %
    gain, (low, _high) = gain_with_ci(*lucky, 1.0)
    assert gain > 0 > low  # the old rule (a point gain above zero) reported this winner
    assert not reports_winner(*lucky)
