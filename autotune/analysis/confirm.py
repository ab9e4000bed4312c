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
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from autotune import names
from autotune._stats import t_quantile
from autotune.analysis.remeasure import Variant, measure_variants
from autotune.bench.host import judge_interval_noise
from autotune.errors import SpecError
from autotune.search.model import rank_by_posterior
from autotune.space.model import SearchSpace
from autotune.spec.model import StudySpec
from autotune.storage import load_study
from autotune.study.results import is_verified_feasible


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
    repeats: int,
    artifact_dir: str | None = None,
    on_start: Callable[[], None] | None = None,
    on_phase: Callable[[int, str], None] | None = None,
) -> Confirmation | None:
    """Open the stored study and confirm its top ``top_k`` configs; None when there is nothing
    to confirm: a multi-objective study (its Pareto front is the answer) or no verified config
    beyond the baseline. ``on_start`` is called once, just before the first launch."""
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
        repeats=repeats,
        artifact_dir=artifact_dir,
        on_phase=on_phase,
    )


def run_confirmation(
    spec: StudySpec,
    study: optuna.Study,
    storage_url: str,
    *,
    top_k: int = 2,
    repeats: int = 2,
    max_rounds: int | None = None,
    on_phase: Callable[[int, str], None] | None = None,
    artifact_dir: str | None = None,
) -> Confirmation:
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
    measured = measure_variants(
        spec,
        study,
        storage_url,
        variants,
        repeats=repeats,
        role=names.CONFIRM,
        on_phase=on_phase,
        artifact_dir=artifact_dir,
        until=lambda results: _precise(results, sign, spec.workload.target_precision),
        max_rounds=max_rounds if max_rounds is not None else max(repeats, DEFAULT_MAX_ROUNDS),
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
        and len(r.samples) == rounds
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
    )
    study.set_user_attr(names.CONFIRMATION, confirmation.to_dict())
    return confirmation


#: confirmation rounds at most, unless the caller says otherwise (each round is one launch per
#: candidate and the baseline)
DEFAULT_MAX_ROUNDS = 4


def _precise(results: dict[str, Any], sign: float, target: float) -> bool:
    """Confirmation's stopping rule, the trials' own (``workload.target_precision``): the
    leading candidate's gain over the baseline is known within ``target`` (half-width of its
    95% interval, relative). ``target`` 0: exactly the minimum rounds. A round with a failure
    is not made up by more rounds: the failed candidate is out either way."""
    if target <= 0:
        return True
    measured = list(results.values())
    base = measured[0].samples
    clean = [m.samples for m in measured[1:] if not m.failures and len(m.samples) >= 2]
    if len(base) < 2 or not clean:
        return True  # nothing that more rounds could settle
    lead = max(clean, key=lambda xs: sign * statistics.median(xs))
    return gain_is_precise(tuple(lead), tuple(base), sign, target)


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
