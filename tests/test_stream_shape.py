"""Speed a stream's shape cannot inflate (bench/phase.py): a user's tok/s over end-to-end time,
TPOT as ``vllm bench serve`` defines it, ITL per chunk, bursty responses marked and their ITL
percentiles absent (never 0.0), intervals of positive figures never below zero. Against
tests/servers/lying_stream.py and hand-made records."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import httpx
import pytest

from autotune import names
from autotune._stats import mean_interval, positive_interval
from autotune.bench.loadcurve import intervals_of, run_benchmark
from autotune.bench.phase import PhaseResult, RequestRecord, stream_request, summarize
from autotune.bench.shape import stream_shape
from autotune.bench.tokens import BY_TOKENIZER, TokenCounter
from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.spec.model import WorkloadSpec
from tests.servers.lying_stream import running

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
N = 24
STEP_S = 0.05  # the test server's time per token (--step): long beside a loaded machine's jitter


@pytest.fixture(scope="module")
def answers() -> dict[str, RequestRecord]:
    """One answer of each mode, by the demo model's tokenizer where the text is all there is."""
    counter = TokenCounter.for_model(str(DEMO))

    async def go(url: str) -> dict[str, RequestRecord]:
        out = {}
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            for mode in ("honest", "honest", "burst", "held", "text", "text4", "split"):
                out[mode] = await stream_request(
                    client, mode, "one two", N, dialect=VLLM_DIALECT, counter=counter
                )
        return out

    with running("--step", str(STEP_S)) as url:
        found = asyncio.run(go(url))
    assert all(r.ok for r in found.values()), {m: r.error for m, r in found.items()}
    return found


@pytest.mark.parametrize("mode", ["burst", "held"])
def test_a_flushed_answer_reads_no_faster_than_its_end_to_end_time(answers, mode) -> None:
    steady, flushed = answers["honest"], answers[mode]
    t = flushed.token_times_s
    # the server really flushed: per-token clocks alone would have read it many times faster
    assert (len(t) - 2) / (t[-1] - t[1]) > 2 * flushed.tokens_per_s
    # (the server spaces them 0.4 ms apart, more than the 0.1 ms "arrived together" an older
    # rule looked for; how far apart they arrive depends on the machine's load, so no verdict
    # here rests on the gaps the client happened to see)
    assert flushed.bursty and not steady.bursty
    assert flushed.output_tokens == N
    assert flushed.decode_tokens_per_s == pytest.approx(N / flushed.e2e_s)
    # a steady answer's decode rate is at least what its own end-to-end time allows
    assert steady.decode_tokens_per_s >= (N - 1) / steady.e2e_s
    # the flush does not win: the server held the answer for N steps (a sleep never returns
    # early), so no reading of its stream may exceed one token per step, the rate a steady
    # server of the same design has; a bound from the design, not from two servers' timings
    assert flushed.decode_tokens_per_s <= 1 / STEP_S


# "split" sends each token's text in two chunks: the first half carries no whole token, so it
# is neither an arrival nor an ITL sample (else splitting would halve the ITL); 1 a chunk
@pytest.mark.parametrize(("mode", "per_chunk"), [("text4", 4.0), ("split", 1.0)])
def test_text_only_chunking_does_not_change_the_count_or_the_speed(answers, mode, per_chunk):
    reference, record = answers["text"], answers[mode]
    assert record.count_source == BY_TOKENIZER and record.output_tokens == N
    assert record.tokens_per_chunk == pytest.approx(per_chunk, rel=0.15)
    assert not record.bursty
    ratio = record.decode_tokens_per_s / reference.decode_tokens_per_s
    assert 1 / 1.5 < ratio < 1.5, ratio
    assert record.ttft_s is not None and record.tpot_s is not None


def rec(times: list[float], e2e: float) -> RequestRecord:
    return RequestRecord(
        prompt="p",
        ok=True,
        ttft_s=times[0],
        e2e_s=e2e,
        token_times_s=tuple(times),
        chunk_times_s=tuple(sorted(set(times))),
        output_tokens=len(times),
    )


def test_tpot_and_itl_follow_vllm_bench_serve() -> None:
    record = rec([0.2, 0.3, 0.3, 0.5, 0.6], e2e=0.6)
    assert record.tpot_s == pytest.approx((0.6 - 0.2) / 4)  # (e2e - ttft) / (n - 1)
    # one ITL per received chunk (0.3 carried two tokens)
    assert record.itls_s == pytest.approx([0.1, 0.2, 0.1])
    assert record.tokens_per_chunk == pytest.approx(5 / 4)
    assert record.tokens_per_s == pytest.approx(5 / 0.6)


def test_a_phase_with_a_bursty_answer_has_no_itl_percentiles_and_says_so() -> None:
    steady = rec([0.1 * (i + 1) for i in range(10)], e2e=1.0)
    bursty = rec([0.1] + [0.9 + 0.0004 * i for i in range(9)], e2e=0.91)
    assert bursty.bursty and not steady.bursty
    single = PhaseResult(records=(steady,), wall_s=1.0)
    metrics = summarize(single, PhaseResult(records=(steady, bursty), wall_s=1.0))
    assert not any(k.startswith("itl_") for k in metrics)  # absent, never 0.0
    assert "ttft_p50_ms" in metrics and "e2e_p50_ms" in metrics
    shape = stream_shape([steady], [steady, bursty])
    assert shape["itl"] == "bursty" and shape["bursty"] == 1
    assert shape["single"]["tokens_per_s"] == pytest.approx(10.0)
    assert shape["single"]["tpot_ms"] == pytest.approx(100.0)
    assert "itl_p50_ms" in summarize(single, PhaseResult(records=(steady,), wall_s=1.0))
    assert "itl" not in stream_shape([steady], [steady])


def test_intervals_of_positive_figures_never_go_below_zero() -> None:
    e2e_p50 = [120.0, 3300.0, 150.0]  # one slow round among fast ones
    assert mean_interval(e2e_p50).low < 0  # what was printed before
    interval = positive_interval(e2e_p50)
    assert 0 < interval.low < min(e2e_p50) and interval.high > max(e2e_p50)
    found = intervals_of([{"e2e_p50_ms": v} for v in e2e_p50], ["e2e_p50_ms"])
    assert found["e2e_p50_ms"].low > 0
    with_zero = positive_interval([0.0, 10.0, 0.0])
    assert with_zero.low == 0.0 and math.isfinite(with_zero.high)


def test_a_benchmark_stores_only_non_negative_intervals_and_the_shape() -> None:
    workload = WorkloadSpec(
        prompts=("one two",),
        max_tokens=8,
        concurrency=2,
        num_requests=4,
        single_requests=1,
        warmup_requests=0,
        repeats=3,
        target_precision=0.0,
    )

    async def go(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await run_benchmark(client, "held", workload, dialect=VLLM_DIALECT)

    with running("--step", str(STEP_S)) as url:
        result = asyncio.run(go(url))
    assert result.ci and all(low >= 0 for low, _high, _n in result.ci.values())
    assert result.shape["itl"] == "bursty"
    assert not any(k.startswith("itl_") for k in result.metrics)
    assert result.shape["single"]["responses"] == 3


def test_show_says_bursty_and_suspect_never_zero(tmp_path, monkeypatch) -> None:
    import optuna
    from rich.console import Console

    from autotune.cli import render

    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    trial = study.ask()
    trial.set_user_attr(names.ROLE, names.SEARCH)
    trial.set_user_attr(names.CORRECT, True)
    trial.set_user_attr(names.METRICS, {"decode_tokens_per_s": 50.0, "ttft_p95_ms": 12.0})
    trial.set_user_attr(
        names.STREAM_SHAPE,
        {"bursty": 3, "responses": 8, "itl": "bursty", "single": {"tokens_per_s": 40.0}},
    )
    suspect = {"autotune": 96, "usage": 384, "metrics": None, "disagree": ["usage"]}
    trial.set_user_attr(names.MEASUREMENT_SUSPECT, suspect)
    study.tell(trial, 50.0)
    out = Console(width=250, record=True)
    monkeypatch.setattr(render, "console", out)
    render.print_report(url, "s")
    text = out.export_text()
    header = next(line for line in text.splitlines() if "ITL p95" in line)
    itl = [c.strip() for c in header.split("┃")].index("ITL p95 ms")
    row = next(line for line in text.splitlines() if "search" in line)
    cells = [c.strip() for c in row.split("│")]
    assert cells[itl] == "bursty"  # the ITL p95 cell: not 0.0, not blank
    assert "measurement suspect: autotune counted 96, the server's usage 384" in text
    assert "3 of 8 answers arrived in bursts" in text


def test_the_headline_is_a_users_rate_even_when_the_first_token_is_held() -> None:
    """A server that holds its first token for half the answer and then streams steadily reads
    2x on decode tok/s (1 / TPOT, the prefill left out, as ``vllm bench serve`` defines it);
    the headline, and the default objective, is tokens over end-to-end time, which no shape of
    stream can raise above what the user got."""
    n, e2e = 10, 1.0
    held = rec([0.5 + 0.5 * i / (n - 1) for i in range(n)], e2e=e2e)  # first token at 0.5 s
    single = PhaseResult(records=(held, held), wall_s=2 * e2e)
    load = PhaseResult(records=(held,), wall_s=e2e)
    metrics = summarize(single, load)
    assert metrics[names.SINGLE_TOKENS_PER_S] == pytest.approx(n / e2e)
    assert metrics[names.DECODE_TOKENS_PER_S] == pytest.approx((n - 1) / 0.5)
    assert names.DEFAULT_OBJECTIVE == names.SINGLE_TOKENS_PER_S
