"""Several suite results side by side: one markdown table per landscape (SIMULATIONS).

The suite runs each strategy over the same seeds, so runs made separately (``auto`` in one
command, the reference strategies in another, ``gp`` on fewer seeds) can be read together:
this merges their seed sets by landscape and seeds, recomputes issue 30's item-2 verdict
(``suite.verdict``) on the merged strategies, and adds ``auto``'s paired one-sided Wilcoxon p
against each other strategy on the seeds both ran (launches capped at the budget + 1, as the
suite's own tests are). Nothing is re-simulated::

    .venv/bin/python -m benchmarks.search.table benchmarks/results/suite_auto.json \\
        benchmarks/results/suite_ref.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.search.stats import wilcoxon_less_p
from benchmarks.search.suite import verdict


def merged(paths: list[Path]) -> dict[str, dict[str, dict[str, Any]]]:
    """landscape -> seeds ("0-29") -> strategy -> its entry, over every file."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        doc = json.loads(path.read_text(encoding="utf-8"))
        for land, entry in doc["landscapes"].items():
            for seed_set in entry["seed_sets"]:
                cell = out.setdefault(land, {}).setdefault(seed_set["seeds"], {})
                for name, s in seed_set["strategies"].items():
                    if "runs" in s:
                        cell[name] = s
    return out


def paired_p(auto: dict[str, Any], other: dict[str, Any]) -> tuple[float, int] | None:
    """One-sided paired p that auto needs fewer launches, on the seeds both ran."""
    a, o = auto["figures"], other["figures"]
    cap = min(a["budget_launches"], o["budget_launches"]) + 1
    mine = dict(zip(a["seeds"], a["launches_per_seed"], strict=True))
    theirs = dict(zip(o["seeds"], o["launches_per_seed"], strict=True))
    common = sorted(set(mine) & set(theirs))
    if len(common) < 5:
        return None
    x = [float(min(mine[s], cap)) for s in common]
    y = [float(min(theirs[s], cap)) for s in common]
    return wilcoxon_less_p(x, y), len(common)


def cell(s: dict[str, Any]) -> str:
    f = s["figures"]
    median = (
        f">{f['budget_launches']}" if f["median_is_lower_bound"] else f"{f['launches_median']:g}"
    )
    return f"{median} ({f['misses_at_60']})"


def render(data: dict[str, dict[str, dict[str, Any]]]) -> str:
    order = ("auto", "tpe", "random", "gp")
    lines = []
    for land, sets in data.items():
        lines += [f"**{land}**", ""]
        lines.append(
            "| seeds | "
            + " | ".join(order)
            + " | auto <= best simple | auto <= 0.6x random"
            + " | auto's paired p (fewer) vs tpe / random / gp |"
        )
        lines.append("|---" * (len(order) + 4) + "|")
        for seeds, strategies in sets.items():
            v = verdict(strategies)
            yes = {True: "yes", False: "**no**", None: "?"}
            ps = []
            for other in ("tpe", "random", "gp"):
                p = (
                    paired_p(strategies["auto"], strategies[other])
                    if "auto" in strategies and other in strategies
                    else None
                )
                ps.append("-" if p is None else f"{p[0]:.2g} (n={p[1]})")
            lines.append(
                f"| {seeds} | "
                + " | ".join(cell(strategies[n]) if n in strategies else "" for n in order)
                + f" | {yes[v.get('auto_at_most_best_simple')] if v.get('checked') else ''}"
                + " | "
                + (
                    "- (random <= 30)"
                    if v.get("checked") and v.get("random_median", 99) <= 30
                    else yes[v.get("auto_at_most_0.6x_random_where_random_over_30")]
                    if v.get("checked") and "random_median" in v
                    else ""
                )
                + f" | {' / '.join(ps)} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.search.table", description=__doc__.split("\n")[0]
    )
    parser.add_argument("results", type=Path, nargs="+", help="suite result JSON files")
    args = parser.parse_args(argv)
    for path in args.results:
        if not path.is_file():
            print(f"error: {path}: no such file", file=sys.stderr)
            return 2
    print(render(merged(args.results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
