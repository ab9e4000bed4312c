"""The whole suite of SIMULATED landscapes, every strategy, one command, one JSON.

    .venv/bin/python -m benchmarks.search.suite                  # everything (long)
    .venv/bin/python -m benchmarks.search.suite --seeds 5 --seed-sets 1 \\
        --landscapes capture,nccl --strategies auto,random --out /tmp/suite.json   # quick

Why one command: the default strategy was shaped on the project's own landscapes; the question
that matters is how it does on problems it was not shaped on, beside the simple strategies
(issue 30). For each landscape of :data:`LANDSCAPES` (a cost model and its space, the harness's
protocol: ``landscape.py``) the true best is found by enumeration (``truth.py``), then every
strategy runs the same seeds, in several disjoint seed sets (0-, 100-, 200-, ...; ``--first-seed-set
3`` starts at 300-, seeds a change was not developed on), through
``run.py``'s loop (the simulated confirmation counted, as the harness counts it). Per landscape,
seed set and strategy the JSON holds (:func:`summary`):

* the median and IQR of launches until the config the run would REPORT is correct and within
  5 % of the true best (the confirmation's launches included; never reached: budget + 1);
* misses at 30 and at 60 launches (runs not there by then);
* simulated hours until then: each launch's startup from the landscape's ``startup_s`` where it
  has one (config-dependent; a failed start costs what it took to fail), plus the check and the
  benchmark (``COST_MINUTES``); a confirmation launch costs the median startup of the run's
  correct configs, plus the check and the benchmark;
* runs that ever reported a wrong config as best (must be 0 for every gated strategy);
* a paired test against each other strategy (same seeds; ``stats.py``'s one-sided Wilcoxon
  signed-rank both ways and the two-sided Mann-Whitney U), on launches capped at ``--budget``
  + 1 so that random's longer reference runs do not count where the others had no budget.

``random`` runs on to ``--reference-budget`` (400) so that its median is measured, as the
harness does; misses always count within 30 / 60. ``gp`` is Optuna's GPSampler with the
baseline trial hidden from it (:func:`gp_sampler`: as ``autotune run --sampler gp`` runs it, the
baseline empties its search space and it samples at random); where it cannot run (it needs scipy
and torch) it is recorded as ``not_run`` with the reason, never dropped.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.search.gp import baseline_blind_gp
from autotune.space.load import load_space
from autotune.space.model import SearchSpace
from benchmarks.search import ROOT
from benchmarks.search.cli import machine_info
from benchmarks.search.landscape import WATCHDOG, BadInput, Landscape, load_landscape, show
from benchmarks.search.run import (
    DEFAULT_REFERENCE_BUDGET,
    Confirm,
    RunResult,
    run_optuna,
    run_strategy,
)
from benchmarks.search.stats import (
    mann_whitney_p,
    quartiles,
    rounded,
    search_launches_to_target,
    summarize,
    trials_to_target,
    wilcoxon_less_p,
)
from benchmarks.search.truth import TARGET_FRACTION, true_best


@dataclass(frozen=True)
class Entry:
    """One landscape of the suite: its space, its function, and what shape it has."""

    space: str
    landscape: str
    shape: str


LANDSCAPES: dict[str, Entry] = {
    "glm5": Entry(
        "search_spaces/glm5-8gpu.yaml",
        "benchmarks/landscapes/glm5.py:landscape",
        "nearly separable, a needle of nine settings, a wrong region (the GLM-5 case)",
    ),
    "interactions": Entry(
        "search_spaces/interactions-sim.yaml",
        "benchmarks/landscapes/interactions.py:landscape",
        "interacting numeric and choice dims, an OOM cliff, a three-dim wrong region",
    ),
    "numeric": Entry(
        "search_spaces/numeric-sim.yaml",
        "benchmarks/landscapes/numeric.py:landscape",
        "numeric: a smooth interior peak in two dims",
    ),
    "unseen": Entry(
        "search_spaces/unseen-sim.yaml",
        "benchmarks/landscapes/unseen.py:landscape",
        "a sharp numeric optimum, interactions, a two-choice wrong region, distractors",
    ),
    "capture": Entry(
        "search_spaces/capture-sim.yaml",
        "benchmarks/landscapes/capture.py:landscape",
        "interacting: CUDA-graph capture sizes pay off only when they cover the served batch",
    ),
    "nccl": Entry(
        "search_spaces/nccl-sim.yaml",
        "benchmarks/landscapes/nccl.py:landscape",
        "a wrong combination of two settings that looks fastest, choices that fail at init",
    ),
    "offload": Entry(
        "search_spaces/offload-sim.yaml",
        "benchmarks/landscapes/offload.py:landscape",
        "flat with an OOM cliff; most memory fractions and any offload far off the plateau",
    ),
}
#: the landscapes written for this suite from published measurements (issue 30)
NEW_LANDSCAPES = ("capture", "nccl", "offload")
STRATEGIES = ("auto", "tpe", "random", "gp")
MISS_AT = (30, 60)
RESULT_PATH = ROOT / "benchmarks" / "results" / "search_suite.json"


def gp_unavailable() -> str | None:
    """Why Optuna's GPSampler cannot run here, or None when it can."""
    if not hasattr(optuna.samplers, "GPSampler"):
        return f"optuna {optuna.__version__} has no GPSampler"
    for module in ("scipy", "torch"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"optuna's GPSampler needs {module}, which is not installed ({exc})"
    return None


def gp_sampler(seed: int) -> optuna.samplers.BaseSampler:
    """``autotune run --sampler gp``'s sampler: GPSampler blind to the baseline trial."""
    return baseline_blind_gp(seed)


def run_one(
    name: str,
    space: SearchSpace,
    land: Landscape,
    seed: int,
    budget: int,
    target: float,
    confirm: Confirm,
) -> RunResult:
    """One run of one strategy, stopped at the target (nothing after it changes a figure)."""
    if name == "gp":
        sampler = gp_sampler(seed)
        return run_optuna(space, land, sampler, name, seed, budget, target, confirm=confirm)
    return run_strategy(name, space, land, seed, budget, target, True, confirm=confirm)


def sim_hours(run: RunResult, target: float, budget: int, cost: dict[str, float]) -> float:
    """Simulated hours until the run reports a config within 5 % (its whole run otherwise).
    Launches cost what ``launch_minutes`` says (the landscape's ``startup_s`` where it has
    one); a confirmation launch, the median startup of the run's correct configs (it re-runs
    correct configs), plus the check and the benchmark."""
    index = search_launches_to_target(run, target, budget)
    if index is None:
        return run.minutes_after[-1] / 60.0 if run.minutes_after else 0.0
    startups = [
        launch.outcome.startup_s / 60.0
        for launch in run.launches
        if launch.outcome.correct and launch.outcome.startup_s is not None
    ]
    startup = statistics.median(startups) if startups else cost["load"]
    per_confirm = startup + cost["check"] + cost["bench"]
    return (run.minutes_after[index - 1] + run.confirm_launches_after[index - 1] * per_confirm) / 60


def summary(
    runs: dict[str, list[RunResult]], target: float, budget: int, cost: dict[str, float]
) -> dict[str, Any]:
    """Per strategy: the harness's figures (``stats.summarize``), misses at 30 / 60, hours,
    and the paired tests against every other strategy (see the module docstring)."""
    reference = runs.get("random")
    ref_hits = ref_censored = None
    if reference is not None:
        ref = summarize(reference, target, budget, None, cost)
        ref_hits, ref_censored = ref["trials_to_95pct_per_seed"], ref["median_is_lower_bound"]
    capped = {
        name: [min(trials_to_target(r, target, r.budget or budget), budget + 1) for r in rs]
        for name, rs in runs.items()
    }
    out: dict[str, Any] = {}
    for name, rs in runs.items():
        s = summarize(
            rs,
            target,
            budget,
            ref_hits if name != "random" else None,
            cost,
            reference_censored=bool(ref_censored),
        )
        hours = [sim_hours(r, target, r.budget or budget, cost) for r in rs]
        q1, med, q3 = quartiles([float(h) for h in s["trials_to_95pct_per_seed"]])
        entry: dict[str, Any] = {
            "launches_median": med,
            "launches_q1": q1,
            "launches_q3": q3,
            "median_is_lower_bound": s["median_is_lower_bound"],
            "budget_launches": s["budget_launches"],
            "launches_per_seed": s["trials_to_95pct_per_seed"],
            "seeds": s["seeds"],
        }
        for limit in MISS_AT:
            entry[f"misses_at_{limit}"] = (
                sum(trials_to_target(r, target, limit) > limit for r in rs)
                if limit <= min(r.budget or budget for r in rs)
                else None
            )
        entry.update(
            {
                "misses_of_the_search_at_budget": s["missed_even_with_a_perfect_report"],
                "search_launches_median": s["search_launches_to_95pct_median"],
                "sim_hours_median": round(statistics.median(hours), 2),
                "sim_hours_q1_q3": [round(q, 2) for q in quartiles(hours)[::2]],
                "runs_reporting_a_wrong_best": s["runs_ever_reporting_incorrect_best"],
                "wrong_configs_launched_median": s["wrong_configs_launched_median"],
            }
        )
        for key in ("ratio_to_random_median", "ratio_is_upper_bound", "ratio_is_lower_bound"):
            if key in s:
                entry[key] = s[key]
        if "ask_ms" in s:
            entry["ask_ms"] = s["ask_ms"]
        entry["paired"] = {
            other: {
                "p_fewer_launches": _p(wilcoxon_less_p, capped[name], capped[other]),
                "p_more_launches": _p(wilcoxon_less_p, capped[other], capped[name]),
                "p_mann_whitney": _p(mann_whitney_p, capped[name], capped[other]),
            }
            for other in runs
            if other != name
        }
        out[name] = entry
    return out


def _p(test, a: list[int], b: list[int]) -> float:
    return float(f"{test([float(x) for x in a], [float(x) for x in b]):.3g}")


def verdict(strategies: dict[str, Any]) -> dict[str, Any]:
    """Issue 30's item 2 on one seed set: is ``auto``'s median at most the best of the simple
    strategies that ran, and at most 0.6x random's where random needs more than 30?"""
    auto = strategies.get("auto")
    simple = {n: s for n, s in strategies.items() if n in ("tpe", "random", "gp") and "runs" in s}
    if auto is None or "runs" not in auto or not simple:
        return {"checked": False, "why": "needs auto and at least one of tpe, random, gp"}
    best_name = min(simple, key=lambda n: simple[n]["figures"]["launches_median"])
    best = simple[best_name]["figures"]["launches_median"]
    mine = auto["figures"]["launches_median"]
    mine_bound = auto["figures"]["median_is_lower_bound"]
    out: dict[str, Any] = {
        "checked": True,
        "auto_median": mine,
        # a median past the budget is a lower bound: an order it cannot show is None
        "auto_median_is_lower_bound": mine_bound,
        "best_simple": best_name,
        "best_simple_median": best,
        "auto_at_most_best_simple": _at_most(
            mine, mine_bound, best, simple[best_name]["figures"]["median_is_lower_bound"]
        ),
    }
    if "random" in simple:
        rand = simple["random"]["figures"]
        out["random_median"] = rand["launches_median"]
        out["auto_at_most_0.6x_random_where_random_over_30"] = (
            None
            if rand["launches_median"] <= 30
            else _at_most(
                mine, mine_bound, 0.6 * rand["launches_median"], rand["median_is_lower_bound"]
            )
        )
    return out


def _at_most(mine: float, mine_bound: bool, other: float, other_bound: bool) -> bool | None:
    """Whether a median is at most another, where either may be only a lower bound (the true
    median is at least the figure): None where the figures cannot tell."""
    if mine_bound and (other_bound or mine <= other):
        return None
    if mine > other:
        return False if not other_bound else None
    return True


def run_landscape(
    name: str, args: argparse.Namespace, strategies: list[str], confirm: Confirm
) -> dict[str, Any]:
    entry = LANDSCAPES[name]
    started = time.perf_counter()
    try:
        space = load_space(ROOT / entry.space)
    except Exception as exc:  # noqa: BLE001 - the space loader's own error names file and key
        raise BadInput(f"{entry.space}: {exc}") from None
    land = load_landscape(entry.landscape, None)
    with WATCHDOG.armed(land.call_limit):
        best_value, best_values, method = true_best(space, land)
        target = TARGET_FRACTION * best_value
        baseline = land(space.baseline_values())
        print(
            f"[{name}] true best {show(best_value)}; target {show(target)}; baseline "
            f"{show(baseline.true)}",
            flush=True,
        )
        gp_reason = gp_unavailable() if "gp" in strategies else None
        sets: list[dict[str, Any]] = []
        for s in range(args.first_seed_set, args.first_seed_set + args.seed_sets):
            seeds = [100 * s + i for i in range(args.seeds)]
            runs: dict[str, list[RunResult]] = {}
            for strategy in strategies:
                if strategy == "gp" and gp_reason is not None:
                    continue
                budget = args.reference_budget if strategy == "random" else args.budget
                runs[strategy] = [
                    run_one(strategy, space, land, seed, budget, target, confirm) for seed in seeds
                ]
            figures = summary(runs, target, args.budget, land.cost)
            per_strategy: dict[str, Any] = {}
            for strategy in strategies:
                per_strategy[strategy] = (
                    {"runs": len(runs[strategy]), "figures": figures[strategy]}
                    if strategy in figures
                    else {"not_run": gp_reason}
                )
            sets.append(
                {
                    "seeds": f"{seeds[0]}-{seeds[-1]}",
                    "strategies": per_strategy,
                    "verdict": verdict(per_strategy),
                }
            )
            _print_set(name, sets[-1])
    return {
        "space": entry.space,
        "landscape": entry.landscape,
        "shape": entry.shape,
        "noise": land.noise,
        "cost_minutes": land.cost,
        "launch_cost": "startup_s(params) per config"
        if land.startup is not None
        else "COST_MINUTES (the same for every config)",
        "true_best": rounded(best_value),
        "true_best_config": best_values,
        "true_best_method": method,
        "target": rounded(target),
        "baseline_true": rounded(baseline.true),
        "baseline_outcome": "correct"
        if baseline.correct
        else "wrong output"
        if baseline.started
        else f"failed to start: {baseline.failure}",
        "seed_sets": sets,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _print_set(name: str, seed_set: dict[str, Any]) -> None:
    print(f"[{name}] seeds {seed_set['seeds']}", flush=True)
    for strategy, s in seed_set["strategies"].items():
        if "not_run" in s:
            print(f"  {strategy:<8} not run: {s['not_run']}", flush=True)
            continue
        f = s["figures"]
        median = f">{f['budget_launches']}" if f["median_is_lower_bound"] else f["launches_median"]
        print(
            f"  {strategy:<8} median {median} ({f['launches_q1']:g}-{f['launches_q3']:g}), "
            f"miss@30 {f['misses_at_30']}, miss@60 {f['misses_at_60']}, "
            f"{f['sim_hours_median']} sim h, wrong best {f['runs_reporting_a_wrong_best']}",
            flush=True,
        )
    v = seed_set["verdict"]
    if v.get("checked"):
        print(
            f"  auto {v['auto_median']} vs best simple {v['best_simple']} "
            f"{v['best_simple_median']}: "
            + {True: "ok", False: "WORSE", None: "both past the budget"}[
                v["auto_at_most_best_simple"]
            ],
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.search.suite", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--landscapes", default=",".join(LANDSCAPES))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--seeds", type=int, default=30, help="seeds per seed set")
    parser.add_argument("--seed-sets", type=int, default=3, help="disjoint sets: 0-, 100-, ...")
    parser.add_argument(
        "--first-seed-set",
        type=int,
        default=0,
        help="index of the first seed set (3: seeds 300-, ...): held-out seeds for a change "
        "developed on the first sets",
    )
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument(
        "--reference-budget",
        type=int,
        default=DEFAULT_REFERENCE_BUDGET,
        help="launches random may take so that its median is measured",
    )
    parser.add_argument("--out", type=Path, default=RESULT_PATH)
    args = parser.parse_args(argv)
    try:
        return _main(args)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    names = [n for n in args.landscapes.split(",") if n]
    strategies = [n for n in args.strategies.split(",") if n]
    for n in names:
        if n not in LANDSCAPES:
            raise BadInput(f"--landscapes: unknown {n!r}; one of {', '.join(LANDSCAPES)}")
    for n in strategies:
        if n not in STRATEGIES:
            raise BadInput(f"--strategies: unknown {n!r}; one of {', '.join(STRATEGIES)}")
    if not names or not strategies:
        raise BadInput("name at least one landscape and one strategy")
    for flag, value, low in (
        ("--seeds", args.seeds, 1),
        ("--seed-sets", args.seed_sets, 1),
        ("--first-seed-set", args.first_seed_set, 0),
        ("--budget", args.budget, 1),
        ("--reference-budget", args.reference_budget, args.budget),
    ):
        if value < low:
            raise BadInput(f"{flag} must be >= {low}, not {value}")
    confirm = Confirm()
    landscapes = {n: run_landscape(n, args, strategies, confirm) for n in names}
    result = {
        "label": "SIMULATIONS (cost models), not real servers: a benchmark of the search only",
        "command": "python -m benchmarks.search.suite " + " ".join(sys.argv[1:]),
        "seeds_per_set": args.seeds,
        "seed_sets": args.seed_sets,
        "first_seed_set": args.first_seed_set,
        "budget_launches": args.budget,
        "reference_budget_launches": args.reference_budget,
        "strategies": strategies,
        "strategy_notes": {
            "auto": "autotune run's default (autotune/search/strategy.py)",
            "tpe": "autotune's TPE (multivariate, grouped, constant liar)",
            "random": "Optuna's RandomSampler, run to --reference-budget",
            "gp": "Optuna's GPSampler with the baseline trial hidden from it (the baseline "
            "empties its intersection search space: it then samples at random)",
        },
        "figures_are": "per landscape, seed set and strategy: median and quartiles over seeds "
        "of launches until the config the run would report is correct and >= 95 % of the "
        "true best, the simulated confirmation's launches included (not reached: the run's "
        "budget + 1; random runs to --reference-budget); misses_at_N: runs not there within N "
        "launches; paired tests on launches capped at --budget + 1",
        "landscapes": landscapes,
        "machine": machine_info(),
        "total_wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out} in {result['total_wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
