"""Speculative decoding: how often the drafts were right, read from the engine's ``/metrics``.

A speculative config is a search dimension like any other (keys of ``--speculative-config`` as
JSON-key parameters; see ``search_spaces/cpu-demo.yaml``), and the correctness gate holds it to
the baseline's greedy tokens like any other: greedy verification is lossless only when the
engine's verification is right, and a bug that accepts a wrong draft gives fluent, different text
that no benchmark sees. What the gate cannot say is *why* a speculative config is fast or slow:
that is the acceptance. vLLM counts it in Prometheus counters (vLLM 0.32, measured on the CPU
build with the n-gram proposer)::

    vllm:spec_decode_num_drafts_total               steps in which drafts were proposed
    vllm:spec_decode_num_draft_tokens_total         draft tokens proposed
    vllm:spec_decode_num_accepted_tokens_total      draft tokens the model agreed with
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}

From them: acceptance rate = accepted / draft tokens, and mean accepted length = 1 + accepted /
drafts (tokens emitted per verification step, the bonus token included: vLLM's own definition in
``vllm/v1/spec_decode/metrics.py``). Counters are summed over label sets (engines, models) and
cover the server's whole life (checks and benchmark), since every trial starts its own server.

The engine's :meth:`~autotune.engines.base.Engine.evidence` hook calls :func:`evidence` after
the benchmark, and before an ``incorrect_output`` verdict is raised (the drafts that were
accepted are evidence of that failure too). It never fails a trial: a scrape that does not
work is recorded as ``{"error": ...}``. It only sends a request when the trial's settings
carry ``--speculative-config``.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from autotune._prometheus import samples
from autotune.space.settings import ServerSettings

#: the JSON flag that turns speculation on (absent = no speculation, nothing to scrape)
FLAG = "--speculative-config"
#: trial user attribute holding :meth:`SpecDecodeStats.to_dict`
SCRAPE_TIMEOUT_S = 10.0

_DRAFTS = "vllm:spec_decode_num_drafts_total"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecDecodeStats:
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    #: accepted tokens per draft position (0 = the first draft token)
    accepted_per_position: tuple[float, ...] = ()

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accepted_per_position"] = list(self.accepted_per_position)
        rate, length = self.acceptance_rate, self.mean_accepted_length
        out["acceptance_rate"] = None if rate is None else round(rate, 4)
        out["mean_accepted_length"] = None if length is None else round(length, 4)
        return out


def parse_metrics(text: str) -> SpecDecodeStats | None:
    """The spec-decode counters of a Prometheus text exposition, or None when it has none
    (speculation off, an engine that does not count it, or text that is not the format)."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    try:
        found = samples(text)
    except ValueError:
        return None
    for sample in found:
        if sample.name not in (_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _PER_POS):
            continue
        if sample.name == _PER_POS:
            position = sample.labels.get("position", "")
            if position.isdigit():
                per_pos[int(position)] = per_pos.get(int(position), 0.0) + sample.value
            continue
        totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    if not {_DRAFTS, _DRAFT_TOKENS, _ACCEPTED} <= set(totals):
        return None
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)) if per_pos else ()
    return SpecDecodeStats(
        drafts=totals[_DRAFTS],
        draft_tokens=totals[_DRAFT_TOKENS],
        accepted_tokens=totals[_ACCEPTED],
        accepted_per_position=positions,
    )


def in_use(settings: ServerSettings) -> bool:
    return FLAG in settings.json_flags


async def scrape(client: httpx.AsyncClient) -> dict[str, Any]:
    """GET ``/metrics`` and parse it: the stats as a dict, or ``{"error": why}``."""
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):  # in all: a page may trickle
            response = await client.get("/metrics", timeout=SCRAPE_TIMEOUT_S)
        response.raise_for_status()
    except (httpx.HTTPError, TimeoutError, ValueError) as exc:
        return {"error": f"GET /metrics failed: {type(exc).__name__}: {exc}"[:300]}
    stats = parse_metrics(response.text)
    if stats is None:
        return {"error": "/metrics has no vllm:spec_decode_* counters"}
    return stats.to_dict()


async def evidence(client: httpx.AsyncClient, settings: ServerSettings) -> dict[str, Any] | None:
    """The acceptance (with the trial's ``--speculative-config``) when the trial speculates;
    None, without a request, when it does not."""
    if not in_use(settings):
        return None
    stats = await scrape(client)
    stats["config"] = dict(settings.json_flags[FLAG])
    return stats
