"""Confirmation: beat the winner's curse before declaring a best config.

With 10-20% run-to-run noise, the trial with the highest single measurement is often just the
luckiest. Before a study declares its best, the top candidates (verified, feasible trials,
ranked by the search model's posterior mean, which pools each config's measurement with those
of every config that shares its settings: :func:`rank_candidates`) and the baseline are
measured again, interleaved (B, A1, A2, B, A1, A2, ...), as ordinary gated
trials. The winner is the candidate with the best median over those rounds that passed the gate
and every constraint in every round; its gain over the baseline is the ratio of geometric means,
with a 95% Welch t confidence interval on the log ratio. A t interval, not a bootstrap: with the
two or three rounds a study can afford, a bootstrap interval is far too narrow (it never sees
more spread than the few samples show), while t's heavy tails at low degrees of freedom say
honestly how little two rounds prove. The result is
stored in the study (``confirmation``) and from then on ``report.best_trials`` returns that
winner, so `show`, `export` and the dashboard's notes agree.

The rounds are a race (:func:`race_step`), planned from the run's budget (``study/budget.py``)
in launches: after each round from :data:`~autotune.study.budget.MIN_ROUNDS` on, a candidate
whose interval against the leader lies clearly below is dropped (its later rounds are not
launched, and its launches go to more rounds of the others: :func:`round_fits`), and the
confirmation stops as soon as its verdict is settled (the leader's interval against the
baseline excludes no change, either way) or precise (``workload.target_precision``), or when
no candidate is left; otherwise when the next round does not fit in its launches. Why it
stopped, the launches it made and the launches it was given are stored with it (``stopped_by``,
``launches``, ``planned_launches``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from autotune import names
from autotune._stats import t_quantile
from autotune.analysis.remeasure import Variant, VariantMeasurements, measure_variants
from autotune.bench.host import judge_interval_noise
from autotune.errors import SpecError
from autotune.search.model import rank_by_posterior
from autotune.space.model import SearchSpace
from autotune.spec.model import StudySpec
from autotune.storage import load_study
from autotune.study.budget import MAX_ROUNDS, MIN_ROUNDS
from autotune.study.results import is_verified_feasible

#: why a confirmation stopped (its ``stopped_by``)
SETTLED = "settled"  # the leader's interval against the baseline excludes no change
PRECISE = "precise"  # the leader's gain is known within workload.target_precision
BUDGET = "budget"  # its planned rounds were measured
ALL_ELIMINATED = "all_eliminated"  # every candidate failed a round
BASELINE_FAILED = "baseline_failed"  # the baseline failed a round: nothing left to compare to


@dataclass(frozen=True)
class CandidateResult:
    trial_number: int | None  # None for the baseline
    label: str
    samples: tuple[float, ...]
    failures: tuple[str, ...]
    median: float | None


@dataclass(frozen=True)
class Confirmation:
    metric: str
    repeats: int
    winner: int | None
    gain: float | None  # winner median / baseline median - 1, in the "better" direction
    gain_ci: tuple[float, float] | None
    candidates: tuple[CandidateResult, ...]
    #: "host noise, not the configs, decides this interval: ..." when most rounds were
    #: measured on a busy host (bench/host.py), else None
    host_noise: str | None = None
    #: why the race stopped (SETTLED, PRECISE, BUDGET, ALL_ELIMINATED, BASELINE_FAILED)
    stopped_by: str | None = None
    #: servers it launched, and the most its plan gave it (rounds x (baseline + top_k))
    launches: int = 0
    planned_launches: int = 0
    #: candidates dropped by the race, clearly below the leader
    eliminated: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def top_candidates(spec: StudySpec, study: optuna.Study, k: int) -> list[optuna.trial.FrozenTrial]:
    """The k most promising verified, feasible search trials of the study
    (:func:`rank_candidates`)."""
    return rank_candidates(
        spec.space, study.get_trials(deepcopy=False), names.sign(spec.objective.metrics[0]), k
    )


def rank_candidates(
    space: SearchSpace, trials: list[optuna.trial.FrozenTrial], sign: float, k: int
) -> list[optuna.trial.FrozenTrial]:
    """The k most promising verified, feasible search trials (one per distinct config, the
    baseline left out), by the search model's posterior mean (``search_model.rank_by_posterior``,
    fitted on every verified trial), not by each one's single measurement: the candidates are
    chosen by all the evidence, and the confirmation's fresh rounds then decide between them.
    ``sign`` is +1 when higher is better."""
    verified = [t for t in trials if is_verified_feasible(t)]
    positive = [t for t in verified if t.values and t.values[0] > 0]
    observations = [(t.params, sign * math.log(t.values[0])) for t in positive]
    ranked = [positive[i] for i in rank_by_posterior(space, observations)]
    ranked += sorted((t for t in verified if t not in positive), key=lambda t: -sign * t.values[0])
    seen, out = set(), []
    for trial in ranked:
        role = trial.user_attrs.get(names.ROLE)
        if role not in names.SEARCH_ROLES or role == names.BASELINE:
            continue
        key = repr(sorted((trial.user_attrs.get(names.PARAMS_RESOLVED) or {}).items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(trial)
        if len(out) == k:
            break
    return out


def confirm_study(
    spec: StudySpec,
    storage_url: str,
    study_name: str,
    *,
    top_k: int,
    rounds: int = MAX_ROUNDS,
    artifact_dir: str | None = None,
    on_start: Callable[[], None] | None = None,
    on_phase: Callable[[int, str], None] | None = None,
) -> Confirmation | None:
    """Open the stored study and confirm its top ``top_k`` configs; None when there is nothing
    to confirm: a multi-objective study (its Pareto front is the answer) or no verified config
    beyond the baseline. ``rounds`` is the most rounds (the race may stop earlier); ``on_start``
    is called once, just before the first launch."""
    if len(spec.objective.metrics) != 1:
        return None
    study = load_study(storage_url, study_name, heartbeat=True)
    if not top_candidates(spec, study, top_k):
        return None
    if on_start is not None:
        on_start()
    return run_confirmation(
        spec,
        study,
        storage_url,
        top_k=top_k,
        rounds=rounds,
        artifact_dir=artifact_dir,
        on_phase=on_phase,
    )


def run_confirmation(
    spec: StudySpec,
    study: optuna.Study,
    storage_url: str,
    *,
    top_k: int = 2,
    rounds: int = MAX_ROUNDS,
    on_phase: Callable[[int, str], None] | None = None,
    artifact_dir: str | None = None,
) -> Confirmation:
    """Race the top ``top_k`` candidates against the baseline for at most ``rounds`` rounds
    (:func:`race_step` decides after each one) and store the verdict in the study."""
    if len(spec.objective.metrics) != 1:
        raise SpecError(
            "confirmation applies to single-objective studies; a multi-objective "
            "study reports its Pareto front",
            key="objective",
        )
    candidates = top_candidates(spec, study, top_k)
    if not candidates:
        raise SpecError("no verified correct trial to confirm yet", key="--study")
    metric = spec.objective.metrics[0]
    sign = names.sign(metric)
    variants = [Variant("baseline", spec.space.baseline_values())]
    for trial in candidates:
        values = {
            n: spec.space.parameter(n).from_optuna(v)
            for n, v in (trial.user_attrs.get(names.PARAMS_RESOLVED) or {}).items()
        }
        variants.append(Variant(f"trial {trial.number}", values))
    most = max(rounds, MIN_ROUNDS)
    race = Race(sign, most * len(variants), spec.workload.target_precision)
    measured = measure_variants(
        spec,
        study,
        storage_url,
        variants,
        repeats=most,
        role=names.CONFIRM,
        on_phase=on_phase,
        artifact_dir=artifact_dir,
        next_round=race.next_round,
    )
    rounds = max(len(m.outcomes) for m in measured.values())
    results = []
    for variant, trial in zip(variants, [None, *candidates], strict=True):
        m = measured[variant.label]
        samples = tuple(m.samples)
        results.append(
            CandidateResult(
                trial_number=None if trial is None else trial.number,
                label=variant.label,
                samples=samples,
                failures=tuple(m.failures),
                median=statistics.median(samples) if samples else None,
            )
        )
    base = results[0]
    clean = [
        r
        for r in results[1:]
        if r.median is not None
        and not r.failures
        and r.label in (race.alive or ())
        and _feasible_rounds(study, r.label)
    ]
    winner = max(clean, key=lambda r: sign * r.median, default=None)
    gain, ci = None, None
    if winner is not None and base.median:
        gain, ci = gain_with_ci(winner.samples, base.samples, sign)
    rounds_host = [
        t.user_attrs.get(names.HOST)
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get(names.ROLE) == names.CONFIRM
        and t.user_attrs.get(names.VARIANT) in {r.label for r in results}
    ]
    confirmation = Confirmation(
        metric=metric,
        repeats=rounds,
        winner=None if winner is None else winner.trial_number,
        gain=gain,
        gain_ci=ci,
        candidates=tuple(results),
        host_noise=judge_interval_noise([h for h in rounds_host if h]),
        stopped_by=race.stopped_by,
        launches=sum(len(m.outcomes) for m in measured.values()),
        planned_launches=most * len(variants),
        eliminated=tuple(race.eliminated),
    )
    study.set_user_attr(names.CONFIRMATION, confirmation.to_dict())
    return confirmation


@dataclass(frozen=True)
class RaceStep:
    """What :func:`race_step` decides after a round: the candidates still racing, and why the
    race stops now (None: one more round)."""

    keep: tuple[str, ...]
    stop: str | None


def race_step(
    candidates: Mapping[str, Sequence[float]],
    base: Sequence[float],
    sign: float,
    *,
    rounds: int,
    max_rounds: int,
    precision: float = 0.0,
) -> RaceStep:
    """Confirmation's sequential rule, after ``rounds`` rounds, on the samples of the
    candidates still racing that failed no round (a failed candidate is out) and the
    baseline's. Before :data:`MIN_ROUNDS` it only counts. From then on, a candidate whose
    interval against the leader (best median; :func:`gain_with_ci`, the confirmation's own
    interval) lies wholly below zero is dropped, and the race stops when the leader's interval
    against the baseline excludes no change either way (SETTLED: a confirmed gain, or a
    confirmed loss), when its gain is known within ``precision`` (PRECISE), or at
    ``max_rounds`` (BUDGET). A lone candidate left by the others' elimination races on while
    its verdict is open: one more round of two launches is what can still settle it. The
    harness of ``benchmarks/search`` simulates the confirmation with this function."""
    if not candidates:
        return RaceStep((), ALL_ELIMINATED)
    keep = tuple(candidates)
    if rounds < MIN_ROUNDS:
        return RaceStep(keep, BUDGET if rounds >= max_rounds else None)
    if len(base) < 2:
        return RaceStep(keep, BASELINE_FAILED)
    lead = max(keep, key=lambda c: sign * statistics.median(candidates[c]))
    lead_samples = tuple(candidates[lead])
    keep = tuple(
        c
        for c in keep
        if c == lead or gain_with_ci(tuple(candidates[c]), lead_samples, sign)[1][1] >= 0
    )
    _, (low, high) = gain_with_ci(lead_samples, tuple(base), sign)
    if low > 0 or high < 0:
        return RaceStep(keep, SETTLED)
    if precision > 0 and gain_is_precise(lead_samples, tuple(base), sign, precision):
        return RaceStep(keep, PRECISE)
    return RaceStep(keep, BUDGET if rounds >= max_rounds else None)


def round_fits(spent: int, racing: int, launches: int) -> bool:
    """Whether one more round (the baseline and the ``racing`` candidates) fits in the
    confirmation's ``launches`` after ``spent``. The budget is in launches, not rounds: a
    candidate the race drops leaves its launches to more rounds of those left, which is what
    a small gain needs (its interval narrows with the rounds, not with the candidates)."""
    return spent + racing + 1 <= launches


class Race:
    """The confirmation's rounds as ``measure_variants`` asks for them (``next_round``): the
    baseline and every candidate still racing, until :func:`race_step` stops or the next
    round does not fit in ``launches`` (:func:`round_fits`)."""

    def __init__(self, sign: float, launches: int, precision: float) -> None:
        self.sign, self.launches, self.precision = sign, launches, precision
        self.alive: list[str] | None = None
        self.eliminated: list[str] = []
        self.stopped_by: str | None = None

    def next_round(self, results: dict[str, VariantMeasurements], rounds: int) -> list[str]:
        base, *others = results
        if self.alive is None:
            self.alive = list(others)
        if rounds == 0:
            return [base, *self.alive]
        failed = [c for c in self.alive if results[c].failures]
        racing = {c: results[c].samples for c in self.alive if c not in failed}
        step = race_step(
            racing,
            results[base].samples,
            self.sign,
            rounds=rounds,
            max_rounds=self.launches // 2,  # the most one candidate can get
            precision=self.precision,
        )
        self.eliminated += [c for c in racing if c not in step.keep]
        self.alive = list(step.keep)
        spent = sum(len(m.outcomes) for m in results.values())
        stop = step.stop
        if stop is None and not round_fits(spent, len(self.alive), self.launches):
            stop = BUDGET
        if stop is not None:
            self.stopped_by = stop
            return []
        return [base, *self.alive]


def gain_is_precise(
    lead: tuple[float, ...], base: tuple[float, ...], sign: float, target: float
) -> bool:
    """Whether the lead's gain over the baseline is known within ``target`` (relative
    half-width of its 95% interval): the test behind confirmation's stopping rule, on samples
    (the search benchmark simulates confirmation with it)."""
    if target <= 0 or len(lead) < 2 or len(base) < 2:
        return True
    _, (low, high) = gain_with_ci(lead, base, sign)
    return math.log1p(high) - math.log1p(low) <= 2 * target


def _feasible_rounds(study: optuna.Study, label: str) -> bool:
    rounds = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get(names.ROLE) == names.CONFIRM
        and t.user_attrs.get(names.VARIANT) == label
    ]
    return bool(rounds) and all(is_verified_feasible(t) for t in rounds)


def t975(df: float) -> float:
    return t_quantile(0.975, df)  # exact at fractional Welch degrees of freedom


def _log_stats(samples: tuple[float, ...]) -> tuple[float, float, int]:
    logs = [math.log(x) for x in samples]
    var = statistics.variance(logs) if len(logs) > 1 else 0.0
    return statistics.fmean(logs), var, len(logs)


def gain_with_ci(
    winner: tuple[float, ...], base: tuple[float, ...], sign: float
) -> tuple[float, tuple[float, float]]:
    """Gain of the winner over the baseline (in the better direction) and its 95% interval."""
    mean_w, var_w, n_w = _log_stats(winner)
    mean_b, var_b, n_b = _log_stats(base)
    diff = sign * (mean_w - mean_b)  # log of the ratio, oriented so > 0 is better
    se2 = var_w / n_w + var_b / n_b
    if se2 > 0:
        df = se2**2 / ((var_w / n_w) ** 2 / max(1, n_w - 1) + (var_b / n_b) ** 2 / max(1, n_b - 1))
        half = t975(df) * math.sqrt(se2)
    else:
        half = 0.0
    return math.expm1(diff), (math.expm1(diff - half), math.expm1(diff + half))
