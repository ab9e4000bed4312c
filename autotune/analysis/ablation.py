"""Which change really bought the gain: revert one change at a time and measure.

The motivating case had two changes applied at once, the real fix and an unnecessary patch
that got the credit and broke CUDA graphs. ``run_ablation`` takes the best verified config,
lists every parameter in which it differs from the baseline (a patch is a parameter like any
other), and measures, interleaved and repeated: the best config, and for each change the best
config with that one change reverted to its baseline value (or left to the engine's default).

Each variant is summarised by its median (robust to the odd outlier a shared machine produces).
The noise band is what the machine does to one config on its own: three robust standard
deviations of the pooled within-variant scatter (1.4826 x the median absolute deviation of every
sample from its variant's median), and never less than ``min_effect`` (default 5%) of the best
config's median, since users see 10-20% run-to-run noise on real servers. Verdicts:

* ``helps``: reverting it makes the objective worse by more than the noise band;
* ``no effect``: the difference is within the band: drop it;
* ``hurts``: reverting it makes the objective better by more than the band: drop it;
* ``needed for correctness``: without it the output is wrong or the server fails: keep it.

The minimal config keeps only ``helps`` and ``needed for correctness``; it is measured too
(with greedy backward elimination, it is confirmed to keep the gain within the band), and the
whole report is stored in the study's user attributes under ``ablation``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from autotune import names
from autotune.analysis.remeasure import Variant, VariantMeasurements, measure_variants
from autotune.errors import SpecError
from autotune.spec.model import StudySpec
from autotune.study.results import best_trials, is_verified_feasible

HELPS, NO_EFFECT, HURTS, CORRECTNESS = "helps", "no effect", "hurts", "needed for correctness"
_DEFAULT = "(engine default)"


@dataclass(frozen=True)
class Contribution:
    parameter: str
    best_value: Any
    reverted_to: Any
    delta: float | None  # objective(best) - objective(reverted), in "better" direction
    delta_low: float | None  # the delta's range over the samples (worst case / best case)
    delta_high: float | None
    verdict: str
    detail: str = ""


@dataclass(frozen=True)
class AblationReport:
    trial_number: int
    metric: str
    direction: str
    best_median: float
    noise_band: float
    min_effect: float
    contributions: tuple[Contribution, ...]
    minimal_values: dict[str, Any]
    minimal_median: float | None
    minimal_keeps_gain: bool | None
    repeats: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def changes_from_baseline(spec: StudySpec, values: dict[str, Any]) -> list[str]:
    """Parameters whose value in ``values`` is not what the baseline ran with."""
    baseline = spec.space.baseline_values()
    return [
        name for name, value in values.items() if name not in baseline or baseline[name] != value
    ]


def revert(spec: StudySpec, values: dict[str, Any], name: str) -> dict[str, Any]:
    baseline = spec.space.baseline_values()
    reverted = dict(values)
    if name in baseline:
        reverted[name] = baseline[name]
    else:
        reverted.pop(name)
    # a parameter whose condition no longer holds is left out as well
    active: dict[str, Any] = {}
    for param in spec.space.parameters:
        if param.name in reverted and spec.space.is_active(param, active):
            active[param.name] = reverted[param.name]
    return active


def run_ablation(
    spec: StudySpec,
    study: optuna.Study,
    storage_url: str,
    *,
    repeats: int = 3,
    trial_number: int | None = None,
    min_effect: float = 0.05,
    on_phase: Callable[[int, str], None] | None = None,
    artifact_dir: str | None = None,
) -> AblationReport:
    if repeats < 2:
        raise SpecError("ablation needs at least 2 repeats to know its noise band", key="--repeats")
    trial = _pick_trial(spec, study, trial_number)
    metric = spec.objective.metrics[0]
    sign = names.sign(metric)
    best_values = _trial_values(spec, trial)
    changes = changes_from_baseline(spec, best_values)
    variants = [Variant("best", best_values)]
    variants += [Variant(f"revert:{name}", revert(spec, best_values, name)) for name in changes]
    measured = measure_variants(
        spec,
        study,
        storage_url,
        variants,
        repeats=repeats,
        role=names.ABLATION,
        on_phase=on_phase,
        artifact_dir=artifact_dir,
    )
    best = measured["best"]
    if not best.samples:
        raise SpecError(
            f"trial {trial.number}'s config did not pass again during ablation: {best.failures}",
            key="--trial",
        )
    best_median = statistics.median(best.samples)
    band = _noise_band(measured.values(), best_median, min_effect)
    contributions = []
    baseline = spec.space.baseline_values()
    for name in changes:
        m = measured[f"revert:{name}"]
        contributions.append(
            _judge(name, best_values[name], baseline.get(name, _DEFAULT), best, m, band, sign)
        )
    keep = {c.parameter for c in contributions if c.verdict in (HELPS, CORRECTNESS)}
    minimal = dict(best_values)
    for name in changes:
        if name not in keep and name in minimal:
            minimal = revert(spec, minimal, name)
    minimal_median, keeps = None, None
    if minimal != best_values:
        check = measure_variants(
            spec,
            study,
            storage_url,
            [Variant("minimal", minimal)],
            repeats=repeats,
            role=names.ABLATION,
            on_phase=on_phase,
        )
        samples = check["minimal"].samples
        if samples:
            minimal_median = statistics.median(samples)
            keeps = sign * (best_median - minimal_median) <= band
        else:
            keeps = False
    report = AblationReport(
        trial_number=trial.number,
        metric=metric,
        direction=names.direction(metric),
        best_median=best_median,
        noise_band=band,
        min_effect=min_effect,
        contributions=tuple(contributions),
        minimal_values=minimal,
        minimal_median=minimal_median,
        minimal_keeps_gain=keeps,
        repeats=repeats,
    )
    study.set_user_attr(names.ABLATION_REPORT, report.to_dict())
    return report


def _trial_values(spec: StudySpec, trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The parameter values ``trial`` ran with, in the parameters' own terms."""
    values = {}
    for name, value in (trial.user_attrs.get(names.PARAMS_RESOLVED) or trial.params).items():
        try:
            param = spec.space.parameter(name)
        except KeyError:
            raise SpecError(
                f"trial {trial.number} sets {name!r}, which the search space of {spec.path} "
                "does not have",
                key="--trial",
            ) from None
        values[name] = param.from_optuna(value)
    return values


def _pick_trial(
    spec: StudySpec, study: optuna.Study, number: int | None
) -> optuna.trial.FrozenTrial:
    """The trial to ablate: ``number``, or the best (the confirmation's best median when the
    baseline stands). A trial that makes no change from the baseline is refused (SpecError,
    before anything is launched): there is nothing to revert."""
    trials = study.get_trials(deepcopy=False)  # one read, passed down
    if number is None:
        picked = _best_to_ablate(study, trials)
    elif number < 0 or number >= len(trials) or not is_verified_feasible(trials[number]):
        raise SpecError(f"trial {number} is not a verified correct trial", key="--trial")
    else:
        picked = trials[number]
    # the best may be a search trial that drew the baseline's values: as little to revert
    if not changes_from_baseline(spec, _trial_values(spec, picked)):
        what = (
            "is the baseline"
            if picked.user_attrs.get(names.ROLE) == names.BASELINE
            else "runs the baseline's values"
        )
        which = " (the best config)" if number is None else ""
        raise SpecError(
            f"trial {picked.number}{which} {what}: there is no change to ablate (name a "
            "trial that changes something with --trial)",
            key="--trial",
        )
    return picked


def _best_to_ablate(
    study: optuna.Study, trials: list[optuna.trial.FrozenTrial]
) -> optuna.trial.FrozenTrial:
    """The best trial, or the confirmation's best median when the baseline stands."""
    best = best_trials(study, trials=trials)
    if not best:
        raise SpecError("the study has no verified correct trial to ablate", key="--study")
    if best[0].user_attrs.get(names.ROLE) != names.BASELINE:
        return best[0]
    # the baseline stands (no confirmed winner): ablate the confirmation's best median, the
    # config whose changes the user asks about; the baseline has none to revert
    winner = (study.user_attrs.get(names.CONFIRMATION) or {}).get("winner")
    if (
        isinstance(winner, int)
        and 0 <= winner < len(trials)
        and is_verified_feasible(trials[winner])
    ):
        return trials[winner]
    raise SpecError(
        "the baseline is the best config: there is no change to ablate (name one with --trial)",
        key="--trial",
    )


def _noise_band(measured, best_median: float, min_effect: float) -> float:
    deviations = [
        abs(x - statistics.median(m.samples))
        for m in measured
        if len(m.samples) >= 2
        for x in m.samples
    ]
    scatter = 3 * 1.4826 * statistics.median(deviations) if deviations else 0.0
    return max(scatter, min_effect * abs(best_median))


def _judge(
    name: str,
    best_value: Any,
    reverted_to: Any,
    best: VariantMeasurements,
    reverted: VariantMeasurements,
    band: float,
    sign: float,
) -> Contribution:
    if not reverted.samples:
        return Contribution(
            name,
            best_value,
            reverted_to,
            None,
            None,
            None,
            CORRECTNESS,
            f"without it: {', '.join(sorted(set(reverted.failures)))}",
        )
    delta = sign * (statistics.median(best.samples) - statistics.median(reverted.samples))
    low = (
        sign * (min(best.samples) - max(reverted.samples))
        if sign > 0
        else sign * (max(best.samples) - min(reverted.samples))
    )
    high = (
        sign * (max(best.samples) - min(reverted.samples))
        if sign > 0
        else sign * (min(best.samples) - max(reverted.samples))
    )
    if delta > band:
        verdict = HELPS
    elif delta < -band:
        verdict = HURTS
    else:
        verdict = NO_EFFECT
    return Contribution(
        name, best_value, reverted_to, delta, min(low, high), max(low, high), verdict
    )
