"""Benchmark OF THE SEARCH on SIMULATED landscapes (cost models; no server, no GPU).

Rerun (the figures of benchmarks/README.md; about 15 minutes on 2 shared cores)::

    .venv/bin/python -m benchmarks.search                         # GLM-5 landscape
    .venv/bin/python -m benchmarks.search --space search_spaces/interactions-sim.yaml \\
        --landscape benchmarks/landscapes/interactions.py:landscape \\
        --out benchmarks/results/search_efficiency_interactions.json
    # any landscape: FUNCTION(params) -> {"tok_s": x} | {"tok_s": x, "correct": False}
    #                                   | {"failure": "oom"}
    .venv/bin/python -m benchmarks.search --space S.yaml --landscape my.py:f --noise 0.1

The command line and the result file: the true best (``truth.py``), every strategy's runs on
each seed set (``run.py``; 3 disjoint sets of 30 seeds by default), their figures
(``stats.py``), printed as a table per seed set and written as JSON (``--out``). Bad input (a
landscape that breaks the protocol of ``landscape.py``, a space or flag it cannot use) is one
line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna

from autotune.space.load import load_space
from autotune.space.model import SearchSpace
from benchmarks.search import ROOT
from benchmarks.search.landscape import (
    CALL_LIMIT,
    WATCHDOG,
    BadInput,
    Landscape,
    check_number,
    described,
    load_landscape,
    show,
)
from benchmarks.search.run import (
    DEFAULT_REFERENCE_BUDGET,
    MAX_UNLAUNCHED_PER_TRIAL,
    REFERENCE_STRATEGIES,
    STRATEGIES,
    Confirm,
    RunResult,
    run_strategy,
)
from benchmarks.search.stats import rounded, summarize
from benchmarks.search.truth import TARGET_FRACTION, true_best

DEFAULT_SPACE = ROOT / "search_spaces" / "glm5-8gpu.yaml"
DEFAULT_LANDSCAPE = "benchmarks/landscapes/glm5.py:landscape"
RESULT_PATH = ROOT / "benchmarks" / "results" / "search_efficiency.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.search", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--space", type=Path, default=DEFAULT_SPACE)
    parser.add_argument("--landscape", default=DEFAULT_LANDSCAPE, help="FILE.py:FUNCTION")
    parser.add_argument("--noise", type=float, default=None)
    parser.add_argument("--seeds", type=int, default=30, help="seeds per seed set")
    parser.add_argument("--seed-sets", type=int, default=3, help="disjoint sets: 0-, 100-, ...")
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument(
        "--reference-budget",
        type=int,
        default=DEFAULT_REFERENCE_BUDGET,
        help="launches the reference strategies (random, the grids, the peers without the gate) "
        "may take, so that their medians are measured; misses still count within --budget",
    )
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--full", action="store_true", help="run every budget to the end")
    parser.add_argument(
        "--confirm-top",
        type=int,
        default=Confirm.top,
        help="configs the simulated confirmation re-measures (0: report the highest measurement)",
    )
    parser.add_argument(
        "--confirm-repeats",
        type=int,
        default=Confirm.repeats,
        help="confirmation rounds asked for, as autotune run's (default: planned from the budget)",
    )
    parser.add_argument(
        "--target-precision",
        type=float,
        default=Confirm.precision,
        help="the confirmation's stopping rule (the spec's workload.target_precision)",
    )
    parser.add_argument(
        "--call-limit",
        type=float,
        default=CALL_LIMIT,
        help="wall seconds one landscape call may take (0: no limit); past it: bad input",
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
    try:
        space = load_space(args.space)
    except Exception as exc:  # noqa: BLE001 - the space loader's own error names file and key
        raise BadInput(f"--space {args.space}: {exc}") from None
    for flag, value, low in (
        ("--seeds", args.seeds, 1),
        ("--seed-sets", args.seed_sets, 1),
        ("--budget", args.budget, 1),
        ("--reference-budget", args.reference_budget, args.budget),
    ):
        if value < low:
            raise BadInput(f"{flag} must be >= {low}, not {value}")
    check_number(args.target_precision, "--target-precision")
    land = load_landscape(args.landscape, args.noise, args.call_limit)
    unknown = [n for n in land.not_modelled if n not in {p.name for p in space.parameters}]
    if unknown:
        raise BadInput(f"{land.where}: NOT_MODELLED names {unknown[0]!r}, not in {args.space}")
    names = [n for n in args.strategies.split(",") if n]
    if not names:
        raise BadInput("--strategies: name at least one strategy")
    for n in names:
        if n not in STRATEGIES:
            raise BadInput(f"--strategies: unknown strategy {n!r}; one of {', '.join(STRATEGIES)}")
    if "random" not in names:
        names.append("random")
    if args.confirm_top < 0 or (args.confirm_repeats is not None and args.confirm_repeats < 2):
        raise BadInput("--confirm-top must be >= 0 and --confirm-repeats >= 2")
    confirm = Confirm(args.confirm_top, args.confirm_repeats, args.target_precision)
    with WATCHDOG.armed(land.call_limit):
        return _measure(args, space, land, names, confirm, started)


def _measure(
    args: argparse.Namespace,
    space: SearchSpace,
    land: Landscape,
    names: list[str],
    confirm: Confirm,
    started: float,
) -> int:
    """The true best, every strategy's runs, and the result file (the landscape's calls under
    ``--call-limit``)."""
    t0 = time.perf_counter()
    best_value, best_values, method = true_best(space, land)
    true_best_s = time.perf_counter() - t0
    target = TARGET_FRACTION * best_value
    baseline = land(space.baseline_values())
    print(
        f"true best {show(best_value)} ({method}, {true_best_s:.0f} s); target {show(target)}; "
        f"baseline {show(baseline.true) if baseline.correct else described(baseline)}",
        flush=True,
    )

    def budget_of(name: str) -> int:
        return args.reference_budget if name in REFERENCE_STRATEGIES else args.budget

    sets: list[dict[str, Any]] = []
    for s in range(args.seed_sets):
        seeds = [100 * s + i for i in range(args.seeds)]
        runs: dict[str, list[RunResult]] = {n: [] for n in names}
        for seed in seeds:
            for n in names:
                runs[n].append(
                    run_strategy(
                        n, space, land, seed, budget_of(n), target, not args.full, confirm=confirm
                    )
                )
        reference = summarize(runs["random"], target, args.budget, None, land.cost)
        summary = {
            n: summarize(
                rs,
                target,
                args.budget,
                reference["trials_to_95pct_per_seed"] if n != "random" else None,
                land.cost,
                reference_censored=reference["median_is_lower_bound"],
            )
            for n, rs in runs.items()
        }
        sets.append({"seeds": f"{seeds[0]}-{seeds[-1]}", "strategies": summary})
        _print_set(sets[-1], args.budget, args.reference_budget)

    result = {
        "label": "SIMULATION (a cost model), not a real server",
        "space": shown(args.space),
        "landscape": args.landscape,
        "noise": land.noise,
        "budget_launches": args.budget,
        "reference_budget_launches": args.reference_budget,
        "reference_strategies": sorted(REFERENCE_STRATEGIES & set(names)),
        "seeds_per_set": args.seeds,
        "true_best": rounded(best_value),
        "true_best_config": best_values,
        "true_best_method": method,
        "true_best_wall_s": round(true_best_s, 1),
        "target": rounded(target),
        "baseline_true": rounded(baseline.true),
        # a wrong baseline's speed is no baseline to beat, a failed one has none
        "baseline_outcome": "correct"
        if baseline.correct
        else "wrong output"
        if baseline.started
        else f"failed to start: {baseline.failure}",
        "cost_minutes": land.cost,
        "stopped_at_target": not args.full,
        "confirmation": {
            "top": confirm.top,
            "repeats": confirm.repeats,
            "target_precision": confirm.precision,
            "launches": "planned as autotune run plans --trials (study/budget.py: at most a "
            "fifth of the budget, 2-8 rounds x (top + baseline), rounds before candidates, none "
            "below --trials 20 unless "
            "--confirm-repeats), raced with confirm.race_step",
            "note": "gated strategies report what autotune run would: the confirmed winner "
            "(top configs by posterior mean, re-measured with the baseline), or the baseline "
            "where no confirmation fits; its launches count in the figures and the budget. "
            "Peers without the gate confirm nothing.",
        }
        if confirm.top
        else "none: the highest single measurement is reported",
        "figures_are": "per seed set: median and quartiles over seeds of launches until the "
        "reported best's true value is >= 95 % of the true best; not reached = the run's own "
        "budget + 1 (reference strategies: --reference-budget, so that their medians are "
        "measured); misses (not_reached_within_budget) always count within --budget",
        # the first seed set at top level (the keys this file had before), all sets below
        "strategies": sets[0]["strategies"],
        "seed_sets": sets,
        "machine": machine_info(),
        "total_wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(args.out)
    print(f"\nwrote {args.out} in {result['total_wall_s']} s")
    return 0


def shown(path: Path) -> str:
    """A path as benchmarks/README.md's command lines spell it (relative to the repository)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _print_set(seed_set: dict[str, Any], budget: int, reference_budget: int) -> None:
    print(
        f"\nseeds {seed_set['seeds']} (budget {budget} launches; miss = not within {budget}; "
        f"reference strategies run to {reference_budget} so that their medians are measured)"
    )
    header = (
        f"{'strategy':<20}{'median':>7}{'IQR':>12}{'miss':>6}{'x random':>9}"
        f"{'p MWU':>10}{'p Wilc':>10}{'sim h':>7}{'wrong best':>11}{'ask ms':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, s in seed_set["strategies"].items():
        iqr = f"{s['trials_to_95pct_q1']:.0f}-{s['trials_to_95pct_q3']:.0f}"
        ratio = s.get("ratio_to_random_median")
        p1 = s.get("p_mann_whitney_vs_random")
        p2 = s.get("p_wilcoxon_fewer_than_random")
        ask = s.get("ask_ms", {}).get("median")
        median = (
            f">{s['budget_launches']}"
            if s["median_is_lower_bound"]
            else f"{s['trials_to_95pct_median']:.1f}"
        )
        bound = (
            "<" if s.get("ratio_is_upper_bound") else ">" if s.get("ratio_is_lower_bound") else ""
        )
        ratio_text = (
            ("?" if "ratio_is_upper_bound" in s else "") if ratio is None else f"{bound}{ratio:.2f}"
        )
        print(
            f"{name:<20}{median:>7}{iqr:>12}"
            f"{s['not_reached_within_budget']:>6}"
            f"{ratio_text:>9}"
            f"{'' if p1 is None else f'{p1:.1e}':>10}"
            f"{'' if p2 is None else f'{p2:.1e}':>10}"
            f"{s['sim_hours_to_95pct_median']:>7.1f}"
            f"{s['runs_ever_reporting_incorrect_best']:>11}"
            f"{'' if ask is None else f'{ask:.0f}':>8}",
            flush=True,
        )
    for name, s in seed_set["strategies"].items():
        if s["not_reached_within_budget"] and name not in REFERENCE_STRATEGIES:
            search = s["missed_even_with_a_perfect_report"]
            print(
                f"note: of the {s['not_reached_within_budget']} misses of {name}, "
                f"{s['not_reached_within_budget'] - search} had launched a config within 5 % "
                f"early enough for its confirmation to fit in {budget} launches (a miss of the "
                f"report); {search} had not (a miss of the search: no report could avoid it)",
                flush=True,
            )
        if s["runs_stopped_by_constraint_violations"]:
            print(
                f"note: {s['runs_stopped_by_constraint_violations']} runs of {name} stopped "
                f"before the budget: their sampler drew {MAX_UNLAUNCHED_PER_TRIAL} x budget "
                "configs the constraints forbid (counted as not reached)",
                flush=True,
            )


def machine_info() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "optuna": optuna.__version__,
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "note": "machine shared with other concurrent work (2 cores); wall and ask times are "
        "indicative only, launch counts do not depend on them",
    }
