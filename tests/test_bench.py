"""The benchmark client against canned streams (httpx.MockTransport): timing, statistics,
failures counted and never dropped."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import httpx
import pytest

from autotune import names
from autotune.bench.loadcurve import run_benchmark
from autotune.bench.phase import (
    PhaseResult,
    RequestRecord,
    combine,
    percentile,
    stream_request,
    summarize,
)
from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.spec.model import WorkloadSpec


def sse(chunks: list[dict]) -> bytes:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return body.encode()


def stream_body(n_tokens: int) -> bytes:
    chunks = [
        {"choices": [{"index": 0, "text": f" t{i}", "token_ids": [i]}]} for i in range(n_tokens)
    ]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n_tokens}})
    return sse(chunks)


def client_for(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://test")


def benchmark_with(handler, workload: WorkloadSpec):
    """``run_benchmark`` of ``workload`` against ``handler`` (an httpx MockTransport's)."""

    async def go():
        async with client_for(handler) as client:
            return await run_benchmark(client, "m", workload, dialect=VLLM_DIALECT)

    return asyncio.run(go())


def test_a_control_refused_as_too_long_is_no_request_error_a_5xx_is():
    """One load request a phase is a fresh-prompt control (bench/replay.py): a server that
    refuses it as a bad request (its nonce line took a prompt past the context limit) has no
    failed request for it; a control that fails otherwise failed as any request would."""
    import json as json_module

    def answer(status: int):
        def handler(request):
            prompt = json_module.loads(request.content)["prompt"]
            if "\n(request " in prompt:
                return httpx.Response(status, content=b"too long")
            return httpx.Response(200, content=stream_body(4))

        return handler

    workload = WorkloadSpec(
        prompts=("a", "b"),
        max_tokens=4,
        concurrency=2,
        num_requests=6,
        single_requests=2,
        warmup_requests=0,
        repeats=1,
        target_precision=0.0,
    )
    refused = benchmark_with(answer(400), workload)
    assert refused.failed_requests == 0 and refused.total_requests == 2 + 5
    assert refused.replay is not None and not refused.replay["checked"]
    assert "the control failed: http 400" in refused.replay["reason"]
    broken = benchmark_with(answer(503), workload)
    assert broken.failed_requests == 1 and broken.total_requests == 2 + 6
    assert "503" in broken.errors[0]


def test_stream_request_counts_tokens_and_sends_greedy_fixed_length():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        return httpx.Response(200, content=stream_body(8))

    async def go():
        async with client_for(handler) as client:
            return await stream_request(client, "m", "1 2 3", 8, dialect=VLLM_DIALECT)

    record = asyncio.run(go())
    assert record.ok and record.output_tokens == 8 and record.token_ids == tuple(range(8))
    assert record.text == "".join(f" t{i}" for i in range(8))
    assert seen["temperature"] == 0.0 and seen["ignore_eos"] is True and seen["stream"] is True
    assert seen["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(500, content=b"boom"), "http 500"),
        (httpx.Response(200, content=b"data: [DONE]\n\n"), "without tokens"),
    ],
)
def test_failed_requests_are_records_not_exceptions(response, error):
    async def go():
        async with client_for(lambda request: response) as client:
            return await stream_request(client, "m", "p", 4, dialect=VLLM_DIALECT)

    record = asyncio.run(go())
    assert not record.ok and error in record.error


def test_connection_errors_are_recorded():
    def handler(request):
        raise httpx.ConnectError("refused")

    async def go():
        async with client_for(handler) as client:
            return await stream_request(client, "m", "p", 4, dialect=VLLM_DIALECT)

    record = asyncio.run(go())
    assert not record.ok and "ConnectError" in record.error


def test_a_connection_dropped_before_any_answer_is_tried_once_more_not_a_hang():
    """A keep-alive connection the server had just closed: httpx-aiohttp reports aiohttp's
    ServerDisconnectedError as ConnectTimeout. One fresh attempt; never called a hang."""
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ConnectTimeout("Server disconnected")
        chunk = {"choices": [{"text": " 4", "token_ids": [4]}]}
        return httpx.Response(200, content=b"data: " + json.dumps(chunk).encode() + b"\n\n")

    async def go():
        async with client_for(handler) as client:
            return await stream_request(client, "m", "p", 1, dialect=VLLM_DIALECT)

    record = asyncio.run(go())
    assert len(calls) == 2 and record.ok and not record.hung
    assert record.token_ids == (4,)

    calls.clear()

    def always(request):
        calls.append(1)
        raise httpx.ConnectTimeout("Server disconnected")

    async def gone():
        async with client_for(always) as client:
            return await stream_request(client, "m", "p", 1, dialect=VLLM_DIALECT)

    record = asyncio.run(gone())
    assert len(calls) == 2 and not record.ok and not record.hung
    assert "ConnectTimeout" in record.error


def rec(times, e2e=None, ok=True):
    return RequestRecord(
        prompt="p",
        ok=ok,
        ttft_s=times[0] if times else None,
        e2e_s=e2e or (times[-1] if times else 1.0),
        token_times_s=tuple(times),
        output_tokens=len(times),
    )


def test_decode_rate_excludes_prefill():
    record = rec([0.5, 0.6, 0.7, 0.8, 0.9])  # 4 gaps of 100 ms after a 500 ms prefill
    assert record.decode_tokens_per_s == pytest.approx(10.0)


def test_bunched_delivery_falls_back_to_end_to_end_rate():
    record = rec([1.0] * 5 + [1.00001] * 5, e2e=2.0)
    assert record.bunched
    assert record.decode_tokens_per_s == pytest.approx(10 / 2.0)


def test_all_tokens_in_one_chunk_still_give_a_rate():
    record = rec([0.8] * 8, e2e=1.0)
    assert record.decode_tokens_per_s == pytest.approx(8.0)


def test_summarize_percentiles_and_throughput():
    single = PhaseResult(records=(rec([0.1, 0.2, 0.3]),), wall_s=0.3)
    load = PhaseResult(records=(rec([0.1, 0.2]), rec([0.3, 0.5]), rec([], ok=False)), wall_s=1.0)
    metrics = summarize(single, load)
    assert metrics["decode_tokens_per_s"] == pytest.approx(10.0)
    assert metrics["output_tokens_per_s"] == pytest.approx(4.0)
    assert metrics["requests_per_s"] == pytest.approx(2.0)
    assert metrics["ttft_p50_ms"] == pytest.approx(200.0)
    assert metrics["itl_p50_ms"] == pytest.approx(150.0)


def test_percentile_matches_linear_interpolation():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10], 95) == 10
    assert percentile(list(range(101)), 95) == pytest.approx(95)


def test_combine_reports_median_and_spread():
    medians, spread = combine([{"x": 90.0}, {"x": 100.0}, {"x": 110.0}])
    assert medians["x"] == 100.0 and spread["x"] == pytest.approx(0.2)


def test_run_benchmark_counts_every_failure():
    calls = {"n": 0}

    def handler(request):
        calls["n"] += 1
        if calls["n"] % 5 == 0:
            return httpx.Response(503, content=b"overloaded")
        return httpx.Response(200, content=stream_body(4))

    workload = WorkloadSpec(
        prompts=("a", "b"),
        max_tokens=4,
        concurrency=2,
        num_requests=6,
        single_requests=2,
        warmup_requests=1,
        repeats=2,
    )

    result = benchmark_with(handler, workload)
    # warm-up 1, then repeat 1: single 2, its fresh-prompt control 1 (sent, but no benchmark
    # request) and load 6; the 5th and 10th requests are 503s, both under load, so the
    # benchmark stops after that repeat (no point measuring on) and counts exactly two
    # failures of nine
    assert calls["n"] == 1 + 2 + 1 + 6
    assert result.total_requests == 9
    assert result.failed_requests == 2
    assert len(result.repeats) == 1
    assert all("503" in e for e in result.errors)


def test_a_benchmark_measures_its_own_client_and_the_trial_records_it_as_a_trap() -> None:
    """The client's CPU and event-loop lag are measured around every benchmark and stored
    with the server-side traps, so a client that could not keep up is said, not hidden."""
    from autotune.bench.loadcurve import record_curve

    def handler(request):
        return httpx.Response(200, content=stream_body(4))

    workload = WorkloadSpec(
        prompts=("a",), max_tokens=4, concurrency=2, num_requests=4, single_requests=1, repeats=2
    )

    result = benchmark_with(handler, workload)
    assert result.client is not None
    assert result.client["cpu_busy"] >= 0 and "flagged" in result.client

    class Trial:
        user_attrs = {names.TRAPS: {"prefix_cache": {"flagged": True, "reason": "hits 90%"}}}

        def set_user_attr(self, key, value):
            self.user_attrs = {**self.user_attrs, key: value}

    trial = Trial()
    record_curve(trial, dataclasses.replace(result, client={"flagged": True, "reason": "lag"}))
    traps = trial.user_attrs[names.TRAPS]
    assert traps["client"]["reason"] == "lag" and traps["flagged"] == ["hits 90%", "lag"]


def test_a_chunk_that_carries_no_token_sets_neither_the_ttft_nor_an_itl(monkeypatch):
    """A server that sends a text chunk with no token ids at once, then the real answer,
    claimed a TTFT of that first chunk's time; empty chunks between tokens cut every ITL.
    Each network read here is one event and the client's clock ticks one second a read, so
    the times say which chunk each figure came from."""
    events = [{"choices": [{"index": 0, "text": " ", "token_ids": []}]}]
    for i in range(3):
        events.append({"choices": [{"index": 0, "text": f" t{i}", "token_ids": [i]}]})
        events.append({"choices": [{"index": 0, "text": " ", "token_ids": []}]})

    async def body():
        for event in events:
            yield f"data: {json.dumps(event)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    ticks = iter(range(1000))
    monkeypatch.setattr("autotune.bench.phase.time.perf_counter", lambda: float(next(ticks)))

    async def go():
        handler = lambda request: httpx.Response(200, content=body())  # noqa: E731
        async with client_for(handler) as client:
            return await stream_request(client, "m", "1 2 3", 3, dialect=VLLM_DIALECT)

    record = asyncio.run(go())
    assert record.ok and record.output_tokens == 3, record
    assert record.chunk_tokens == (1, 1, 1)
    assert record.ttft_s == record.token_times_s[0] == record.chunk_times_s[0]
    assert len(set(record.chunk_times_s)) == 3
    first_empty_read = 1.0  # the first clock read after start is the empty chunk's arrival
    assert record.ttft_s > first_empty_read
    assert all(gap >= 2.0 for gap in record.itls_s)  # an empty chunk between tokens is no gap
