"""What the default search strategy knows about configurations: their encoding and its model.

:class:`Encoder` turns configs into feature rows (one-hot choices, ``u`` and ``u**2`` for
numeric values scaled to [0, 1]) and builds configs dimension by dimension, respecting ``when``;
:class:`Model` is the closed-form Bayesian model of log(objective) with main effects and
pairwise interactions (plus a local term over the numeric values where the measurements'
evidence asks for it: :func:`fit_speed`) that :class:`autotune.search.strategy.AutoSampler` asks;
:func:`read_history` reads what a study has measured. Split out of ``strategy.py`` so that
each module has one job.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autotune import names
from autotune.space.model import Parameter, SearchSpace

#: the model's prior, in units of log(objective): s.d. of one feature's main effect (0.3:
#: +-35 %), relative s.d. of a pairwise interaction, and the measurement noise (10 %)
EFFECT_SD = 0.3
PAIR_SD = 1.1
NOISE_SD = 0.1
#: the local term over the numeric dimensions (log units; length in the unit cube): what the
#: main effects (``u``, ``u**2``) and their products cannot say, a peak or a cliff in a numeric
#: value, and that a config next to a measured one is known
LOCAL_SD = 0.3
LOCAL_LENGTH = 0.2


# --- encoding of configurations ------------------------------------------------------------


@dataclass(frozen=True)
class Dim:
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


class Encoder:
    """Configs (Optuna-form dicts of the active parameters) to feature rows and back."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self.dims: list[Dim] = []
        for p in space.parameters:
            if p.type in ("bool", "categorical", "int_list"):
                natives = (False, True) if p.type == "bool" else tuple(p.choices)
                options = tuple(
                    space.to_optuna_params({p.name: v})[p.name] if p.type == "int_list" else v
                    for v in natives
                )
                self.dims.append(Dim(p, options, natives))
            else:
                self.dims.append(Dim(p))
        self.width = 1 + sum(d.width for d in self.dims)
        #: columns of each numeric dimension's ``u`` and of its "absent" flag
        starts = np.cumsum([1] + [d.width for d in self.dims])[:-1]
        numeric = [
            (int(c), int(c) + 2) for d, c in zip(self.dims, starts, strict=True) if not d.is_choice
        ]
        self.numeric = Numeric(
            np.array([u for u, _ in numeric], dtype=int),
            np.array([a for _, a in numeric], dtype=int),
        )

    def optuna_choices(self, choices: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
        """``{parameter: native choices}`` in Optuna form (``int_list`` as labels); names and
        values the space does not have are left out."""
        out: dict[str, tuple[Any, ...]] = {}
        for d in self.dims:
            if d.is_choice and d.param.name in choices:
                wanted = [list(v) if isinstance(v, tuple) else v for v in choices[d.param.name]]
                natives = [list(v) if isinstance(v, tuple) else v for v in d.natives]
                picked = tuple(o for o, v in zip(d.options, natives, strict=True) if v in wanted)
                if picked:
                    out[d.param.name] = picked
        return out

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

    def native(self, d: Dim, value: Any) -> Any:
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

    def complete(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` sets every parameter that is active under its own values."""
        natives = self.natives_of(config)
        return all(
            d.param.name in config for d in self.dims if self.space.is_active(d.param, natives)
        )

    def natives_of(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {
            d.param.name: self.native(d, config[d.param.name])
            for d in self.dims
            if d.param.name in config
        }

    def violated(self, config: Mapping[str, Any]) -> bool:
        return bool(self.space.violated(self.natives_of(config)))


@dataclass(frozen=True)
class Numeric:
    """Where a row keeps its numeric dimensions: the ``u`` column of each, and its "absent"
    column (inactive, or left to the engine)."""

    u: np.ndarray
    absent: np.ndarray

    def coords(self, x: np.ndarray) -> np.ndarray:
        """Unit coordinates of the rows' numeric values; an absent value sits at -1, far from
        every value it could take."""
        return np.where(x[:, self.absent] > 0.5, -1.0, x[:, self.u])


NO_NUMERIC = Numeric(np.array([], dtype=int), np.array([], dtype=int))


def config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


# --- the model -----------------------------------------------------------------------------


@dataclass
class Model:
    """Bayesian regression on main effects AND pairwise interactions of the features, in dual
    (Gaussian-process) form: kernel ``(xs.xs') + p**2 (xs.xs')**2 / D`` with ``xs = x *
    effect_sd``, which is a linear model on every feature (weight s.d. ``effect_sd``) plus one
    on every product of two features, without building the ~3,000 product features. Fixed
    hyperparameters, closed form: milliseconds for 60 trials. The objective's model uses the
    module's defaults (log units); :class:`Feasibility` uses the same form on labels.

    With ``local_sd`` > 0 the kernel adds a squared-exponential term over the numeric
    dimensions' unit coordinates (length :data:`LOCAL_LENGTH`): a smooth function of the
    numeric values that ``u`` and ``u**2`` cannot express (:func:`fit_speed` decides)."""

    x: np.ndarray  # feature rows of the observations
    alpha: np.ndarray
    chol: np.ndarray
    offset: float
    dims: int
    effect_sd: float = EFFECT_SD
    pair_sd: float = PAIR_SD
    numeric: Numeric = NO_NUMERIC
    local_sd: float = 0.0

    def kernel(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Prior covariance of the rows ``a`` and ``b`` (feature rows)."""
        sa, sb = self.scaled(a), self.scaled(b)
        dot = sa @ sb.T
        out = dot + self.pair_sd**2 * dot**2 / self.dims
        if self.local_sd > 0 and len(self.numeric.u):
            ca, cb = self.numeric.coords(a), self.numeric.coords(b)
            d2 = np.sum(ca * ca, 1)[:, None] + np.sum(cb * cb, 1)[None, :] - 2 * ca @ cb.T
            out = out + self.local_sd**2 * np.exp(-np.maximum(d2, 0.0) / (2 * LOCAL_LENGTH**2))
        return out

    def prior_variance(self, x: np.ndarray) -> np.ndarray:
        xs = self.scaled(x)
        norm = np.sum(xs * xs, axis=1)
        local = self.local_sd**2 if len(self.numeric.u) else 0.0
        return norm + self.pair_sd**2 * norm**2 / self.dims + local

    def scaled(self, x: np.ndarray) -> np.ndarray:
        xs = x * self.effect_sd
        xs[:, 0] = 0.0  # the intercept is the offset
        return xs

    @classmethod
    def fit(
        cls,
        x: np.ndarray,
        y: np.ndarray,
        dims: int,
        *,
        effect_sd: float = EFFECT_SD,
        pair_sd: float = PAIR_SD,
        noise_sd: float = NOISE_SD,
        offset: float | None = None,
        numeric: Numeric = NO_NUMERIC,
        local_sd: float = 0.0,
    ) -> Model:
        model = cls(x, np.empty(0), np.empty(0), 0.0, dims, effect_sd, pair_sd, numeric, local_sd)
        model.offset = float(np.mean(y)) if offset is None else offset
        model.chol = np.linalg.cholesky(model.kernel(x, x) + noise_sd**2 * np.eye(len(y)))
        model.alpha = np.linalg.solve(model.chol.T, np.linalg.solve(model.chol, y - model.offset))
        return model

    def log_evidence(self, y: np.ndarray) -> float:
        """log p(y) under the model's prior (what its hyperparameters are chosen by)."""
        return float(
            -0.5 * (y - self.offset) @ self.alpha
            - np.sum(np.log(np.diag(self.chol)))
            - 0.5 * len(y) * math.log(2 * math.pi)
        )

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation at the rows of ``x``."""
        cross = self.kernel(x, self.x)
        mean = cross @ self.alpha + self.offset
        v = np.linalg.solve(self.chol, cross.T)
        prior = self.prior_variance(x)
        return mean, np.sqrt(np.maximum(prior - np.sum(v * v, axis=0), 1e-12))

    def ucb(self, x: np.ndarray, beta: float) -> np.ndarray:
        """Posterior mean plus ``beta`` posterior standard deviations at the rows of ``x``."""
        mean, sd = self.predict(x)
        return mean + beta * sd


def fit_speed(encoder: Encoder, x: np.ndarray, y: np.ndarray) -> Model:
    """The model of the log objective at the feature rows ``x``: main effects and pairwise
    interactions, plus the local term over the numeric dimensions (:data:`LOCAL_SD`) when the
    data say it is needed, i.e. when it has the higher evidence (marginal likelihood).

    Why chosen by evidence, not always on: where the speed is a smooth function of a few
    numeric values (a peak in memory fraction, a cliff), main effects and pairs extrapolate to
    the domain's corners and the search kept launching there (a two-dimensional peak was never
    found in 60 launches, worse than random); where numeric values hardly matter (GLM-5's), the
    local term's extra uncertainty drew launches to them for nothing. The evidence tells the
    two apart from the measurements themselves."""
    dims = len(encoder.dims)
    model = Model.fit(x, y, dims)
    if len(encoder.numeric.u):
        local = Model.fit(x, y, dims, numeric=encoder.numeric, local_sd=LOCAL_SD)
        if local.log_evidence(y) > model.log_evidence(y):
            model = local
    return model


#: the feasibility model's prior: labels +1 (started and passed the gate) and -1 (crashed, did
#: not start, or failed the gate), a feature's effect s.d. on that scale, and label noise
FEASIBLE_EFFECT_SD = 0.6
FEASIBLE_NOISE_SD = 0.5
#: the feasibility model's prior mean: a config is assumed to work until shown otherwise
#: (P = 0.98 where nothing failed nearby: an untried choice is not made to look risky)
FEASIBLE_PRIOR = 1.0


@dataclass
class Feasibility:
    """Where configs start and pass the gate: the same regression as :class:`Model`, on labels
    +1/-1 instead of speeds. Why a second model: a config that printed garbage or ran out of
    memory has no speed; entering it into the speed model as "very slow" blames every one of
    its settings (an fp8 KV cache that is wrong only with one attention backend and block size
    becomes "slow" everywhere). Kept apart, the speed model learns speed from the configs that
    have one, and this one learns the region to avoid, interactions included."""

    model: Model | None

    @classmethod
    def fit(cls, ok: np.ndarray, bad: np.ndarray, dims: int) -> Feasibility:
        if len(bad) == 0:
            return cls(None)
        x = np.vstack([ok, bad]) if len(ok) else bad
        y = np.concatenate([np.ones(len(ok)), -np.ones(len(bad))])
        return cls(
            Model.fit(
                x,
                y,
                dims,
                effect_sd=FEASIBLE_EFFECT_SD,
                noise_sd=FEASIBLE_NOISE_SD,
                offset=FEASIBLE_PRIOR,
            )
        )

    def log_probability(self, x: np.ndarray) -> np.ndarray:
        """log P(the config at each row of ``x`` works): a probit on the label regression's
        posterior mean (which stays at the prior where nothing failed nearby)."""
        if self.model is None:
            return np.zeros(len(x))
        mean, _sd = self.model.predict(x)
        z = mean / FEASIBLE_NOISE_SD
        p = 0.5 * np.vectorize(math.erfc)(-z / math.sqrt(2.0))
        return np.log(np.clip(p, 1e-6, 1.0))


#: fewer measured configs than this: rank them by their own measurements
MIN_FOR_RANKING = 4


def rank_by_posterior(space: SearchSpace, observations: list[tuple[Mapping[str, Any], float]]):
    """Indices of ``observations`` (Optuna-form params, signed log objective: higher is better),
    best first by the model's posterior mean fitted on all of them.

    Why not by each config's own measurement: with 5-20 % noise per launch and dozens of
    configs within a few percent of each other, the highest single measurement is mostly the
    luckiest one (the winner's curse). The posterior mean of a config pools its measurement
    with those of every config that shares its settings, so one lucky draw moves it little.
    With fewer than :data:`MIN_FOR_RANKING` observations the measurements themselves rank."""
    values = np.array([v for _, v in observations], dtype=float)
    if len(observations) < MIN_FOR_RANKING:
        return [int(i) for i in np.argsort(-values, kind="stable")]
    enc = Encoder(space)
    x = np.array([enc.row(c) for c, _ in observations])
    mean = fit_speed(enc, x, values).predict(x)[0]
    return [int(i) for i in np.lexsort((-values, -mean))]


@dataclass
class History:
    """What the study has taught: measured configs (log objective), bad ones, all tried."""

    good: list[tuple[dict[str, Any], float]]
    bad: list[dict[str, Any]]
    tried: set[str]


def read_history(study: optuna.Study, sign: float) -> History:
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
    return History(good, bad, tried)
