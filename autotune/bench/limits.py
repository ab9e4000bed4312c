"""What ends a benchmark request besides its answer: every request ends.

* the no-token deadline (``workload.request_timeout_s``,
  :class:`autotune.client.stream.TokenDeadline`): only a token restarts it;
* the max_tokens cap (``client/bounds.py``, shared with the gate): a stream past it is the
  config's protocol failure, recorded ``protocol_violation``;
* the total bound (:func:`request_bound_s`): from the baseline's own end-to-end time, so a
  stream trickling a token just inside every deadline ends too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune import names
from autotune.bench.tokens import TokenCounter


def streamed_tokens(
    ids: Sequence[int], text: Sequence[str], times: Sequence[float], counter: TokenCounter
) -> int:
    """How many tokens a stream has sent so far: its ids, else its text by the tokenizer (a
    text-only server may split one token over several events), else its events over 4 (no
    tokenizer: only a stream far past the limit is cut). Counted only once the events already
    outnumber the cap, so the hot path pays nothing."""
    if ids:
        return len(ids)
    if counter.available:
        return counter.count("".join(text))
    return len(times) // 4


#: a benchmark request may take this many times the baseline's e2e p99 in all: far beyond any
#: correct config's slowdown under load, and a bound on a stream that never ends
REQUEST_BOUND_FACTOR = 10.0


def request_bound_s(baseline: Any, request_timeout_s: float) -> float | None:
    """Each benchmark request's total-time bound: :data:`REQUEST_BOUND_FACTOR` times the
    baseline trial's e2e p99, never under twice the no-token deadline. None while there is no
    measured baseline (the baseline itself: the deadline and the cap end its requests)."""
    if not baseline:
        return None
    e2e_ms = (baseline.user_attrs.get(names.METRICS) or {}).get(names.latency_metric("e2e", 99))
    if not e2e_ms:
        return None
    return max(2 * request_timeout_s, REQUEST_BOUND_FACTOR * e2e_ms / 1000.0)


#: a benchmark may lose at most this share of its requests (a rare dropped connection) and
#: still be scored, in a trial and in ``bench --url``; more is ``request_errors``
MAX_FAILED_FRACTION = 0.02
