"""The statistics of a strategy's runs: medians, IQR, paired tests, censored ratios.

Per strategy and per seed set: median and IQR of launches to 95 %, the confirmation's included
(``search_launches_to_95pct_median``: without them; ``found_95pct_*``: the first launch of a
config truly within 5 %, reported or not); runs that never get there count as their budget + 1.
The reference strategies (random, the grids, the peers without the gate) run on to
``--reference-budget`` (default 400), so that their medians are measured instead of capped at
61; a median that even that does not reach prints as ``> N`` and bounds the ratio to it from
one side (:func:`summarize`). Misses (``not_reached_within_budget``) count within ``--budget``
for every strategy. Simulated hours to 95 % come from a per-launch cost model (the landscape's
``COST_MINUTES``: a failed start costs ``failed_start``, a wrong output ``load + check``, a
correct config or a confirmation round ``load + check + bench``; the peers without the gate pay
``load + bench`` for every config that starts). Mann-Whitney U (two-sided) and Wilcoxon
signed-rank (paired by seed, one-sided: fewer launches than random) p-values against
``random``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks.search.run import RunResult


def rounded(value: float) -> float:
    """A figure for the JSON: 4 decimals as before for values >= 1, and at least 6 significant
    digits below (``round(1e-9, 4)`` wrote a true best and a target of 0.0)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, max(4, 5 - math.floor(math.log10(abs(value)))))


def trials_to_target(run: RunResult, target: float, budget: int) -> int:
    """Launches until the reported best is correct and within 5 % of the true best, the
    confirmation's launches included; budget + 1 when that never happens within the budget."""
    index = search_launches_to_target(run, target, budget)
    return budget + 1 if index is None else index + run.confirm_launches_after[index - 1]


def search_launches_to_target(run: RunResult, target: float, budget: int) -> int | None:
    for index, (value, correct, extra) in enumerate(
        zip(run.best_true_after, run.best_correct_after, run.confirm_launches_after, strict=True),
        start=1,
    ):
        if correct and value >= target and index + extra <= budget:
            return index
    return None


def _reportable_in_time(run: RunResult, budget: int) -> bool:
    """Whether the run launched a config within 5 % early enough that a report of it, with the
    confirmation's launches at that point, fits in ``budget`` (the ceiling any ranking of the
    measured configs could reach)."""
    found = run.found_at
    return found is not None and found + run.confirm_launches_after[found - 1] <= budget


def sim_hours_to_target(run: RunResult, target: float, budget: int, cost: dict[str, float]):
    """Simulated hours until then (the confirmation's launches each load, check and measure);
    the whole budget's search when the target is never reached."""
    index = search_launches_to_target(run, target, budget)
    if index is None:
        return run.minutes_after[-1] / 60.0 if run.minutes_after else 0.0
    per_confirm = cost["load"] + cost["check"] + cost["bench"]
    return (run.minutes_after[index - 1] + run.confirm_launches_after[index - 1] * per_confirm) / 60


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def mann_whitney_p(a: list[float], b: list[float]) -> float:
    """Two-sided Mann-Whitney U p-value (normal approximation with tie correction)."""
    n1, n2 = len(a), len(b)
    ranks = _ranks(a + b)
    u = sum(ranks[:n1]) - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    counts: dict[float, int] = {}
    for v in a + b:
        counts[v] = counts.get(v, 0) + 1
    ties = sum(t**3 - t for t in counts.values())
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0
    z = (abs(u - n1 * n2 / 2.0) - 0.5) / math.sqrt(var)
    return min(1.0, 2.0 * _normal_sf(max(z, 0.0)))


def wilcoxon_less_p(a: list[float], b: list[float]) -> float:
    """One-sided Wilcoxon signed-rank p-value that ``a`` < ``b``, paired (normal approx.)."""
    diffs = [x - y for x, y in zip(a, b, strict=True) if x != y]
    n = len(diffs)
    if n == 0:
        return 1.0
    ranks = _ranks([abs(d) for d in diffs])
    w_plus = sum(r for r, d in zip(ranks, diffs, strict=True) if d > 0)
    mean = n * (n + 1) / 4.0
    counts: dict[float, int] = {}
    for d in diffs:
        counts[abs(d)] = counts.get(abs(d), 0) + 1
    var = n * (n + 1) * (2 * n + 1) / 24.0 - sum(t**3 - t for t in counts.values()) / 48.0
    if var <= 0:
        return 1.0
    z = (mean - w_plus - 0.5) / math.sqrt(var)
    return _normal_sf(z)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def summarize(
    runs: list[RunResult],
    target: float,
    budget: int,
    reference: list[int] | None,
    cost: dict[str, float],
    reference_censored: bool = False,
):
    # each run counts against the launches it was given (a reference strategy's runs go on to
    # --reference-budget, so that its median is measured rather than capped at budget + 1);
    # misses are always counted within ``budget``, the 60 launches
    own = [r.budget or budget for r in runs]
    hits = [trials_to_target(r, target, b) for r, b in zip(runs, own, strict=True)]
    q1, med, q3 = quartiles([float(h) for h in hits])
    hours = [sim_hours_to_target(r, target, b, cost) for r, b in zip(runs, own, strict=True)]
    found = [r.found_at or b + 1 for r, b in zip(runs, own, strict=True)]
    reached_at = [search_launches_to_target(r, target, b) for r, b in zip(runs, own, strict=True)]
    search = [i or b + 1 for i, b in zip(reached_at, own, strict=True)]
    confirm_at = [
        r.confirm_launches_after[i - 1] for r, i in zip(runs, reached_at, strict=True) if i
    ]
    out: dict[str, Any] = {
        "seeds": [r.seed for r in runs],
        "budget_launches": max(own),
        "trials_to_95pct_median": med,
        "trials_to_95pct_q1": q1,
        "trials_to_95pct_q3": q3,
        "trials_to_95pct_per_seed": hits,
        "not_reached_within_budget": sum(h > budget for h in hits),
        # more than half of the runs never got there even within their own budget: the median
        # is a lower bound (shown as "> N")
        "median_is_lower_bound": 2 * sum(h > b for h, b in zip(hits, own, strict=True))
        >= len(hits),
        "sim_hours_to_95pct_median": round(statistics.median(hours), 2),
        "sim_hours_note": "a run that never reached the target counts its whole budget",
        "found_95pct_median": statistics.median(found),
        "found_95pct_per_seed": found,
        "found_95pct_not_within_budget": sum(f > budget for f in found),
        # misses of the report, not of the search: a config within 5 % had been launched
        # within the budget, and what the run would report never was one within it
        "missed_after_launching_target": sum(
            h > budget and f <= budget for h, f in zip(hits, found, strict=True)
        ),
        # misses that no report could have avoided: the first config within 5 % came too late
        # for the confirmation after it to fit in the budget (or never came). A bound: with a
        # perfect ranking and a confirmation that never picks wrong, these runs still miss
        "missed_even_with_a_perfect_report": sum(not _reportable_in_time(r, budget) for r in runs),
        "search_launches_to_95pct_median": statistics.median(search),
        # what the confirmation cost where the run reached the target (None: no run did)
        "confirmation_launches_median": statistics.median(confirm_at) if confirm_at else None,
        "incorrect_reported_as_best": sum(not ok for r in runs for ok in r.best_correct_after),
        "runs_ever_reporting_incorrect_best": sum(not all(r.best_correct_after) for r in runs),
        "wrong_configs_launched_median": statistics.median(r.wrong_launched for r in runs),
        "unlaunched_constraint_violations_median": statistics.median(r.unlaunched for r in runs),
        # a "not reached" that is the sampler's failure to draw a config the constraints allow
        # within MAX_UNLAUNCHED_PER_TRIAL x budget draws, not a budget spent
        "runs_stopped_by_constraint_violations": sum(r.gave_up for r in runs),
    }
    if reference is not None:
        ref_median = statistics.median(reference)
        ratio = round(med / ref_median, 3) if ref_median else None
        # a median that is only a lower bound (more than half the runs never got there within
        # their budget) bounds the ratio from one side: random's, from above; this strategy's,
        # from below; both, not at all (no ratio)
        censored = out["median_is_lower_bound"]
        out["ratio_to_random_median"] = None if censored and reference_censored else ratio
        out["ratio_is_upper_bound"] = reference_censored and not censored
        out["ratio_is_lower_bound"] = censored and not reference_censored
        out["p_mann_whitney_vs_random"] = mann_whitney_p(
            [float(h) for h in hits], [float(h) for h in reference]
        )
        out["p_wilcoxon_fewer_than_random"] = wilcoxon_less_p(
            [float(h) for h in hits], [float(h) for h in reference]
        )
    asks = [s * 1000.0 for r in runs for s in r.ask_s]
    if asks:
        asks.sort()
        out["ask_ms"] = {
            "n": len(asks),
            "median": round(statistics.median(asks), 2),
            "p95": round(asks[min(len(asks) - 1, int(0.95 * len(asks)))], 2),
            "max": round(asks[-1], 2),
        }
    return out
