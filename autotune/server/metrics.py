"""Server-side evidence: the engine's own Prometheus ``/metrics``, read around each phase.

The client's figures say how fast answers came; the server's counters say why: requests queued
(``requests_waiting``), the KV cache full (``kv_cache_usage``), sequences evicted and recomputed
(``preemptions``, a config that looks fast at one load and collapses at the next), prefix-cache
hits, speculative-decoding acceptance. autotune reads them from the server it measures:

* before and after every benchmark phase (warm-up, single-request, load): counter **deltas**
  per phase and over the whole benchmark;
* every ``interval_s`` while the benchmark runs: gauges' **max and mean** as seen.

Names differ per engine, so the engine supplies a :class:`MetricsMap` (generic name -> the
Prometheus family names that carry it; vLLM's is ``engines/vllm/metrics.py``). A server without
``/metrics``, or one that answers something else, is recorded ``available: false`` with the
reason; it never fails a trial (evidence is optional, the measurement is not).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Mapping
from typing import Any

import httpx

from autotune._prometheus import totals
from autotune.client.send import get_whole
from autotune.engines.base import MetricsMap

METRICS_PATH = "/metrics"
#: seconds between gauge samples while a benchmark runs (one small GET; vLLM's page is a few kB)
SAMPLE_INTERVAL_S = 1.0
#: seconds one scrape may take in all (a page that trickles never ends a per-read timeout)
SCRAPE_TOTAL_S = 5.0


def parse(text: str) -> dict[str, float]:
    """Prometheus text -> {family name: value summed over label sets} (see
    :func:`autotune._prometheus.totals`). Raises ``ValueError`` on text that is not the format."""
    return totals(text)


def _pick(values: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


class ServerMetricsRecorder:
    """Scrapes ``/metrics`` through the benchmark's own client (same base URL and key).

    Use: ``await start()``; pass :meth:`phase` to ``run_benchmark(phase_hook=...)``;
    ``await stop()`` returns the record (always a dict, never raises).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        mapping: MetricsMap | None,
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        path: str = METRICS_PATH,
    ) -> None:
        self.client = client
        self.mapping = mapping
        self.interval_s = interval_s
        self.path = path
        self.unavailable: str | None = None
        self.scrapes = 0
        self.scrape_errors: list[str] = []
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._phase_start: dict[str, dict[str, float]] = {}
        self._phases: dict[str, dict[str, Any]] = {}
        self._gauges: dict[str, list[float]] = {}  # all samples of the benchmark
        self._phase_gauges: dict[str, dict[str, list[float]]] = {}
        self._active: set[str] = set()
        self._poller: asyncio.Task[None] | None = None

    async def _scrape(self) -> dict[str, float]:
        response = await get_whole(self.client, self.path, total_s=SCRAPE_TOTAL_S)
        if response.status_code != 200:
            raise ValueError(f"GET {self.path} answered {response.status_code}")
        values = parse(response.text)
        self.scrapes += 1
        self._last = values
        self._sample_gauges(values)
        return values

    async def _try_scrape(self) -> dict[str, float] | None:
        if self.unavailable:
            return None
        try:
            return await self._scrape()
        except (httpx.HTTPError, ValueError, TimeoutError) as exc:
            self.scrape_errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return None

    def _sample_gauges(self, values: Mapping[str, float]) -> None:
        if self.mapping is None:
            return
        for name, families in self.mapping.gauges.items():
            value = _pick(values, families)
            if value is None:
                continue
            self._gauges.setdefault(name, []).append(value)
            for phase in self._active:
                self._phase_gauges.setdefault(phase, {}).setdefault(name, []).append(value)

    async def start(self) -> None:
        """The first scrape; when it fails the server is recorded without metrics."""
        if self.mapping is None:
            self.unavailable = "the engine names no Prometheus metrics"
            return
        try:
            self._first = await self._scrape()
        except (httpx.HTTPError, ValueError, TimeoutError) as exc:
            self.unavailable = f"{type(exc).__name__}: {exc}"[:300]
            return
        known = [n for names in (*self.mapping.gauges.values(), *self.mapping.counters.values())
                 for n in names if n in self._first]  # fmt: skip
        if not known:
            self.unavailable = f"{self.path} carries none of the engine's known metric names"
            return
        self._poller = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._try_scrape()

    async def phase(self, name: str, event: str) -> None:
        """``run_benchmark``'s phase hook: ``event`` is ``start`` or ``end``."""
        if self.unavailable:
            return
        values = await self._try_scrape()
        if event == "start":
            self._active.add(name)
            self._phase_start[name] = values if values is not None else dict(self._last)
            return
        self._active.discard(name)
        before = self._phase_start.pop(name, None)
        if before is None or values is None:
            self._phases[name] = {"error": "no scrape at the phase's start or end"}
            return
        record = self._deltas(before, values)
        record.update(_gauge_stats(self._phase_gauges.pop(name, {})))
        self._phases[name] = record

    def _deltas(self, before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        assert self.mapping is not None
        for name, families in self.mapping.counters.items():
            a, b = _pick(before, families), _pick(after, families)
            if a is None or b is None:
                continue
            # a counter that went down was reset (a restarted engine process): count from zero
            out[name] = b - a if b >= a else b
        hits, queries = out.get("prefix_cache_hits"), out.get("prefix_cache_queries")
        if hits is not None and queries:
            out["prefix_cache_hit_rate"] = round(hits / queries, 4)
        accepted = out.get("spec_decode_accepted_tokens")
        drafted = out.get("spec_decode_draft_tokens")
        if accepted is not None and drafted:
            out["spec_decode_acceptance_rate"] = round(accepted / drafted, 4)
        return out

    async def stop(self) -> dict[str, Any]:
        """The record stored per trial (``server_metrics``)."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self.unavailable:
            return {"available": False, "reason": self.unavailable, "source": self.path}
        await self._try_scrape()
        total = self._deltas(self._first, self._last)
        total.update(_gauge_stats(self._gauges))
        record: dict[str, Any] = {
            "available": True,
            "source": self.path,
            "total": total,
            "phases": self._phases,
            "scrapes": self.scrapes,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        if self.scrape_errors:
            record["scrape_errors"] = self.scrape_errors[:5]
        return record


def _gauge_stats(samples: Mapping[str, list[float]]) -> dict[str, float]:
    out = {}
    for name, values in samples.items():
        if values:
            out[f"{name}_max"] = round(max(values), 4)
            out[f"{name}_mean"] = round(statistics.fmean(values), 4)
    return out


def preemption_notes(rows: Any) -> list[str]:
    """One line per trial whose server preempted sequences while it was measured (``show``):
    its throughput was bought with recomputation, or its KV cache was too small for the load."""
    notes = []
    for row in rows:
        record = getattr(row, "server_metrics", None) or {}
        count = (record.get("total") or {}).get("preemptions") if record.get("available") else None
        if count:
            kv = (record.get("total") or {}).get("kv_cache_usage_max")
            extra = f", KV cache usage up to {kv:.0%}" if isinstance(kv, int | float) else ""
            notes.append(
                f"trial {row.number}: the server preempted {count:g} sequences during the "
                f"benchmark{extra} (KV cache too small for the load; figures include recompute)"
            )
    return notes
