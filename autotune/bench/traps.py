"""Known measurement traps, checked per trial from what autotune already records (#31 item 11).

Each check is a pure function over stored data and returns a dict with ``flagged`` and a
``reason`` in words, or None when its evidence was never recorded (absent, never a 0):

* :func:`prefix_cache_trap`: the engine's prefix-cache hit rate over the benchmark
  (``server_metrics`` counters ``prefix_cache_hits`` / ``prefix_cache_queries``). Repeated
  prompts hit the cache and skip their prefill: a high rate makes a config look faster than it
  would be on fresh traffic, and makes later rounds faster than the first.
* :func:`eager_batches` / :func:`parse_cudagraph_stats`: vLLM's CUDA-graph stats table
  (logged with ``--cudagraph-metrics``, vLLM 0.32 ``compilation/cuda_graph.py``
  ``CUDAGraphLogging``): the capture sizes and, per batch size seen, the runtime mode. A batch
  run in mode ``NONE`` while graphs are on ran eagerly: its size is not among the captured
  sizes (or above the largest), and its speed is not the graph's.
* :func:`client_lag`: the benchmark client's own CPU time and its event loop's lag. A client
  that could not keep up measures itself, not the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: a prefix-cache hit rate at or above this over the benchmark is flagged
HIGH_PREFIX_HIT_RATE = 0.5
#: the client's CPU time over the benchmark's wall time at or above this (one event loop runs
#: on one core) is flagged: it was busy most of the time, so answers waited for it
CLIENT_CPU_BUSY = 0.8
#: an event-loop lag p99 above this many milliseconds is flagged (a token's timestamp is late
#: by the lag, which is of the order of a decode step)
CLIENT_LAG_P99_MS = 50.0


def prefix_cache_trap(server_metrics: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The benchmark's prefix-cache hit rate (overall and per phase), flagged when high; None
    when the server's counters were not recorded (no ``/metrics``, no prefix-cache counters)."""
    if not server_metrics or not server_metrics.get("available"):
        return None
    total = server_metrics.get("total") or {}
    hits, queries = total.get("prefix_cache_hits"), total.get("prefix_cache_queries")
    if hits is None or not queries:
        return None
    rate = hits / queries
    phases = {}
    for name, record in (server_metrics.get("phases") or {}).items():
        h, q = (record or {}).get("prefix_cache_hits"), (record or {}).get("prefix_cache_queries")
        if h is not None and q:
            phases[name] = round(h / q, 4)
    flagged = rate >= HIGH_PREFIX_HIT_RATE
    reason = (
        f"prefix cache hit {rate:.0%} of {queries:g} queried tokens: repeated prompts skip their "
        "prefill, so this speed is not that of fresh traffic (use a unique prefix per round, "
        "or reset the engine's cache between rounds)"
        if flagged
        else f"prefix cache hit {rate:.0%} of {queries:g} queried tokens"
    )
    return {
        "hit_rate": round(rate, 4),
        "hits": hits,
        "queries": queries,
        "phases": phases,
        "flagged": flagged,
        "reason": reason,
    }


_SETTINGS = re.compile(r"\*\*CUDAGraph Config Settings:\*\*")
_MODE = re.compile(r"^\s*- Mode:\s*(\S+)\s*$")
_SIZES = re.compile(r"^\s*- Capture sizes:\s*\[([^\]]*)\]\s*$")
_ROW = re.compile(r"^\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(-?\d+)\s*\|\s*([A-Z_]+)\s*\|\s*(\d+)\s*\|")


def parse_cudagraph_stats(log: str) -> list[dict[str, Any]]:
    """Every CUDA-graph stats table in a vLLM log, in order: ``{"mode", "capture_sizes",
    "rows": [{"unpadded", "padded", "paddings", "runtime_mode", "count"}]}``. A log line's
    prefix (``(APIServer pid=1) INFO ... [loggers.py:257]``) before the table is ignored."""
    tables: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in log.splitlines():
        if _SETTINGS.search(line):
            current = {"mode": None, "capture_sizes": [], "rows": []}
            tables.append(current)
            continue
        if current is None:
            continue
        if m := _MODE.match(line):
            current["mode"] = m.group(1)
        elif m := _SIZES.match(line):
            current["capture_sizes"] = [int(x) for x in m.group(1).replace(" ", "").split(",") if x]
        elif m := _ROW.match(line):
            current["rows"].append(
                {
                    "unpadded": int(m.group(1)),
                    "padded": int(m.group(2)),
                    "paddings": int(m.group(3)),
                    "runtime_mode": m.group(4),
                    "count": int(m.group(5)),
                }
            )
    return tables


def eager_batches(log: str) -> dict[str, Any] | None:
    """Batches vLLM ran eagerly although CUDA graphs were on (runtime mode ``NONE`` under a
    mode that is not ``NONE``), with the captured sizes; None when the log has no CUDA-graph
    stats (the server ran without ``--cudagraph-metrics``, or not vLLM). With graphs off
    (``enforce_eager``: mode ``NONE``) every batch is eager by choice and nothing is flagged."""
    tables = [t for t in parse_cudagraph_stats(log) if t["rows"]]
    if not tables:
        return None
    sizes = sorted({s for t in tables for s in t["capture_sizes"]})
    graphs_on = any(t["mode"] not in (None, "NONE") for t in tables)
    eager: dict[int, int] = {}
    total = 0
    for table in tables:
        for row in table["rows"]:
            total += row["count"]
            if graphs_on and row["runtime_mode"] == "NONE":
                eager[row["unpadded"]] = eager.get(row["unpadded"], 0) + row["count"]
    eager_count = sum(eager.values())
    flagged = eager_count > 0
    largest = max(sizes) if sizes else None
    return {
        "capture_sizes": sizes,
        "graphs_on": graphs_on,
        "eager_sizes": sorted(eager),
        "eager_count": eager_count,
        "batches": total,
        "flagged": flagged,
        "reason": (
            f"{eager_count} of {total} batches ran eagerly (sizes {sorted(eager)}), not among "
            f"the captured CUDA-graph sizes {sizes}"
            + (f" (largest {largest})" if largest is not None else "")
            if flagged
            else f"every batch ran on a CUDA graph or as configured ({total} batches)"
        ),
    }


def _p99(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def client_lag(
    *,
    cpu_s: float | None,
    wall_s: float | None,
    output_tokens: int | None = None,
    lag_samples_ms: Iterable[float] = (),
) -> dict[str, Any] | None:
    """Whether the benchmark client kept up: its CPU time over the wall time (one event loop
    uses one core), its CPU per output token, and its event loop's lag (how late a timer fired:
    every token timestamp is late by as much). None when neither figure was recorded."""
    lags = [float(x) for x in lag_samples_ms]
    if (cpu_s is None or not wall_s) and not lags:
        return None
    out: dict[str, Any] = {}
    reasons = []
    if cpu_s is not None and wall_s:
        busy = cpu_s / wall_s
        out["cpu_busy"] = round(busy, 4)
        if output_tokens:
            out["cpu_ms_per_token"] = round(1000.0 * cpu_s / output_tokens, 4)
        if busy >= CLIENT_CPU_BUSY:
            reasons.append(
                f"the client used {busy:.0%} of a core over the benchmark "
                f"({cpu_s:.1f} s CPU in {wall_s:.1f} s): answers waited for it"
            )
    if lags:
        p99 = _p99(lags)
        out["loop_lag_p99_ms"] = round(p99, 3)
        out["loop_lag_max_ms"] = round(max(lags), 3)
        if p99 > CLIENT_LAG_P99_MS:
            reasons.append(
                f"the client's event loop lagged {p99:.0f} ms (p99 of {len(lags)} samples, "
                f"limit {CLIENT_LAG_P99_MS:.0f} ms): token times are late by as much"
            )
    out["flagged"] = bool(reasons)
    out["reason"] = "; ".join(reasons) or "the client kept up"
    return out


class LoopLagProbe:
    """Samples the running event loop's lag: a timer set every ``interval_s`` fires late by the
    time the loop was busy elsewhere. ``async with LoopLagProbe() as probe:`` around the
    benchmark; ``probe.samples_ms`` then feeds :func:`client_lag`."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.samples_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            late = time.perf_counter() - start - self.interval_s
            self.samples_ms.append(max(0.0, late) * 1000.0)

    async def __aenter__(self) -> LoopLagProbe:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class ClientMeter:
    """The benchmark client's own load, around the benchmark: CPU time of the event loop's
    thread (the one that must keep up with every stream), wall time, and the loop's lag.
    ``async with ClientMeter() as meter: ...``; then ``meter.report(output_tokens)``."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.probe = LoopLagProbe(interval_s)
        self.cpu_s: float | None = None
        self.wall_s: float | None = None
        self._start: tuple[float, float] | None = None

    async def __aenter__(self) -> ClientMeter:
        self._start = (time.thread_time(), time.perf_counter())
        await self.probe.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.probe.__aexit__(*exc)
        if self._start is not None:
            self.cpu_s = time.thread_time() - self._start[0]
            self.wall_s = time.perf_counter() - self._start[1]

    def report(self, output_tokens: int | None = None) -> dict[str, Any] | None:
        return client_lag(
            cpu_s=self.cpu_s,
            wall_s=self.wall_s,
            output_tokens=output_tokens,
            lag_samples_ms=self.probe.samples_ms,
        )


def trial_traps(
    *,
    server_metrics: Mapping[str, Any] | None = None,
    server_log: str | None = None,
    client: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One trial's traps, for ``user_attrs["traps"]``: ``prefix_cache``, ``eager_batches``,
    ``client`` (each only where its evidence was recorded), and ``flagged``: the reasons of
    those that were flagged (empty when none was)."""
    found: dict[str, Any] = {}
    prefix = prefix_cache_trap(server_metrics)
    if prefix is not None:
        found["prefix_cache"] = prefix
    eager = eager_batches(server_log) if server_log else None
    if eager is not None:
        found["eager_batches"] = eager
    if client is not None:
        found["client"] = dict(client)
    found["flagged"] = [v["reason"] for v in found.values() if v.get("flagged")]
    return found
