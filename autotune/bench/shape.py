"""How a benchmark's answers arrived (the ``stream_shape`` record): the single-request headline
(a user's tok/s = tokens / end-to-end time, TTFT and TPOT beside it), tokens per chunk, and the
bursty responses whose per-chunk clock measured a flush, not decoding (``bench/phase.py``'s
``RequestRecord.bursty``). A figure never measured is None, never 0.0.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from autotune import names
from autotune.bench.phase import RequestRecord, percentile


def _median(values: Sequence[float | None], scale: float = 1.0) -> float | None:
    known = [v * scale for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def stream_shape(single: Sequence[RequestRecord], load: Sequence[RequestRecord]) -> dict[str, Any]:
    """How the answers arrived (the ``stream_shape`` record): the single-request headline (a
    user's tok/s = tokens / e2e, TTFT and TPOT beside it, medians), tokens per chunk, bursty
    responses, and which figures bursts made meaningless. A figure never measured is None."""
    single_ok = [r for r in single if r.ok]
    load_ok = [r for r in load if r.ok]
    every = single_ok + load_ok
    bursty_load = sum(r.bursty for r in load_ok)
    tpots = [r.tpot_s * 1000 for r in load_ok if r.tpot_s is not None and not r.bursty]
    shape: dict[str, Any] = {
        "single": {
            "tokens_per_s": _median([r.tokens_per_s for r in single_ok]),
            "ttft_ms": _median([r.ttft_s for r in single_ok], 1000),
            "tpot_ms": _median([r.tpot_s for r in single_ok if not r.bursty], 1000),
            "bursty": sum(r.bursty for r in single_ok),
            "responses": len(single_ok),
        },
        "tokens_per_chunk": _median([r.tokens_per_chunk for r in every]),
        "bursty": sum(r.bursty for r in every),
        "responses": len(every),
        "tpot_ms": {
            f"p{q}": round(percentile(tpots, q), 4) if tpots else None for q in names.PERCENTILES
        },
    }
    if bursty_load:
        shape["itl"] = "bursty"  # the ITL percentiles are absent, not 0.0
    if shape["single"]["bursty"]:
        shape["decode"] = "bursty: tokens / end-to-end time for the bursty responses"
    return shape
