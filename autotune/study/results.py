"""Read a study back into rows and dataclasses for the CLI to render. Prints nothing.

"Best" here is autotune's own rule, never a bare ``study.best_trial``: a COMPLETE trial whose
output was verified correct and whose constraints (correctness, SLOs) all hold. When the
confirmation phase has re-measured the top candidates, its winner is the best. When nothing beat
the baseline (no correct search trial measured better, or the confirmation found no real gain),
the baseline is the best: it is the verified reference, and `export` writes it saying so.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import names
from autotune.errors import AutotuneError
from autotune.spec.load import load_spec
from autotune.storage import load_study

#: what `show`, the report and `export` say when the confirmation's interval includes no change
NO_CONFIRMED_WINNER = "no confirmed winner: the baseline stands"
#: verdicts of correct configs stopped short as clearly slower: never best, and no failure
NOT_MEASURED_ON = (names.SCREENED, "pruned_early")


@dataclass(frozen=True)
class TrialRow:
    number: int
    state: str
    role: str
    verdict: str  # "correct", "incorrect", a failure reason, "running", "waiting"
    detail: str
    params: dict[str, Any]
    metrics: dict[str, float]
    values: tuple[float, ...] | None
    startup_s: float | None
    feasible: bool
    is_best: bool = False
    #: the stored gate record (``check`` attribute): which checks ran and passed
    checks: dict[str, Any] = field(default_factory=dict)
    #: the engine's own counters around the benchmark (``server/metrics.py``)
    server_metrics: dict[str, Any] = field(default_factory=dict)
    #: 95% interval of each metric over the trial's rounds: name -> [low, high, n]
    ci: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class StudyReport:
    name: str
    directions: tuple[str, ...]
    metric_names: tuple[str, ...]
    rows: tuple[TrialRow, ...]
    best: tuple[int, ...]
    failures_by_reason: dict[str, int]
    reference: dict[str, Any] | None
    engine_version: str | None
    attrs: dict[str, Any] = field(default_factory=dict)


def is_verified_feasible(trial: FrozenTrial) -> bool:
    """Correct, measured, and within every constraint: the only trials that can be best. A
    screened trial (one round, clearly worse: PRUNED) never is, whatever its state says."""
    if trial.state != TrialState.COMPLETE or trial.user_attrs.get(names.CORRECT) is not True:
        return False
    if trial.user_attrs.get(names.FAIL_REASON) in NOT_MEASURED_ON:
        return False
    return all(v <= 0.0 for v in trial.constraints.values())


def snapshot(study: optuna.Study) -> list[FrozenTrial]:
    """The study's trials, read once: a reader passes this list down (``trials=``) so that a
    trial a live study adds between two reads cannot make them disagree."""
    return study.get_trials(deepcopy=False)


def verified_baseline(
    study: optuna.Study, *, trials: Sequence[FrozenTrial] | None = None
) -> FrozenTrial | None:
    """The baseline trial that recorded the reference (verified by definition), if it ran."""
    for trial in snapshot(study) if trials is None else trials:
        if trial.user_attrs.get(names.ROLE) == names.BASELINE and is_verified_feasible(trial):
            return trial
    return None


def baseline_reason(
    study: optuna.Study, *, trials: Sequence[FrozenTrial] | None = None
) -> str | None:
    """Why the baseline is the best config of a single-objective study, or None when a search
    trial beat it: no correct trial measured better, or the confirmation found no real gain."""
    if len(study.directions) != 1:
        return None
    trials = snapshot(study) if trials is None else trials
    baseline = verified_baseline(study, trials=trials)
    if baseline is None:
        return None
    confirmation = study.user_attrs.get(names.CONFIRMATION)
    if confirmation is not None:
        if confirmation.get("winner") is None:
            return "no candidate passed every confirmation round"
        gain = confirmation.get("gain")
        if gain is not None and gain <= 0:
            return (
                f"the confirmation found no real gain (trial {confirmation['winner']} "
                f"measured {gain:+.1%} against the baseline)"
            )
        return unconfirmed_gain(confirmation)
    searched = [
        t
        for t in trials
        if is_verified_feasible(t) and t.user_attrs.get(names.ROLE) != names.BASELINE
    ]
    if not searched:
        return "no search trial was verified correct"
    sign = 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0
    if all(sign * t.values[0] <= sign * baseline.values[0] for t in searched):
        return f"none of the {len(searched)} correct search trials measured better"
    return None


def unconfirmed_gain(confirmation: dict[str, Any] | None) -> str | None:
    """``NO_CONFIRMED_WINNER`` and why, when the confirmation's winner measured a gain whose 95%
    interval includes no change (a +33% whose interval spans -57% .. +314% is not a win); None
    when there is no such winner or its interval excludes zero."""
    if not confirmation or confirmation.get("winner") is None:
        return None
    gain, ci = confirmation.get("gain"), confirmation.get("gain_ci")
    if gain is None or not ci or ci[0] > 0:
        return None
    low, high = ci
    return (
        f"{NO_CONFIRMED_WINNER} (trial {confirmation['winner']} measured {gain:+.1%} against "
        f"it, but the 95% CI {low:+.1%} .. {high:+.1%} includes no change)"
    )


def baseline_headline(reason: str) -> str:
    """The one line `show` and the report lead with when ``baseline_reason`` is ``reason``."""
    if reason.startswith(NO_CONFIRMED_WINNER):
        return reason
    return f"no configuration beat the baseline ({reason})"


def best_trials(
    study: optuna.Study, *, trials: Sequence[FrozenTrial] | None = None
) -> list[FrozenTrial]:
    """Single objective: the best verified trial (or the confirmed winner, or the baseline when
    nothing beat it, see ``baseline_reason``); multi: the front."""
    trials = snapshot(study) if trials is None else trials
    candidates = [t for t in trials if is_verified_feasible(t)]
    if not candidates:
        return []
    if baseline_reason(study, trials=trials) is not None:
        baseline = verified_baseline(study, trials=trials)
        return [baseline] if baseline is not None else []
    confirmed = (study.user_attrs.get(names.CONFIRMATION) or {}).get("winner")
    if confirmed is not None:
        by_number = {t.number: t for t in candidates}
        if confirmed in by_number:
            return [by_number[confirmed]]
    directions = study.directions
    signs = [1.0 if d == optuna.study.StudyDirection.MAXIMIZE else -1.0 for d in directions]
    if len(directions) == 1:
        return [max(candidates, key=lambda t: signs[0] * t.values[0])]
    front = []
    for t in candidates:
        dominated = False
        for other in candidates:
            if other is t:
                continue
            better_or_equal = all(
                s * o >= s * v for s, o, v in zip(signs, other.values, t.values, strict=True)
            )
            strictly = any(
                s * o > s * v for s, o, v in zip(signs, other.values, t.values, strict=True)
            )
            if better_or_equal and strictly:
                dominated = True
                break
        if not dominated:
            front.append(t)
    return sorted(front, key=lambda t: t.number)


def verdict_of(trial: FrozenTrial) -> str:
    if trial.state == TrialState.RUNNING:
        return "running"
    if trial.state == TrialState.WAITING:
        return "waiting"
    reason = trial.user_attrs.get(names.FAIL_REASON)
    if reason:
        return "incorrect" if reason == "incorrect_output" else reason
    if trial.user_attrs.get(names.CORRECT) is True:
        return "correct"
    if trial.state == TrialState.FAIL:
        return "interrupted" if trial.user_attrs.get(names.SERVER) else "failed"
    return trial.state.name.lower()


def row_of(trial: FrozenTrial, best: set[int]) -> TrialRow:
    server = trial.user_attrs.get(names.SERVER) or {}
    return TrialRow(
        number=trial.number,
        state=trial.state.name,
        role=trial.user_attrs.get(names.ROLE, ""),
        verdict=verdict_of(trial),
        detail=str(trial.user_attrs.get(names.FAIL_DETAIL, "")),
        params=dict(trial.user_attrs.get(names.PARAMS_RESOLVED) or trial.params),
        metrics=dict(trial.user_attrs.get(names.METRICS) or {}),
        values=tuple(trial.values) if trial.values else None,
        startup_s=server.get("startup_s"),
        feasible=is_verified_feasible(trial),
        is_best=trial.number in best,
        checks=dict(trial.user_attrs.get(names.CHECK) or {}),
        server_metrics=dict(trial.user_attrs.get(names.SERVER_METRICS) or {}),
        ci=dict(trial.user_attrs.get(names.METRICS_CI) or {}),
    )


def load_report(storage_url: str, study_name: str) -> StudyReport:
    return report_of(load_study(storage_url, study_name))


def report_of(study: optuna.Study, *, trials: Sequence[FrozenTrial] | None = None) -> StudyReport:
    trials = snapshot(study) if trials is None else trials
    best = {t.number for t in best_trials(study, trials=trials)}
    rows = tuple(row_of(t, best) for t in trials)
    not_failed = ("correct", "running", "waiting", *NOT_MEASURED_ON)
    reasons = Counter(r.verdict for r in rows if r.verdict not in not_failed)
    metric_names = tuple(study.metric_names or []) if study.metric_names else ()
    attrs = dict(study.user_attrs)
    reference = attrs.pop(names.REFERENCE, None)
    return StudyReport(
        name=study.study_name,
        directions=tuple(d.name.lower() for d in study.directions),
        metric_names=metric_names,
        rows=rows,
        best=tuple(sorted(best)),
        failures_by_reason=dict(reasons.most_common()),
        reference={
            "tolerance": reference["tolerance"],
            "drift_observed": reference["drift_observed"],
            "prompts": len(reference["entries"]),
            "capabilities": reference.get("capabilities"),
        }
        if reference
        else None,
        engine_version=attrs.get(names.ENGINE_VERSION),
        attrs=attrs,
    )


@dataclass(frozen=True)
class ReportSource:
    """Where the study lives, to write the commands a reader can paste (password hidden)."""

    storage_url: str
    spec_path: str | None = None


def objective_names(
    study: optuna.Study, report: StudyReport, source: ReportSource
) -> tuple[str, ...]:
    """The objective's metric names: Optuna's own if set, else the spec's (a study records
    its spec's path), else what the confirmation or ablation measured."""
    if study.metric_names:
        return tuple(study.metric_names)
    path = source.spec_path or report.attrs.get(names.SPEC_PATH)
    if path:
        try:
            metrics = tuple(load_spec(Path(path)).objective.metrics)
        except (AutotuneError, OSError):
            metrics = ()
        if len(metrics) == len(report.directions):
            return metrics
    for key in (names.CONFIRMATION, names.ABLATION_REPORT):
        data = report.attrs.get(key)
        if data and len(report.directions) == 1:
            return (data["metric"],)
    return ()


@dataclass(frozen=True)
class RequestTrouble:
    """A trial whose requests failed or had to be sent again, whatever its verdict: a trial
    whose benchmark lost a request within ``MAX_FAILED_FRACTION`` completes (its benchmark
    stops at that round), and ``show`` and the report said "No trial failed" of it."""

    number: int
    #: benchmark requests that failed, of ``total`` sent
    failed: int
    total: int
    #: the first failed request's error ("" when none failed)
    first_error: str
    #: whether the benchmark stopped at the round the failure came in
    stopped: bool
    #: requests (the gate's and the benchmark's) sent again on a new connection after their
    #: connection failed before any answer: the server's connection handling, not a failure
    retries: int

    def failure_line(self) -> str | None:
        """How many benchmark requests failed and the first error, or None."""
        if not self.failed:
            return None
        stopped = "; the benchmark stopped after that round" if self.stopped else ""
        return (
            f"trial {self.number}: {self.failed} of {self.total} benchmark requests failed "
            f"(first: {self.first_error or 'no error recorded'}){stopped}"
        )

    def retry_line(self) -> str | None:
        """How many requests were sent again on a new connection, or None."""
        if not self.retries:
            return None
        return (
            f"trial {self.number}: {self.retries} request(s) sent again on a new connection "
            "(the server had closed a connection it kept alive); not counted as failed"
        )

    def lines(self) -> list[str]:
        """What ``show`` says of it, one line per kind of trouble."""
        return [line for line in (self.failure_line(), self.retry_line()) if line]


def request_troubles(trials: Sequence[FrozenTrial]) -> list[RequestTrouble]:
    """The trials whose stored ``bench`` (or gate ``check``) records failed or resent
    requests, in trial order."""
    out = []
    for trial in trials:
        bench = trial.user_attrs.get(names.BENCH) or {}
        check = trial.user_attrs.get(names.CHECK) or {}
        failed = int(bench.get("failed_requests") or 0)
        retries = int(bench.get("transport_retries") or 0) + int(
            check.get("transport_retries") or 0
        )
        if not failed and not retries:
            continue
        errors = bench.get("errors") or []
        out.append(
            RequestTrouble(
                number=trial.number,
                failed=failed,
                total=int(bench.get("total_requests") or 0),
                first_error=str(errors[0]) if errors else "",
                stopped=bench.get("stopped_by") == "request_errors",
                retries=retries,
            )
        )
    return out


# --- where the time went ------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeSpent:
    """Seconds the study's trials spent, summed from each trial's ``time_s`` and startup parts.

    ``phases`` (startup, gate, measurement, teardown) are the search's trials (every role but
    the confirmation's); ``startup_parts`` split their startup as the engine's log states it
    (a part no trial's log stated is absent); ``confirmation`` is the confirmation's trials'
    time, all phases together. ``trials`` counts the trials with a record, ``unrecorded`` those
    without (older studies, trials that never launched). ``cache_starts`` holds, for each
    compile-cache state the engine's log stated (``warm``, ``cold``, ``partly warm``), the
    seconds to ready of those starts, every role's, so that a study says what its shared compile
    cache saved it (a start whose log said neither is not counted)."""

    phases: dict[str, float]
    startup_parts: dict[str, float]
    confirmation: float
    trials: int
    unrecorded: int
    screened: int
    cache_starts: dict[str, list[float]] = field(default_factory=dict)
    cache_failure: str | None = None

    @property
    def total(self) -> float:
        return sum(self.phases.values()) + self.confirmation

    def lines(self) -> list[str]:
        """What ``show`` prints under "where the time went" (nothing when nothing recorded)."""
        if not self.trials:
            return []
        total = self.total or 1.0
        out = []
        for phase, seconds in self.phases.items():
            line = f"{phase}: {seconds:.1f} s ({seconds / total:.0%})"
            if phase == "startup" and self.startup_parts:
                parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.startup_parts.items())
                line += f"; of it {parts}"
            out.append(line)
        out.append(f"confirmation: {self.confirmation:.1f} s ({self.confirmation / total:.0%})")
        if self.cache_starts:
            out.append(self.cache_line())
        tail = f"over {self.trials} trial(s)"
        if self.screened:
            tail += f", {self.screened} of them screened after one round"
        if self.unrecorded:
            tail += f"; {self.unrecorded} trial(s) without a record"
        out.append(tail)
        return out

    def cache_line(self) -> str:
        """The compiled starts by compile-cache state, with their median time to ready; each
        other state's median against the cold starts' where both were seen (this study's own
        starts: few, and their configs differ, so it is what this study saw, not a benchmark);
        and the engine's reason when it could not read a cache entry back."""
        seen = [
            f"{len(s)} {state} (median {statistics.median(s):.1f} s)"
            for state, s in self.cache_starts.items()
        ]
        line = "compiled starts: " + ", ".join(seen)
        cold = self.cache_starts.get("cold")
        ratios = [
            f"a {state} start took {statistics.median(s) / statistics.median(cold):.2f}x a cold one"
            for state, s in self.cache_starts.items()
            if cold and state != "cold"
        ]
        if ratios:
            line += "; " + ", ".join(ratios)
        if self.cache_failure:
            line += (
                f"; the engine could not read its compile cache back ({self.cache_failure}), "
                "so those starts compiled again"
            )
        return line


def time_spent(trials: Sequence[FrozenTrial]) -> TimeSpent:
    """The study's time by phase (see :class:`TimeSpent`)."""
    phases: dict[str, float] = {}
    parts: dict[str, float] = {}
    cache_starts: dict[str, list[float]] = {}
    cache_failure: str | None = None
    confirmation, counted, unrecorded, screened = 0.0, 0, 0, 0
    for trial in trials:
        if trial.state in (TrialState.RUNNING, TrialState.WAITING):
            continue
        spent = trial.user_attrs.get(names.TIME_S)
        if not spent:
            unrecorded += 1
            continue
        counted += 1
        screened += trial.user_attrs.get(names.FAIL_REASON) == names.SCREENED
        server = trial.user_attrs.get(names.SERVER) or {}
        state, ready = server.get("compile_cache"), server.get("startup_s")
        if state is not None and ready is not None:
            cache_starts.setdefault(str(state), []).append(float(ready))
        cache_failure = cache_failure or server.get("compile_cache_failure")
        if trial.user_attrs.get(names.ROLE) == names.CONFIRM:
            confirmation += sum(float(v) for v in spent.values())
            continue
        for phase, seconds in spent.items():
            phases[phase] = phases.get(phase, 0.0) + float(seconds)
        for part, seconds in (server.get("startup_parts") or {}).items():
            parts[part] = parts.get(part, 0.0) + float(seconds)
    return TimeSpent(
        phases={k: round(v, 3) for k, v in phases.items()},
        startup_parts={k: round(v, 3) for k, v in parts.items()},
        confirmation=round(confirmation, 3),
        trials=counted,
        unrecorded=unrecorded,
        screened=screened,
        cache_starts=cache_starts,
        cache_failure=cache_failure,
    )
