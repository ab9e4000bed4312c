"""The search strategy: which configuration to launch next, when every launch costs minutes.

``autotune run`` uses :class:`AutoSampler` (``--sampler auto``, the default); ``tpe``, ``random``
and ``gp`` stay available (:func:`build_sampler`). The study records which one it ran with
(study attribute ``sampler``).

Why not plain TPE: a tuning study gets 20-60 launches, noise of 5-20 % per measurement, whole
regions that crash (OOM) or print garbage, and a few dimensions that decide most of the speed.
Measured on two simulated landscapes (``benchmarks/search_efficiency.py``), TPE was no better
than random there. ``auto`` is a small Bayesian model-based search shaped for that:

* **a space-filling first design** (after the baseline): every choice of every categorical
  dimension appears about equally often in the first :data:`N_DESIGN` trials (a random balanced
  design; numeric dimensions stratified), instead of independent random start-up;
* **a Bayesian model of log(objective) with main effects and pairwise interactions**
  (:class:`_Gp`): one-hot features for choices, ``u`` and ``u**2`` for numeric values scaled to
  [0, 1] (log-scaled where the space says ``log``, so an interior optimum is representable),
  and every product of two features through a quadratic kernel (capture sizes that pay off
  only with a matching ``max_num_seqs``); closed form, milliseconds per ask;
* **failure and wrong-output regions learned as bad**: a launch that crashed, did not start or
  failed the gate enters the model as clearly worse than the worst measured config, so the
  region (often an interaction: MLA direct call *under CUDA graphs*) is avoided; an exact repeat
  of any launched config is never proposed;
* **an optimistic choice among local and global candidates** (upper confidence bound): one to
  three dimensions changed from the best configs measured so far, fresh draws from the space,
  then neighbours of the most promising of those. Dimensions whose effect is clear stop being
  explored as their posterior tightens;
* candidates that break the space's constraints are never asked.

Enqueued trials (the baseline, retries, warm-start configs, confirmation and ablation variants)
pass through untouched. Multi-objective studies fall back to TPE (the model is single-objective).

``--warm-start STUDY`` (:func:`warm_start`) enqueues the best verified configs of another study
(same model on an older engine, a smaller model on the same hardware) as the first search trials:
they are launched and gated here like any other trial, so nothing measured elsewhere can be
reported as this study's best.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune import names
from autotune.errors import SpecError
from autotune.report import is_verified_feasible
from autotune.space import Parameter, SearchSpace

#: names accepted by ``autotune run --sampler``
SAMPLERS = ("auto", "tpe", "random", "gp")
DEFAULT_SAMPLER = "auto"
#: study attribute: the strategy a study was created with
SAMPLER_ATTR = "sampler"
#: trial attribute of a warm-start trial: where its config came from
WARM_START_FROM = "warm_start_from"
#: sampled trials after the baseline that come from the space-filling design
N_DESIGN = 5
#: candidates scored per ask: fresh draws, and local moves around the best configs measured
#: (one to three dimensions changed), then local moves around the most promising candidates
N_GLOBAL = 100
N_LOCAL = 200
N_PARENTS = 3
N_REFINE = 5
#: the model's prior, in units of log(objective): s.d. of one feature's main effect (0.3:
#: +-35 %), relative s.d. of a pairwise interaction, and the measurement noise (10 %)
EFFECT_SD = 0.3
PAIR_SD = 1.1
NOISE_SD = 0.1
#: a launch that crashed or failed the gate counts as this much below the worst measured one
BAD_PENALTY = 0.5
#: optimism: posterior standard deviations added to the predicted log objective (UCB)
UCB_BETA = 1.0


def build_sampler(
    name: str, space: SearchSpace, seed: int | None, *, n_objectives: int = 1
) -> optuna.samplers.BaseSampler:
    """The sampler for ``--sampler NAME``. Unknown names are bad input (exit code 2)."""
    if name == "auto":
        if n_objectives > 1:
            return tpe_sampler(space, seed)
        return AutoSampler(space, seed=seed)
    if name == "tpe":
        return tpe_sampler(space, seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        try:
            import scipy  # noqa: F401  # GPSampler needs scipy and torch
            import torch  # noqa: F401
        except ImportError:
            raise SpecError(
                "--sampler gp needs scipy and torch (pip install scipy torch)", key="--sampler"
            ) from None
        return optuna.samplers.GPSampler(seed=seed)
    raise SpecError(f"unknown sampler {name!r}; one of {', '.join(SAMPLERS)}", key="--sampler")


def tpe_sampler(space: SearchSpace, seed: int | None) -> optuna.samplers.TPESampler:
    """TPE, multivariate with groups (conditional spaces), constant liar for parallel workers
    (the sampler autotune used before ``auto``)."""
    n_params = max(1, len(space.parameters))
    return optuna.samplers.TPESampler(
        seed=seed,
        multivariate=True,
        group=True,
        constant_liar=True,
        n_startup_trials=min(10, max(4, n_params)),
    )


# --- encoding of configurations ------------------------------------------------------------


@dataclass(frozen=True)
class _Dim:
    """One parameter as the model sees it: its options (Optuna form) or its numeric range."""

    param: Parameter
    options: tuple[Any, ...] = ()  # Optuna-form choices (int_list as labels)
    natives: tuple[Any, ...] = ()  # the same choices as the parameter's own values

    @property
    def is_choice(self) -> bool:
        return bool(self.options)

    @property
    def width(self) -> int:
        # one-hot (choices) or u, u^2 (numeric), plus "absent" (inactive or engine default)
        return (len(self.options) if self.is_choice else 2) + 1

    def to_unit(self, value: float) -> float:
        low, high = float(self.param.low), float(self.param.high)
        if high <= low:
            return 0.5
        if self.param.log:
            return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
        return (value - low) / (high - low)

    def from_unit(self, u: float) -> float | int:
        p = self.param
        low, high = float(p.low), float(p.high)
        u = min(1.0, max(0.0, u))
        value = (
            math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
            if p.log
            else (low + u * (high - low))
        )
        if p.type == "int":
            step = int(p.step or 1)
            k = round((value - low) / step)
            return int(min(int(high), int(low) + step * k))
        if p.step:
            k = round((value - low) / float(p.step))
            return round(min(high, low + k * float(p.step)), 10)
        return value


class _Encoder:
    """Configs (Optuna-form dicts of the active parameters) to feature rows and back."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.dims: list[_Dim] = []
        for p in space.parameters:
            if p.type in ("bool", "categorical", "int_list"):
                natives = (False, True) if p.type == "bool" else tuple(p.choices)
                options = tuple(
                    space.to_optuna_params({p.name: v})[p.name] if p.type == "int_list" else v
                    for v in natives
                )
                self.dims.append(_Dim(p, options, natives))
            else:
                self.dims.append(_Dim(p))
        self.width = 1 + sum(d.width for d in self.dims)

    def row(self, config: Mapping[str, Any]) -> np.ndarray:
        out = np.zeros(self.width)
        out[0] = 1.0  # intercept
        col = 1
        for d in self.dims:
            value = config.get(d.param.name)
            if value is None and d.param.name not in config:
                out[col + d.width - 1] = 1.0
            elif d.is_choice:
                try:
                    out[col + d.options.index(value)] = 1.0
                except ValueError:
                    out[col + d.width - 1] = 1.0
            else:
                u = d.to_unit(float(value))
                out[col] = u
                out[col + 1] = u * u
            col += d.width
        return out

    def native(self, d: _Dim, value: Any) -> Any:
        if d.is_choice and d.param.type == "int_list":
            return list(d.natives[d.options.index(value)])
        return value

    def build(self, pick: Any) -> dict[str, Any]:
        """Walk the parameters in order; ``pick(dim, natives_so_far)`` gives each active one's
        Optuna-form value. Returns the Optuna-form config of the active parameters."""
        natives: dict[str, Any] = {}
        config: dict[str, Any] = {}
        for d in self.dims:
            if not self.space.is_active(d.param, natives):
                continue
            value = pick(d, natives)
            config[d.param.name] = value
            natives[d.param.name] = self.native(d, value)
        return config

    def natives_of(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {
            d.param.name: self.native(d, config[d.param.name])
            for d in self.dims
            if d.param.name in config
        }

    def violated(self, config: Mapping[str, Any]) -> bool:
        return bool(self.space.violated(self.natives_of(config)))


def config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


# --- the model -----------------------------------------------------------------------------


@dataclass
class _Gp:
    """Bayesian regression on main effects AND pairwise interactions of the features, in dual
    (Gaussian-process) form: kernel ``(xs.xs') + p**2 (xs.xs')**2 / D`` with ``xs = x *
    EFFECT_SD``, which is a linear model on every feature (weight s.d. ``EFFECT_SD`` in log
    units) plus one on every product of two features, without building the ~3,000 product
    features. Fixed hyperparameters, closed form: milliseconds for 60 trials."""

    x: np.ndarray  # scaled features of the observations
    alpha: np.ndarray
    chol: np.ndarray
    offset: float
    dims: int

    @staticmethod
    def kernel(a: np.ndarray, b: np.ndarray, dims: int) -> np.ndarray:
        dot = a @ b.T
        return dot + PAIR_SD**2 * dot**2 / dims

    @staticmethod
    def scaled(x: np.ndarray) -> np.ndarray:
        xs = x * EFFECT_SD
        xs[:, 0] = 0.0  # the intercept is the offset
        return xs

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, dims: int) -> _Gp:
        xs = cls.scaled(x)
        offset = float(np.mean(y))
        chol = np.linalg.cholesky(cls.kernel(xs, xs, dims) + NOISE_SD**2 * np.eye(len(y)))
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y - offset))
        return cls(xs, alpha, chol, offset, dims)

    def ucb(self, x: np.ndarray, beta: float) -> np.ndarray:
        """Posterior mean plus ``beta`` posterior standard deviations at the rows of ``x``."""
        xs = self.scaled(x)
        cross = self.kernel(xs, self.x, self.dims)
        mean = cross @ self.alpha + self.offset
        v = np.linalg.solve(self.chol, cross.T)
        norm = np.sum(xs * xs, axis=1)
        prior = norm + PAIR_SD**2 * norm**2 / self.dims
        return mean + beta * np.sqrt(np.maximum(prior - np.sum(v * v, axis=0), 1e-12))


@dataclass
class _History:
    """What the study has taught: measured configs (log objective), bad ones, all tried."""

    good: list[tuple[dict[str, Any], float]]
    bad: list[dict[str, Any]]
    tried: set[str]


def _history(study: optuna.Study, sign: float) -> _History:
    good: list[tuple[dict[str, Any], float]] = []
    bad: list[dict[str, Any]] = []
    tried: set[str] = set()
    for t in study.get_trials(deepcopy=False):
        if not t.params:
            continue
        tried.add(config_key(t.params))
        if t.user_attrs.get(names.FAIL_REASON) == "constraint_violated":
            continue  # never launched: the space's constraints already exclude it
        constraint = t.constraints.get(names.CORRECTNESS_CONSTRAINT)
        if constraint is not None and constraint > 0:
            bad.append(dict(t.params))  # crashed, failed the gate, or did not start
        elif t.state == TrialState.COMPLETE and t.values and t.values[0] > 0:
            good.append((dict(t.params), sign * math.log(t.values[0])))
        elif t.state == TrialState.PRUNED and t.intermediate_values:
            last = t.intermediate_values[max(t.intermediate_values)]
            if last > 0:  # verified, stopped early because clearly slower
                good.append((dict(t.params), sign * math.log(last)))
    return _History(good, bad, tried)


class AutoSampler(optuna.samplers.BaseSampler):
    """The default strategy (see the module docstring). Plans each sampled trial whole in
    ``before_trial`` and hands its values out in ``sample_independent``."""

    def __init__(self, space: SearchSpace, *, seed: int | None = None) -> None:
        self._space = space
        self._encoder = _Encoder(space)
        self._rng = np.random.default_rng(seed)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._plans: dict[int, dict[str, Any]] = {}
        self._design: list[dict[str, Any]] | None = None
        #: seconds each model-based proposal took (read by the benchmark)
        self.ask_seconds: list[float] = []
        self.phase_of: dict[int, str] = {}

    # --- Optuna's sampler API ---------------------------------------------------------------

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs or names.ROLE in trial.user_attrs:
            return  # enqueued: passes through untouched
        self._plans[trial.number] = self.propose(study, trial.number)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        plan = self._plans.get(trial.number)
        if plan is not None and param_name in plan:
            value = plan[param_name]
            if param_distribution._contains(param_distribution.to_internal_repr(value)):  # noqa: SLF001
                return value
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001 - Optuna's API
        self._plans.pop(trial.number, None)

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()
        self._fallback.reseed_rng()

    # --- proposals --------------------------------------------------------------------------

    def propose(self, study: optuna.Study, number: int) -> dict[str, Any]:
        """The next config to launch (Optuna form)."""
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
        history = _history(study, sign)
        sampled = sum(
            1
            for t in study.get_trials(deepcopy=False)
            if t.number != number and "fixed_params" not in t.system_attrs
        )
        if sampled < N_DESIGN or len(history.good) < 2:
            config = self._design_point(sampled, history.tried)
            self.phase_of[number] = "design"
            return config
        start = time.perf_counter()
        config = self._model_point(history)
        self.ask_seconds.append(time.perf_counter() - start)
        self.phase_of[number] = "model"
        return config

    def _design_point(self, index: int, tried: set[str]) -> dict[str, Any]:
        if self._design is None:
            self._design = self._make_design(N_DESIGN * 4)
        for config in self._design[index:]:
            if config_key(config) not in tried:
                return config
        return self._random_config()

    def _make_design(self, n: int) -> list[dict[str, Any]]:
        """A balanced design: each choice of each dimension equally often, numerics stratified."""
        columns: dict[str, list[Any]] = {}
        for d in self._encoder.dims:
            if d.is_choice:
                reps = -(-n // len(d.options))
                column = [d.options[i % len(d.options)] for i in range(reps * len(d.options))]
                order = self._rng.permutation(len(column))[:n]
                columns[d.param.name] = [column[i] for i in order]
            else:
                strata = (self._rng.permutation(n) + self._rng.random(n)) / n
                columns[d.param.name] = [d.from_unit(float(u)) for u in strata]
        design = []
        for i in range(n):
            config = self._encoder.build(lambda d, _n, i=i: columns[d.param.name][i])
            for _ in range(20):
                if not self._encoder.violated(config):
                    break
                config = self._encoder.build(
                    lambda d, _n, i=i: (
                        columns[d.param.name][i]
                        if d.is_choice
                        else d.from_unit(float(self._rng.random()))
                    )
                )
            if not self._encoder.violated(config):
                design.append(config)
        return design

    def _draw(self, d: _Dim) -> Any:
        if d.is_choice:
            return d.options[int(self._rng.integers(len(d.options)))]
        return d.from_unit(float(self._rng.random()))

    def _random_config(self) -> dict[str, Any]:
        for _ in range(50):
            config = self._encoder.build(lambda d, _n: self._draw(d))
            if not self._encoder.violated(config):
                return config
        return config

    def _mutate(self, parent: Mapping[str, Any]) -> dict[str, Any]:
        active = [d for d in self._encoder.dims if d.param.name in parent]
        k = 1 + int(self._rng.random() < 0.4) + int(self._rng.random() < 0.15)
        chosen = {active[i].param.name for i in self._rng.permutation(len(active))[:k]}

        def pick(d: _Dim, _natives: dict[str, Any]) -> Any:
            if d.param.name not in parent:
                return self._draw(d)
            if d.param.name not in chosen:
                return parent[d.param.name]
            if d.is_choice:
                others = [o for o in d.options if o != parent[d.param.name]]
                return others[int(self._rng.integers(len(others)))] if others else self._draw(d)
            if self._rng.random() < 0.3:
                return self._draw(d)
            u = d.to_unit(float(parent[d.param.name])) + self._rng.normal(0.0, 0.12)
            return d.from_unit(u)

        return self._encoder.build(pick)

    def _model_point(self, history: _History) -> dict[str, Any]:
        enc = self._encoder
        y_good = np.array([v for _, v in history.good])
        # a launch that crashed or failed the gate counts as clearly worse than the worst
        # measured config: its region (often an interaction of two settings) is learned as bad
        configs = [c for c, _ in history.good] + history.bad
        y = np.concatenate([y_good, np.full(len(history.bad), y_good.min() - BAD_PENALTY)])
        model = _Gp.fit(np.array([enc.row(c) for c in configs]), y, len(enc.dims))

        by_measure = sorted(history.good, key=lambda cv: -cv[1])
        parents = [c for c, _ in by_measure[:N_PARENTS]]
        candidates: list[dict[str, Any]] = []
        seen = set(history.tried)

        def add(config: dict[str, Any]) -> None:
            key = config_key(config)
            if key not in seen and not enc.violated(config):
                seen.add(key)
                candidates.append(config)

        for i in range(N_LOCAL):
            add(self._mutate(parents[i % len(parents)]))
        for _ in range(N_GLOBAL):
            add(enc.build(lambda d, _n: self._draw(d)))
        if not candidates:
            return self._random_config()
        score = model.ucb(np.array([enc.row(c) for c in candidates]), UCB_BETA)
        # second round: neighbours of the most promising candidates
        top = [candidates[i] for i in np.argsort(-score)[:N_REFINE]]
        start = len(candidates)
        for i in range(N_LOCAL):
            add(self._mutate(top[i % len(top)]))
        if len(candidates) > start:
            more = model.ucb(np.array([enc.row(c) for c in candidates[start:]]), UCB_BETA)
            score = np.concatenate([score, more])
        return candidates[int(np.argmax(score))]


# --- warm start ----------------------------------------------------------------------------

#: verified configs of the source study enqueued by ``--warm-start``
WARM_START_TOP = 3


def warm_start_configs(
    source: optuna.Study, space: SearchSpace, top: int = WARM_START_TOP
) -> list[tuple[int, dict[str, Any]]]:
    """The source study's best verified configs that this space can express: ``(trial number,
    parameter values)``, best first, duplicates and the baseline left out."""
    sign = 1.0 if source.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
    ranked = sorted(
        (t for t in source.get_trials(deepcopy=False) if is_verified_feasible(t)),
        key=lambda t: -sign * t.values[0],
    )
    known = set(space.names)
    out: list[tuple[int, dict[str, Any]]] = []
    seen: set[str] = set()
    for t in ranked:
        if t.user_attrs.get(names.ROLE) == "baseline":
            continue
        values = t.user_attrs.get(names.PARAMS_RESOLVED) or {
            name: space.parameter(name).from_optuna(v)
            for name, v in t.params.items()
            if name in known
        }
        values = {k: v for k, v in values.items() if k in known}
        if not values or not all(space.parameter(k).contains(v) for k, v in values.items()):
            continue
        if space.violated(values):
            continue
        key = config_key(values)
        if key in seen:
            continue
        seen.add(key)
        out.append((t.number, values))
        if len(out) >= top:
            break
    return out


def warm_start(
    study: optuna.Study, source: optuna.Study, space: SearchSpace, top: int = WARM_START_TOP
) -> list[str]:
    """Enqueue the source's best verified configs as pinned search trials (once per study).

    Returns one line per config enqueued. They run through the gate like any other trial."""
    done = study.user_attrs.get(WARM_START_FROM)
    if done is not None:
        return []
    lines = []
    for number, values in warm_start_configs(source, space, top):
        origin = f"{source.study_name}#{number}"
        study.enqueue_trial(
            space.to_optuna_params(values),
            user_attrs={names.ROLE: "search", names.PINNED: values, WARM_START_FROM: origin},
        )
        lines.append(f"warm start: queued {origin}")
    study.set_user_attr(WARM_START_FROM, source.study_name)
    return lines


def check_name(name: str) -> str:
    """``--sampler NAME`` checked before anything is created (bad input: exit code 2)."""
    if name not in SAMPLERS:
        raise SpecError(f"unknown sampler {name!r}; one of {', '.join(SAMPLERS)}", key="--sampler")
    return name


def record_sampler(study: optuna.Study, requested: str | None) -> str:
    """The strategy this run uses, recorded in the study (attribute ``sampler``): the one asked
    for, else the one the study was created with, else :data:`DEFAULT_SAMPLER`."""
    recorded = study.user_attrs.get(SAMPLER_ATTR)
    chosen = requested or recorded or DEFAULT_SAMPLER
    if chosen != recorded:
        study.set_user_attr(SAMPLER_ATTR, chosen)
    return chosen


def warm_start_from(study: optuna.Study, spec: Any, url: str, source_name: str) -> list[str]:
    """``--warm-start STUDY``: the named study of the same storage seeds this one."""
    if source_name == study.study_name:
        raise SpecError("a study cannot warm-start from itself", key="--warm-start")
    try:
        source = optuna.load_study(study_name=source_name, storage=study._storage)  # noqa: SLF001
    except KeyError:
        raise SpecError(f"no study named {source_name!r} in {url}", key="--warm-start") from None
    return warm_start(study, source, spec.space)
