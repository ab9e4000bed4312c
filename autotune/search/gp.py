"""``--sampler gp``: Optuna's GPSampler, blind to the baseline trial.

GPSampler models the INTERSECTION of the parameters its completed trials set. The baseline
trial sets only the parameters that have a ``baseline:`` value (often none: "the engine's
default" is no value of the space), so with the baseline in the study that intersection is
empty, or nearly, and GPSampler samples every parameter at random for the whole run: on every
landscape of ``benchmarks/search/suite.py`` its runs matched random's, seed for seed. Hidden
from the baseline, it models the space the search trials share. Everything else of the study
(its other trials, its direction, its storage) is the study's own.

GPSampler lists every value of a discrete domain (an int, a float with a ``step``) in memory,
several times over, at every ask: ``high: 1e38`` raised "Maximum allowed size exceeded" in
the middle of a study, and 8e7 values took 1.6 GB. :func:`check_gp_space` refuses, before the
study starts, a domain of more than :data:`GP_MAX_VALUES` values.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import optuna

from autotune import names
from autotune.errors import SpecError
from autotune.space.model import SearchSpace

#: the most values one discrete domain may hold under ``--sampler gp``: a 12-trial ask/tell
#: loop of Optuna 5.1's GPSampler over one int domain this wide peaks about 15 MB above the
#: sampler's own memory (10 million values: 150 MB). A server setting with more values than
#: this is a size or a count better given a ``step`` or searched by another sampler.
GP_MAX_VALUES = 1_000_000


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


def check_gp_space(space: SearchSpace) -> None:
    """Refuse (SpecError naming ``--sampler``) a discrete domain GPSampler cannot hold in
    memory: more than :data:`GP_MAX_VALUES` values. Counted with whole numbers, never listed."""
    for param in space.parameters:
        count = domain_size(param.distribution())
        if count is not None and count > GP_MAX_VALUES:
            raise SpecError(
                f"parameter {param.name!r} has {_shown(count)} values ({_shown(param.low)} to "
                f"{_shown(param.high)}); the GP sampler lists every value of an int (or stepped "
                f"float) domain in memory and takes at most {GP_MAX_VALUES:,}: narrow the "
                f"range, give it a larger step, or use --sampler auto or tpe",
                key="--sampler",
            )


def domain_size(dist: optuna.distributions.BaseDistribution) -> int | None:
    """How many values a discrete numeric domain holds (None for a continuous or categorical
    one)."""
    if isinstance(dist, optuna.distributions.IntDistribution):
        return (dist.high - dist.low) // dist.step + 1
    if isinstance(dist, optuna.distributions.FloatDistribution) and dist.step is not None:
        count = (dist.high - dist.low) / dist.step + 1
        return int(count) if math.isfinite(count) else sys.maxsize  # a step of 1e-320
    return None


def _shown(number: float | None) -> str:
    """A number of a domain as an error shows it: ``100000000000000000000`` as ``1e+20``."""
    if number is None or abs(number) < 1e7:
        return f"{number:,}" if isinstance(number, int) else str(number)
    try:
        return f"{float(number):.3g}"
    except OverflowError:  # an int of more than 308 digits
        return f"about 2^{int(number).bit_length()}"
