"""Benchmark OF THE SEARCH on the GLM-5 8-GPU SIMULATION (a cost model; no server, no GPU).

Rerun (about a minute on 2 cores)::

    .venv/bin/python benchmarks/search_efficiency.py            # 30 seeds, budget 60
    .venv/bin/python benchmarks/search_efficiency.py --seeds 80 --budget 60

Every figure here comes from :mod:`autotune.testing.glm5_sim`, a calibrated cost model of the
motivating GLM-5 deployment -- NOT a measurement of any real server. The question it answers:
with the space in ``search_spaces/glm5-8gpu.yaml``, how many launched trials does each search
strategy need before the config it would report as best is within 5 % of the best *correct*
config, and does it ever report a config whose output is wrong?

Strategies (all driven in-process, one trial at a time like ``autotune run``):

* ``autotune``: ``autotune.study.build_sampler`` (the real one) + ``SearchSpace.suggest`` +
  the verdict policy of ``autotune/objective.py``: a constraint-violating config is PRUNED with
  constraint ``correct`` = 1 and not counted (it never launches); a config that fails to start or
  whose output is wrong is PRUNED with ``correct`` = 1 (counted: it cost a server start); a
  correct one is COMPLETE with its *noisy measured* decode tok/s. Trial 0 is the space's
  baseline, enqueued exactly like ``study.open_study`` does. "Best" is
  ``autotune.report.best_trials`` (verified-correct, COMPLETE, constraints hold).
* ``random``: ``optuna.samplers.RandomSampler``, same space, policy, baseline and best rule.
* ``grid``: what ``vllm bench sweep`` does -- a fixed grid evaluated in order. The grid is the
  Cartesian product of every categorical/bool parameter's choices in declaration order (the last
  declared varies fastest, like ``itertools.product``), numeric parameters left at vLLM's
  defaults (max_num_seqs 256, max_num_batched_tokens 8192, gpu_memory_utilization 0.9, NCCL
  channels unset). Same correctness policy and best rule.
* ``autotune-naive``: the autotune sampler with the correctness gate switched off (a wrong-output
  config is COMPLETE with its measured speed, best = highest measured): what a tuner that only
  measures speed would report.

Mapping of the space onto the simulation's ``Glm5Config`` (``to_sim``):
``enforce_eager``, ``cudagraph_mode``, ``cudagraph_capture_sizes``, ``NCCL_ALGO``,
``NCCL_PROTO``, ``NCCL_MIN_NCHANNELS``, ``disable_custom_all_reduce``, ``mla_path``,
``max_num_seqs``, ``max_num_batched_tokens``, ``gpu_memory_utilization`` map 1:1;
``cudagraph_mode: FULL_DECODE_ONLY`` is modelled as ``FULL`` (the objective is decode, where the
two capture the same graphs); ``NCCL_MAX_NCHANNELS`` (only through the constraint
MIN <= MAX), ``attention_backend`` and ``enable_expert_parallel`` are not modelled (no effect on
the cost: extra dimensions the search must learn to ignore). The objective is single-request
decode tok/s (the study's metric) with 5 % multiplicative measurement noise per trial.

Figures: per strategy the median and IQR over seeds of the number of counted (launched) trials
until the reported best's TRUE (noise-free) tok/s is >= 95 % of the best correct config's true
tok/s; runs that never get there within the budget are counted as budget + 1 and reported
separately. Results go to ``benchmarks/results/search_efficiency.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune import storage as keys
from autotune.report import best_trials
from autotune.space import SearchSpace, load_space
from autotune.study import MAX_UNLAUNCHED_PER_TRIAL, build_sampler
from autotune.testing import glm5_sim
from autotune.testing.glm5_sim import Glm5Config, Glm5Sim

ROOT = Path(__file__).resolve().parents[1]
SPACE_PATH = ROOT / "search_spaces" / "glm5-8gpu.yaml"
RESULT_PATH = ROOT / "benchmarks" / "results" / "search_efficiency.json"
TARGET_FRACTION = 0.95
NOISE = 0.05
NOT_MODELLED = ("NCCL_MAX_NCHANNELS", "attention_backend", "enable_expert_parallel")
#: vLLM's defaults for the numeric dimensions, used by the grid (what a sweep leaves alone)
GRID_NUMERIC_DEFAULTS = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "gpu_memory_utilization": 0.9,
}

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def to_sim(values: dict[str, Any]) -> Glm5Config:
    """The simulated config for a point of the GLM-5 space (see the module docstring)."""
    mapped: dict[str, Any] = {}
    for name, value in values.items():
        if name in NOT_MODELLED:
            continue
        if name == "cudagraph_mode" and value == "FULL_DECODE_ONLY":
            value = "FULL"
        mapped[name] = value
    return Glm5Config.from_mapping(mapped)


def true_tok_s(config: Glm5Config) -> float:
    return glm5_sim.decode_tok_s(config, 1)


def best_correct_true(space: SearchSpace) -> tuple[float, dict[str, Any]]:
    """The best correct config's noise-free tok/s, by enumerating every modelled dimension.

    Numeric dims that only matter for start-up are held at values that start; channels are
    enumerated over their whole integer range.
    """
    cat = {
        p.name: ([False, True] if p.type == "bool" else list(p.choices))
        for p in space.parameters
        if p.type in ("bool", "categorical", "int_list") and p.name not in NOT_MODELLED
    }
    best, best_values = 0.0, {}
    names = list(cat)
    for combo in itertools.product(*(cat[n] for n in names)):
        values = dict(zip(names, combo, strict=True))
        if values["enforce_eager"]:
            values.pop("cudagraph_mode")
            values.pop("cudagraph_capture_sizes")
        for channels in range(1, 33):
            point = {**values, "NCCL_MIN_NCHANNELS": channels, **GRID_NUMERIC_DEFAULTS}
            cfg = to_sim(point)
            if glm5_sim.startup_failure(cfg) or not glm5_sim.is_correct(cfg):
                continue
            value = true_tok_s(cfg)
            if value > best:
                best, best_values = value, point
    return best, best_values


@dataclass
class Launched:
    """One counted trial: what it cost, what was measured, what is true."""

    values: dict[str, Any]
    started: bool
    correct: bool
    measured: float | None
    true: float


@dataclass
class RunResult:
    strategy: str
    seed: int
    launched: list[Launched] = field(default_factory=list)
    #: true tok/s of the config the strategy reports as best after each counted trial (0: none)
    best_true_after: list[float] = field(default_factory=list)
    best_correct_after: list[bool] = field(default_factory=list)
    unlaunched: int = 0
    wall_s: float = 0.0


def measure(sim: Glm5Sim, values: dict[str, Any]) -> Launched:
    cfg = to_sim(values)
    if glm5_sim.startup_failure(cfg) is not None:
        return Launched(values, False, False, None, 0.0)
    return Launched(
        values, True, glm5_sim.is_correct(cfg), sim.measure_tok_s(cfg, 1), true_tok_s(cfg)
    )


def run_optuna(
    space: SearchSpace,
    sampler: optuna.samplers.BaseSampler,
    seed: int,
    budget: int,
    name: str,
    *,
    gate: bool = True,
) -> RunResult:
    """The autotune loop in-process: baseline first, then the sampler, the objective's policy."""
    sim = Glm5Sim(noise=NOISE, seed=seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(space.baseline_optuna_params(), user_attrs={keys.ROLE: "baseline"})
    result = RunResult(name, seed)
    start = time.perf_counter()
    true_of: dict[int, Launched] = {}
    while len(result.launched) < budget:
        trial = study.ask()
        role = trial.user_attrs.get(keys.ROLE, "search")
        values = space.suggest_baseline(trial) if role == "baseline" else space.suggest(trial)
        trial.set_user_attr(keys.PARAMS_RESOLVED, values)
        trial.set_user_attr(keys.ROLE, role)
        if space.violated(values):
            trial.set_user_attr(keys.FAIL_REASON, "constraint_violated")
            trial.set_constraint(keys.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
            result.unlaunched += 1
            if result.unlaunched > MAX_UNLAUNCHED_PER_TRIAL * budget:
                break
            continue
        record = measure(sim, values)
        result.launched.append(record)
        true_of[trial.number] = record
        if not record.started:
            trial.set_user_attr(keys.FAIL_REASON, "startup_failed")
            trial.set_constraint(keys.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
        elif gate and not record.correct:
            trial.set_user_attr(keys.FAIL_REASON, "incorrect_output")
            trial.set_user_attr(keys.CORRECT, False)
            trial.set_constraint(keys.CORRECTNESS_CONSTRAINT, 1.0)
            study.tell(trial, state=TrialState.PRUNED)
        else:
            # The naive tuner never checks: it records every started config as correct.
            trial.set_user_attr(keys.CORRECT, True)
            trial.set_constraint(keys.CORRECTNESS_CONSTRAINT, 0.0)
            study.tell(trial, record.measured)
        best = best_trials(study)
        chosen = true_of[best[0].number] if best else None
        result.best_true_after.append(chosen.true if chosen else 0.0)
        result.best_correct_after.append(chosen.correct if chosen else True)
    result.wall_s = time.perf_counter() - start
    return result


def grid_points(space: SearchSpace) -> list[dict[str, Any]]:
    """The sweep's grid: categorical/bool choices in declaration order, numeric dims at vLLM's
    defaults, inactive conditional dims dropped (and duplicates removed)."""
    choice_params = [p for p in space.parameters if p.type in ("bool", "categorical", "int_list")]
    seen: set[str] = set()
    points = []
    for combo in itertools.product(
        *([False, True] if p.type == "bool" else list(p.choices) for p in choice_params)
    ):
        raw = {
            p.name: (list(v) if p.type == "int_list" else v)
            for p, v in zip(choice_params, combo, strict=True)
        }
        values: dict[str, Any] = {}
        for param in space.parameters:
            if not space.is_active(param, values):
                continue
            if param.name in raw:
                values[param.name] = raw[param.name]
            elif param.name in GRID_NUMERIC_DEFAULTS:
                values[param.name] = GRID_NUMERIC_DEFAULTS[param.name]
        key = json.dumps(values, sort_keys=True)
        if key not in seen:
            seen.add(key)
            points.append(values)
    return points


def run_grid(space: SearchSpace, points: list[dict[str, Any]], seed: int, budget: int) -> RunResult:
    sim = Glm5Sim(noise=NOISE, seed=seed)
    result = RunResult("grid", seed)
    start = time.perf_counter()
    best: Launched | None = None
    for values in points:
        if len(result.launched) >= budget:
            break
        if space.violated(values):
            result.unlaunched += 1
            continue
        record = measure(sim, values)
        result.launched.append(record)
        if record.started and record.correct and (best is None or record.measured > best.measured):
            best = record
        result.best_true_after.append(best.true if best else 0.0)
        result.best_correct_after.append(True)
    result.wall_s = time.perf_counter() - start
    return result


def trials_to_target(run: RunResult, target: float, budget: int) -> int:
    for index, (value, correct) in enumerate(
        zip(run.best_true_after, run.best_correct_after, strict=True), start=1
    ):
        if correct and value >= target:
            return index
    return budget + 1


def naive_pick_wrong(run: RunResult) -> bool:
    """Would a tuner ignoring correctness have reported a wrong config from these same trials?"""
    started = [r for r in run.launched if r.started]
    return bool(started) and not max(started, key=lambda r: r.measured).correct


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


def summarize(
    runs: list[RunResult], target: float, best_true: float, budget: int
) -> dict[str, Any]:
    hits = [trials_to_target(r, target, budget) for r in runs]
    q1, med, q3 = quartiles([float(h) for h in hits])
    return {
        "seeds": len(runs),
        "trials_to_95pct_median": med,
        "trials_to_95pct_q1": q1,
        "trials_to_95pct_q3": q3,
        "trials_to_95pct_per_seed": hits,
        "not_reached_within_budget": sum(h > budget for h in hits),
        "final_best_true_fraction_median": statistics.median(
            r.best_true_after[-1] / best_true for r in runs
        ),
        "incorrect_reported_as_best": sum(not ok for r in runs for ok in r.best_correct_after),
        "runs_ending_with_incorrect_best": sum(not r.best_correct_after[-1] for r in runs),
        "naive_selection_would_pick_incorrect": sum(naive_pick_wrong(r) for r in runs),
        "incorrect_configs_launched_median": statistics.median(
            sum(x.started and not x.correct for x in r.launched) for r in runs
        ),
        "unlaunched_constraint_violations_median": statistics.median(r.unlaunched for r in runs),
        "wall_s_median": round(statistics.median(r.wall_s for r in runs), 3),
    }


def machine_info() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "optuna": optuna.__version__,
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "note": "machine shared with other concurrent work (2 cores); wall times are "
        "indicative only, trial counts do not depend on them",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--out", type=Path, default=RESULT_PATH)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    space = load_space(SPACE_PATH)
    spec_like = SimpleNamespace(space=space)
    best_true, best_values = best_correct_true(space)
    target = TARGET_FRACTION * best_true
    wrong_fast = max(true_tok_s(to_sim({**best_values, "mla_path": "direct_call"})), 0.0)
    points = grid_points(space)
    grid_first_hit = next(
        (
            i
            for i, v in enumerate((p for p in points if not space.violated(p)), start=1)
            if (
                lambda c: (
                    not glm5_sim.startup_failure(c)
                    and glm5_sim.is_correct(c)
                    and true_tok_s(c) >= target
                )
            )(to_sim(v))
        ),
        None,
    )

    strategies: dict[str, list[RunResult]] = {
        "autotune": [],
        "random": [],
        "grid": [],
        "autotune-naive": [],
    }
    for seed in range(args.seeds):
        strategies["autotune"].append(
            run_optuna(space, build_sampler(spec_like, seed), seed, args.budget, "autotune")
        )
        strategies["random"].append(
            run_optuna(space, optuna.samplers.RandomSampler(seed=seed), seed, args.budget, "random")
        )
        strategies["grid"].append(run_grid(space, points, seed, args.budget))
        strategies["autotune-naive"].append(
            run_optuna(
                space,
                build_sampler(spec_like, seed),
                seed,
                args.budget,
                "autotune-naive",
                gate=False,
            )
        )
        print(
            f"seed {seed}: "
            + ", ".join(
                f"{name} {trials_to_target(runs[-1], target, args.budget)}"
                for name, runs in strategies.items()
            ),
            flush=True,
        )

    summary = {
        name: summarize(runs, target, best_true, args.budget) for name, runs in strategies.items()
    }
    sampler = build_sampler(spec_like, 0)
    result = {
        "label": "SIMULATION (autotune.testing.glm5_sim cost model), not a real server",
        "space": str(SPACE_PATH.relative_to(ROOT)),
        "budget_counted_trials": args.budget,
        "seeds": args.seeds,
        "noise": NOISE,
        "objective": "single-request decode tok/s (simulated), maximize",
        "best_correct_true_tok_s": round(best_true, 3),
        "best_correct_config": best_values,
        "fastest_incorrect_true_tok_s": round(wrong_fast, 3),
        "target_tok_s": round(target, 3),
        "grid_size": len(points),
        "grid_first_point_reaching_target": grid_first_hit,
        "autotune_sampler": {
            "class": type(sampler).__name__,
            "repr": {
                k: repr(v)
                for k, v in vars(sampler).items()
                if k in ("_multivariate", "_group", "_constant_liar", "_n_startup_trials")
            },
        },
        "not_modelled_dims": list(NOT_MODELLED),
        "mapping_note": "FULL_DECODE_ONLY modelled as FULL; NCCL_MAX_NCHANNELS only via the "
        "MIN <= MAX constraint; attention_backend and enable_expert_parallel "
        "have no effect in the simulation",
        "figures_are": "medians (and quartiles) over seeds; not-reached runs count as budget+1",
        "strategies": summary,
        "machine": machine_info(),
        "total_wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")

    print(
        f"\nGLM-5 8-GPU SIMULATION -- best correct config {best_true:.1f} tok/s (true), "
        f"target {target:.1f}; fastest wrong config {wrong_fast:.1f}"
    )
    print(
        f"budget {args.budget} counted trials, {args.seeds} seeds, noise {NOISE:.0%}; "
        f"grid: {len(points)} points, first reaching the target at position "
        f"{grid_first_hit}"
    )
    header = (
        f"{'strategy':<16}{'median':>8}{'IQR':>14}{'not reached':>13}"
        f"{'final/best':>12}{'wrong best':>12}{'naive wrong':>13}"
    )
    print(header)
    print("-" * len(header))
    for name, s in summary.items():
        iqr = f"{s['trials_to_95pct_q1']:.1f}-{s['trials_to_95pct_q3']:.1f}"
        print(
            f"{name:<16}{s['trials_to_95pct_median']:>8.1f}{iqr:>14}"
            f"{s['not_reached_within_budget']:>13}"
            f"{s['final_best_true_fraction_median']:>12.3f}"
            f"{s['runs_ending_with_incorrect_best']:>12}"
            f"{s['naive_selection_would_pick_incorrect']:>13}"
        )
    print(f"\nwrote {args.out} in {result['total_wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
