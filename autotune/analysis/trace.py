"""Where one decode step's time goes, read from a PyTorch profiler (Kineto) trace.

Ablation says *which* change helped; a step-time breakdown says *why*, and what is left to win
(the motivating case was cracked by one: 157 all-reduces x 135 us = 21 ms of a 50.5 ms step).

The input is the Chrome-trace JSON that ``torch.profiler`` writes (``*.pt.trace.json[.gz]``):
``traceEvents`` of complete events (``"ph": "X"``, ``ts``/``dur`` in microseconds) with a
``cat`` such as ``cpu_op``, ``user_annotation``, ``python_function``, ``kernel``,
``gpu_memcpy``. Which events mark an engine step, and which kernels are collectives, is the
engine's knowledge, handed in as a :class:`TraceRecipe`.

The breakdown is a *partition* of one decode window (from the start of the second step, the
first after prefill, to the end of the last step), so its categories add up to the window
exactly. ``span_ms`` (prefill included) is what the caller compares with the time the client
waited for the same request, an independent check (``autotune.analysis.profile``).
Overlapping events
are resolved by a sweep that gives each instant to the highest-priority category active at it:

* on a GPU trace, kernel time by category (collectives first, then attention/MLA, GEMM, MoE,
  sampling, other kernels, memory copies), and ``gaps``: time no kernel ran, the launch
  overhead CUDA graphs remove;
* on a CPU trace (no kernels), the worker's main thread: ``model compute`` (operator time inside
  a step), ``python in step`` (the rest of the step), ``between steps`` (the worker waits for the
  scheduler's next step and hands its output back: scheduler and inter-process communication).
"""

from __future__ import annotations

import bisect
import dataclasses
import gzip
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.engines.base import TraceRecipe
from autotune.errors import SpecError

#: CPU categories, in the order they are shown
MODEL_COMPUTE, PYTHON_IN_STEP, BETWEEN_STEPS = "model compute", "python in step", "between steps"
#: GPU categories beyond the recipe's kernel categories
OTHER_KERNELS, MEMCPY, GAPS = "other kernels", "memory copies", "gaps (no kernel running)"

_KERNEL_CATS = ("kernel",)
_MEMCPY_CATS = ("gpu_memcpy", "gpu_memset")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


@dataclass(frozen=True)
class Breakdown:
    """One decode window of one worker, partitioned into categories (milliseconds)."""

    device: str  # "cpu" or "gpu"
    window_ms: float
    steps: int
    categories_ms: Mapping[str, float]
    collective_calls: int = 0
    source: str = ""
    #: from the start of the first working step (prefill) to the end of the last
    span_ms: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def per_token_ms(self, tokens: int) -> dict[str, float]:
        """Each category divided by the output tokens the window produced."""
        if tokens <= 0:
            return {}
        return {name: ms / tokens for name, ms in self.categories_ms.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "window_ms": round(self.window_ms, 3),
            "steps": self.steps,
            "categories_ms": {k: round(v, 3) for k, v in self.categories_ms.items()},
            "collective_calls": self.collective_calls,
            "span_ms": round(self.span_ms, 3),
            "source": self.source,
            "notes": list(self.notes),
        }


def load_trace(path: Path) -> dict[str, Any]:
    """A trace file, gzipped or not. A file that is not a trace is a clear error, not a crash."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            trace = json.load(handle)
    except (OSError, ValueError, EOFError) as exc:
        raise SpecError(f"{path} is not a readable profiler trace: {exc}") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise SpecError(f"{path} has no traceEvents list: not a PyTorch profiler trace")
    return trace


def has_steps(trace: Mapping[str, Any], recipe: TraceRecipe) -> bool:
    """Whether this trace is a worker's (it holds engine steps), not the API server's."""
    return any(
        _is_complete(e) and recipe.step.search(str(e.get("name", ""))) for e in _events(trace)
    )


def breakdown(trace: Mapping[str, Any], recipe: TraceRecipe, *, source: str = "") -> Breakdown:
    """Partition the trace's decode window; GPU categories when it holds kernels, else CPU."""
    events = [e for e in _events(trace) if _is_complete(e)]
    steps = _steps(events, recipe)
    working = [s for s in steps if not (recipe.empty_step and recipe.empty_step.search(s["name"]))]
    if len(working) < 3:
        raise ValueError(
            f"{source or 'trace'}: {len(working)} engine steps found; a decode window needs at "
            "least 3 (prefill, then decode steps)"
        )
    start = working[1]["ts"]
    end = max(s["ts"] + s["dur"] for s in steps)
    kernels = [e for e in events if e.get("cat") in _KERNEL_CATS + _MEMCPY_CATS]
    if kernels:
        result = _gpu(events, kernels, recipe, start, end, len(working) - 1, source)
    else:
        result = _cpu(events, steps, start, end, len(working) - 1, source)
    return dataclasses.replace(result, span_ms=(end - working[0]["ts"]) / 1000)


# --- CPU ------------------------------------------------------------------------------------------


def _cpu(
    events: Sequence[Mapping[str, Any]],
    steps: Sequence[Mapping[str, Any]],
    start: float,
    end: float,
    count: int,
    source: str,
) -> Breakdown:
    thread = (steps[0].get("pid"), steps[0].get("tid"))
    ops = [e for e in events if e.get("cat") == "cpu_op" and (e.get("pid"), e.get("tid")) == thread]
    # priority: an operator inside a step is compute; the rest of a step is Python
    intervals = [(e["ts"], e["ts"] + e["dur"], 0) for e in _inside(ops, steps)]
    intervals += [(s["ts"], s["ts"] + s["dur"], 1) for s in steps]
    shares = _sweep(
        intervals, start, end, labels=(MODEL_COMPUTE, PYTHON_IN_STEP), rest=BETWEEN_STEPS
    )
    return Breakdown("cpu", (end - start) / 1000, count, shares, 0, source)


def _inside(ops: Iterable[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]) -> list:
    """Operators that start inside some step (steps are sorted and do not overlap)."""
    starts = [s["ts"] for s in steps]
    inside = []
    for op in ops:
        i = bisect.bisect_right(starts, op["ts"]) - 1
        if i >= 0 and op["ts"] < steps[i]["ts"] + steps[i]["dur"]:
            inside.append(op)
    return inside


# --- GPU ------------------------------------------------------------------------------------------


def _gpu(
    events: Sequence[Mapping[str, Any]],
    kernels: Sequence[Mapping[str, Any]],
    recipe: TraceRecipe,
    start: float,
    end: float,
    count: int,
    source: str,
) -> Breakdown:
    # Kernels run after the CPU launched them: a kernel belongs to the window when its launch
    # (the runtime call with the same ``correlation`` id: cudaLaunchKernel, cudaGraphLaunch)
    # happened inside it; without launch records, when the kernel itself started inside it.
    launched = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in _RUNTIME_CATS and "correlation" in (e.get("args") or {})
    }

    def launch_ts(kernel: Mapping[str, Any]) -> float:
        return launched.get((kernel.get("args") or {}).get("correlation"), kernel["ts"])

    inside = [k for k in kernels if start <= launch_ts(k) <= end]
    if not inside:
        raise ValueError(f"{source or 'trace'}: no GPU kernel ran inside the decode window")
    g_start = min(k["ts"] for k in inside)
    g_end = max(k["ts"] + k["dur"] for k in inside)
    names = [c for c, _ in recipe.kernel_categories]
    labels = (*names, OTHER_KERNELS, MEMCPY)
    intervals = []
    calls = 0
    for k in inside:
        label = _kernel_label(k, recipe, len(names))
        if recipe.collectives and label == 0:
            calls += 1
        intervals.append((k["ts"], k["ts"] + k["dur"], label))
    shares = _sweep(intervals, g_start, g_end, labels=labels, rest=GAPS)
    return Breakdown("gpu", (g_end - g_start) / 1000, count, shares, calls, source)


def _kernel_label(kernel: Mapping[str, Any], recipe: TraceRecipe, n: int) -> int:
    if kernel.get("cat") in _MEMCPY_CATS:
        return n + 1
    name = str(kernel.get("name", ""))
    for i, (_, pattern) in enumerate(recipe.kernel_categories):
        if pattern.search(name):
            return i
    return n


# --- shared ---------------------------------------------------------------------------------


def _sweep(
    intervals: Sequence[tuple[float, float, int]],
    start: float,
    end: float,
    *,
    labels: Sequence[str],
    rest: str,
) -> dict[str, float]:
    """Milliseconds of [start, end] owned by each label: at every instant the lowest label
    index among the intervals active then; instants with none go to ``rest``."""
    points: list[tuple[float, int, int]] = []
    for a, b, label in intervals:
        a, b = max(a, start), min(b, end)
        if b > a:
            points += [(a, 1, label), (b, -1, label)]
    points.sort(key=lambda p: (p[0], p[1]))
    active = [0] * len(labels)
    owned = dict.fromkeys(labels, 0.0)
    owned[rest] = 0.0
    last = start
    for t, delta, label in points:
        if t > last:
            owner = next((labels[i] for i, n in enumerate(active) if n), rest)
            owned[owner] += t - last
            last = t
        active[label] += delta
    owned[rest] += max(0.0, end - last)
    return {k: v / 1000 for k, v in owned.items()}


def _steps(events: Sequence[Mapping[str, Any]], recipe: TraceRecipe) -> list[Mapping[str, Any]]:
    steps = sorted(
        (e for e in events if recipe.step.search(str(e.get("name", "")))), key=lambda e: e["ts"]
    )
    # top-level only: a step nested in another (a Python frame inside an annotation) is one step
    top: list[Mapping[str, Any]] = []
    for step in steps:
        if top and step["ts"] < top[-1]["ts"] + top[-1]["dur"]:
            continue
        top.append(step)
    return top


def _events(trace: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if isinstance(e, dict)]


def _is_complete(event: Mapping[str, Any]) -> bool:
    return (
        event.get("ph") == "X"
        and isinstance(event.get("ts"), int | float)
        and isinstance(event.get("dur"), int | float)
    )
