"""``--sampler gp``: Optuna's GPSampler, blind to the baseline trial.

GPSampler models the INTERSECTION of the parameters its completed trials set. The baseline
trial sets only the parameters that have a ``baseline:`` value (often none: "the engine's
default" is no value of the space), so with the baseline in the study that intersection is
empty, or nearly, and GPSampler samples every parameter at random for the whole run: on every
landscape of ``benchmarks/search/suite.py`` its runs matched random's, seed for seed. Hidden
from the baseline, it models the space the search trials share. Everything else of the study
(its other trials, its direction, its storage) is the study's own.
"""

from __future__ import annotations

from typing import Any

import optuna

from autotune import names


class _WithoutBaseline:
    """The study as GPSampler should see it: every trial but the baseline."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [t for t in self._study._get_trials(*args, **kwargs) if not is_baseline(t)]

    def get_trials(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [t for t in self._study.get_trials(*args, **kwargs) if not is_baseline(t)]

    @property
    def trials(self) -> list[Any]:
        return self.get_trials()


def is_baseline(trial: Any) -> bool:
    return trial.user_attrs.get(names.ROLE) == "baseline"


def baseline_blind_gp(seed: int | None) -> optuna.samplers.BaseSampler:
    """Optuna's GPSampler that never sees the baseline trial (needs scipy and torch)."""

    class BaselineBlindGP(optuna.samplers.GPSampler):
        def infer_relative_search_space(self, study, trial):  # type: ignore[no-untyped-def]
            return super().infer_relative_search_space(_WithoutBaseline(study), trial)

        def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
            return super().sample_relative(_WithoutBaseline(study), trial, search_space)

    return BaselineBlindGP(seed=seed)
