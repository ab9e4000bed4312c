"""Guide the sampler: skip choices this machine cannot run, and start with safe neighbours.

Two things TPE cannot know on its own, wrapped around it as one Optuna sampler:

* **machine limits** (``Engine.machine_limits``): a dropped choice is never proposed; when TPE
  asks for it, another allowed choice of that parameter is drawn instead. The space file and the
  stored distributions stay as they are, so a study resumes on another machine unchanged (that
  machine drops what *it* cannot run).
* **early neighbours**: the first few sampled trials are one-change neighbours of the baseline
  (the baseline's values plus one parameter changed, every other one left at the engine's
  default), pinned like ablation variants; a change the engine launches as its own default is
  none. TPE's random start-up on a space with a fault patch
  and a lossy KV-cache dtype otherwise spends a newcomer's first trials on configurations the
  gate rejects, so a three-trial run shows no working loop. A neighbour comes only from a
  discrete parameter that no constraint names (its interplay with engine defaults is unknown),
  never from a ``fault``/``experimental`` patch or a choice the engine calls lossy; optimization
  and fix patches come first (the space's author proposed them as improvements), then flags and
  env vars in declaration order, one neighbour per parameter.

Enqueued trials (the baseline, retries, confirmation and ablation variants) pass through
untouched. The study records the plan (``early_proposals``) and each neighbour trial its label.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial

from autotune import names
from autotune.engines.base import DroppedChoice, Engine
from autotune.patching import SAFE_KINDS, PatchError, discover_patches
from autotune.search import strategy
from autotune.space.model import Parameter, SearchSpace

#: how many sampled trials after the baseline are one-change neighbours
EARLY_NEIGHBOURS = 2


@dataclass(frozen=True)
class Neighbour:
    """The baseline with one parameter changed."""

    parameter: str
    value: Any
    values: dict[str, Any]  # the whole pinned config, parameter values (int_list as lists)

    @property
    def label(self) -> str:
        return f"{self.parameter}={self.value!r}"


def early_neighbours(
    space: SearchSpace,
    engine: Engine,
    dropped: Sequence[DroppedChoice] = (),
    *,
    patch_kinds: dict[str, str] | None = None,
    count: int = EARLY_NEIGHBOURS,
) -> list[Neighbour]:
    """Up to ``count`` one-change neighbours of the baseline, safest first (see module doc)."""
    if patch_kinds is None:
        patch_kinds = _patch_kinds(engine)
    constrained = set().union(*(c.names for c in space.constraints)) if space.constraints else set()
    gone = {(d.parameter, repr(d.value)) for d in dropped}
    baseline = space.baseline_values()
    # what the baseline launches: a neighbour the engine launches the same way (a value equal
    # to the engine's own default, ``Engine.launch_settings``) would measure the baseline again
    baseline_launch = engine.launch_settings(space.resolve(baseline))
    ranked: list[tuple[int, int, Neighbour]] = []
    for index, param in enumerate(space.parameters):
        if param.name in constrained or param.when or param.type not in _DISCRETE:
            continue
        rank = _rank(param, patch_kinds)
        if rank is None:
            continue
        for value in _values(param):
            unchanged = param.has_baseline and value == baseline.get(param.name)
            if unchanged or (param.name, repr(value)) in gone:
                continue
            if param.target.kind != "patch" and engine.lossy_choice(param.target.name, value):
                continue
            values = {**baseline, param.name: list(value) if param.type == "int_list" else value}
            if space.violated(values):
                continue
            if engine.launch_settings(space.resolve(values)) == baseline_launch:
                continue
            ranked.append((rank, index, Neighbour(param.name, values[param.name], values)))
            break  # one neighbour per parameter
    ranked.sort(key=lambda item: (item[0], item[1]))
    return [n for _, _, n in ranked[:count]]


_DISCRETE = ("categorical", "bool", "int_list")


def _rank(param: Parameter, patch_kinds: dict[str, str]) -> int | None:
    if param.target.kind == "patch":
        return 0 if patch_kinds.get(param.target.name) in SAFE_KINDS else None
    return 1 if param.type == "bool" else 2


def _values(param: Parameter) -> Sequence[Any]:
    # a bool flag left to the engine's default is most often off: turning it on is the change
    return (True, False) if param.type == "bool" else param.choices


def risky_for(space: SearchSpace, engine: Engine) -> dict[str, tuple[Any, ...]]:
    """What the search strategy is told before it measures anything
    (:func:`autotune.search.strategy.risky_choices`): the non-default choices of ``fault`` and
    ``experimental`` patches, and the choices the engine calls lossy."""
    patches = {name: (p.info.kind, p.info.default) for name, p in _discovered(engine).items()}
    return strategy.risky_choices(space, patches, engine.lossy_choice)


def _patch_kinds(engine: Engine) -> dict[str, str]:
    return {name: patch.info.kind for name, patch in _discovered(engine).items()}


def _discovered(engine: Engine) -> dict[str, Any]:
    """The spec's patches by name; none when they cannot be read (the preflight reports that)."""
    try:
        return discover_patches(engine.engine_spec.patch_dirs)
    except PatchError:
        return {}


class GuidedSampler(optuna.samplers.BaseSampler):
    """``base`` (TPE) with machine limits applied and early neighbours proposed first."""

    def __init__(
        self,
        base: optuna.samplers.BaseSampler,
        space: SearchSpace,
        *,
        dropped: Sequence[DroppedChoice] = (),
        neighbours: Sequence[Neighbour] = (),
        seed: int | None = None,
    ) -> None:
        self._base = base
        self._space = space
        self._neighbours = list(neighbours)
        self._rng = random.Random(seed)
        self._dropped: dict[str, set[Any]] = {}
        for d in dropped:
            value = self._optuna_value(d.parameter, d.value)
            self._dropped.setdefault(d.parameter, set()).add(value)
        self._pinned: dict[int, dict[str, Any]] = {}  # trial number -> optuna-form values

    # --- early neighbours --------------------------------------------------------------

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._base.before_trial(study, trial)
        if "fixed_params" in trial.system_attrs or names.ROLE in trial.user_attrs:
            return  # enqueued: the baseline, a retry, a confirmation or ablation variant
        used = {
            t.user_attrs.get(names.EARLY_PROPOSAL)
            for t in study.get_trials(deepcopy=False)
            if t.number != trial.number
        }
        todo = [n for n in self._neighbours if n.label not in used]
        if not todo:
            return
        neighbour = todo[0]
        attrs = {
            names.ROLE: names.SEARCH,
            names.PINNED: neighbour.values,
            names.EARLY_PROPOSAL: neighbour.label,
        }
        for key, value in attrs.items():
            study._storage.set_trial_user_attr(trial._trial_id, key, value)  # noqa: SLF001
            trial.user_attrs[key] = value  # the Trial reads its attrs from this frozen copy
        self._pinned[trial.number] = self._space.to_optuna_params(neighbour.values)

    # --- sampling ----------------------------------------------------------------------

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        if trial.number in self._pinned:
            return {}
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if trial.number in self._pinned or not search_space:
            return {}
        values = self._base.sample_relative(study, trial, search_space)
        return {name: self._allowed(name, v, search_space.get(name)) for name, v in values.items()}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        pinned = self._pinned.get(trial.number)
        if pinned is not None and param_name in pinned:
            return pinned[param_name]
        value = self._base.sample_independent(study, trial, param_name, param_distribution)
        return self._allowed(param_name, value, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001 - Optuna's API
        self._pinned.pop(trial.number, None)
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._base.reseed_rng()
        self._rng.seed()

    # --- machine limits ----------------------------------------------------------------

    def _allowed(self, name: str, value: Any, distribution: BaseDistribution | None) -> Any:
        gone = self._dropped.get(name)
        if not gone or value not in gone or not isinstance(distribution, CategoricalDistribution):
            return value
        left = [c for c in distribution.choices if c not in gone]
        return self._rng.choice(left) if left else value

    def _optuna_value(self, name: str, value: Any) -> Any:
        try:
            return self._space.to_optuna_params({name: value})[name]
        except KeyError:
            return value


def record_plan(
    study: optuna.Study, dropped: Sequence[DroppedChoice], neighbours: Sequence[Neighbour]
) -> None:
    """What was dropped on this machine and why, and the early neighbours planned."""
    study.set_user_attr(
        names.MACHINE_LIMITS,
        [{"parameter": d.parameter, "value": d.value, "reason": d.reason} for d in dropped],
    )
    if names.EARLY_PROPOSALS not in study.user_attrs:
        study.set_user_attr(names.EARLY_PROPOSALS, [n.label for n in neighbours])
