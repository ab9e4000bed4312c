"""The run of one strategy: the harness's trial loop and the simulated confirmation.

The loop is ``autotune run``'s, in-process (:func:`run_optuna`): the space's constraints (a
violating config is never launched and not counted), the landscape's outcome with the
harness's noise, and the objective's verdict policy (a failed start or wrong output is PRUNED
with the ``correct`` constraint at 1; a correct config is COMPLETE with its measured value).
What a gated strategy reports after each launch is what ``autotune run`` would report if it
stopped there: the winner of its confirmation, simulated (:class:`Confirm`: the product's
candidate ranking and stopping rule; its launches count), or with ``--confirm-top 0`` the
highest measured verified trial (``autotune.study.results.best_trials``); a run whose budget
holds no confirmation reports the baseline, as ``autotune run`` does. Trial 0 is the
space's baseline, enqueued like ``study.open_study`` does. Parameters a config does not set
(the baseline's) are the landscape's engine defaults. A run stops at its first launch that
reaches 95 % (nothing after it changes the figures) unless ``--full``. The model-based ask
time of ``auto`` is kept (``ask_s``).

Strategies:

* ``auto`` -- the default of ``autotune run`` (``autotune/search/strategy.py``), with the gate;
* ``tpe`` -- the TPE sampler autotune used before (``--sampler tpe``), with the gate;
* ``random`` -- ``optuna.samplers.RandomSampler``, with the gate (the reference of the ratio
  and of the p-values);
* ``grid-random`` / ``grid-sweep`` -- a ``vllm bench sweep`` grid (every categorical/bool/
  int_list choice, numeric dims left at the engine's defaults), in random order / in
  declaration order (the last parameter varies fastest), with the gate;
* ``random-nogate``, ``grid-random-nogate``, ``grid-sweep-nogate`` -- the peers as they really
  run: no correctness gate, best = highest measured config that started.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import warnings
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune import names
from autotune.analysis.confirm import Race, gain_with_ci, rank_candidates
from autotune.engines.vllm.machine import lossy_reason
from autotune.errors import SpecError
from autotune.patching import discover_patches
from autotune.search.model import config_key
from autotune.search.strategy import AutoSampler, build_sampler, risky_choices
from autotune.space.model import SearchSpace
from autotune.spec.model import WorkloadSpec
from autotune.study.budget import PLAN_MAX_ROUNDS, BudgetPlan, plan_budget
from autotune.study.results import best_trials, unconfirmed_gain
from benchmarks.search import ROOT
from benchmarks.search.landscape import BadInput, Landscape, Outcome, launch_minutes, measured
from benchmarks.search.truth import grid_choices

PATCH_DIR = ROOT / "patches"
STRATEGIES = (
    "auto",
    "tpe",
    "random",
    "grid-random",
    "grid-sweep",
    "random-nogate",
    "grid-random-nogate",
    "grid-sweep-nogate",
)
MAX_UNLAUNCHED_PER_TRIAL = 50
#: the strategies the default is measured AGAINST: their runs go on past ``--budget`` (to
#: ``--reference-budget``) so that their medians are measured. Capped at budget + 1 (61), random's
#: median read as 61 on landscapes where it is 97 or 400+, and every ratio to it was overstated.
REFERENCE_STRATEGIES = frozenset(
    {"random", "grid-random", "grid-sweep", "random-nogate", "grid-random-nogate",
     "grid-sweep-nogate"}
)  # fmt: skip
DEFAULT_REFERENCE_BUDGET = 400

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass(frozen=True)
class Launch:
    """One launch of a run, kept for diagnostics (``benchmarks/ranking.py``): the config in
    Optuna form, its role, what was measured (None: it did not start or, under the gate,
    printed wrong output) and its noise-free outcome."""

    params: dict[str, Any]
    role: str
    measured: float | None
    outcome: Outcome


@dataclass
class RunResult:
    strategy: str
    seed: int
    #: true value of the reported best after each launch (0: none), and whether it is correct
    best_true_after: list[float] = field(default_factory=list)
    best_correct_after: list[bool] = field(default_factory=list)
    minutes_after: list[float] = field(default_factory=list)
    #: launches the confirmation would add if the search stopped after each launch (where no
    #: budget confirms yet, what the first confirmed report would still take: ``_reported``)
    confirm_launches_after: list[int] = field(default_factory=list)
    wrong_launched: int = 0
    unlaunched: int = 0
    ask_s: list[float] = field(default_factory=list)
    #: the first launch of a config whose TRUE value reaches the target (whether or not it is
    #: reported then): where a miss comes from, the search or the report
    found_at: int | None = None
    #: the run ended before its budget: its sampler drew MAX_UNLAUNCHED_PER_TRIAL x budget
    #: configs that break the constraints (counted as not reached, and said so)
    gave_up: bool = False
    #: the launches this run was given (``--budget``, or ``--reference-budget`` for a
    #: reference strategy): a run that never reached the target counts as budget + 1
    budget: int = 0
    launches: list[Launch] = field(default_factory=list)


@dataclass(frozen=True)
class Confirm:
    """The confirmation ``autotune run`` ends with (``analysis/confirm.py``; its defaults
    ``--confirm-top 2``, ``--confirm-repeats`` unset, and the spec's default
    ``target_precision``), planned and raced with the product's own functions: a run whose
    search made ``searched`` launches is the smallest ``--trials`` whose plan
    (``study.budget.plan_budget``) gives the search exactly that many and holds a confirmation
    (:meth:`plan`; none: the run reports the baseline, "no confirmed winner"). Its top configs by
    the search model's posterior mean (``confirm.rank_candidates``) and the baseline are then
    measured again, one round at a time, and ``confirm.race_step`` drops the clearly slower and
    stops the race (settled, precise, or the plan's rounds). The best median of those left
    wins, unless the 95 % interval of its gain over the baseline includes no change (then the
    baseline is reported, as ``study.results.unconfirmed_gain`` says: :func:`reports_winner`).
    Each config's confirmation
    draws come from a random stream of its own (per seed and config), so the answer changes only
    when the candidates do."""

    top: int = 2
    repeats: int | None = None
    precision: float = WorkloadSpec.target_precision

    def plan(self, searched: int) -> BudgetPlan | None:
        """The plan of the smallest ``--trials`` that ends its search after ``searched``
        launches and confirms; None when no budget does (below about 16 search launches)."""
        most = max(PLAN_MAX_ROUNDS, self.repeats or 0) * (self.top + 1)
        for total in range(searched, searched + most + 1):
            try:
                plan = plan_budget(total, 0, self.top, self.repeats)
            except SpecError:  # explicit rounds that do not fit this budget
                continue
            if plan.confirms and plan.search == searched:
                return plan
        return None


def _record(run: RunResult, best: Outcome | None, minutes: float, confirm: int = 0) -> None:
    run.best_true_after.append(best.true if best else 0.0)
    run.best_correct_after.append(best.correct if best else True)
    run.minutes_after.append((run.minutes_after[-1] if run.minutes_after else 0.0) + minutes)
    run.confirm_launches_after.append(confirm)


def _reached(run: RunResult, target: float, budget: int) -> bool:
    launches = len(run.best_true_after) + run.confirm_launches_after[-1]
    return run.best_correct_after[-1] and run.best_true_after[-1] >= target and launches <= budget


def _reported(
    study: optuna.Study,
    space: SearchSpace,
    land: Landscape,
    outcome_of: dict[int, Outcome],
    seed: int,
    confirm: Confirm | None,
    searched: int = 0,
) -> tuple[Outcome | None, int]:
    """What the run would report if the search stopped after ``searched`` launches, and the
    launches that costs: the confirmed winner (``confirm``), else the highest measured verified
    trial (``study.results.best_trials``, what a run without confirmation reports). Where no
    budget ending its search here confirms, the report is the baseline and the cost is what the
    first report the product can make would still take (more search launches up to the first
    plan that confirms, then its confirmation): what a perfect ranking would need from here."""
    if confirm is None or confirm.top == 0:
        best = best_trials(study)
        return (outcome_of[best[0].number] if best else None), 0
    trials = study.get_trials(deepcopy=False)
    baseline = next((t for t in trials if t.user_attrs.get(names.ROLE) == "baseline"), None)
    base = outcome_of.get(baseline.number) if baseline is not None else None
    base_ok = base is not None and base.started and base.correct
    plan = confirm.plan(searched)
    if plan is None:  # no confirmation: "no confirmed winner: the baseline stands"
        later = next(n for n in itertools.count(searched + 1) if confirm.plan(n) is not None)
        return (base if base_ok else None), later - searched + confirm.plan(later).confirm
    candidates = rank_candidates(space, trials, 1.0, plan.top_k)
    if not candidates:
        return (base if base_ok else None), 0

    outcomes = [outcome_of[t.number] for t in candidates]
    keys = [config_key(t.params) for t in candidates]
    if base_ok:
        keys.append(config_key(baseline.params))
    won, launches = simulate_confirmation(
        outcomes, base if base_ok else None, keys, plan.rounds, land.noise, seed, confirm.precision
    )
    return (outcomes[won] if won is not None else base if base_ok else None), launches


@dataclass
class _Drawn:
    """One variant's simulated rounds, shaped as ``confirm.Race`` reads a variant's
    measurements (a simulated launch never fails: a candidate was verified when searched)."""

    samples: list[float] = field(default_factory=list)
    failures: tuple[str, ...] = ()

    @property
    def outcomes(self) -> list[float]:
        return self.samples


def simulate_confirmation(
    candidates: Sequence[Outcome],
    base: Outcome | None,
    keys: Sequence[str],
    rounds: int,
    noise: float,
    seed: int,
    precision: float,
) -> tuple[int | None, int]:
    """The product's confirmation of ``candidates`` against ``base`` (None: the baseline
    failed), simulated: the index of the candidate ``autotune run`` would report (None: the
    baseline stands) and the launches it made. The rounds are asked of the product's own race
    (``confirm.Race``: ``rounds`` x the variants in launches, as ``confirm.run_confirmation``
    gives it); only the measurements are drawn here, each variant's from a stream of its own
    (``keys``: per seed and config), so the answer changes only when the candidates do."""
    labels = [str(i) for i in range(len(candidates))]
    results: dict[str, _Drawn] = {"baseline": _Drawn(), **{c: _Drawn() for c in labels}}
    outcome_of = dict(zip(labels, candidates, strict=True))
    pairs = zip(labels, keys[: len(labels)], strict=True)
    stream_of = {c: random.Random(f"confirm:{seed}:{key}") for c, key in pairs}
    if base is not None:
        outcome_of["baseline"] = base
        stream_of["baseline"] = random.Random(f"confirm:{seed}:{keys[len(candidates)]}")
    race = Race(1.0, rounds * (len(candidates) + 1), precision)
    done = 0
    while chosen := race.next_round(results, done):  # type: ignore[arg-type]
        for label in chosen:
            if label in outcome_of:  # a failed baseline is never drawn
                results[label].samples.append(measured(outcome_of[label], noise, stream_of[label]))
        done += 1
    alive = [int(c) for c in race.alive or []]
    if not alive:
        return None, sum(len(r.samples) for r in results.values())
    best = max(alive, key=lambda i: statistics.median(results[str(i)].samples))
    launches = sum(len(r.samples) for r in results.values())
    if base is not None and not reports_winner(
        results[str(best)].samples, results["baseline"].samples
    ):
        return None, launches
    return best, launches


def reports_winner(winner: Sequence[float], base: Sequence[float]) -> bool:
    """Whether ``autotune run`` reports the confirmation's winner over the baseline, by the
    product's own rule (``study.results.unconfirmed_gain``): only when the 95 % interval of its
    gain lies above no change. A point gain whose interval includes zero leaves the baseline
    standing ("no confirmed winner"), so the harness must not count it as reported."""
    gain, ci = gain_with_ci(tuple(winner), tuple(base), 1.0)
    return unconfirmed_gain({"winner": 0, "gain": gain, "gain_ci": list(ci)}) is None


def run_optuna(
    space: SearchSpace,
    land: Landscape,
    sampler: optuna.samplers.BaseSampler,
    name: str,
    seed: int,
    budget: int,
    target: float,
    *,
    gate: bool = True,
    stop_at_target: bool = True,
    confirm: Confirm | None = None,
    points: Iterator[dict[str, Any]] | None = None,
) -> RunResult:
    """The autotune loop in-process: baseline first, then the sampler (or the fixed ``points``
    of a grid, each setting only its own parameters), the objective's policy, and what it
    would report (:func:`_reported`; peers without the gate report their highest measurement
    and confirm nothing)."""
    noise_rng = random.Random(seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(space.baseline_optuna_params(), user_attrs={names.ROLE: "baseline"})
    run = RunResult(name, seed, budget=budget)
    outcome_of: dict[int, Outcome] = {}
    launched = 0
    while launched < budget:
        only: Collection[str] | None = None
        # the baseline (enqueued) is asked first; ``study.trials`` deep-copies every trial,
        # which made a 400-launch grid run take minutes
        if points is not None and run.unlaunched + launched > 0:
            point = next(points, None)
            if point is None:
                break
            study.enqueue_trial(space.to_optuna_params(point), user_attrs={names.ROLE: "search"})
            only = set(point)
        trial = study.ask()
        role = trial.user_attrs.get(names.ROLE, "search")
        values = (
            space.suggest(trial, only=space.baseline_names())
            if role == "baseline"
            else space.suggest(trial, only=only)
        )
        trial.set_user_attr(names.PARAMS_RESOLVED, values)
        trial.set_user_attr(names.ROLE, role)
        if space.violated(values):
            trial.set_user_attr(names.FAIL_REASON, "constraint_violated")
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
            run.unlaunched += 1
            if run.unlaunched > MAX_UNLAUNCHED_PER_TRIAL * budget:
                run.gave_up = True
                break
            continue
        outcome = land(values)
        launched += 1
        outcome_of[trial.number] = outcome
        if run.found_at is None and outcome.started and outcome.correct and outcome.true >= target:
            run.found_at = launched
        run.wrong_launched += outcome.started and not outcome.correct
        value: float | None = None
        if not outcome.started:
            trial.set_user_attr(names.FAIL_REASON, outcome.failure or "startup_failed")
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
        elif gate and not outcome.correct:
            trial.set_user_attr(names.FAIL_REASON, "incorrect_output")
            trial.set_user_attr(names.CORRECT, False)
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
        else:
            # without the gate every started config is taken as correct
            trial.set_user_attr(names.CORRECT, True)
            trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 0.0)
            value = measured(outcome, land.noise, noise_rng)
            study.tell(trial, value)
        run.launches.append(Launch(dict(trial.params), role, value, outcome))
        minutes = launch_minutes(outcome, land.cost, gate=gate)
        if gate and run.found_at is None:
            # Nothing the confirmation could report reaches the target before a config that
            # does was launched (it reports launched, verified configs or the baseline, all
            # correct under the gate), so it is not simulated until then: the figures are the
            # same, and a reference run of hundreds of launches does not refit the search
            # model on every one of them.
            _record(run, None, minutes)
        else:
            best, confirm_launches = _reported(
                study, space, land, outcome_of, seed, confirm if gate else None, launched
            )
            _record(run, best, minutes, confirm_launches)
        if stop_at_target and _reached(run, target, budget):
            break
    if isinstance(sampler, AutoSampler):
        run.ask_s = list(sampler.ask_seconds)
    return run


def run_grid(
    space: SearchSpace,
    land: Landscape,
    name: str,
    seed: int,
    budget: int,
    target: float,
    *,
    shuffled: bool,
    gate: bool,
    stop_at_target: bool = True,
    confirm: Confirm | None = None,
) -> RunResult:
    """The sweep's grid through the same loop (baseline first, the grid's points after it)."""
    return run_optuna(
        space,
        land,
        optuna.samplers.RandomSampler(seed=seed),
        name,
        seed,
        budget,
        target,
        gate=gate,
        stop_at_target=stop_at_target,
        confirm=confirm,
        points=grid_points(space, random.Random(seed) if shuffled else None),
    )


def grid_points(space: SearchSpace, rng: random.Random | None):
    """The sweep's grid, lazily: in declaration order, or (``rng``) in a random order (uniform
    draws from the product, repeats of a canonical point skipped). Inactive dims dropped,
    numeric dims left to the engine's defaults."""
    choice_params = [p for p in space.parameters if grid_choices(space, p.name) is not None]
    domains = [grid_choices(space, p.name) for p in choice_params]
    seen: set[str] = set()

    def canonical(combo: tuple[Any, ...]) -> dict[str, Any]:
        raw = dict(zip((p.name for p in choice_params), combo, strict=True))
        values: dict[str, Any] = {}
        for p in space.parameters:
            if p.name in raw and space.is_active(p, values):
                values[p.name] = raw[p.name]
        return values

    source = (
        itertools.product(*domains)
        if rng is None
        else (tuple(rng.choice(d) for d in domains) for _ in itertools.count())
    )
    misses = 0
    for combo in source:
        values = canonical(combo)
        key = json.dumps(values, sort_keys=True)
        if key in seen:
            misses += 1
            if misses > 100_000:
                return
            continue
        misses = 0
        seen.add(key)
        yield values


def run_strategy(
    name: str,
    space: SearchSpace,
    land: Landscape,
    seed: int,
    budget: int,
    target: float,
    stop: bool,
    patch_dirs: tuple[Path, ...] = (PATCH_DIR,),
    confirm: Confirm | None = None,
) -> RunResult:
    if name in ("auto", "tpe", "random", "random-nogate"):
        sampler = build_sampler(
            name.removesuffix("-nogate"), space, seed, risky=_risky(space, patch_dirs)
        )
        return run_optuna(
            space,
            land,
            sampler,
            name,
            seed,
            budget,
            target,
            gate=not name.endswith("-nogate"),
            stop_at_target=stop,
            confirm=confirm,
        )
    if name.startswith("grid-"):
        return run_grid(
            space,
            land,
            name,
            seed,
            budget,
            target,
            shuffled=name.startswith("grid-random"),
            gate=not name.endswith("-nogate"),
            stop_at_target=stop,
            confirm=confirm,
        )
    raise BadInput(f"--strategies: unknown strategy {name!r}; one of {', '.join(STRATEGIES)}")


_RISKY: dict[tuple[str, tuple[Path, ...]], dict[str, tuple[Any, ...]]] = {}


def _risky(space: SearchSpace, patch_dirs: tuple[Path, ...]) -> dict[str, tuple[Any, ...]]:
    """What ``autotune run`` tells the strategy before it measures anything: the kinds of the
    patches the space targets (``patch_dirs``) and vLLM's lossy choices (an fp8 KV cache)."""
    key = (str(space.path), patch_dirs)
    if key not in _RISKY:
        found = discover_patches(patch_dirs) if patch_dirs else {}
        kinds = {n: (p.info.kind, p.info.default) for n, p in found.items()}
        _RISKY[key] = risky_choices(space, kinds, lossy_reason)
    return _RISKY[key]
