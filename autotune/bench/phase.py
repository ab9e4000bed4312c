"""The benchmark client: autotune's own async, streaming load generator.

It takes an ``httpx.AsyncClient`` and never builds one, so tests can hand it a
``MockTransport``. Every request is greedy and fixed-length where the engine's dialect allows
(``engines/dialect.py``: fixed output lengths, and the responses can be checked against the
reference: correctness under load). Each request's timestamps are kept; nothing is averaged away
and a failed request is counted, never dropped.

Measurements, per repeat:

* **single-request** (the motivating case's headline): ``single_requests`` requests one after
  another. A user's tok/s is output tokens / end-to-end time; beside it TTFT and TPOT =
  (e2e - TTFT) / (tokens - 1), as ``vllm bench serve`` defines them. Decode tok/s (1 / TPOT:
  decoding without the prefill) falls back to tokens / e2e for a bursty response, so no shape
  of stream reads faster than its end-to-end time allows.
* **load**: ``num_requests`` requests with ``concurrency`` in flight; output tok/s = tokens /
  wall time, requests/s, TTFT, inter-token latency (ITL, one per received chunk that carries a
  token, as vLLM's benchmark has it) and end-to-end percentiles.

Tokens are counted by autotune (``bench/tokens.py``): by ids, else by the model's tokenizer,
never by events; the server's ``usage`` is kept as a cross-check. A response is **bursty** when
:data:`BURST_SHARE` of its tokens arrive within :data:`BURST_WINDOW` of its end-to-end time (a
held answer flushed at once, an API server starved of CPU): its per-chunk gaps then measure the
flush, not decoding, so a phase with a bursty response records no ITL percentiles (absent, and
``stream_shape`` says ``bursty``), never 0.0.

Metrics are the median over repeats; the spread ((max - min) / median) is recorded beside them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from autotune import names
from autotune.bench.answer import StreamedAnswer
from autotune.bench.limits import streamed_tokens
from autotune.bench.tokens import (
    BY_IDS,
    BY_TOKENIZER,
    BY_USAGE,
    NO_TOKENIZER,
    TokenCounter,
    length_problem,
)
from autotune.client.bounds import PROTOCOL_VIOLATION, runaway_cap, runs_away
from autotune.client.send import TRANSPORT_ERRORS, open_raw_stream
from autotune.client.stream import (
    LineSplitter,
    ServerProgress,
    StreamError,
    TokenDeadline,
    completion_body,
)
from autotune.engines.dialect import RequestDialect
from autotune.errors import excerpt

#: a response is bursty when this share of its tokens arrives within BURST_WINDOW of its e2e
BURST_SHARE = 0.9
BURST_WINDOW = 0.1
#: fewer tokens than this are never called bursty (two tokens are always "together")
BURST_MIN_TOKENS = 4


@dataclass(frozen=True)
class RequestRecord:
    """One streamed request as the client saw it."""

    prompt: str
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    token_times_s: tuple[float, ...] = ()  # arrival of each token, relative to the send
    token_ids: tuple[int, ...] = ()
    text: str = ""
    #: autotune's count (see ``count_source``); the server's usage is ``usage_tokens``
    output_tokens: int = 0
    #: no token arrived within the deadline (the request was given up, the phase ended)
    hung: bool = False
    #: arrival of each received chunk that carried a token, and the tokens each carried
    chunk_times_s: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    #: the server's ``usage.completion_tokens`` (a cross-check, never the count), if sent
    usage_tokens: int | None = None
    #: how ``output_tokens`` was counted: bench/tokens.py's BY_* (None: given by the caller)
    count_source: str | None = None
    #: times it was sent again on a new connection, its first failing before any answer (a
    #: kept-alive connection the server had closed): the server's habit, not a failure
    transport_retries: int = 0
    #: the benchmark phase that sent it (``single (round 1)``, ``load 8 (round 2)``, ...)
    phase: str = ""
    #: the answer's length asked for (``max_tokens``), and the tokens streamed beyond it, never
    #: counted in ``output_tokens`` (nobody asked for them)
    asked_tokens: int = 0
    uncounted_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.output_tokens or len(self.token_times_s)

    @property
    def itls_s(self) -> list[float]:
        """Inter-token latency per received chunk with a token (``vllm bench serve``'s ITL)."""
        t = self.chunk_times_s or self.token_times_s
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def tokens_per_chunk(self) -> float | None:
        chunks = len(self.chunk_times_s or self.token_times_s)
        return self.tokens / chunks if chunks else None

    @property
    def bursty(self) -> bool:
        """:data:`BURST_SHARE` of the tokens arrived within :data:`BURST_WINDOW` of the
        end-to-end time: the per-chunk clock measured a flush, not decoding."""
        t = self.token_times_s
        n = len(t)
        if n < BURST_MIN_TOKENS or not self.e2e_s:
            return False
        k = max(2, math.ceil(n * BURST_SHARE - 1e-9))  # tokens that must arrive together
        window = min(t[i + k - 1] - t[i] for i in range(n - k + 1))
        return window < BURST_WINDOW * self.e2e_s

    bunched = bursty  # the old name

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, (e2e - TTFT) / (tokens - 1)."""
        n = self.tokens
        if n < 2 or self.e2e_s is None or self.ttft_s is None or self.e2e_s <= self.ttft_s:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    @property
    def tokens_per_s(self) -> float | None:
        """A user's tok/s: output tokens over end-to-end time (immune to the stream's shape)."""
        return self.tokens / self.e2e_s if self.e2e_s and self.token_times_s else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Decode rate of this request, excluding the prefill: 1 / TPOT.

        A bursty response (or one whose tokens all came at once) falls back to tokens /
        end-to-end time, a lower bound no burst can inflate.
        """
        if not self.token_times_s:
            return None
        tpot = self.tpot_s
        if tpot is None or self.bursty:
            return self.tokens_per_s
        return 1.0 / tpot


@dataclass(frozen=True)
class PhaseResult:
    records: tuple[RequestRecord, ...]
    wall_s: float
    #: the first hung request of the phase, which ended it (see :func:`run_phase`)
    hang: str | None = None


@dataclass(frozen=True)
class BenchResult:
    """Median metrics over repeats, their spread, every repeat's metrics, failures, samples."""

    metrics: dict[str, float]
    spread: dict[str, float]
    repeats: tuple[dict[str, float], ...]
    total_requests: int
    failed_requests: int
    errors: tuple[str, ...] = ()
    #: successful records of every measured phase (single-request, each level, goodput probes;
    #: not the warm-up): the correctness-under-load check judges a sample of each
    samples: tuple[RequestRecord, ...] = field(default=(), repr=False)
    #: the first hung request (phase, request, deadline), which ended the benchmark, or None
    hang: str | None = None
    #: 95% t interval of each metric's mean over the rounds: name -> [low, high, n]
    ci: dict[str, list[float]] = field(default_factory=dict)
    #: why measuring stopped ("precision", "max_repeats", "max_measure_s", "repeats", ...)
    stopped_by: str | None = None
    #: concurrency level -> that level's median metrics (the load curve of one launch)
    load_curve: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the goodput search (loadcurve.GoodputResult.to_dict()), when workload.slo is given
    goodput: dict[str, Any] | None = None
    #: token counts: per phase autotune's and the server's usage, how responses were counted,
    #: the tokenizer (bench/tokens.py cross_check reads it)
    counts: dict[str, Any] = field(default_factory=dict)
    #: how the answers arrived (bench/shape.py stream_shape)
    shape: dict[str, Any] = field(default_factory=dict)
    #: the benchmark client's own load (bench/traps.py client_lag), or None if not measured
    client: dict[str, Any] | None = None
    #: requests sent again on a new connection (``RequestRecord.transport_retries``), in all
    transport_retries: int = 0
    #: fresh-prompt controls against the repeated prompts (bench/replay.py), None: no round
    replay: dict[str, Any] | None = None


async def stream_request(
    client: httpx.AsyncClient,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    dialect: RequestDialect,
    read_timeout_s: float | None = 30.0,
    counter: TokenCounter = NO_TOKENIZER,
    total_timeout_s: float | None = None,
    progress: ServerProgress | None = None,
) -> RequestRecord:
    """Send one streaming completion and time every chunk. Never raises for server faults.

    ``read_timeout_s`` is the longest wait for any token (the first included): a request that
    waits longer is recorded ``hung``; a slow request that keeps streaming never is. With
    ``progress`` (shared by the requests of one phase) the wait is the server's silence: a
    request queued behind others that stream is waiting, not hung. Tokens are counted by ids,
    else by ``counter`` on the text (see ``bench/tokens.py``).
    """
    body = completion_body(
        dialect,
        model,
        prompt,
        max_tokens,
        stream=True,
        include_usage=True,
        fixed_length=True,
        token_ids=True,
    )
    start = time.perf_counter()
    tokens = StreamedAnswer(dialect)
    times = tokens.times
    clock = time.perf_counter
    try:
        # The hot path of a benchmark (one pass per streamed token, on cores the server under
        # test needs): one clock read per chunk, one json.loads per event, the deadline a stored
        # number (protocol.TokenDeadline), no per-chunk timer, no httpx objects per chunk.
        async with (
            TokenDeadline(
                read_timeout_s, start, total_s=total_timeout_s, progress=progress
            ) as deadline,
            open_raw_stream(client, "/v1/completions", body) as stream,
        ):
            tokens.retries = stream.transport_retries
            if stream.status != 200:
                detail = excerpt((await stream.read()).decode("utf-8", "replace"))
                error = f"http {stream.status}: {detail}"
                return _failed(prompt, error, start, tokens)
            lines_of = LineSplitter()
            cap = runaway_cap(max_tokens)
            async for data in stream.chunks:
                now = clock() - start
                count = len(times)
                if tokens.add(lines_of.split(data), now):
                    break
                if len(times) != count:  # only a token resets the deadline, not any byte
                    deadline.last = now
                    if progress is not None:
                        progress.last = start + now
                    if len(times) > cap and runs_away(
                        streamed := streamed_tokens(tokens.ids, tokens.text, times, counter),
                        len(tokens.chunk_times),
                        cap,
                    ):
                        error = (
                            f"{PROTOCOL_VIOLATION}: {streamed} tokens streamed for "
                            f"max_tokens={max_tokens} (more than {cap})"
                            if streamed > cap
                            else f"{PROTOCOL_VIOLATION}: {len(tokens.chunk_times)} chunks with "
                            f"text streamed for max_tokens={max_tokens} ({streamed} token(s))"
                        )
                        return _failed(prompt, error, start, tokens)
            else:  # the body ended: a last event without its newline still counts
                tokens.end(lines_of.rest, clock() - start)
    except TimeoutError:  # our own no-token deadline (protocol.TokenDeadline)
        waited = "the first token" if not times else f"token {len(times) + 1}"
        error = f"hang: no token within {read_timeout_s:g} s (waiting for {waited})"
        if deadline.total_expired:
            error = (
                f"hang: the request ran past its total bound of {total_timeout_s:g} s "
                f"({len(times)} tokens by then)"
            )
        record = _failed(prompt, error, start, tokens)
        return dataclasses.replace(record, hung=True)
    except TRANSPORT_ERRORS as exc:
        return _failed(prompt, f"{type(exc).__name__}: {exc}", start, tokens)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _failed(prompt, f"bad stream chunk: {exc}", start, tokens)
    except StreamError as exc:
        return _failed(prompt, str(exc), start, tokens)
    e2e = time.perf_counter() - start
    if not tokens.chunk_times:
        error = "stream ended without tokens"
        if "text/event-stream" not in stream.content_type:
            # a server that ignores "stream": true answers one JSON body: say so, each time
            kind = stream.content_type or "no content type"
            error += f": the answer was not a server-sent event stream ({kind})"
        return _failed(prompt, error, start, tokens)
    chunk_times, per_chunk, source = tokens.count(counter)
    if not chunk_times:
        return _failed(prompt, "stream ended without tokens (no chunk carried one)", start, tokens)
    if source in (BY_IDS, BY_TOKENIZER):
        token_times = [t for t, k in zip(chunk_times, per_chunk, strict=True) for _ in range(k)]
        n_tokens = len(token_times)
    else:  # no tokenizer: one time per chunk, the count the server's word (flagged suspect)
        token_times = list(chunk_times)
        n_tokens = tokens.usage if source == BY_USAGE else len(token_times)
    problem = length_problem(source, int(n_tokens or 0), max_tokens, tokens.finish)
    if problem is not None:
        return _failed(prompt, problem, start, tokens)
    beyond = max(0, int(n_tokens or 0) - max_tokens)
    if beyond:  # within the runaway slack: the figures count only the tokens asked for
        n_tokens = max_tokens
        token_times = token_times[:max_tokens] if source in (BY_IDS, BY_TOKENIZER) else token_times
    return RequestRecord(
        prompt=prompt,
        ok=True,
        ttft_s=chunk_times[0],
        e2e_s=e2e,
        token_times_s=tuple(token_times),
        token_ids=tuple(tokens.ids),
        text="".join(tokens.text),
        output_tokens=int(n_tokens or 0),
        chunk_times_s=tuple(chunk_times),
        chunk_tokens=tuple(per_chunk),
        usage_tokens=tokens.usage,
        count_source=source,
        transport_retries=tokens.retries,
        asked_tokens=max_tokens,
        uncounted_tokens=beyond,
    )


def _failed(prompt: str, error: str, start: float, tokens: StreamedAnswer) -> RequestRecord:
    """A request that did not complete, with whatever token times it had (never dropped)."""
    return RequestRecord(
        prompt=prompt,
        ok=False,
        error=error,
        e2e_s=time.perf_counter() - start,
        token_times_s=tuple(tokens.times),
        transport_retries=tokens.retries,
    )


async def run_phase(
    client: httpx.AsyncClient,
    model: str,
    prompts: Sequence[str],
    num_requests: int,
    concurrency: int,
    max_tokens: int | Sequence[int],
    *,
    dialect: RequestDialect,
    read_timeout_s: float | None,
    phase: str = "load",
    counter: TokenCounter = NO_TOKENIZER,
    total_timeout_s: float | None = None,
) -> PhaseResult:
    """``num_requests`` requests, prompts taken round-robin, at most ``concurrency`` at once.
    ``max_tokens`` is one length for all, or one per prompt (``WorkloadSpec.output_tokens``).

    A request is hung when the server streamed no token to any request of the phase for
    ``read_timeout_s`` (:class:`ServerProgress`). The first hung request ends the phase: the
    requests still in flight or queued are cancelled (a hung server would make each of them
    wait its own deadline, one wave after another), and the result's ``hang`` names the
    request, the phase and the deadline.
    """
    semaphore = asyncio.Semaphore(concurrency)
    progress = ServerProgress()  # a request queued behind streaming ones is not hung

    async def one(index: int) -> RequestRecord:
        async with semaphore:
            return await stream_request(
                client,
                model,
                prompts[index % len(prompts)],
                max_tokens if isinstance(max_tokens, int) else max_tokens[index % len(prompts)],
                dialect=dialect,
                read_timeout_s=read_timeout_s,
                counter=counter,
                total_timeout_s=total_timeout_s,
                progress=progress,
            )

    start = time.perf_counter()
    tasks = [asyncio.ensure_future(one(i)) for i in range(num_requests)]
    hang = None
    try:
        for index, task in enumerate(tasks):
            record = await task
            if record.hung and hang is None:
                hang = f"{phase} phase: request {index + 1} of {num_requests} ({record.error})"
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    records = [replace(t.result(), phase=phase) for t in tasks if t.done() and not t.cancelled()]
    if hang is None:
        hang = next((f"{phase} phase: {r.error}" for r in records if r.hung), None)
    return PhaseResult(records=tuple(records), wall_s=time.perf_counter() - start, hang=hang)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return float("nan")
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def summarize(single: PhaseResult, load: PhaseResult) -> dict[str, float]:
    """The metrics of one repeat, units in the names."""
    metrics: dict[str, float] = {}
    # the headline, a user's tok/s (tokens / e2e), then decoding alone (1 / TPOT) beside it
    for name, values in (
        (names.SINGLE_TOKENS_PER_S, [r.tokens_per_s for r in single.records if r.ok]),
        (names.DECODE_TOKENS_PER_S, [r.decode_tokens_per_s for r in single.records if r.ok]),
    ):
        known = [v for v in values if v is not None]
        if known:
            metrics[name] = statistics.median(known)
    ok = [r for r in load.records if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    if load.wall_s > 0:
        metrics["output_tokens_per_s"] = tokens / load.wall_s
        metrics["requests_per_s"] = len(ok) / load.wall_s
    ttfts = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    # a bursty response's chunk gaps time a flush: ITL percentiles then mean nothing (absent)
    bursty = any(r.bursty for r in ok)
    itls = [] if bursty else [x * 1000 for r in ok for x in r.itls_s]
    e2es = [r.e2e_s * 1000 for r in ok if r.e2e_s is not None]
    for kind, values in zip(names.LATENCY_KINDS, (ttfts, itls, e2es), strict=True):
        if values:
            for q in names.PERCENTILES:
                metrics[names.latency_metric(kind, q)] = percentile(values, q)
    return metrics


def combine(repeats: Sequence[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Median over repeats and relative spread ((max - min) / median) per metric."""
    medians: dict[str, float] = {}
    spread: dict[str, float] = {}
    names = sorted({k for r in repeats for k in r})
    for name in names:
        values = [r[name] for r in repeats if name in r]
        med = statistics.median(values)
        medians[name] = med
        spread[name] = (max(values) - min(values)) / med if med else 0.0
    return medians, spread


def bench_summary(result: BenchResult) -> dict[str, Any]:
    return {
        "total_requests": result.total_requests,
        "failed_requests": result.failed_requests,
        "errors": list(result.errors),
        "spread": result.spread,
        "repeats": list(result.repeats),
        "hang": result.hang,
        "stopped_by": result.stopped_by,
        "counted_by": result.counts.get("counted_by", {}),
        "tokenizer": result.counts.get("tokenizer"),
        "transport_retries": result.transport_retries,
        "replay_check": result.replay,
        **({"answer_lengths": lengths} if (lengths := result.counts.get("lengths")) else {}),
    }


def phase_counts(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """autotune's and the server's token totals of one phase; None when a request failed (its
    tokens were generated but not counted, so no cross-check would be fair)."""
    if not records or any(not r.ok for r in records):
        return None
    usage = [r.usage_tokens for r in records]
    return {
        "autotune": sum(r.output_tokens for r in records),
        "usage": None if any(u is None for u in usage) else sum(u for u in usage if u is not None),
    }
