"""The landscape: a user's function from a config to its noise-free outcome, imported and checked.

The protocol, and what is bad input (one line naming the file and function, exit code 2, no
result file): FILE is imported as Python imports a script (its folder on the path, so it may
import modules of its own beside it); FUNCTION takes one argument, the config's values (a
parameter the config leaves to the engine is absent: read it with ``params.get``), and returns
a dict of the keys ``tok_s`` (a number: int, float, NumPy scalar or 0-d array, within
1e-300..1e300 so that the noise keeps it finite and > 0), ``correct`` (a bool, default true) and
``failure`` (a non-empty reason; it wins over the others). A key that reads like a misspelt one
of these is bad input (``"corect": False`` counted a wrong config as correct); other keys are
ignored and named once on stderr. Bad input too is a landscape that raises (or calls
``sys.exit``) on any config, at import or in a call: a simulated failure is returned as
``{"failure": ...}``, an exception is a bug in the landscape, and the harness cannot tell one
from the other. It must be deterministic (the harness draws the noise; a landscape drawing its
own made a target out of a lucky maximum): its first calls are made twice and must agree. One
call may take ``--call-limit`` seconds (default 10; 0: none): the harness calls it some 10^4 to
10^6 times for the true best, and a landscape stuck in a loop hung it; when the true best will
take over a minute it says so up front (``truth.py``). A landscape with no correct config in
the space is bad input too (no target: the figures would mean nothing); a baseline that fails
or is wrong is fine and said so (``baseline_outcome``). Speeds of any scale give the same
figures.

A landscape module may also set ``NOISE`` (the default of ``--noise``, else 5 %),
``NOT_MODELLED`` (parameters with no effect: held at their baseline by the true best),
``COST_MINUTES`` (the per-launch cost model, over :data:`DEFAULT_COST`) and define
``startup_s(params)``: the seconds from launch to ready for that config, or to the crash for one
that fails to start (a number >= 0, deterministic like the landscape). Why: a launch costs what
its config costs (weights, compile, graph capture; a start that dies at init costs less than
one that loads, serves and is found wrong), and a strategy's simulated hours should say so.
Where it is defined it replaces ``COST_MINUTES``' ``load`` and ``failed_start``
(:func:`launch_minutes`). The harness adds the
measurement noise itself (:func:`measured`: measured = true / max(0.5, 1 + N(0, noise))).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib.util
import inspect
import math
import numbers
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.search import ROOT

DEFAULT_NOISE = 0.05
DEFAULT_COST = {"load": 10.0, "failed_start": 5.0, "check": 1.0, "bench": 3.0}
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


class BadInput(Exception):
    """A landscape or space the harness cannot use (exit code 2, one line)."""


@dataclass(frozen=True)
class Outcome:
    started: bool
    correct: bool
    true: float  # noise-free value (0 when it did not start)
    failure: str | None = None
    #: the landscape's ``startup_s`` for this config (None: it has none; ``COST_MINUTES`` then)
    startup_s: float | None = None


@dataclass
class Landscape:
    """A user's landscape function with the harness's checks around it."""

    function: Callable[[dict[str, Any]], dict[str, Any]]
    where: str
    noise: float
    not_modelled: tuple[str, ...]
    cost: dict[str, float]
    #: the module's ``startup_s(params)`` (None: launches cost ``cost``'s load / failed_start)
    startup: Callable[[dict[str, Any]], Any] | None = None

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
                    f"{self.where} is not deterministic: {described(outcome)}, then "
                    f"{described(again)} on {params!r} (the harness adds the noise: --noise)"
                )
        return outcome

    def _once(self, params: dict[str, Any]) -> Outcome:
        start = time.perf_counter()
        try:
            WATCHDOG.started = start
            try:
                result = self.function(dict(params))
            finally:
                WATCHDOG.started = None
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
        outcome = self._checked(result, params)
        if self.startup is None:
            return outcome
        return dataclasses.replace(outcome, startup_s=self._startup(params))

    def _startup(self, params: dict[str, Any]) -> float:
        """The module's ``startup_s(params)``, checked: a finite number of seconds >= 0."""
        try:
            seconds = self.startup(dict(params))  # type: ignore[misc]
        except (Exception, SystemExit) as exc:
            raise BadInput(f"{self.where}: startup_s raised {exc!r} on {params!r}") from None
        if isinstance(seconds, np.ndarray) and seconds.ndim == 0:
            seconds = seconds[()]
        if isinstance(seconds, bool | np.bool_) or not isinstance(seconds, numbers.Real):
            raise BadInput(f"{self.where}: startup_s returned {seconds!r}, not a number")
        return check_number(float(seconds), f"{self.where}: startup_s on {params!r}")

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


WATCHDOG = _Watchdog()


def described(outcome: Outcome) -> str:
    if not outcome.started:
        return f"failed to start ({outcome.failure})"
    return f"{show(outcome.true)} tok/s" + ("" if outcome.correct else " (wrong output)")


def show(value: float) -> str:
    """A figure for the console: two decimals as before, or four significant digits where two
    decimals would print 0.00 or a 300-digit number (tok_s of 1e-9 or 1e12 are legitimate)."""
    return f"{value:.2f}" if value == 0 or 0.01 <= abs(value) < 1e9 else f"{value:.4g}"


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
        noise=check_number(
            noise if noise is not None else getattr(module, "NOISE", DEFAULT_NOISE),
            "--noise" if noise is not None else f"{path.name}: NOISE",
        ),
        not_modelled=_names(getattr(module, "NOT_MODELLED", ()), f"{path.name}: NOT_MODELLED"),
        cost=_cost(getattr(module, "COST_MINUTES", {}), f"{path.name}: COST_MINUTES"),
        call_limit=check_number(call_limit, "--call-limit"),
        startup=_startup_function(module, where),
    )


def _startup_function(module: Any, where: str) -> Callable[[dict[str, Any]], Any] | None:
    """The module's optional ``startup_s(params)`` (see the module docstring)."""
    function = getattr(module, "startup_s", None)
    if function is not None and not callable(function):
        raise BadInput(f"{where}: startup_s is {type(function).__name__}, not a function")
    return function


def check_number(value: Any, where: str) -> float:
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
    return {**DEFAULT_COST, **{k: check_number(v, f"{where}[{k!r}]") for k, v in value.items()}}


def measured(outcome: Outcome, noise: float, rng: random.Random) -> float:
    if noise <= 0:
        return outcome.true
    return outcome.true / max(0.5, 1.0 + rng.gauss(0.0, noise))


def launch_minutes(outcome: Outcome, cost: dict[str, float], *, gate: bool) -> float:
    """One launch's simulated minutes: its startup (the landscape's ``startup_s`` where it has
    one, else ``cost``'s load, or failed_start for a start that fails), then the check and
    the benchmark it reached."""
    startup = None if outcome.startup_s is None else outcome.startup_s / 60.0
    if not outcome.started:
        return cost["failed_start"] if startup is None else startup
    load = cost["load"] if startup is None else startup
    if not gate:
        return load + cost["bench"]
    if not outcome.correct:
        return load + cost["check"]
    return load + cost["check"] + cost["bench"]
