"""``autotune recheck BEST.yaml``: is an exported config still correct and still fast?

Patches and flags are version-bound, and an engine, NCCL or driver upgrade can make an exported
config wrong (a patch whose target moved, a kernel with a new bug) or slow (a lever that stopped
working). Re-tuning for a night after each upgrade is what users do today; deploying blind is the
alternative. A recheck costs two server starts per round: the baseline (which records a fresh
greedy reference on the upgraded engine) and the exported config, interleaved like a
confirmation (``autotune.analysis.remeasure``), each through the full correctness gate.

The figures it compares with are the ones recorded at export:
:func:`autotune.study.export.record_line` writes one
machine-readable comment into the exported YAML's header (``# autotune-record: {json}``: the
parameter values, the objective metrics of the exported trial and of the baseline, the engine
version, the spec's path), so a recheck needs only the file. Verdict (:func:`judge`):

* the baseline fails: the engine itself is broken here; nothing to blame on the config (exit 1);
* the exported config fails the gate (or does not start): exit 1, ``wrong``;
* it is slower than at export by more than the noise band, or slower than today's baseline by
  more than the band: exit 1, ``slower``;
* otherwise exit 0.

The noise band is ``max(min_effect, the benchmark's own repeat spread)`` of the figure compared
with (``min_effect`` default 10%: users see 10-20% run-to-run noise on real servers).

When the config is wrong or slower, the guilty parameter is found with the ablation machinery
(``autotune.analysis.ablation.changes_from_baseline`` / ``revert``):
each change from the baseline is
reverted on its own and measured once. For a wrong config, the guilty changes are those whose
revert passes the gate; for a slower one, the revert that is fastest, if it beats the exported
config by more than the band. A config with a single change needs no extra launch: that change
is the only candidate. Every measurement is a trial of a new study ``recheck-<study>-<time>`` in
the spec's storage, so ``autotune show --study ...`` shows the evidence.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune import names
from autotune.analysis.ablation import changes_from_baseline, revert
from autotune.analysis.remeasure import Variant, measure_variants
from autotune.engines import build_engine
from autotune.errors import SpecError
from autotune.spec.load import load_spec
from autotune.storage import artifact_dir_for, open_storage
from autotune.study.export import RECORD_KEY, read_record
from autotune.study.hardware import describe_machine
from autotune.study.loop import preflight, roofline_record, study_target

DEFAULT_MIN_EFFECT = 0.10
WRONG, SLOWER, BASELINE_BROKEN, OK = "wrong", "slower", "baseline_broken", "ok"


# --- the verdict --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One variant's rounds: objective samples of the correct ones, verdicts of the others."""

    samples: tuple[float, ...] = ()
    failures: tuple[str, ...] = ()
    #: the largest relative repeat spread of the objective seen in its benchmarks
    spread: float = 0.0

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


@dataclass(frozen=True)
class Verdict:
    status: str  # OK | WRONG | SLOWER | BASELINE_BROKEN
    reason: str
    band: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


def judge(
    *,
    metric: str,
    sign: float,
    recorded: float | None,
    recorded_baseline: float | None,
    baseline: Measured,
    exported: Measured,
    min_effect: float = DEFAULT_MIN_EFFECT,
) -> Verdict:
    """Pure: the verdict from the figures (``sign`` +1 when larger is better)."""
    if not baseline.samples:
        return Verdict(
            BASELINE_BROKEN,
            f"the baseline itself fails on this engine ({', '.join(baseline.failures)}): "
            "the engine, not the exported config, is broken here",
        )
    if exported.failures or not exported.samples:
        return Verdict(
            WRONG,
            f"the exported config no longer passes: {', '.join(exported.failures) or 'no result'}",
        )
    now, base_now = exported.median, baseline.median
    assert now is not None and base_now is not None
    rel = max(min_effect, exported.spread, baseline.spread)
    then = f" (at export {recorded:.1f})" if recorded is not None else ""
    base_then = f" (at export {recorded_baseline:.1f})" if recorded_baseline is not None else ""
    figures = f"{metric} now {now:.1f}{then}; baseline now {base_now:.1f}{base_then}"
    if recorded is not None and sign * (recorded - now) > rel * abs(recorded):
        return Verdict(
            SLOWER,
            f"slower than at export by more than the noise band ({rel:.0%}): {figures}",
            rel * abs(recorded),
        )
    if sign * (base_now - now) > rel * abs(base_now):
        return Verdict(
            SLOWER,
            f"now slower than the baseline by more than the noise band ({rel:.0%}): {figures}",
            rel * abs(base_now),
        )
    return Verdict(OK, f"still correct and not slower beyond noise ({rel:.0%}): {figures}")


def blame_wrong(reverted: Mapping[str, Measured]) -> list[str]:
    """The changes whose revert alone makes the config pass again."""
    return [name for name, m in reverted.items() if m.samples and not m.failures]


def blame_slower(
    reverted: Mapping[str, Measured], exported: Measured, sign: float, band: float
) -> list[str]:
    """The change whose revert is fastest, when it beats the exported config beyond ``band``."""
    now = exported.median
    best = [
        (sign * (m.median - now), name)
        for name, m in reverted.items()
        if m.median is not None and not m.failures and now is not None
    ]
    best = [b for b in best if b[0] > band]
    return [max(best)[1]] if best else []


# --- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecheckResult:
    verdict: Verdict
    study_name: str
    storage_url: str
    baseline: Measured
    exported: Measured
    #: the changes from the baseline the exported config makes
    changes: tuple[str, ...]
    guilty: tuple[str, ...] = ()
    reverted: dict[str, Measured] = field(default_factory=dict)
    engine_version: str | None = None
    recorded_engine_version: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict.ok


def run_recheck(
    best_path: Path,
    *,
    spec_path: Path | None = None,
    storage: str | None = None,
    rounds: int = 1,
    min_effect: float = DEFAULT_MIN_EFFECT,
    blame: bool = True,
    on_phase: Any = None,
) -> RecheckResult:
    record = read_record(best_path)
    if spec_path is None and not record.get("spec"):
        raise SpecError(
            "the record names no study spec: give it with --spec",
            file=str(best_path),
            key=f"{RECORD_KEY}.spec",
        )
    spec = load_spec(spec_path or Path(record["spec"]))
    values = _values(spec, record, best_path)
    metric = spec.objective.metrics[0]
    sign = names.sign(metric)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%f")
    name = f"recheck-{spec.name}-{stamp}"
    # What `autotune run` checks before it creates anything, checked the same way (a model
    # that is not there, an engine not installed, a space the engine refuses, a bad storage
    # URL): a recheck of a spec `run` refuses creates no study and launches nothing.
    engine = build_engine(spec)
    preflight(spec, engine)
    roofline_record(spec)
    url, _ = study_target(spec, None, storage, existing=False)
    artifact_dir_for(url, name)
    study = optuna.create_study(
        storage=open_storage(url), study_name=name, directions=spec.objective.directions
    )
    study.set_user_attr(names.SPEC_PATH, str(spec.path))
    study.set_user_attr(names.MACHINE, describe_machine())  # where the recheck measured
    study.set_user_attr(names.RECHECK_OF, {"file": str(best_path.resolve()), **record})
    baseline_values = spec.space.baseline_values()
    variants = [
        Variant("baseline", baseline_values, role=names.BASELINE),
        Variant("exported", values),
    ]
    measured = measure_variants(
        spec, study, url, variants, repeats=rounds, role=names.CONFIRM, on_phase=on_phase
    )
    base, exported = (_measured(study, measured[v.label], metric) for v in variants)
    verdict = judge(
        metric=metric,
        sign=sign,
        recorded=(record.get("metrics") or {}).get(metric),
        recorded_baseline=(record.get("baseline_metrics") or {}).get(metric),
        baseline=base,
        exported=exported,
        min_effect=min_effect,
    )
    changes = tuple(changes_from_baseline(spec, values))
    guilty: list[str] = []
    reverted: dict[str, Measured] = {}
    if blame and verdict.status in (WRONG, SLOWER) and changes:
        if len(changes) == 1 and verdict.status == WRONG:
            guilty = list(changes)  # the baseline passes, so its only change is to blame
        else:
            revert_variants = [Variant(f"revert:{n}", revert(spec, values, n)) for n in changes]
            again = measure_variants(
                spec, study, url, revert_variants, repeats=1, role=names.ABLATION, on_phase=on_phase
            )
            reverted = {
                v.label.removeprefix("revert:"): _measured(study, again[v.label], metric)
                for v in revert_variants
            }
            if verdict.status == WRONG:
                guilty = blame_wrong(reverted)
            else:
                guilty = blame_slower(reverted, exported, sign, verdict.band or 0.0)
    result = RecheckResult(
        verdict=verdict,
        study_name=name,
        storage_url=url,
        baseline=base,
        exported=exported,
        changes=changes,
        guilty=tuple(guilty),
        reverted=reverted,
        engine_version=engine.version(),
        recorded_engine_version=record.get("engine_version"),
    )
    study.set_user_attr(
        names.RECHECK,
        {
            "status": verdict.status,
            "reason": verdict.reason,
            "guilty": list(guilty),
            "changes": list(changes),
        },
    )
    return result


def _values(spec: Any, record: Mapping[str, Any], path: Path) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in record["values"].items():
        try:
            param = spec.space.parameter(name)
        except KeyError:
            raise SpecError(
                f"the exported config sets {name!r}, which the search space of "
                f"{spec.path} does not have",
                file=str(path),
                key=f"{RECORD_KEY}.values.{name}",
            ) from None
        try:
            value = param.from_optuna(value)
            inside = param.contains(value)
        except (TypeError, ValueError, OverflowError):
            inside = False
        if not inside:
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:60] + "..."
            raise SpecError(
                f"{name}={shown} is outside the parameter's domain in {spec.space.path}",
                file=str(path),
                key=f"{RECORD_KEY}.values.{name}",
            )
        values[name] = value
    return values


def _measured(study: Any, m: Any, metric: str) -> Measured:
    """A :class:`Measured` from ``remeasure.VariantMeasurements`` plus the trials' spreads."""

    spreads = []
    details = []
    for outcome in m.outcomes:
        trial = study.trials[outcome.number]
        bench = trial.user_attrs.get(names.BENCH) or {}
        spreads.append(float((bench.get("spread") or {}).get(metric, 0.0)))
        if outcome.verdict != "correct":
            detail = str(trial.user_attrs.get(names.FAIL_DETAIL) or "")[:200]
            details.append(f"{outcome.verdict}" + (f" ({detail})" if detail else ""))
    return Measured(
        samples=tuple(m.samples), failures=tuple(details), spread=max(spreads, default=0.0)
    )
