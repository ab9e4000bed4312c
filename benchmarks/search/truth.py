"""The truth: the best correct config's noise-free value, by enumeration (the oracle).

Exhaustive where feasible (:func:`true_best`): every combination of the choice dims and of the
numeric dims with at most 8 values (parameters the landscape module lists in ``NOT_MODELLED``
held at their baseline, else left unset; other numeric dims at the engine's defaults), or
200,000 random configs when that grid exceeds 1,000,000 points; plus 20,000 random configs
(numeric dims drawn); then the best 20 correct points are polished by coordinate ascent over
every dimension (numeric dims scanned on up to 64 levels) until nothing improves. The result
JSON names the method used. The target is 95 % of that value (:data:`TARGET_FRACTION`).
"""

from __future__ import annotations

import itertools
import math
import random
import sys
from typing import Any

from autotune.space.model import SearchSpace
from benchmarks.search.landscape import BadInput, Landscape

TARGET_FRACTION = 0.95
#: the grid's (and the true-best enumeration's) limit on enumerated numeric values
SMALL_NUMERIC = 8
ENUMERATION_LIMIT = 1_000_000
RANDOM_SEARCH_POINTS = 200_000
POLISH_FROM = 20
#: random configs added to the enumeration before polishing (numeric dims it left at default)
POLISH_SAMPLE = 20_000
POLISH_LEVELS = 64
#: the true best's landscape calls take longer than this: say how long, up front
SLOW_TRUE_BEST_S = 60.0


def grid_choices(space: SearchSpace, name: str) -> list[Any] | None:
    """The values of a dim the grid enumerates, or None for a numeric dim left at default."""
    p = space.parameter(name)
    if p.type == "bool":
        return [False, True]
    if p.type in ("categorical", "int_list"):
        return [list(c) if p.type == "int_list" else c for c in p.choices]
    return None


def _numeric_levels(space: SearchSpace, name: str, limit: int) -> list[Any]:
    p = space.parameter(name)
    low, high = float(p.low), float(p.high)
    if p.type == "int":
        step = int(p.step or 1)
        values = list(range(int(low), int(high) + 1, step))
        if len(values) <= limit:
            return values
        if p.log:
            raw = [
                math.exp(math.log(low) + i * (math.log(high) - math.log(low)) / (limit - 1))
                for i in range(limit)
            ]
        else:
            raw = [low + i * (high - low) / (limit - 1) for i in range(limit)]
        return sorted({int(low) + step * round((v - low) / step) for v in raw})
    if p.step:
        n = int(round((high - low) / float(p.step))) + 1
        if n <= limit:
            return [round(low + i * float(p.step), 10) for i in range(n)]
    if p.log:
        return [
            math.exp(math.log(low) + i * (math.log(high) - math.log(low)) / (limit - 1))
            for i in range(limit)
        ]
    return [low + i * (high - low) / (limit - 1) for i in range(limit)]


def _distinct(p: Any) -> float:
    """How many values a numeric parameter can take (inf for a continuous one)."""
    if p.type == "int":
        return (int(p.high) - int(p.low)) // int(p.step or 1) + 1
    if p.step:
        return round((float(p.high) - float(p.low)) / float(p.step)) + 1
    return math.inf


def _enumerate(space: SearchSpace, domains: dict[str, list[Any]], fixed: dict[str, Any]):
    """Every config of ``domains`` (activity respected, inactive dims dropped), lazily."""
    params = list(space.parameters)

    def walk(i: int, values: dict[str, Any]):
        if i == len(params):
            yield dict(values)
            return
        p = params[i]
        if not space.is_active(p, values) or (p.name not in domains and p.name not in fixed):
            yield from walk(i + 1, values)
            return
        for v in domains.get(p.name, [fixed.get(p.name)]):
            values[p.name] = v
            yield from walk(i + 1, values)
            del values[p.name]

    yield from walk(0, {})


def true_best(space: SearchSpace, land: Landscape) -> tuple[float, dict[str, Any], str]:
    """The best correct config's noise-free value (see the module docstring for the method)."""
    baseline = space.baseline_values()
    fixed = {n: baseline[n] for n in land.not_modelled if n in baseline}
    domains: dict[str, list[Any]] = {}
    for p in space.parameters:
        if p.name in land.not_modelled:
            continue
        choices = grid_choices(space, p.name)
        if choices is None:
            if _distinct(p) <= SMALL_NUMERIC:
                domains[p.name] = _numeric_levels(space, p.name, SMALL_NUMERIC)
        else:
            domains[p.name] = choices
    scored: list[tuple[float, dict[str, Any]]] = []
    size = sum(
        1 for _ in itertools.islice(_enumerate(space, domains, fixed), ENUMERATION_LIMIT + 1)
    )
    if size <= ENUMERATION_LIMIT:
        method = f"exhaustive ({size} configs) over {sorted(domains)}"
        points = _enumerate(space, domains, fixed)
    else:
        rng = random.Random(12345)
        method = f"{RANDOM_SEARCH_POINTS} random configs"

        def draws():
            for _ in range(RANDOM_SEARCH_POINTS):
                values = {n: _snap(space, n, v) for n, v in space.draw(rng).items()}
                yield {**values, **{n: v for n, v in fixed.items() if n in values}}

        points = draws()
    expected = (size if size <= ENUMERATION_LIMIT else RANDOM_SEARCH_POINTS) + POLISH_SAMPLE
    clock = _Eta(land, expected)
    failures: dict[str, int] = {}
    wrong = 0
    for values in points:
        if space.violated(values):
            continue
        out = land(values)
        clock.tick()
        if out.started and out.correct:
            scored.append((out.true, values))
        elif out.started:
            wrong += 1
        else:
            failures[out.failure or ""] = failures.get(out.failure or "", 0) + 1
    rng = random.Random(54321)
    for _ in range(POLISH_SAMPLE):
        values = space.draw(rng)
        values = {n: _snap(space, n, v) for n, v in values.items()}
        if space.violated(values):
            continue
        out = land(values)
        clock.tick()
        if out.started and out.correct:
            scored.append((out.true, values))
        elif out.started:
            wrong += 1
        else:
            failures[out.failure or ""] = failures.get(out.failure or "", 0) + 1
    if not scored:
        # no target to reach: "launches to 95 % of the best correct config" has no meaning
        reasons = ", ".join(
            f"{r} {n}" for r, n in sorted(failures.items(), key=lambda rn: -rn[1])[:3]
        )
        raise BadInput(
            f"{land.where}: no correct config in the space, so no best to reach: of "
            f"{wrong + sum(failures.values())} configs evaluated, {wrong} gave wrong output and "
            f"{sum(failures.values())} failed to start" + (f" ({reasons})" if reasons else "")
        )
    scored.sort(key=lambda sv: -sv[0])
    best_value, best_values = scored[0]
    for value, values in scored[:POLISH_FROM]:
        value, values = _polish(space, land, value, values)
        if value > best_value:
            best_value, best_values = value, values
    return (
        best_value,
        best_values,
        (
            method + f" plus {POLISH_SAMPLE} random configs, then coordinate ascent from the best "
            f"{POLISH_FROM}"
        ),
    )


class _Eta:
    """Says up front when the true best will take long: it calls the landscape some 10^4 to
    2.2 x 10^5 times, and a landscape of 50 ms per call silently took hours."""

    def __init__(self, land: Landscape, expected: int) -> None:
        self.land, self.expected, self.seen, self.said = land, expected, 0, False
        self.start_calls, self.start_s = land.calls, land.call_seconds

    def tick(self) -> None:
        """Per call; measures calls 50-100, 100-1000 and 1000-10000 (the first ones are
        repeated (:data:`REPEAT_CHECKS`) and warm caches up)."""
        self.seen += 1
        if self.said or self.seen not in (50, 100, 1000, 10000):
            return
        calls, seconds = self.land.calls, self.land.call_seconds
        per_call = (seconds - self.start_s) / max(1, calls - self.start_calls)
        self.start_calls, self.start_s = calls, seconds
        if self.seen == 50:
            return
        if per_call * self.expected > SLOW_TRUE_BEST_S:
            self.said = True
            print(
                f"true best: about {self.expected} calls of {self.land.where} at "
                f"{per_call * 1000:.2g} ms each (~{per_call * self.expected / 60:.0f} min, "
                "plus the polish); a landscape should be a fast cost model",
                file=sys.stderr,
                flush=True,
            )


def _snap(space: SearchSpace, name: str, value: Any) -> Any:
    """A drawn float on its parameter's step (``SearchSpace.draw`` draws continuous floats)."""
    p = space.parameter(name)
    if p.type == "float" and p.step:
        k = round((value - float(p.low)) / float(p.step))
        return round(float(p.low) + k * float(p.step), 10)
    return value


def _polish(
    space: SearchSpace, land: Landscape, value: float, values: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    improved = True
    while improved:
        improved = False
        for p in space.parameters:
            if p.name in land.not_modelled or not space.is_active(p, values):
                continue
            options = grid_choices(space, p.name) or _numeric_levels(space, p.name, POLISH_LEVELS)
            for option in options:
                candidate = _reactivate(space, {**values, p.name: option}, values)
                if candidate == values or space.violated(candidate):
                    continue
                out = land(candidate)
                if out.started and out.correct and out.true > value * (1 + 1e-12):
                    value, values, improved = out.true, candidate, True
    return value, values


def _reactivate(space: SearchSpace, values: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """Drop dims a change made inactive; a dim it made active takes its first value."""
    out: dict[str, Any] = {}
    for p in space.parameters:
        if not space.is_active(p, out):
            continue
        if p.name in values:
            out[p.name] = values[p.name]
        elif p.name in old:
            out[p.name] = old[p.name]
        else:
            choices = grid_choices(space, p.name)
            if choices is not None:
                out[p.name] = choices[0]
            elif p.has_baseline:
                out[p.name] = p.baseline
            else:
                continue
    return out
