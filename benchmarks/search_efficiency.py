"""Benchmark OF THE SEARCH on SIMULATED landscapes (cost models; no server, no GPU).

Rerun (the README's figures; about 15 minutes on 2 shared cores)::

    .venv/bin/python benchmarks/search_efficiency.py                     # GLM-5 landscape
    .venv/bin/python benchmarks/search_efficiency.py --space search_spaces/interactions-sim.yaml \\
        --landscape benchmarks/landscapes/interactions.py:landscape \\
        --out benchmarks/results/search_efficiency_interactions.json
    # any landscape: FUNCTION(params) -> {"tok_s": x} | {"tok_s": x, "correct": False}
    #                                   | {"failure": "oom"}
    .venv/bin/python benchmarks/search_efficiency.py --space S.yaml --landscape my.py:f --noise 0.1

The landscape protocol, and what is bad input (one line naming the file and function, exit
code 2, no result file): FILE is imported as Python imports a script (its folder on the path,
so it may import modules of its own beside it); FUNCTION takes one argument, the config's
values (a parameter the config leaves to the engine is absent: read it with ``params.get``),
and returns a dict of
the keys ``tok_s`` (a number: int, float, NumPy scalar or 0-d array, within 1e-300..1e300 so
that the noise keeps it finite and > 0), ``correct`` (a bool, default true) and ``failure`` (a
non-empty reason; it wins over the others). A key that reads like a misspelt one of these is
bad input (``"corect": False`` counted a wrong config as correct); other keys are ignored and
named once on stderr. Bad input too is a landscape that raises (or
calls ``sys.exit``) on any config, at import or in a call: a simulated failure is returned as
``{"failure": ...}``, an exception is a bug in the landscape, and the harness cannot tell one
from the other. It must be deterministic (the harness draws the noise; a landscape drawing its
own made a target out of a lucky maximum): its first calls are made twice and must agree. One
call may take ``--call-limit`` seconds (default 10; 0: none): the harness calls it some 10^4 to
10^6 times for the true best, and a landscape stuck in a loop hung it; when the true best will
take over a minute it says so up front. A landscape with no correct config in the space is bad
input too (no target: the figures would mean nothing); a baseline that fails or is wrong is
fine and said so (``baseline_outcome``). Speeds of any scale give the same figures.

The question: with a search space and a landscape (a function from a config to its noise-free
outcome), how many LAUNCHES does each strategy need before the config it would report as best
is within 5 % of the best *correct* config's TRUE value, and does it ever report a wrong one?

The harness adds the measurement noise (``--noise``, default the landscape module's ``NOISE``,
else 5 %: measured = true / max(0.5, 1 + N(0, noise))), applies the space's constraints (a
violating config is never launched and not counted) and the objective's verdict policy (a
failed start or wrong output is PRUNED with the ``correct`` constraint at 1; a correct config
is COMPLETE with its measured value). What a gated strategy reports after each launch is what
``autotune run`` would report if it stopped there: the winner of its confirmation, simulated
(:class:`Confirm`: the product's candidate ranking and stopping rule; its launches count), or
with ``--confirm-top 0`` the highest measured verified trial
(``autotune.study.results.best_trials``).
Trial 0 is the space's baseline, enqueued like ``study.open_study`` does. Parameters a config
does not set (the baseline's) are the landscape's engine defaults.

Strategies:

* ``auto`` -- the default of ``autotune run`` (``autotune/search/strategy.py``), with the gate;
* ``tpe`` -- the TPE sampler autotune used before (``--sampler tpe``), with the gate;
* ``random`` -- ``optuna.samplers.RandomSampler``, with the gate (the reference of the ratio
  and of the p-values);
* ``grid-random`` / ``grid-sweep`` -- a ``vllm bench sweep`` grid (every categorical/bool/
  int_list choice, numeric dims left at the engine's defaults), in random order / in
  declaration order (the last parameter varies fastest), with the gate;
* ``random-nogate``, ``grid-random-nogate``, ``grid-sweep-nogate`` -- the peers as they really
  run: no correctness gate, best = highest measured config that started.

True best: exhaustive where feasible (``true_best``): every combination of the choice dims and
of the numeric dims with at most 8 values (parameters the landscape module lists in
``NOT_MODELLED`` held at their baseline, else left unset; other numeric dims at the engine's
defaults), or 200,000 random configs when that grid exceeds 1,000,000 points; plus 20,000
random configs (numeric dims drawn); then the best 20 correct points are polished by
coordinate ascent over every dimension (numeric dims scanned on up to 64 levels) until
nothing improves. The result JSON names the method used.

Figures, per strategy and per seed set (3 disjoint sets of 30 seeds by default): median and IQR
of launches to 95 %, the confirmation's included (``search_launches_to_95pct_median``: without
them; ``found_95pct_*``: the first launch of a config truly within 5 %, reported or not); runs
that never get there count as their budget + 1. The reference strategies (random, the grids,
the peers without the gate) run on to ``--reference-budget`` (default 400), so that their
medians are measured instead of capped at 61 (random's is 60-110 launches on the interactions
landscape and several hundred on GLM-5's); a median that even that does not reach prints as
``> N`` and makes the ratio to it an upper bound. Misses (``not_reached_within_budget``) count
within ``--budget`` for every strategy;
simulated hours to 95 % from a per-launch cost model (the landscape's ``COST_MINUTES``: a
failed start costs ``failed_start``, a wrong output ``load + check``, a correct config or a
confirmation round ``load + check + bench``; the peers without the gate pay ``load + bench``
for every config that starts); Mann-Whitney U (two-sided) and Wilcoxon signed-rank
(paired by seed, one-sided: fewer launches than random) p-values against ``random``. A run stops
at its first launch that reaches 95 % (nothing after it changes the figures) unless ``--full``.
The model-based ask time of ``auto`` is measured and saved (``ask_ms``).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.util
import inspect
import itertools
import json
import math
import numbers
import os
import platform
import random
import signal
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autotune import names
from autotune.analysis.confirm import (
    DEFAULT_MAX_ROUNDS,
    gain_is_precise,
    gain_with_ci,
    rank_candidates,
)
from autotune.engines.vllm.machine import lossy_reason
from autotune.patching import discover_patches
from autotune.search.model import config_key
from autotune.search.strategy import AutoSampler, build_sampler, risky_choices
from autotune.space.load import load_space
from autotune.space.model import SearchSpace
from autotune.spec.model import WorkloadSpec
from autotune.study.results import best_trials

ROOT = Path(__file__).resolve().parents[1]
PATCH_DIR = ROOT / "patches"
DEFAULT_SPACE = ROOT / "search_spaces" / "glm5-8gpu.yaml"
DEFAULT_LANDSCAPE = "benchmarks/landscapes/glm5.py:landscape"
RESULT_PATH = ROOT / "benchmarks" / "results" / "search_efficiency.json"
TARGET_FRACTION = 0.95
DEFAULT_NOISE = 0.05
DEFAULT_COST = {"load": 10.0, "failed_start": 5.0, "check": 1.0, "bench": 3.0}
#: the grid's (and the true-best enumeration's) limit on enumerated numeric values
SMALL_NUMERIC = 8
ENUMERATION_LIMIT = 1_000_000
RANDOM_SEARCH_POINTS = 200_000
POLISH_FROM = 20
#: random configs added to the enumeration before polishing (numeric dims it left at default)
POLISH_SAMPLE = 20_000
POLISH_LEVELS = 64
STRATEGIES = (
    "auto",
    "tpe",
    "random",
    "grid-random",
    "grid-sweep",
    "random-nogate",
    "grid-random-nogate",
    "grid-sweep-nogate",
)
MAX_UNLAUNCHED_PER_TRIAL = 50
#: the strategies the default is measured AGAINST: their runs go on past ``--budget`` (to
#: ``--reference-budget``) so that their medians are measured. Capped at budget + 1 (61), random's
#: median read as 61 on landscapes where it is 97 or 400+, and every ratio to it was overstated.
REFERENCE_STRATEGIES = frozenset(
    {"random", "grid-random", "grid-sweep", "random-nogate", "grid-random-nogate",
     "grid-sweep-nogate"}
)  # fmt: skip
DEFAULT_REFERENCE_BUDGET = 400
#: the keys a landscape's result may have
RESULT_KEYS = frozenset({"tok_s", "correct", "failure"})
#: keys that read as a verdict in other words: ignoring one could count a wrong config correct
VERDICT_LIKE = frozenset({"ok", "valid", "wrong", "incorrect", "error", "passed", "pass"})
#: the speeds the harness takes: its noise divides by 0.5 to about 4, so a speed outside this
#: range could become inf or 0 (the search model and the statistics work on any scale within)
MIN_TOK_S = 1e-300
MAX_TOK_S = 1e300
#: the first landscape calls made twice to check that the landscape is deterministic
REPEAT_CHECKS = 50
#: default wall seconds one landscape call may take (``--call-limit``)
CALL_LIMIT = 10.0
#: the true best's landscape calls take longer than this: say how long, up front
SLOW_TRUE_BEST_S = 60.0

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class BadInput(Exception):
    """A landscape or space the harness cannot use (exit code 2, one line)."""


# --- the landscape --------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    started: bool
    correct: bool
    true: float  # noise-free value (0 when it did not start)
    failure: str | None = None


@dataclass
class Landscape:
    """A user's landscape function with the harness's checks around it."""

    function: Callable[[dict[str, Any]], dict[str, Any]]
    where: str
    noise: float
    not_modelled: tuple[str, ...]
    cost: dict[str, float]

    #: wall seconds one call may take (0: no limit), and calls made, and their total time
    call_limit: float = 0.0
    calls: int = 0
    call_seconds: float = 0.0
    #: the first calls are made twice and must agree (:meth:`__call__`)
    repeat_checks: int = REPEAT_CHECKS
    #: extra result keys already named on stderr (:meth:`_check_keys`)
    ignored_keys: set[Any] = field(default_factory=set)

    def __call__(self, params: dict[str, Any]) -> Outcome:
        """The outcome of ``params``, checked against the protocol (bad input otherwise).

        Why the first :data:`REPEAT_CHECKS` calls are made twice: the harness adds the noise
        itself, and the true best, the target and every run's outcomes come from separate
        calls; a landscape that draws its own noise makes the target a maximum over lucky
        draws that no run can reach, and the figures misleading. Refused, not averaged."""
        outcome = self._once(params)
        if self.repeat_checks > 0:
            self.repeat_checks -= 1
            again = self._once(params)
            if again != outcome:
                raise BadInput(
                    f"{self.where} is not deterministic: {_described(outcome)}, then "
                    f"{_described(again)} on {params!r} (the harness adds the noise: --noise)"
                )
        return outcome

    def _once(self, params: dict[str, Any]) -> Outcome:
        start = time.perf_counter()
        try:
            _WATCHDOG.started = start
            try:
                result = self.function(dict(params))
            finally:
                _WATCHDOG.started = None
        except _CallTimeout:
            raise BadInput(
                f"{self.where} took more than {self.call_limit:g} s on {params!r} (--call-limit; "
                "a landscape is a cost model the harness calls some 10^5 times)"
            ) from None
        # a user's function: say which one broke, and on what (a sys.exit() in it ended the
        # harness with its code and no result)
        except (Exception, SystemExit) as exc:
            hint = ""
            if isinstance(exc, KeyError) and exc.args and exc.args[0] not in params:
                # the baseline and the grids leave parameters to the engine: absent, not None
                hint = (
                    f" ({exc.args[0]!r} is left out where the config keeps the engine's "
                    "default: read it with params.get)"
                )
            raise BadInput(f"{self.where} raised {exc!r} on {params!r}{hint}") from None
        finally:
            self.calls += 1
            self.call_seconds += time.perf_counter() - start
        return self._checked(result, params)

    def _check_keys(self, result: dict[Any, Any], params: dict[str, Any]) -> None:
        """A key that reads like a misspelt one of :data:`RESULT_KEYS` is bad input (``"corect":
        False`` counted a wrong config as correct); any other extra key (a landscape that also
        returns its latency, a note) is ignored, said once on stderr: refusing it would refuse
        landscapes written for other tools."""
        for key in sorted(set(result) - RESULT_KEYS, key=str):
            text = str(key).lower()
            near = difflib.get_close_matches(text, RESULT_KEYS, n=1, cutoff=0.6)
            meant = "correct" if text in VERDICT_LIKE else (near[0] if near else None)
            if meant is not None:
                raise BadInput(
                    f"{self.where} returned key {key!r} on {params!r} (did you mean "
                    f"{meant!r}?); keys: " + ", ".join(sorted(RESULT_KEYS))
                )
            if key not in self.ignored_keys:
                self.ignored_keys.add(key)
                print(
                    f"note: {self.where} returned key {key!r}, ignored (the harness reads "
                    f"{', '.join(sorted(RESULT_KEYS))})",
                    file=sys.stderr,
                )

    def _checked(self, result: Any, params: dict[str, Any]) -> Outcome:
        if not isinstance(result, dict):
            raise BadInput(f"{self.where} returned {type(result).__name__}, not a dict")
        self._check_keys(result, params)
        if "failure" in result:
            reason = result["failure"]
            if not isinstance(reason, str) or not reason:
                raise BadInput(
                    f"{self.where} returned failure={reason!r}: a failure needs a reason "
                    "(a non-empty string such as 'oom')"
                )
            return Outcome(False, False, 0.0, reason)
        if "tok_s" not in result:
            raise BadInput(
                f"{self.where} returned {result!r} on {params!r}: needs tok_s (or a failure reason)"
            )
        # NumPy's scalars count (np.float32, np.int64, np.bool_ are not float, int, bool): a
        # landscape that computes with NumPy returns them, or a 0-d array (np.asarray)
        value = result["tok_s"]
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
            raise BadInput(
                f"{self.where} returned tok_s={value!r} ({type(value).__name__}), not a number"
            )
        if not MIN_TOK_S <= float(value) <= MAX_TOK_S:
            raise BadInput(
                f"{self.where} returned tok_s={value!r} on {params!r}: needs a finite tok_s > 0 "
                f"(within {MIN_TOK_S:g} .. {MAX_TOK_S:g}), or a failure reason"
            )
        correct = result.get("correct", True)
        if isinstance(correct, np.ndarray) and correct.ndim == 0:
            correct = correct[()]
        if not isinstance(correct, bool | np.bool_):
            raise BadInput(f"{self.where} returned correct={correct!r}, not a bool")
        return Outcome(True, bool(correct), float(value))


class _CallTimeout(BaseException):
    """Raised in a landscape call that ran past ``--call-limit`` (a BaseException, so that a
    landscape's own ``except Exception`` does not swallow it)."""


class _Watchdog:
    """The landscape calls' time limit: a periodic SIGALRM (Unix, main thread) whose handler
    raises :class:`_CallTimeout` in a call that has run past ``limit`` seconds. A landscape
    stuck in a loop hung the harness for ever. Why a periodic tick, not a timer per call:
    the true best makes up to ~10^6 calls, and two ``setitimer`` and two ``signal`` calls
    each doubled its time. Code stuck inside one C call (a NumPy routine) is interrupted
    when it returns."""

    def __init__(self) -> None:
        self.limit = 0.0
        self.started: float | None = None

    def expired(self, _signum: int, _frame: Any) -> None:
        started = self.started
        if started is not None and time.perf_counter() - started > self.limit:
            self.started = None
            raise _CallTimeout

    @contextlib.contextmanager
    def armed(self, limit: float) -> Iterator[None]:
        if (
            limit <= 0
            or not hasattr(signal, "setitimer")
            or threading.current_thread() is not threading.main_thread()
        ):
            yield
            return
        self.limit = limit
        tick = min(1.0, limit / 4)
        previous = signal.signal(signal.SIGALRM, self.expired)
        signal.setitimer(signal.ITIMER_REAL, tick, tick)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            self.started = None


_WATCHDOG = _Watchdog()


def _described(outcome: Outcome) -> str:
    if not outcome.started:
        return f"failed to start ({outcome.failure})"
    return f"{_show(outcome.true)} tok/s" + ("" if outcome.correct else " (wrong output)")


def _show(value: float) -> str:
    """A figure for the console: two decimals as before, or four significant digits where two
    decimals would print 0.00 or a 300-digit number (tok_s of 1e-9 or 1e12 are legitimate)."""
    return f"{value:.2f}" if value == 0 or 0.01 <= abs(value) < 1e9 else f"{value:.4g}"


def _rounded(value: float) -> float:
    """A figure for the JSON: 4 decimals as before for values >= 1, and at least 6 significant
    digits below (``round(1e-9, 4)`` wrote a true best and a target of 0.0)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, max(4, 5 - math.floor(math.log10(abs(value)))))


def load_landscape(text: str, noise: float | None, call_limit: float = CALL_LIMIT) -> Landscape:
    path_text, _, name = text.rpartition(":")
    path = Path(path_text)
    if not path_text or not name:
        raise BadInput(f"--landscape {text!r}: expected FILE.py:FUNCTION")
    if not path.is_absolute():
        path = path if path.exists() else ROOT / path
    if not path.is_file():
        raise BadInput(f"--landscape: no such file {path_text}")
    spec = importlib.util.spec_from_file_location(f"_landscape_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise BadInput(f"--landscape: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    # imported as Python imports a script: registered under its name (a dataclass, pickle or
    # typing.get_type_hints looks its module up in sys.modules: a landscape defining a dataclass
    # failed to import) and with its folder on the path (a landscape importing a module of its
    # own beside it failed with ModuleNotFoundError); at the end of the path, so that a file
    # beside it cannot shadow a module the harness imports
    sys.modules[spec.name] = module
    folder = str(path.parent.resolve())
    if folder not in sys.path:
        sys.path.append(folder)
    try:
        spec.loader.exec_module(module)
    # a user's file: say which one broke, not a traceback; a sys.exit() at import ended the
    # harness with that code (0: "success") and no result
    except (Exception, SystemExit) as exc:
        sys.modules.pop(spec.name, None)
        raise BadInput(f"--landscape: importing {path} failed: {exc!r}") from None
    if not hasattr(module, name):
        raise BadInput(f"--landscape: {path} has no function {name!r}")
    function = getattr(module, name)
    where = f"{path.name}:{name}"
    if not callable(function):
        raise BadInput(f"--landscape: {where} is {type(function).__name__}, not a function")
    try:
        inspect.signature(function).bind({})
    except TypeError:
        raise BadInput(
            f"--landscape: {where}{inspect.signature(function)} cannot be called with one "
            "argument (FUNCTION(params) -> dict)"
        ) from None
    except ValueError:
        pass  # no signature to read (a builtin): its first call says
    return Landscape(
        function=function,
        where=where,
        noise=_number(
            noise if noise is not None else getattr(module, "NOISE", DEFAULT_NOISE),
            "--noise" if noise is not None else f"{path.name}: NOISE",
        ),
        not_modelled=_names(getattr(module, "NOT_MODELLED", ()), f"{path.name}: NOT_MODELLED"),
        cost=_cost(getattr(module, "COST_MINUTES", {}), f"{path.name}: COST_MINUTES"),
        call_limit=_number(call_limit, "--call-limit"),
    )


def _number(value: Any, where: str) -> float:
    """A finite number >= 0 (noise, minutes), or bad input naming where it came from."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise BadInput(f"{where} must be a finite number >= 0, not {value!r}")
    return float(value)


def _names(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(n, str) for n in _iterable(value, where)):
        raise BadInput(f"{where} must be a list of parameter names, not {value!r}")
    return tuple(value)


def _iterable(value: Any, where: str) -> list[Any]:
    try:
        return list(value)
    except TypeError:
        raise BadInput(f"{where} must be a list, not {value!r}") from None


def _cost(value: Any, where: str) -> dict[str, float]:
    """The landscape's per-launch minutes over the harness's defaults; unknown keys are bad
    input (a typo would silently keep the default)."""
    if not isinstance(value, dict):
        raise BadInput(f"{where} must be a mapping such as {DEFAULT_COST}, not {value!r}")
    unknown = sorted(set(value) - set(DEFAULT_COST), key=str)
    if unknown:
        raise BadInput(f"{where}: unknown key {unknown[0]!r}; keys: {', '.join(DEFAULT_COST)}")
    return {**DEFAULT_COST, **{k: _number(v, f"{where}[{k!r}]") for k, v in value.items()}}


def measured(outcome: Outcome, noise: float, rng: random.Random) -> float:
    if noise <= 0:
        return outcome.true
    return outcome.true / max(0.5, 1.0 + rng.gauss(0.0, noise))


def launch_minutes(outcome: Outcome, cost: dict[str, float], *, gate: bool) -> float:
    if not outcome.started:
        return cost["failed_start"]
    if not gate:
        return cost["load"] + cost["bench"]
    if not outcome.correct:
        return cost["load"] + cost["check"]
    return cost["load"] + cost["check"] + cost["bench"]


# --- the space's grid and the true best -----------------------------------------------------


def _choices(space: SearchSpace, name: str) -> list[Any] | None:
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
        choices = _choices(space, p.name)
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
            options = _choices(space, p.name) or _numeric_levels(space, p.name, POLISH_LEVELS)
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
            choices = _choices(space, p.name)
            if choices is not None:
                out[p.name] = choices[0]
            elif p.has_baseline:
                out[p.name] = p.baseline
            else:
                continue
    return out


def grid_points(space: SearchSpace, rng: random.Random | None):
    """The sweep's grid, lazily: in declaration order, or (``rng``) in a random order (uniform
    draws from the product, repeats of a canonical point skipped). Inactive dims dropped,
    numeric dims left to the engine's defaults."""
    choice_params = [p for p in space.parameters if _choices(space, p.name) is not None]
    domains = [_choices(space, p.name) for p in choice_params]
    seen: set[str] = set()

    def canonical(combo: tuple[Any, ...]) -> dict[str, Any]:
        raw = dict(zip((p.name for p in choice_params), combo, strict=True))
        values: dict[str, Any] = {}
        for p in space.parameters:
            if p.name in raw and space.is_active(p, values):
                values[p.name] = raw[p.name]
        return values

    source = (
        itertools.product(*domains)
        if rng is None
        else (tuple(rng.choice(d) for d in domains) for _ in itertools.count())
    )
    misses = 0
    for combo in source:
        values = canonical(combo)
        key = json.dumps(values, sort_keys=True)
        if key in seen:
            misses += 1
            if misses > 100_000:
                return
            continue
        misses = 0
        seen.add(key)
        yield values


# --- runs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One launch of a run, kept for diagnostics (``benchmarks/ranking.py``): the config in
    Optuna form, its role, what was measured (None: it did not start or, under the gate,
    printed wrong output) and its noise-free outcome."""

    params: dict[str, Any]
    role: str
    measured: float | None
    outcome: Outcome


@dataclass
class RunResult:
    strategy: str
    seed: int
    #: true value of the reported best after each launch (0: none), and whether it is correct
    best_true_after: list[float] = field(default_factory=list)
    best_correct_after: list[bool] = field(default_factory=list)
    minutes_after: list[float] = field(default_factory=list)
    #: launches the confirmation would add if the search stopped after each launch
    confirm_launches_after: list[int] = field(default_factory=list)
    wrong_launched: int = 0
    unlaunched: int = 0
    ask_s: list[float] = field(default_factory=list)
    #: the first launch of a config whose TRUE value reaches the target (whether or not it is
    #: reported then): where a miss comes from, the search or the report
    found_at: int | None = None
    #: the run ended before its budget: its sampler drew MAX_UNLAUNCHED_PER_TRIAL x budget
    #: configs that break the constraints (counted as not reached, and said so)
    gave_up: bool = False
    #: the launches this run was given (``--budget``, or ``--reference-budget`` for a
    #: reference strategy): a run that never reached the target counts as budget + 1
    budget: int = 0
    launches: list[Launch] = field(default_factory=list)


@dataclass(frozen=True)
class Confirm:
    """The confirmation ``autotune run`` ends with (``confirm.py``, its defaults
    ``--confirm-top 2 --confirm-repeats 2`` and the spec's default ``target_precision``): the
    top configs by the search model's posterior mean (``confirm.rank_candidates``, the
    product's own function) and the baseline are measured again, one round each at a time,
    at least ``repeats`` rounds and on, up to ``max_rounds``, until the leading candidate's gain
    over the baseline is known within ``precision`` (``confirm.gain_is_precise``, the product's
    rule). The best median wins, unless its gain over the baseline (``confirm.gain_with_ci``) is
    not positive (then the baseline is reported, as ``report.baseline_reason`` does). Each
    config's confirmation draws come from a random stream of its own (per seed and config), so
    the answer changes only when the candidates do."""

    top: int = 2
    repeats: int = 2
    max_rounds: int = DEFAULT_MAX_ROUNDS
    precision: float = WorkloadSpec.target_precision

    def precise(self, lead: list[float], base: list[float]) -> bool:
        return gain_is_precise(tuple(lead), tuple(base), 1.0, self.precision)


def _record(run: RunResult, best: Outcome | None, minutes: float, confirm: int = 0) -> None:
    run.best_true_after.append(best.true if best else 0.0)
    run.best_correct_after.append(best.correct if best else True)
    run.minutes_after.append((run.minutes_after[-1] if run.minutes_after else 0.0) + minutes)
    run.confirm_launches_after.append(confirm)


def _reached(run: RunResult, target: float, budget: int) -> bool:
    launches = len(run.best_true_after) + run.confirm_launches_after[-1]
    return run.best_correct_after[-1] and run.best_true_after[-1] >= target and launches <= budget


def _reported(
    study: optuna.Study,
    space: SearchSpace,
    land: Landscape,
    outcome_of: dict[int, Outcome],
    seed: int,
    confirm: Confirm | None,
) -> tuple[Outcome | None, int]:
    """What the run would report if the search stopped now, and the launches that costs: the
    confirmed winner (``confirm``), else the highest measured verified trial
    (``report.best_trials``, what a run without confirmation reports)."""
    if confirm is None or confirm.top == 0:
        best = best_trials(study)
        return (outcome_of[best[0].number] if best else None), 0
    trials = study.get_trials(deepcopy=False)
    candidates = rank_candidates(space, trials, 1.0, confirm.top)
    baseline = next((t for t in trials if t.user_attrs.get(names.ROLE) == "baseline"), None)
    base = outcome_of.get(baseline.number) if baseline is not None else None
    if not candidates:
        return (base if base is not None and base.started and base.correct else None), 0

    variants = [(t.params, outcome_of[t.number]) for t in candidates]
    base_ok = base is not None and base.started and base.correct
    if base_ok:
        variants.append((baseline.params, base))
    streams = [random.Random(f"confirm:{seed}:{config_key(c)}") for c, _ in variants]
    samples: list[list[float]] = [[] for _ in variants]
    rounds = 0
    while True:
        rounds += 1
        for stream, (_c, outcome), got in zip(streams, variants, samples, strict=True):
            got.append(measured(outcome, land.noise, stream))
        if rounds < confirm.repeats:
            continue
        lead = max(samples[: len(candidates)], key=statistics.median)
        if rounds >= confirm.max_rounds or not base_ok or confirm.precise(lead, samples[-1]):
            break
    medians = [statistics.median(got) for got in samples]
    best = max(range(len(candidates)), key=lambda i: medians[i])
    winner = variants[best][1]
    # the product's rule (report.baseline_reason): no gain by the confirmation's own measure
    if base_ok and gain_with_ci(tuple(samples[best]), tuple(samples[-1]), 1.0)[0] <= 0:
        winner = base
    return winner, rounds * (len(candidates) + 1)


def run_optuna(
    space: SearchSpace,
    land: Landscape,
    sampler: optuna.samplers.BaseSampler,
    name: str,
    seed: int,
    budget: int,
    target: float,
    *,
    gate: bool = True,
    stop_at_target: bool = True,
    confirm: Confirm | None = None,
    points: Iterator[dict[str, Any]] | None = None,
) -> RunResult:
    """The autotune loop in-process: baseline first, then the sampler (or the fixed ``points``
    of a grid, each setting only its own parameters), the objective's policy, and what it
    would report (:func:`_reported`; peers without the gate report their highest measurement
    and confirm nothing)."""
    noise_rng = random.Random(seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(space.baseline_optuna_params(), user_attrs={names.ROLE: "baseline"})
    run = RunResult(name, seed, budget=budget)
    outcome_of: dict[int, Outcome] = {}
    launched = 0
    while launched < budget:
        only: Collection[str] | None = None
        # the baseline (enqueued) is asked first; ``study.trials`` deep-copies every trial,
        # which made a 400-launch grid run take minutes
        if points is not None and run.unlaunched + launched > 0:
            point = next(points, None)
            if point is None:
                break
            study.enqueue_trial(space.to_optuna_params(point), user_attrs={names.ROLE: "search"})
            only = set(point)
        trial = study.ask()
        role = trial.user_attrs.get(names.ROLE, "search")
        values = (
            space.suggest(trial, only=space.baseline_names())
            if role == "baseline"
            else space.suggest(trial, only=only)
        )
        trial.set_user_attr(names.PARAMS_RESOLVED, values)
        trial.set_user_attr(names.ROLE, role)
        if space.violated(values):
            trial.set_user_attr(names.FAIL_REASON, "constraint_violated")
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
            run.unlaunched += 1
            if run.unlaunched > MAX_UNLAUNCHED_PER_TRIAL * budget:
                run.gave_up = True
                break
            continue
        outcome = land(values)
        launched += 1
        outcome_of[trial.number] = outcome
        if run.found_at is None and outcome.started and outcome.correct and outcome.true >= target:
            run.found_at = launched
        run.wrong_launched += outcome.started and not outcome.correct
        value: float | None = None
        if not outcome.started:
            trial.set_user_attr(names.FAIL_REASON, outcome.failure or "startup_failed")
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
        elif gate and not outcome.correct:
            trial.set_user_attr(names.FAIL_REASON, "incorrect_output")
            trial.set_user_attr(names.CORRECT, False)
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
        else:
            # without the gate every started config is taken as correct
            trial.set_user_attr(names.CORRECT, True)
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 0.0)
            value = measured(outcome, land.noise, noise_rng)
            study.tell(trial, value)
        run.launches.append(Launch(dict(trial.params), role, value, outcome))
        minutes = launch_minutes(outcome, land.cost, gate=gate)
        if gate and run.found_at is None:
            # Nothing the confirmation could report reaches the target before a config that
            # does was launched (it reports launched, verified configs or the baseline, all
            # correct under the gate), so it is not simulated until then: the figures are the
            # same, and a reference run of hundreds of launches does not refit the search
            # model on every one of them.
            _record(run, None, minutes)
        else:
            best, confirm_launches = _reported(
                study, space, land, outcome_of, seed, confirm if gate else None
            )
            _record(run, best, minutes, confirm_launches)
        if stop_at_target and _reached(run, target, budget):
            break
    if isinstance(sampler, AutoSampler):
        run.ask_s = list(sampler.ask_seconds)
    return run


def run_grid(
    space: SearchSpace,
    land: Landscape,
    name: str,
    seed: int,
    budget: int,
    target: float,
    *,
    shuffled: bool,
    gate: bool,
    stop_at_target: bool = True,
    confirm: Confirm | None = None,
) -> RunResult:
    """The sweep's grid through the same loop (baseline first, the grid's points after it)."""
    return run_optuna(
        space,
        land,
        optuna.samplers.RandomSampler(seed=seed),
        name,
        seed,
        budget,
        target,
        gate=gate,
        stop_at_target=stop_at_target,
        confirm=confirm,
        points=grid_points(space, random.Random(seed) if shuffled else None),
    )


def trials_to_target(run: RunResult, target: float, budget: int) -> int:
    """Launches until the reported best is correct and within 5 % of the true best, the
    confirmation's launches included; budget + 1 when that never happens within the budget."""
    index = _search_launches_to_target(run, target, budget)
    return budget + 1 if index is None else index + run.confirm_launches_after[index - 1]


def _search_launches_to_target(run: RunResult, target: float, budget: int) -> int | None:
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
    index = _search_launches_to_target(run, target, budget)
    if index is None:
        return run.minutes_after[-1] / 60.0 if run.minutes_after else 0.0
    per_confirm = cost["load"] + cost["check"] + cost["bench"]
    return (run.minutes_after[index - 1] + run.confirm_launches_after[index - 1] * per_confirm) / 60


# --- statistics -----------------------------------------------------------------------------


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
    reached_at = [_search_launches_to_target(r, target, b) for r, b in zip(runs, own, strict=True)]
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


def run_strategy(
    name: str,
    space: SearchSpace,
    land: Landscape,
    seed: int,
    budget: int,
    target: float,
    stop: bool,
    patch_dirs: tuple[Path, ...] = (PATCH_DIR,),
    confirm: Confirm | None = None,
) -> RunResult:
    if name in ("auto", "tpe", "random", "random-nogate"):
        sampler = build_sampler(
            name.removesuffix("-nogate"), space, seed, risky=_risky(space, patch_dirs)
        )
        return run_optuna(
            space,
            land,
            sampler,
            name,
            seed,
            budget,
            target,
            gate=not name.endswith("-nogate"),
            stop_at_target=stop,
            confirm=confirm,
        )
    if name.startswith("grid-"):
        return run_grid(
            space,
            land,
            name,
            seed,
            budget,
            target,
            shuffled=name.startswith("grid-random"),
            gate=not name.endswith("-nogate"),
            stop_at_target=stop,
            confirm=confirm,
        )
    raise BadInput(f"--strategies: unknown strategy {name!r}; one of {', '.join(STRATEGIES)}")


_RISKY: dict[tuple[str, tuple[Path, ...]], dict[str, tuple[Any, ...]]] = {}


def _risky(space: SearchSpace, patch_dirs: tuple[Path, ...]) -> dict[str, tuple[Any, ...]]:
    """What ``autotune run`` tells the strategy before it measures anything: the kinds of the
    patches the space targets (``patch_dirs``) and vLLM's lossy choices (an fp8 KV cache)."""
    key = (str(space.path), patch_dirs)
    if key not in _RISKY:
        found = discover_patches(patch_dirs) if patch_dirs else {}
        kinds = {n: (p.info.kind, p.info.default) for n, p in found.items()}
        _RISKY[key] = risky_choices(space, kinds, lossy_reason)
    return _RISKY[key]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    parser.add_argument("--confirm-repeats", type=int, default=Confirm.repeats)
    parser.add_argument("--confirm-max-rounds", type=int, default=Confirm.max_rounds)
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
        ("--confirm-max-rounds", args.confirm_max_rounds, 1),
    ):
        if value < low:
            raise BadInput(f"{flag} must be >= {low}, not {value}")
    _number(args.target_precision, "--target-precision")
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
    if args.confirm_top < 0 or args.confirm_repeats < 1:
        raise BadInput("--confirm-top must be >= 0 and --confirm-repeats >= 1")
    confirm = Confirm(
        args.confirm_top,
        args.confirm_repeats,
        max(args.confirm_repeats, args.confirm_max_rounds),
        args.target_precision,
    )
    with _WATCHDOG.armed(land.call_limit):
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
        f"true best {_show(best_value)} ({method}, {true_best_s:.0f} s); target {_show(target)}; "
        f"baseline {_show(baseline.true) if baseline.correct else _described(baseline)}",
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
        "space": _shown(args.space),
        "landscape": args.landscape,
        "noise": land.noise,
        "budget_launches": args.budget,
        "reference_budget_launches": args.reference_budget,
        "reference_strategies": sorted(REFERENCE_STRATEGIES & set(names)),
        "seeds_per_set": args.seeds,
        "true_best": _rounded(best_value),
        "true_best_config": best_values,
        "true_best_method": method,
        "true_best_wall_s": round(true_best_s, 1),
        "target": _rounded(target),
        "baseline_true": _rounded(baseline.true),
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
            "max_rounds": confirm.max_rounds,
            "target_precision": confirm.precision,
            "launches": f"{confirm.repeats}-{confirm.max_rounds} rounds x (top + baseline)",
            "note": "gated strategies report what autotune run would: the confirmed winner "
            "(top configs by posterior mean, re-measured with the baseline); its launches "
            "count in the figures and the budget. Peers without the gate confirm nothing.",
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


def _shown(path: Path) -> str:
    """A path as the README's command line spells it (relative to the repository)."""
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
        shown = (
            ("?" if "ratio_is_upper_bound" in s else "") if ratio is None else f"{bound}{ratio:.2f}"
        )
        print(
            f"{name:<20}{median:>7}{iqr:>12}"
            f"{s['not_reached_within_budget']:>6}"
            f"{shown:>9}"
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


if __name__ == "__main__":
    raise SystemExit(main())
