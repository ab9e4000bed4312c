"""autotune counts the tokens it reports (bench/tokens.py): by ids, else by the model's
tokenizer, never by events and never by the server's word; usage and /metrics cross-check it,
and a disagreement is recorded as ``measurement_suspect``. Against tests/servers/lying_stream.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from autotune import names
from autotune.bench.loadcurve import record_curve, run_benchmark
from autotune.bench.tokens import (
    BY_IDS,
    BY_TOKENIZER,
    BY_USAGE,
    NO_TOKENIZER,
    TokenCounter,
    cross_check,
    suspect_line,
)
from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.engines.vllm.metrics import VLLM_METRICS
from autotune.server.metrics import ServerMetricsRecorder
from autotune.spec.model import WorkloadSpec
from tests.servers.lying_stream import running

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
N = 16


class Trial:
    """What record_curve needs of an optuna.Trial."""

    def __init__(self, **attrs: Any) -> None:
        self.user_attrs: dict[str, Any] = dict(attrs)

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value


@pytest.fixture(scope="module")
def url():
    with running("--step", "0.01") as base:
        yield base


def bench(url: str, mode: str, counter: TokenCounter, *, metrics: bool = False):
    workload = WorkloadSpec(
        prompts=("one two",),
        max_tokens=N,
        concurrency=2,
        num_requests=4,
        single_requests=2,
        warmup_requests=0,
        repeats=1,
        request_timeout_s=60.0,
        target_precision=0.0,  # exactly one round: 2 single + 4 load requests
    )

    async def go():
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            recorder = ServerMetricsRecorder(client, VLLM_METRICS if metrics else None)
            await recorder.start()
            result = await run_benchmark(
                client,
                mode,
                workload,
                dialect=VLLM_DIALECT,
                counter=counter,
                phase_hook=recorder.phase,
            )
            return result, await recorder.stop()

    return asyncio.run(go())


def measured(url: str, mode: str, counter: TokenCounter):
    result, server_metrics = bench(url, mode, counter)
    trial = Trial(**{names.SERVER_METRICS: server_metrics})
    record_curve(trial, result)
    return result, trial.user_attrs


def test_the_demo_tokenizer_counts_split_and_grouped_pieces() -> None:
    counter = TokenCounter.for_model(str(DEMO))
    assert counter.available and counter.source.endswith("tokenizer.json")
    text = " one two three"
    assert counter.count(text) == 6  # Ġo ne Ġtw o Ġth ree
    # a token split over two events counts once, where it is completed
    assert counter.per_chunk([" t", "w", "o"]) == [0, 1, 1]
    # four tokens in one event count four
    assert counter.per_chunk([" one two", " three"]) == [4, 2]
    # model.tokenizer is tried before model.path
    assert TokenCounter.for_model("/nonexistent/model", str(DEMO)).available


def test_no_tokenizer_says_why() -> None:
    counter = TokenCounter.for_model("/nonexistent/model", None)
    assert not counter.available
    assert "/nonexistent/model" in counter.unavailable
    assert counter.describe() == {"available": False, "reason": counter.unavailable}


def test_usage_four_times_the_stream_is_not_the_speed_and_is_flagged(url: str) -> None:
    honest, honest_attrs = measured(url, "honest", NO_TOKENIZER)
    liar, liar_attrs = measured(url, "usage4x", NO_TOKENIZER)
    assert all(r.output_tokens == N and r.count_source == BY_IDS for r in liar.samples)
    assert all(r.usage_tokens == 4 * N for r in liar.samples)
    ratio = liar.metrics["output_tokens_per_s"] / honest.metrics["output_tokens_per_s"]
    assert 1 / 1.5 < ratio < 1.5, ratio  # the server's 4x did not make it 4x faster
    assert names.MEASUREMENT_SUSPECT not in honest_attrs
    suspect = liar_attrs[names.MEASUREMENT_SUSPECT]
    assert suspect["disagree"] == ["usage"]
    # six benchmark answers and the round's fresh-prompt control
    assert suspect["usage"] == 4 * suspect["autotune"] and suspect["autotune"] == 7 * N
    assert "usage" in suspect_line(suspect)


def test_text_only_usage_liar_is_counted_by_the_tokenizer(url: str) -> None:
    counter = TokenCounter.for_model(str(DEMO))
    liar, attrs = measured(url, "usage4x-text", counter)
    assert all(r.output_tokens == N and r.count_source == BY_TOKENIZER for r in liar.samples)
    assert attrs[names.MEASUREMENT_SUSPECT]["disagree"] == ["usage"]


def test_without_a_tokenizer_the_servers_word_is_a_flagged_figure(url: str) -> None:
    result, attrs = measured(url, "text", NO_TOKENIZER)
    assert all(r.count_source == BY_USAGE and r.output_tokens == N for r in result.samples)
    suspect = attrs[names.MEASUREMENT_SUSPECT]
    assert suspect["disagree"] == [] and suspect["counted_by"] == {BY_USAGE: 6}
    assert suspect["no_tokenizer"] == "no tokenizer given"
    assert "no tokenizer" in suspect_line(suspect)


def test_ids_that_are_not_the_texts_tokens_are_flagged(url: str) -> None:
    """Two ids a token of text: counted by ids, every figure doubled, and usage agreed. The
    tokenizer's count of the streamed text (after the benchmark) says so; an honest server's
    ids are its text's tokens exactly."""
    counter = TokenCounter.for_model(str(DEMO))
    _honest, honest_attrs = measured(url, "honest", counter)
    assert names.MEASUREMENT_SUSPECT not in honest_attrs
    _liar, attrs = measured(url, "ids2x", counter)
    suspect = attrs[names.MEASUREMENT_SUSPECT]
    assert "text" in suspect["disagree"]
    assert suspect["retokenized"]["ids"] == 2 * suspect["retokenized"]["text"]
    assert "token ids for" in suspect_line(suspect)


def test_a_metrics_counter_that_disagrees_is_flagged() -> None:
    counts = {
        "phases": {"load at 2 (round 1)": {"autotune": 100, "usage": 100}},
        "counted_by": {BY_IDS: 4},
    }
    agree = {"available": True, "phases": {"load at 2 (round 1)": {"generation_tokens": 101.0}}}
    assert cross_check(counts, agree) is None  # within 2 %
    off = {"available": True, "phases": {"load at 2 (round 1)": {"generation_tokens": 400.0}}}
    suspect = cross_check(counts, off)
    assert suspect is not None
    assert suspect["disagree"] == ["metrics"]
    assert (suspect["autotune"], suspect["usage"], suspect["metrics"]) == (100, 100, 400.0)


def test_the_servers_metrics_counter_is_compared_per_phase(url: str) -> None:
    result, server_metrics = bench(url, "honest", NO_TOKENIZER, metrics=True)
    assert server_metrics["available"], server_metrics
    assert cross_check(result.counts, server_metrics) is None
    with running("--step", "0.01", "--metrics-lie") as lying:
        result, server_metrics = bench(lying, "usage4x", NO_TOKENIZER, metrics=True)
    suspect = cross_check(result.counts, server_metrics)
    assert suspect is not None and suspect["disagree"] == ["usage", "metrics"]
    assert suspect["metrics"] == 4 * suspect["autotune"]


def test_bench_url_json_carries_the_shape_and_the_suspect_count(tmp_path, url) -> None:
    import json

    from typer.testing import CliRunner

    from autotune.cli.app import app
    from tests.builders import write_fake_spec

    space = (
        "parameters:\n  max_num_seqs:\n    type: categorical\n    choices: [2, 8]\n"
        "    baseline: 8\n    target: {flag: --max-num-seqs}\n"
    )
    spec = write_fake_spec(tmp_path, space, name="remote")
    out = tmp_path / "bench.json"
    args = ["bench", "--spec", str(spec), "--url", url, "--model", "usage4x", "--json", str(out)]
    result = CliRunner().invoke(app, args, env={"AUTOTUNE_API_KEY": ""})
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    suspect = data[names.MEASUREMENT_SUSPECT]
    assert suspect["usage"] == 4 * suspect["autotune"] and "usage" in suspect["disagree"]
    assert data["stream_shape"]["single"]["tokens_per_s"] > 0
    assert any("measurement suspect" in n for n in data["notices"])
