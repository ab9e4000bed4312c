"""The search strategy: which configuration to launch next, when every launch costs minutes.

:func:`build_sampler` returns the sampler ``--sampler`` names: ``auto`` (:class:`AutoSampler`,
the default), ``tpe``, ``random`` or ``gp``; the study records it (study attribute
``sampler``). ``auto`` proposes a balanced first design of :data:`N_DESIGN` trials without the
risky choices (:func:`risky_choices`), then asks the Bayesian speed and feasibility models of
:mod:`autotune.search.model`: mostly a sweep of :data:`SWEEP_GROUP` dimensions around the
incumbent (the best posterior mean), a :data:`GLOBAL_SHARE` of global steps, and where the
sweep stalls a check of a choice the model has written off; never an exact repeat or a config
that breaks a constraint. Enqueued trials pass through untouched;
multi-objective studies get TPE.

Why it is built this way, and how well it works: ``docs/design/search-strategy.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from autotune import names
from autotune.errors import SpecError
from autotune.patching import RISKY_KINDS
from autotune.search.gp import baseline_blind_gp, check_gp_space
from autotune.search.model import (
    Dim,
    Encoder,
    Feasibility,
    History,
    config_key,
    fit_speed,
    read_history,
)
from autotune.space.model import SearchSpace

#: names accepted by ``autotune run --sampler``
SAMPLERS = ("auto", "tpe", "random", "gp")
DEFAULT_SAMPLER = "auto"
#: study attribute: the strategy a study was created with
SAMPLER_ATTR = "sampler"
#: sampled trials after the baseline that come from the space-filling design
N_DESIGN = 5
#: candidates scored per ask: fresh draws, and local moves around the best configs measured
#: (one to three dimensions changed), then local moves around the most promising candidates
N_GLOBAL = 100
N_LOCAL = 200
N_PARENTS = 3
N_REFINE = 5
#: optimism: posterior standard deviations added to the predicted log objective (UCB)
UCB_BETA = 2.0
#: share of model-phase asks that search the whole space instead of the incumbent's neighbours
GLOBAL_SHARE = 0.25
#: dimensions changed together in one sweep launch
SWEEP_GROUP = 3
#: prior penalty (log units) of each risky choice in a config: about -14 %, overturned by one
#: or two good measurements
RISK_PRIOR = 0.15
#: sweep launches between two checks of a dimension the model has written off
#: (:meth:`AutoSampler._check_point`)
CHECK_EVERY = 4
#: log units the incumbent's posterior mean must rise by to count as progress (checks wait
#: for :data:`CHECK_EVERY` sweep launches without progress)
STALL_GAIN = 0.03
#: log units the incumbent's posterior mean must rise by for those checks to start over
NEW_REGIME = 0.2
#: numeric values tried per dimension in the incumbent's neighbourhood (stratified), and
#: variants drawn for the dimensions a change makes active
N_LEVELS = 4
N_ACTIVATED = 3


def build_sampler(
    name: str,
    space: SearchSpace,
    seed: int | None,
    *,
    n_objectives: int = 1,
    risky: Mapping[str, Collection[Any]] | None = None,
) -> optuna.samplers.BaseSampler:
    """The sampler for ``--sampler NAME``. Unknown names are bad input (exit code 2).
    ``risky`` (:func:`risky_choices`) is what ``auto`` knows before measuring anything."""
    if name == "auto":
        if n_objectives > 1:
            return tpe_sampler(space, seed)
        return AutoSampler(space, seed=seed, risky=risky)
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
                "--sampler gp needs scipy and torch (pip install 'autotune[gp]' torch)",
                key="--sampler",
            ) from None
        check_gp_space(space)
        return baseline_blind_gp(seed)
    raise SpecError(f"unknown sampler {name!r}; one of {', '.join(SAMPLERS)}", key="--sampler")


def risky_choices(
    space: SearchSpace,
    patches: Mapping[str, tuple[str, Any]] | None = None,
    lossy: Callable[[str, Any], str | None] | None = None,
) -> dict[str, tuple[Any, ...]]:
    """The choices known to be risky before anything is measured, per parameter: every
    non-default choice of a patch whose kind is in ``patching.RISKY_KINDS`` (``patches``:
    patch name -> (kind, default)), and every choice the engine calls lossy (``lossy(target,
    value)``, e.g. an fp8 KV cache). General knowledge, not knowledge of a landscape."""
    out: dict[str, tuple[Any, ...]] = {}
    for p in space.parameters:
        if p.type not in ("categorical", "bool", "int_list"):
            continue
        values = (False, True) if p.type == "bool" else p.choices
        if p.target.kind == "patch":
            kind, default = (patches or {}).get(p.target.name, (None, None))
            risky = [v for v in values if kind in RISKY_KINDS and v != default]
        elif lossy is not None and p.target.kind in ("flag", "env"):
            risky = [v for v in values if lossy(p.target.name, v)]
        else:
            risky = []
        if risky:
            out[p.name] = tuple(risky)
    return out


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


class AutoSampler(optuna.samplers.BaseSampler):
    """The default strategy (see the module docstring). Plans each sampled trial whole in
    ``before_trial`` and hands its values out in ``sample_independent``."""

    def __init__(
        self,
        space: SearchSpace,
        *,
        seed: int | None = None,
        risky: Mapping[str, Collection[Any]] | None = None,
    ) -> None:
        self._space = space
        self._encoder = Encoder(space)
        #: choices known to be risky (a fault/experimental patch, a lossy dtype), Optuna form:
        #: left out of the design, and started with a penalty that measurements can overturn
        self._risky = self._encoder.optuna_choices(risky or {})
        self._rng = np.random.default_rng(seed)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._plans: dict[int, dict[str, Any]] = {}
        self._design: list[dict[str, Any]] | None = None
        #: seconds each model-based proposal took (read by the benchmark)
        self.ask_seconds: list[float] = []
        self.phase_of: dict[int, str] = {}
        self.phase_of_last = "model"
        self._visited: set[str] = set()
        #: sweep launches since the last check of a dimension the model had written off, and
        #: the dimensions checked so far in the current round of checks
        self._since_check = 0
        self._checked: set[str] = set()
        self._checked_level = -np.inf
        self._best_level = -np.inf
        self._choice_names = {d.param.name for d in self._encoder.dims if d.is_choice}

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
        history = read_history(study, sign)
        # the design's own trials so far: not the enqueued ones, and not the guide's early
        # neighbours (``guide.GuidedSampler`` pins those after this sampler planned them), so
        # that the design has its N_DESIGN points in ``autotune run`` as in the benchmark
        sampled = sum(
            1
            for t in study.get_trials(deepcopy=False)
            if t.number != number
            and "fixed_params" not in t.system_attrs
            and names.EARLY_PROPOSAL not in t.user_attrs
        )
        if sampled < N_DESIGN or len(history.good) < 2:
            config = self._design_point(sampled, history.tried)
            self.phase_of[number] = "design"
            return config
        start = time.perf_counter()
        config = self._model_point(history)
        self.ask_seconds.append(time.perf_counter() - start)
        self.phase_of[number] = self.phase_of_last
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
                risky = self._risky.get(d.param.name, ())
                options = [o for o in d.options if o not in risky] or list(d.options)
                reps = -(-n // len(options))
                column = [options[i % len(options)] for i in range(reps * len(options))]
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

    def _draw(self, d: Dim) -> Any:
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

        def pick(d: Dim, _natives: dict[str, Any]) -> Any:
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

    def _model_point(self, history: History) -> dict[str, Any]:
        enc = self._encoder
        good = [c for c, _ in history.good]
        # speed from the configs that have one; where configs crash or print garbage from a
        # model of its own (search_model.Feasibility)
        configs = good
        y = np.array([v for _, v in history.good])
        feasible = Feasibility.fit(
            np.array([enc.row(c) for c in good]),
            np.array([enc.row(c) for c in history.bad]).reshape(len(history.bad), enc.width),
            len(enc.dims),
        )
        # the model learns the difference from the prior (risky choices start lower)
        y = y - self._prior(configs)
        model = fit_speed(enc, np.array([enc.row(c) for c in configs]), y)

        def ucb(configs: list[dict[str, Any]]) -> np.ndarray:
            rows = np.array([enc.row(c) for c in configs])
            return model.ucb(rows, UCB_BETA) + self._prior(configs) + feasible.log_probability(rows)

        def spread(configs: list[dict[str, Any]]) -> np.ndarray:
            return model.predict(np.array([enc.row(c) for c in configs]))[1]

        seen = set(history.tried)
        mean = model.predict(np.array([enc.row(c) for c in good]))[0] + self._prior(good)
        # the incumbent: the best posterior mean (not the luckiest draw) among the configs
        # that set every active dimension (the baseline leaves some to the engine, and a
        # neighbour of it would have to draw those at random)
        complete = [i for i, c in enumerate(good) if enc.complete(c)] or list(range(len(good)))
        best = max(complete, key=lambda i: mean[i])
        incumbent = good[best]
        if self._rng.random() >= GLOBAL_SHARE:
            self.phase_of_last = "sweep"
            parents = [good[i] for i in np.argsort(-mean) if i in set(complete)][:N_PARENTS]
            config = self._sweep_point(ucb, incumbent, float(mean[best]), seen, spread, parents)
            if config is not None:
                return config
        self.phase_of_last = "model"
        by_mean = [good[i] for i in np.argsort(-mean)]
        parents = by_mean[:N_PARENTS]
        candidates: list[dict[str, Any]] = []

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
        score = ucb(candidates)
        # second round: neighbours of the most promising candidates
        top = [candidates[i] for i in np.argsort(-score)[:N_REFINE]]
        start = len(candidates)
        for i in range(N_LOCAL):
            add(self._mutate(top[i % len(top)]))
        if len(candidates) > start:
            more = ucb(candidates[start:])
            score = np.concatenate([score, more])
        return candidates[int(np.argmax(score))]

    def _sweep_point(
        self,
        ucb: Callable[[list[dict[str, Any]]], np.ndarray],
        incumbent: Mapping[str, Any],
        level: float,
        seen: set[str],
        spread: Callable[[list[dict[str, Any]]], np.ndarray],
        parents: list[dict[str, Any]],
    ) -> dict[str, Any] | None:
        """Coordinate ascent around the incumbent: each round visits every active dimension
        once, most promising first (its best untried value by UCB), so that no dimension is
        left untested while launches go to the same few; the incumbent may change between
        visits (improvements are accepted as they come). Only values whose UCB is above the
        incumbent's posterior mean (``level``) count: a dimension whose every value is known
        to be worse (a wrong or crashing choice) is not visited again, except by a check of
        the model (:meth:`_check_point`) once the sweep has made no progress (the incumbent's
        posterior mean up by :data:`STALL_GAIN`) for :data:`CHECK_EVERY` launches."""
        enc = self._encoder
        neighbours = [
            (name, c)
            for name, c in self._neighbours(incumbent)
            if config_key(c) not in seen and not enc.violated(c)
        ]
        if not neighbours:
            return None
        score_all = ucb([c for _n, c in neighbours])
        hopeful = [(n, c, u) for (n, c), u in zip(neighbours, score_all, strict=True) if u > level]
        self._since_check += 1
        if level > self._best_level + STALL_GAIN:
            # the sweep is making progress: the model is trusted until it stalls
            self._best_level = level
            self._since_check = 0
        if self._since_check > CHECK_EVERY:
            written_off = {n for n, _c in neighbours if n in self._choice_names} - {
                n for n, _c, _u in hopeful
            }
            if written_off:
                check = self._check_point(
                    neighbours,
                    spread([c for _n, c in neighbours]),
                    written_off,
                    level,
                    ucb,
                    parents,
                    seen,
                )
                if check is not None:
                    return check
        if not hopeful:
            return None
        if not {n for n, _c, _u in hopeful} - self._visited:
            self._visited = set()  # a new round
        open_moves = [(n, c, u) for n, c, u in hopeful if n not in self._visited]
        configs = [c for _n, c, _u in open_moves]
        owner = [n for n, _c, _u in open_moves]
        score = np.array([u for _n, _c, u in open_moves])
        best = int(np.argmax(score))
        self._visited.add(owner[best])
        config = dict(configs[best])
        # group testing: the next most promising open dimensions' best values are changed in
        # the same launch (the model tells their effects apart over later launches)
        ranked = sorted(range(len(configs)), key=lambda i: -score[i])
        changed = {owner[best]}
        for i in ranked:
            if len(changed) >= SWEEP_GROUP:
                break
            name = owner[i]
            if name in changed or name not in config:
                continue
            merged = self._merge(config, configs[i], name)
            if config_key(merged) in seen or enc.violated(merged):
                continue
            config = merged
            changed.add(name)
            self._visited.add(name)
        return config

    def _check_point(
        self,
        neighbours: list[tuple[str, dict[str, Any]]],
        spread: np.ndarray,
        written_off: set[str],
        level: float,
        ucb: Callable[[list[dict[str, Any]]], np.ndarray],
        parents: list[dict[str, Any]],
        seen: set[str],
    ) -> dict[str, Any] | None:
        """A check of the model: one choice the model has written off (no value of its
        dimension is above the incumbent's posterior mean by UCB), launched in the context
        of the best configs measured. Why: the model's verdict on a choice often comes from
        measurements far from the incumbent (a setting that looked slow, or failed, beside
        others that were the cause), and a sweep that trusts it never tests the choice where
        it matters; one launch in :data:`CHECK_EVERY` + 1 tests the choice the model knows
        least about (highest posterior s.d. next to the incumbent), round robin over the
        written-off dimensions, in whichever of the :data:`N_PARENTS` best configs it has
        the highest UCB (the incumbent may sit at an edge, a memory fraction that only the
        current choice fits into), so that the model's blind spots are measured at a bounded
        cost."""
        if not written_off - self._checked or level > self._checked_level + NEW_REGIME:
            # every written-off dimension checked, or the incumbent is far better than when
            # the round began (verdicts from a slower regime do not carry over): a new round
            self._checked = set()
            self._checked_level = level
        moves = [
            (float(sd), i)
            for i, ((name, _c), sd) in enumerate(zip(neighbours, spread, strict=True))
            if name in written_off and name not in self._checked
        ]
        if not moves:
            return None
        name, other = neighbours[max(moves)[1]]
        self._since_check = 0
        self._checked.add(name)
        options = [other]
        for parent in parents:
            if name in parent and parent[name] != other[name]:
                merged = self._merge(parent, other, name)
                if config_key(merged) not in seen and not self._encoder.violated(merged):
                    options.append(merged)
        self.phase_of_last = "check"
        return dict(options[int(np.argmax(ucb(options)))])

    def _merge(
        self, base: Mapping[str, Any], other: Mapping[str, Any], name: str
    ) -> dict[str, Any]:
        """``base`` with ``other``'s value of ``name`` (and of the dimensions that change
        makes active); a dimension neither sets is drawn."""

        def pick(d: Dim, _natives: dict[str, Any]) -> Any:
            key = d.param.name
            if key in other and (key == name or key not in base):
                return other[key]
            return base[key] if key in base else self._draw(d)

        return self._encoder.build(pick)

    def _prior(self, configs: list[dict[str, Any]]) -> np.ndarray:
        """Prior mean of the log objective: :data:`RISK_PRIOR` below for each risky choice."""
        return np.array(
            [
                -RISK_PRIOR
                * sum(c.get(name) in opts for name, opts in self._risky.items() if name in c)
                for c in configs
            ],
            dtype=float,
        ).reshape(len(configs))

    def _neighbours(self, incumbent: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """Every one-change neighbour of ``incumbent``: each other choice of each active
        categorical dimension, a few spread and nearby values of each numeric one. Dimensions
        a change makes active are drawn (:data:`N_ACTIVATED` variants)."""
        out: list[tuple[str, dict[str, Any]]] = []
        for d in self._encoder.dims:
            if d.param.name not in incumbent:
                continue
            current = incumbent[d.param.name]
            if d.is_choice:
                values = [o for o in d.options if o != current]
            else:
                u0 = d.to_unit(float(current))
                spread = [(k + self._rng.random()) / N_LEVELS for k in range(N_LEVELS)]
                near = [u0 + s for s in (-0.1, 0.1, -0.25, 0.25)]
                values = [d.from_unit(u) for u in spread + near]
                values = [v for v in dict.fromkeys(values) if v != current]
            for value in values:
                for _ in range(N_ACTIVATED):
                    fresh = False

                    def pick(dim: Dim, _n: dict[str, Any], name=d.param.name, value=value) -> Any:
                        nonlocal fresh
                        if dim.param.name == name:
                            return value
                        if dim.param.name in incumbent:
                            return incumbent[dim.param.name]
                        fresh = True
                        return self._draw(dim)

                    out.append((d.param.name, self._encoder.build(pick)))
                    if not fresh:
                        break
        return out


def check_name(name: str) -> str:
    """``--sampler NAME`` checked before anything is created (bad input: exit code 2)."""
    if name not in SAMPLERS:
        raise SpecError(f"unknown sampler {name!r}; one of {', '.join(SAMPLERS)}", key="--sampler")
    return name


def check_space(name: str, space: SearchSpace) -> None:
    """The search space ``--sampler NAME`` must be able to search, checked before anything is
    created: ``gp`` refuses a discrete domain too wide to list (:func:`check_gp_space`)."""
    if name == "gp":
        check_gp_space(space)


def record_sampler(study: optuna.Study, requested: str | None) -> str:
    """The strategy this run uses, recorded in the study (attribute ``sampler``): the one asked
    for, else the one the study was created with, else :data:`DEFAULT_SAMPLER`."""
    recorded = study.user_attrs.get(SAMPLER_ATTR)
    chosen = requested or recorded or DEFAULT_SAMPLER
    if chosen != recorded:
        study.set_user_attr(SAMPLER_ATTR, chosen)
    return chosen
