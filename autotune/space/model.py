"""Search spaces as data, and the only caller of Optuna's ``suggest_*``.

A space is data: each parameter has a type, a domain and a target (a CLI flag, an environment
variable, a key inside a JSON-valued flag such as ``--compilation-config``, or a patch).
Parameters can be conditional (``when``) and constraints relate them
(:mod:`autotune.space.constraints`).
Reading the YAML is :mod:`autotune.space.load`; this module asks Optuna for values and routes
them to their targets (:meth:`SearchSpace.resolve`), starting nothing.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune.names import int_list_label, parse_int_list
from autotune.space.constraints import Constraint
from autotune.space.settings import ServerSettings, merge_json_key

#: an environment variable's name as a shell accepts it (a space's ``env`` target, the spec's
#: ``engine.env``): anything else cannot be exported, or means a typo
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_one_line(value: str) -> bool:
    """Whether an environment value (a space's ``env`` choice, the spec's ``engine.env``) can be
    written as one line of the ``.env`` file that export writes beside the config, and in the
    config's YAML header: a line break (``\\n``, ``\\r``, and the ones Python and YAML also
    break at: ``\\x85``, ``\\u2028``...) would end the variable there and start a line the
    file's reader takes as another; any other control character makes the YAML unreadable."""
    return all(c in " \t" or c.isprintable() for c in value)


TYPES = ("int", "float", "categorical", "bool", "int_list")
_MISSING = object()


@dataclass(frozen=True)
class Target:
    """Where a parameter's value goes: ``flag``, ``env``, ``json`` (flag + key) or ``patch``."""

    kind: str
    name: str
    key: str | None = None
    false_flag: str | None = None

    def describe(self) -> str:
        if self.kind == "json":
            return f"{self.name} {self.key}"
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Parameter:
    """One dimension of the search space."""

    name: str
    type: str
    target: Target
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    when: Mapping[str, Any] = field(default_factory=dict)
    baseline: Any = _MISSING

    @property
    def has_baseline(self) -> bool:
        return self.baseline is not _MISSING

    def suggest(self, trial: optuna.Trial) -> Any:
        """Ask Optuna for a value. ``int_list`` choices travel as strings such as ``"1,2,4"``."""
        if self.type == "int":
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        if self.type == "float":
            return trial.suggest_float(
                self.name, float(self.low), float(self.high), log=self.log, step=self.step
            )
        if self.type == "bool":
            return trial.suggest_categorical(self.name, [False, True])
        if self.type == "int_list":
            label = trial.suggest_categorical(self.name, [int_list_label(c) for c in self.choices])
            return parse_int_list(label)
        return trial.suggest_categorical(self.name, list(self.choices))

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """The distribution :meth:`suggest` asks Optuna for (what a study stores per trial)."""
        if self.type == "int":
            return optuna.distributions.IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        if self.type == "float":
            return optuna.distributions.FloatDistribution(
                float(self.low), float(self.high), log=self.log, step=self.step
            )
        if self.type == "bool":
            return optuna.distributions.CategoricalDistribution([False, True])
        if self.type == "int_list":
            return optuna.distributions.CategoricalDistribution(
                [int_list_label(c) for c in self.choices]
            )
        return optuna.distributions.CategoricalDistribution(list(self.choices))

    def draw(self, rng: random.Random) -> Any:
        """A uniformly random value, for feasibility checks without a study."""
        if self.type == "int":
            step = int(self.step or 1)
            return int(self.low) + step * rng.randint(0, (int(self.high) - int(self.low)) // step)
        if self.type == "float":
            return rng.uniform(float(self.low), float(self.high))
        if self.type == "bool":
            return rng.random() < 0.5
        return (
            list(rng.choice(self.choices)) if self.type == "int_list" else rng.choice(self.choices)
        )

    def contains(self, value: Any) -> bool:
        if self.type == "bool":
            return isinstance(value, bool)
        if self.type in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                return False
            if self.type == "int" and not (isinstance(value, int) or value.is_integer()):
                return False
            # compared as they are: float() of an integer over 1.8e308 raised OverflowError
            if not self.low <= value <= self.high:
                return False
            return self.step is None or _on_grid(value, self.low, self.step)
        if self.type == "int_list":
            # a scalar (``baseline: 4``, ``when: {sizes: 4}``) is no list: list(4) raised
            if not isinstance(value, list | tuple):
                return False
            return list(value) in [list(c) for c in self.choices]
        return value in self.choices

    def from_optuna(self, value: Any) -> Any:
        """Turn a stored Optuna value back into the parameter's own value."""
        if self.type == "int_list" and isinstance(value, str):
            return parse_int_list(value)
        return value


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space, loaded from ``path``."""

    path: Path
    parameters: tuple[Parameter, ...]
    constraints: tuple[Constraint, ...] = ()

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parameters]

    def parameter(self, name: str) -> Parameter:
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(name)

    def is_active(self, param: Parameter, values: Mapping[str, Any]) -> bool:
        for other, expected in param.when.items():
            if other not in values:
                return False
            actual = values[other]
            if isinstance(expected, dict) and "in" in expected:
                if actual not in expected["in"]:
                    return False
            elif actual != expected:
                return False
        return True

    def suggest(self, trial: optuna.Trial, only: Collection[str] | None = None) -> dict[str, Any]:
        """Values of the active parameters, asked of Optuna in declaration order.

        ``only`` names the parameters to ask for, the others are left out so the engine runs
        with its own defaults: the baseline (:meth:`baseline_names`) and the pinned variants of
        ablation and confirmation. Those trials were enqueued with exactly these values, so
        Optuna returns them."""
        return self._assign(lambda param: param.suggest(trial), only)

    def baseline_names(self) -> frozenset[str]:
        """The parameters the baseline sets (those with a ``baseline`` value)."""
        return frozenset(p.name for p in self.parameters if p.has_baseline)

    def _assign(
        self, value_of: Callable[[Parameter], Any], only: Collection[str] | None = None
    ) -> dict[str, Any]:
        """The one walk over the parameters: each active one (its ``when`` holds for the values
        chosen before it) and named in ``only`` gets ``value_of(param)``."""
        values: dict[str, Any] = {}
        for param in self.parameters:
            if (only is None or param.name in only) and self.is_active(param, values):
                values[param.name] = value_of(param)
        return values

    def to_optuna_params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Values as Optuna stores them (``int_list`` as its string label)."""
        return {
            name: int_list_label(value) if self.parameter(name).type == "int_list" else value
            for name, value in values.items()
        }

    def baseline_values(self) -> dict[str, Any]:
        """The baseline: each parameter's ``baseline`` value where given, engine default else."""
        return self._assign(lambda param: param.baseline, self.baseline_names())

    def baseline_optuna_params(self) -> dict[str, Any]:
        """Baseline values as Optuna stores them (for ``enqueue_trial``)."""
        return self.to_optuna_params(self.baseline_values())

    def violated(self, values: Mapping[str, Any]) -> list[str]:
        return [c.expr for c in self.constraints if not c.holds(values)]

    def draw(self, rng: random.Random) -> dict[str, Any]:
        """A uniformly random configuration, for feasibility checks without a study."""
        return self._assign(lambda param: param.draw(rng))

    def resolve(self, values: Mapping[str, Any]) -> ServerSettings:
        """Route each value to its target. Pure: builds the settings, starts nothing."""
        flags: dict[str, Any] = {}
        json_flags: dict[str, dict[str, Any]] = {}
        env: dict[str, str] = {}
        patches: dict[str, Any] = {}
        for param in self.parameters:
            if param.name not in values:
                continue
            value = values[param.name]
            target = param.target
            if target.kind == "flag":
                if param.type == "bool" and value is False and target.false_flag:
                    flags[target.false_flag] = True
                elif param.type == "int_list":
                    flags[target.name] = [int(v) for v in value]
                else:
                    flags[target.name] = value
            elif target.kind == "env":
                if value is not None:
                    env[target.name] = _env_text(value)
            elif target.kind == "json":
                # null leaves the key unset; a JSON flag with no key set is not passed at all
                # (``speculative_method: null`` = no --speculative-config, no speculation)
                if value is not None:
                    merge_json_key(json_flags.setdefault(target.name, {}), target.key, value)
            else:
                patches[target.name] = value
        return ServerSettings(flags=flags, json_flags=json_flags, env=env, patches=patches)


def _on_grid(value: float, low: float, step: float) -> bool:
    """Whether ``value`` is ``low`` plus a whole number of ``step`` (what Optuna proposes for a
    stepped domain); a float grid allows for rounding (0.8 + 3 * 0.05 is 0.9500000000000001)."""
    if isinstance(value, int) and isinstance(low, int) and isinstance(step, int):
        return (value - low) % step == 0
    count = (value - low) / step
    return abs(count - round(count)) <= 1e-9 * max(1.0, abs(count))


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)
