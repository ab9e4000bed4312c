"""The search benchmark's suite (``python -m benchmarks.search.suite``): one command runs every
landscape x strategy over disjoint seed sets and writes one JSON; launches cost what the
landscape's ``startup_s`` says they cost.

SIMULATIONS only: the landscapes are cost models, and the suite measures the search, not a
server. A tiny configuration runs here (2 landscapes, 2 seed sets of 2 seeds, short budgets).
"""

from __future__ import annotations

import json
import textwrap

import optuna
import pytest
from optuna.search_space import IntersectionSearchSpace

from autotune import names
from autotune.space.load import load_space
from benchmarks.search import ROOT, suite
from benchmarks.search.landscape import BadInput, Outcome, launch_minutes, load_landscape
from benchmarks.search.truth import true_best

PAIRED_KEYS = {"p_fewer_launches", "p_more_launches", "p_mann_whitney"}


@pytest.fixture(scope="module")
def tiny_suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite") / "suite.json"
    code = suite.main(
        [
            "--landscapes", "nccl,offload",
            "--strategies", "auto,random,gp",
            "--seeds", "2",
            "--seed-sets", "2",
            "--budget", "30",
            "--reference-budget", "60",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    return json.loads(out.read_text())


def test_the_suite_writes_one_json_with_every_landscape_strategy_and_seed_set(tiny_suite):
    assert tiny_suite["label"].startswith("SIMULATIONS")
    assert set(tiny_suite["landscapes"]) == {"nccl", "offload"}
    for land in tiny_suite["landscapes"].values():
        assert land["launch_cost"].startswith("startup_s")
        assert [s["seeds"] for s in land["seed_sets"]] == ["0-1", "100-101"]
        for seed_set in land["seed_sets"]:
            # gp is never dropped: it ran, or it says why not
            assert set(seed_set["strategies"]) == {"auto", "random", "gp"}
            gp = seed_set["strategies"]["gp"]
            assert "figures" in gp or (isinstance(gp["not_run"], str) and gp["not_run"])
            ran = [n for n, s in seed_set["strategies"].items() if "figures" in s]
            for name in ran:
                f = seed_set["strategies"][name]["figures"]
                assert f["seeds"] == [int(x) for x in seed_set["seeds"].split("-")]
                assert f["launches_q1"] <= f["launches_median"] <= f["launches_q3"]
                assert f["misses_at_30"] is not None and 0 <= f["misses_at_30"] <= 2
                # a budget of 30 counts no miss at 60; random, run to 60, does
                assert (f["misses_at_60"] is None) == (name != "random")
                assert f["sim_hours_median"] > 0
                assert set(f["paired"]) == set(ran) - {name}
                for tests in f["paired"].values():
                    assert set(tests) == PAIRED_KEYS
                    assert all(0.0 <= p <= 1.0 for p in tests.values())
            assert seed_set["verdict"]["checked"] is True


def test_a_wrong_config_is_never_reported_best_though_it_is_the_fastest(tiny_suite):
    """nccl's wrong combination (LL128 with P2P across the root complex) is faster than the
    true best correct config: a search without the gate would report it."""
    space = load_space(ROOT / suite.LANDSCAPES["nccl"].space)
    land = load_landscape(suite.LANDSCAPES["nccl"].landscape, None)
    best, _, _ = true_best(space, land)
    wrong = land({"NCCL_PROTO": "LL128", "NCCL_P2P_LEVEL": "SYS"})
    assert wrong.started and not wrong.correct and wrong.true > best
    assert tiny_suite["landscapes"]["nccl"]["true_best"] == pytest.approx(best, rel=1e-6)
    for land_result in tiny_suite["landscapes"].values():
        for seed_set in land_result["seed_sets"]:
            for s in seed_set["strategies"].values():
                if "figures" in s:
                    assert s["figures"]["runs_reporting_a_wrong_best"] == 0


def test_launch_cost_depends_on_the_config_and_a_failed_start_is_cheaper_than_a_wrong_output():
    land = load_landscape(suite.LANDSCAPES["nccl"].landscape, None)
    refused = land({"NCCL_ALGO": "NVLS"})  # NCCL refuses it at communicator init
    wrong = land({"NCCL_PROTO": "LL128", "NCCL_P2P_LEVEL": "SYS"})
    good = land({"NCCL_PROTO": "LL128"})
    minutes = [launch_minutes(o, land.cost, gate=True) for o in (refused, wrong, good)]
    assert not refused.started and minutes[0] < minutes[1] < minutes[2]
    capture = load_landscape(suite.LANDSCAPES["capture"].landscape, None)
    short = capture({"max_cudagraph_capture_size": 32})
    long = capture({"max_cudagraph_capture_size": 512, "capture_step": 4})
    assert short.started and long.started and short.startup_s < long.startup_s


def test_without_startup_s_a_launch_costs_the_cost_model():
    outcome = Outcome(True, True, 1.0)
    cost = {"load": 10.0, "failed_start": 5.0, "check": 1.0, "bench": 3.0}
    assert launch_minutes(outcome, cost, gate=True) == 14.0
    assert launch_minutes(Outcome(False, False, 0.0, "oom"), cost, gate=True) == 5.0


def test_a_startup_s_that_is_not_a_number_of_seconds_is_bad_input(tmp_path):
    path = tmp_path / "land.py"
    path.write_text(
        textwrap.dedent(
            """
            def f(params):
                return {"tok_s": 1.0}

            def startup_s(params):
                return -1.0
            """
        )
    )
    land = load_landscape(f"{path}:f", None)
    with pytest.raises(BadInput, match="startup_s"):
        land({})


def test_unknown_landscape_or_strategy_is_bad_input(tmp_path, capsys):
    out = tmp_path / "x.json"
    assert suite.main(["--landscapes", "nope", "--out", str(out)]) == 2
    assert suite.main(["--strategies", "auto,cmaes", "--out", str(out)]) == 2
    assert "unknown" in capsys.readouterr().err
    assert not out.exists()


def test_gp_sees_the_study_without_its_baseline_trial():
    """GPSampler models the intersection of the completed trials' parameters: the baseline,
    which sets only the parameters that have a baseline (here none), empties it, and GPSampler
    then samples at random for the whole run. The product's ``--sampler gp`` (which the suite
    runs) hides the baseline from it."""
    from autotune.search.gp import _WithoutBaseline

    study = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.IntDistribution(1, 8)}
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={names.ROLE: "baseline"}))
    for x in (2, 5, 7):
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions=dist, value=x))
    seen = _WithoutBaseline(study)
    assert IntersectionSearchSpace().calculate(study) == {}
    assert IntersectionSearchSpace().calculate(seen) == dist
    assert [t.params["x"] for t in seen.get_trials()] == [2, 5, 7]
    assert seen.direction == study.direction


def _figures(median: float, bound: bool = False) -> dict:
    return {"runs": 30, "figures": {"launches_median": median, "median_is_lower_bound": bound}}


@pytest.mark.parametrize(
    ("auto", "tpe", "random", "at_most_best", "at_most_06_random"),
    [
        (_figures(30), _figures(40), _figures(100), True, True),
        (_figures(45), _figures(40), _figures(100), False, True),
        (_figures(38), _figures(61, True), _figures(401, True), True, True),
        # both past the budget: no order is measured
        (_figures(61, True), _figures(61, True), _figures(401, True), None, None),
        (_figures(57.5, True), _figures(48), _figures(107.5), False, None),
        (_figures(25), _figures(26), _figures(28), True, None),  # random needs <= 30
    ],
)
def test_the_verdict_says_what_the_medians_show_and_no_more(
    auto, tpe, random, at_most_best, at_most_06_random
):
    strategies = {"auto": auto, "tpe": tpe, "random": random, "gp": {"not_run": "no scipy"}}
    v = suite.verdict(strategies)
    assert v["auto_at_most_best_simple"] is at_most_best
    assert v["auto_at_most_0.6x_random_where_random_over_30"] is at_most_06_random


def test_autotune_s_gp_sampler_models_the_search_trials_not_the_baseline():
    """``--sampler gp`` (``strategy.build_sampler``'s GPSampler): with a baseline trial that
    sets no parameter, its relative search space is the search trials' (empty before the fix:
    every draw random). Needs scipy (the ``gp`` extra)."""
    import importlib.util

    from tests.helpers import missing

    for module in ("scipy", "torch"):
        if importlib.util.find_spec(module) is None:
            missing(f"no {module} (the gp extra and the engine install it)")
    from autotune.search.gp import baseline_blind_gp

    study = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.IntDistribution(1, 8)}
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={names.ROLE: "baseline"}))
    for x in (2, 5, 7):
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions=dist, value=x))
    trial = study.ask()
    assert baseline_blind_gp(0).infer_relative_search_space(study, trial) == dist
    assert optuna.samplers.GPSampler(seed=0).infer_relative_search_space(study, trial) == {}


def test_results_run_separately_read_together_as_one_table(tiny_suite, tmp_path, capsys):
    """``benchmarks.search.table`` merges suite files by landscape and seeds: auto's and the
    reference strategies' runs made by two commands give the table one command gives, with
    the item-2 verdict and auto's paired p recomputed on the merged strategies."""
    from benchmarks.search import table

    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(tiny_suite))
    parts = []
    for keep in ({"auto"}, {"random", "gp"}):
        doc = json.loads(json.dumps(tiny_suite))
        for land in doc["landscapes"].values():
            for seed_set in land["seed_sets"]:
                seed_set["strategies"] = {
                    n: s for n, s in seed_set["strategies"].items() if n in keep
                }
        parts.append(tmp_path / f"{'-'.join(sorted(keep))}.json")
        parts[-1].write_text(json.dumps(doc))
    assert table.main([str(whole)]) == 0
    one = capsys.readouterr().out
    assert table.main([str(p) for p in parts]) == 0
    assert capsys.readouterr().out == one
    assert "**nccl**" in one and "**offload**" in one
    rows = [line for line in one.splitlines() if line.startswith(("| 0-1 ", "| 100-101 "))]
    assert len(rows) == 4  # two landscapes x two seed sets
    assert table.main([str(tmp_path / "missing.json")]) == 2


def test_the_oracle_needs_the_first_budget_that_confirms_where_the_gain_is_large(tmp_path):
    """``benchmarks.search.oracle``: with the true best launched first, what is left is the
    product's confirmation. On ``numeric`` the best is about 12x the baseline, so the first
    budget whose plan holds a confirmation (20: two rounds of one candidate) reports it for
    every seed; a budget too small for any confirmation never does."""
    from benchmarks.search import oracle

    out = tmp_path / "oracle.json"
    args = ["--landscapes", "numeric", "--seeds", "3", "--seed-sets", "1", "--out", str(out)]
    assert oracle.main(args) == 0
    sets = json.loads(out.read_text())["landscapes"]["numeric"]
    assert sets[0]["per_seed"] == [20, 20, 20] and sets[0]["median"] == 20
    assert oracle.main([*args[:-2], "--most", "10", "--out", str(out)]) == 0  # --most + 1: never
    assert json.loads(out.read_text())["landscapes"]["numeric"][0]["per_seed"] == [11, 11, 11]
    assert oracle.main(["--landscapes", "nope", "--out", str(out)]) == 2
