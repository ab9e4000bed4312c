"""Measure chosen configurations again, interleaved, as ordinary gated trials.

Ablation and confirmation both need the same thing: a few fixed configurations ("variants"),
each measured several times, in round-robin order (A, B, C, A, B, C, ...) so that a slow drift
of the machine (thermal, a neighbour's load) hits every variant alike. Each measurement is a
real trial of the study (role ``ablation`` or ``confirm``): it goes through the same server
lifecycle and correctness gate, and is stored and shown like any other trial. A variant's
``values`` are pinned: parameters it leaves out run at the engine's default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune import names
from autotune.engines import build_engine
from autotune.errors import InfrastructureError
from autotune.spec.model import StudySpec
from autotune.storage import artifact_dir_for, artifact_store
from autotune.study.loop import COMPILE_CACHE_DIR, quiet_optuna
from autotune.study.record import TrialOutcome
from autotune.study.trial import TrialContext, TrialRunner


@dataclass(frozen=True)
class Variant:
    label: str
    values: Mapping[str, Any]
    #: this variant's trial role, when not the caller's (recheck runs its baseline as "baseline")
    role: str | None = None


@dataclass
class VariantMeasurements:
    variant: Variant
    outcomes: list[TrialOutcome] = field(default_factory=list)

    @property
    def samples(self) -> list[float]:
        """The first objective's value of each correct measurement."""
        return [o.values[0] for o in self.outcomes if o.verdict == "correct" and o.values]

    @property
    def failures(self) -> list[str]:
        return [o.verdict for o in self.outcomes if o.verdict != "correct"]


def measure_variants(
    spec: StudySpec,
    study: optuna.Study,
    storage_url: str,
    variants: list[Variant],
    *,
    repeats: int,
    role: str,
    on_phase: Callable[[int, str], None] | None = None,
    artifact_dir: str | None = None,
    next_round: Callable[[dict[str, VariantMeasurements], int], Sequence[str]] | None = None,
) -> dict[str, VariantMeasurements]:
    """Run ``repeats`` rounds; in each round every variant once, in order.

    With ``next_round``, ``repeats`` is ignored: before each round ``next_round(results,
    round_index)`` names the variants that round measures (in the variants' order), and an
    empty answer ends the measurement (confirmation's race drops candidates this way).
    """
    quiet_optuna()
    engine = build_engine(spec)
    artifacts_path = artifact_dir_for(storage_url, study.study_name, artifact_dir)
    ctx = TrialContext(
        spec=spec,
        engine=engine,
        log_dir=artifacts_path / "logs",
        artifacts=artifact_store(artifacts_path),
        on_phase=on_phase or (lambda _n, _p: None),
        study=study,
        allow_pruning=False,
        compile_cache=artifacts_path / COMPILE_CACHE_DIR,
    )
    runner = TrialRunner(ctx)
    results = {v.label: VariantMeasurements(v) for v in variants}
    round_index = 0
    while True:
        if next_round is None:
            chosen = variants if round_index < repeats else []
        else:
            wanted = set(next_round(results, round_index))
            chosen = [v for v in variants if v.label in wanted]
        if not chosen:
            break
        for variant in chosen:
            outcome = _measure_once(study, runner, spec, variant, role, round_index)
            if outcome.infrastructure:  # not the variant's fault: one more try
                outcome = _measure_once(study, runner, spec, variant, role, round_index)
            results[variant.label].outcomes.append(outcome)
        round_index += 1
    return results


def _measure_once(
    study: optuna.Study,
    runner: TrialRunner,
    spec: StudySpec,
    variant: Variant,
    role: str,
    round_index: int,
) -> TrialOutcome:
    study.enqueue_trial(
        spec.space.to_optuna_params(variant.values),
        user_attrs={
            names.ROLE: variant.role or role,
            names.VARIANT: variant.label,
            names.PINNED: dict(variant.values),
            names.ROUND: round_index,
        },
    )
    # Optuna runs the oldest waiting trial first: a retry queued earlier may come before ours.
    for _ in range(5):
        runner.last = None
        study.optimize(runner, n_trials=1, catch=(InfrastructureError,), gc_after_trial=False)
        if runner.last is None:
            raise RuntimeError("a re-measurement ended without an outcome")
        trial = study.trials[runner.last.number]
        if trial.user_attrs.get(names.VARIANT) == variant.label:
            return runner.last
    raise RuntimeError(f"variant {variant.label!r} was never run (other trials were queued)")
