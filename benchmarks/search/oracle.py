"""What confirming the true best alone costs on each landscape (SIMULATIONS).

An oracle search launches the true best config first. It still has to have it confirmed the
way ``autotune run`` confirms (``study.budget.plan_budget``, the race of
``analysis.confirm``, the product's winner rule, simulated by ``run.simulate_confirmation``).
Per seed: the smallest budget from 2 to ``--most`` launches whose plan confirms and whose
simulated confirmation reports the best (``--most`` + 1 where none does). Where a landscape's
best is a few percent above the baseline at 5-10 % launch-to-launch noise, this, not the
search, sets the launches of every strategy.

Not a strict floor: a search's report may be another config within 5 % of the best, and the
harness re-draws a confirmation whenever the candidates change (it counts the first budget
whose report is good), so a search with several near-best candidates gets more draws than
this oracle's one config. Printed and saved (``benchmarks/results/search_oracle.json``)::

    .venv/bin/python -m benchmarks.search.oracle --seeds 30 --seed-sets 3
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

from autotune.search.model import config_key
from autotune.space.load import load_space
from autotune.study.budget import plan_budget
from benchmarks.search import ROOT
from benchmarks.search.landscape import Outcome, load_landscape
from benchmarks.search.run import simulate_confirmation
from benchmarks.search.stats import quartiles
from benchmarks.search.suite import LANDSCAPES, TARGET_FRACTION
from benchmarks.search.truth import true_best

RESULT_PATH = ROOT / "benchmarks" / "results" / "search_oracle.json"
#: the spec's default target precision (``WorkloadSpec.target_precision``)
PRECISION = 0.03


@functools.cache
def _problem(land_name: str) -> tuple[Outcome, Outcome, list[str], float]:
    """The landscape's true best outcome, its baseline's, their config keys, and the noise
    (the true best is searched once per landscape: exhaustive where the space allows)."""
    entry = LANDSCAPES[land_name]
    space = load_space(ROOT / entry.space)
    land = load_landscape(entry.landscape, None)
    _value, best_values, _ = true_best(space, land)
    keys = [config_key(best_values), config_key(space.baseline_values())]
    return land(best_values), land(space.baseline_values()), keys, land.noise


def oracle_launches(land_name: str, seed: int, most: int) -> int:
    """The smallest budget whose confirmation reports the true best, for one seed."""
    best, base, keys, noise = _problem(land_name)
    for total in range(2, most + 1):
        plan = plan_budget(total)
        if not plan.confirms:
            continue
        won, _ = simulate_confirmation(
            [best], base if base.started and base.correct else None, keys, plan.rounds,
            noise, seed, PRECISION,
        )  # fmt: skip
        if won is not None:
            return total
    return most + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.search.oracle", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--landscapes", default=",".join(LANDSCAPES))
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--seed-sets", type=int, default=3)
    parser.add_argument("--most", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULT_PATH)
    args = parser.parse_args(argv)
    names = [n for n in args.landscapes.split(",") if n]
    unknown = [n for n in names if n not in LANDSCAPES]
    if unknown or args.seeds < 1 or args.seed_sets < 1 or args.most < 2:
        print(f"error: bad --landscapes {unknown} or counts", file=sys.stderr)
        return 2
    out: dict[str, Any] = {}
    for name in names:
        sets = []
        for s in range(args.seed_sets):
            seeds = [100 * s + i for i in range(args.seeds)]
            per_seed = [oracle_launches(name, seed, args.most) for seed in seeds]
            q1, med, q3 = quartiles([float(x) for x in per_seed])
            sets.append(
                {
                    "seeds": f"{seeds[0]}-{seeds[-1]}",
                    "median": med,
                    "q1": q1,
                    "q3": q3,
                    "per_seed": per_seed,
                }
            )
            print(f"[{name}] seeds {sets[-1]['seeds']}: oracle median {med:g} ({q1:g}-{q3:g})")
        out[name] = sets
    result = {
        "label": "SIMULATIONS: an oracle that launches the true best first, then the product's "
        "confirmation; per seed the smallest --trials whose confirmation reports it",
        "command": "python -m benchmarks.search.oracle " + " ".join(argv or sys.argv[1:]),
        "target_fraction": TARGET_FRACTION,
        "landscapes": out,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
