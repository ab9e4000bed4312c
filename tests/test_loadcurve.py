"""Load curve, precision stopping and goodput (loadcurve.py), against the timer-based fake server
and, where a verdict must not depend on this machine's timing, against synthetic measurements.
Assertions on the fake server compare round counts and levels, never durations."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import httpx
import optuna
import pytest

from autotune import names
from autotune._stats import Interval, mean_interval, t_quantile
from autotune.analysis.confirm import PRECISE, race_step
from autotune.bench.loadcurve import (
    CLAIMED,
    Probe,
    _stop_reason,
    run_benchmark,
    search_goodput,
    slo_verdict,
)
from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.spec.model import SloSpec, WorkloadSpec
from tests.builders import write_fake_spec
from tests.fake_proc import AUTH, server
from tests.helpers import run_autotune

SPACE = """
parameters:
  max_num_seqs: {type: categorical, choices: [2, 8], baseline: 2, target: {flag: --max-num-seqs}}
"""


def bench(url: str, workload: WorkloadSpec, **kwargs):
    async def go():
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=30) as client:
            return await run_benchmark(client, "toy", workload, dialect=VLLM_DIALECT, **kwargs)

    return asyncio.run(go())


# --- statistics -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (30, 2.0423)],
)
def test_t_quantile_matches_the_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_one_sample_has_no_interval_and_two_have_a_wide_one():
    assert math.isinf(mean_interval([5.0]).relative_half_width)
    iv = mean_interval([9.0, 11.0])
    assert iv.low == pytest.approx(10 - 12.7062, abs=1e-3)
    assert iv.high == pytest.approx(10 + 12.7062, abs=1e-3)


# --- precision stopping -----------------------------------------------------------------------


def test_stop_rule_counts_rounds_not_time():
    workload = WorkloadSpec(prompts=("a",), repeats=2, target_precision=0.05, max_repeats=6)
    quiet = [{"x": 100.0}, {"x": 100.5}]
    assert _stop_reason(workload, quiet, ["x"], start=math.inf) == "precision"
    noisy = [{"x": 100.0}, {"x": 150.0}, {"x": 70.0}]
    assert _stop_reason(workload, noisy, ["x"], start=math.inf) is None
    assert _stop_reason(workload, noisy * 2, ["x"], start=math.inf) == "max_repeats"
    assert _stop_reason(workload, quiet[:1], ["x"], start=math.inf) is None  # below the minimum
    fixed = WorkloadSpec(prompts=("a",), repeats=3, target_precision=0)
    assert _stop_reason(fixed, noisy, ["x"], start=math.inf) == "repeats"


def test_a_noisy_server_is_measured_longer_than_a_quiet_one(tmp_path):
    workload = WorkloadSpec(
        prompts=("1 2 3", "a b c"),
        max_tokens=32,
        concurrency=4,
        num_requests=8,
        single_requests=1,
        warmup_requests=1,
        repeats=2,
        target_precision=0.10,
        max_measure_s=600,  # the count cap decides, never the clock
        max_repeats=8,
    )
    # The rule on fixed rounds (no clock): quiet rounds stop at the minimum, noisy ones at the cap.
    metric = "output_tokens_per_s"
    quiet_rounds = [{metric: v} for v in (1000.0, 1010.0)]
    noisy_rounds = [{metric: v} for v in (1000.0, 400.0, 1600.0, 700.0, 1300.0, 500.0, 1500.0)]
    assert _stop_reason(workload, quiet_rounds, [metric], time.perf_counter()) == "precision"
    for n in range(2, 8):
        assert _stop_reason(workload, noisy_rounds[:n], [metric], time.perf_counter()) is None
    assert _stop_reason(workload, [*noisy_rounds, {metric: 900.0}], [metric], 0.0) == "max_repeats"
    # End to end: a server with 80% wake noise is measured to the cap; whatever the machine's
    # own noise does to the quiet one, where it stops on precision its interval meets the target.
    noise = ("--wake-noise", "0.8", "--wake-noise-seed", "3")
    with server(tmp_path, "--decode-ms", "5", "--batch-penalty", "0", *noise) as noisy:
        loud = bench(noisy.url, workload)
    assert loud.stopped_by == "max_repeats" and len(loud.repeats) == 8
    with server(tmp_path, "--decode-ms", "5", "--batch-penalty", "0") as quiet:
        calm = bench(quiet.url, workload)
    assert calm.stopped_by in ("precision", "max_repeats")
    low, high, n = calm.ci[metric]
    assert n == len(calm.repeats) and low < calm.metrics[metric] < high
    if calm.stopped_by == "precision":
        assert (high - low) / 2 <= 0.10 * (low + high) / 2 + 1e-9


def test_confirmation_stops_on_the_same_rule():
    """The trials' precision target (``workload.target_precision``) also ends confirmation's
    race (``confirm.race_step``) when the leader's gain is known that well, settled or not."""
    base = [100.0, 100.2, 100.1]
    tight = {"trial 1": [100.1, 100.3, 100.0]}  # no change, known within 1 %
    assert race_step(tight, base, 1.0, rounds=3, max_rounds=4, precision=0.03).stop == PRECISE
    assert race_step(tight, base, 1.0, rounds=3, max_rounds=4, precision=0).stop is None
    loose = {"trial 1": [150.0, 110.0]}
    assert (
        race_step(loose, [100.0, 140.0], 1.0, rounds=2, max_rounds=4, precision=0.03).stop is None
    )


# --- load curve -------------------------------------------------------------------------------


def test_one_launch_measures_every_level(tmp_path):
    workload = WorkloadSpec(
        prompts=("1 2 3", "a b c"),
        max_tokens=16,
        concurrency=4,
        levels=(1, 4),
        num_requests=8,
        single_requests=1,
        warmup_requests=1,
        repeats=2,
        target_precision=0,
    )
    with server(tmp_path, "--decode-ms", "4", "--batch-penalty", "0") as proc:
        result = bench(proc.url, workload)
    assert set(result.load_curve) == {"1", "4"}
    assert len(result.repeats) == 2
    # warm-up once, then per round 1 single + 8 at each of the 2 levels (the round's
    # fresh-prompt control is sent too, but is no benchmark request)
    assert result.total_requests == 1 + 2 * (1 + 8 + 8)
    one, four = result.load_curve["1"], result.load_curve["4"]
    # 4 at once share every decode step (batch penalty 0): far more than 1.5x the throughput
    assert four["output_tokens_per_s"] > 1.5 * one["output_tokens_per_s"]
    # the unsuffixed names are the largest level's
    assert result.metrics["output_tokens_per_s"] == four["output_tokens_per_s"]
    assert result.metrics["output_tokens_per_s@1"] == one["output_tokens_per_s"]


def test_objective_names_a_level_and_the_trial_stores_the_curve(tmp_path):
    spec = write_fake_spec(
        tmp_path,
        SPACE,
        workload={"concurrency": [1, 4], "repeats": 2},
        objective={"metric": "output_tokens_per_s@1"},
    )
    run = run_autotune(
        "run", "--trials", "1", "--spec", str(spec), "--confirm-top", "0", timeout=120
    )
    assert run.returncode == 0, run.stderr
    study = optuna.load_study(study_name="fake", storage=f"sqlite:///{tmp_path}/fake.db")
    trial = study.trials[0]
    curve = trial.user_attrs[names.LOAD_CURVE]
    assert set(curve) == {"1", "4"}
    assert trial.value == pytest.approx(trial.user_attrs[names.METRICS]["output_tokens_per_s@1"])
    assert trial.value == pytest.approx(curve["1"]["output_tokens_per_s"], rel=1e-3)
    low, high, n = trial.user_attrs[names.METRICS_CI]["output_tokens_per_s@1"]
    assert n == 2 and low <= trial.value <= high


@pytest.mark.parametrize(
    ("objective", "workload", "key", "words"),
    [
        ({"metric": "output_tokens_per_s@8"}, {"concurrency": [1, 4]}, "objective.metric", "8"),
        ({"metric": "goodput"}, {}, "objective.metric", "workload.slo"),
        (
            {"metric": "output_tokens_per_s", "constraints": ["ttft_p95_ms@2 <= 100"]},
            {"concurrency": [1, 4]},
            "objective.constraints",
            "2",
        ),
        ({"metric": "output_tokens_per_s"}, {"slo": ["goodput <= 3"]}, "workload.slo[0]", "load"),
        ({"metric": "output_tokens_per_s"}, {"concurrency": []}, "workload.concurrency", "empty"),
    ],
)
def test_a_level_or_slo_the_workload_does_not_have_is_refused(
    tmp_path, objective, workload, key, words
):
    spec = write_fake_spec(tmp_path, SPACE, workload=workload, objective=objective)
    run = run_autotune("run", "--trials", "1", "--spec", str(spec), timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    said = " ".join((run.stdout + run.stderr).split())
    assert str(spec.name) in said and key in said and words in said
    assert not (Path(tmp_path) / "fake.db").exists()


# --- goodput ----------------------------------------------------------------------------------


def synthetic(itl_at: dict[int, tuple[float, float]] | None = None, *, slope: float = 10.0):
    """A probe whose ITL p95 interval at level c is ``itl_at[c]`` or slope*c +- 1."""
    slos = [SloSpec("itl_p95_ms", "<=", 55.0)]
    seen: list[int] = []

    async def probe(level: int) -> Probe:
        seen.append(level)
        low, high = (itl_at or {}).get(level, (slope * level - 1, slope * level + 1))
        verdict = slo_verdict(slos, {"itl_p95_ms": Interval((low + high) / 2, low, high, 3)})
        return Probe(level, verdict, 3)

    return probe, seen


def test_goodput_doubles_then_bisects():
    probe, seen = synthetic()
    value, probes = asyncio.run(search_goodput(probe, 64))
    assert value == 5  # 10 * 5 = 50 <= 55 < 60
    assert seen == [1, 2, 4, 8, 6, 5]
    assert [p.verdict for p in probes] == [CLAIMED, CLAIMED, CLAIMED, "fail", "fail", CLAIMED]


def test_a_level_whose_interval_straddles_the_slo_is_not_claimed():
    assert slo_verdict([SloSpec("x", "<=", 10)], {"x": Interval(9.5, 9.0, 10.5, 4)}) == "straddle"
    assert slo_verdict([SloSpec("x", ">=", 10)], {"x": Interval(11, 10.5, 11.5, 4)}) == CLAIMED
    assert slo_verdict([SloSpec("x", "<=", 10)], {"x": Interval(12, 11, 13, 4)}) == "fail"
    # level 5's point value (52) meets the SLO, but its interval reaches past 55
    probe, seen = synthetic({5: (49.0, 56.0)})
    value, probes = asyncio.run(search_goodput(probe, 64))
    assert value == 4 and seen == [1, 2, 4, 8, 6, 5]
    assert probes[-1].verdict == "straddle"


def test_goodput_stops_at_the_cap():
    probe, seen = synthetic(slope=0.1)
    value, _ = asyncio.run(search_goodput(probe, 48))
    assert value == 48 and seen == [1, 2, 4, 8, 16, 32, 48]


def test_goodput_on_a_server_whose_latency_rises_with_concurrency(tmp_path):
    # step cost = 10 ms * batch (batch penalty 1): ITL ~ 10 * concurrency; SLO 55 ms -> 5.
    # The median ITL, not p95: on a shared 2-core machine the tail holds the neighbours' stalls.
    workload = WorkloadSpec(
        prompts=("1 2 3", "a b c"),
        max_tokens=8,
        concurrency=1,
        num_requests=4,
        single_requests=1,
        warmup_requests=1,
        repeats=1,
        target_precision=0.05,
        max_repeats=3,
        slos=(SloSpec("itl_p50_ms", "<=", 55.0),),
    )
    args = ("--decode-ms", "10", "--batch-penalty", "1", "--prefill-ms", "0.1")
    with server(tmp_path, *args) as proc:
        result = bench(proc.url, workload)
    probes = result.goodput["probes"]
    levels = [p["concurrency"] for p in probes]
    # doubling until 8 (80 ms) is not claimed, then bisection between 4 and 8
    assert levels == [1, 2, 4, 8, 6, 5]
    # Timing only ever adds latency, so the measured answer can be below 5, never above it.
    assert result.metrics["goodput"] in (4.0, 5.0)
    for p in probes:
        claimed = p["verdict"] == CLAIMED
        assert claimed == (p["concurrency"] <= result.metrics["goodput"]), probes
        low, high = p["values"]["itl_p50_ms"][1:]
        if claimed:
            assert high <= 55.0


def test_the_precision_test_on_samples_is_the_stopping_rules():
    from autotune.analysis.confirm import gain_is_precise

    assert gain_is_precise((100.0, 100.1), (50.0, 50.05), 1.0, 0.03)
    assert not gain_is_precise((100.0, 140.0), (50.0, 70.0), 1.0, 0.03)
    assert gain_is_precise((100.0,), (50.0, 70.0), 1.0, 0.03)  # one round: nothing to settle


def test_a_stop_rule_ends_the_rounds_and_skips_the_goodput_search(tmp_path):
    """``stop_rule`` is asked after every round the precision rule would go on from (never
    after the last), and a reason it returns is the benchmark's ``stopped_by``."""
    workload = WorkloadSpec(
        prompts=("1 2 3",),
        max_tokens=4,
        concurrency=1,
        num_requests=2,
        single_requests=1,
        warmup_requests=0,
        repeats=4,
        target_precision=0,
        slos=(SloSpec("itl_p50_ms", "<=", 1000.0),),
    )
    asked: list[tuple[int, int]] = []

    def never(index, rounds):
        asked.append((index, len(rounds)))
        return None

    def after_two(index, rounds):
        return "enough" if index == 1 else None

    with server(tmp_path, "--decode-ms", "1") as proc:
        full = bench(proc.url, workload, stop_rule=never)
        cut = bench(proc.url, workload, stop_rule=after_two)
    assert asked == [(0, 1), (1, 2), (2, 3)]  # round 4 ends by the workload's own rule
    assert len(full.repeats) == 4 and full.stopped_by == "repeats"
    assert full.goodput is not None
    assert len(cut.repeats) == 2 and cut.stopped_by == "enough"
    assert cut.goodput is None and "goodput" not in cut.metrics
