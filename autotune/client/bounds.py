"""How long a stream may run on: the max_tokens cap every request of autotune enforces.

A server that ignores ``max_tokens`` streams on for ever; the no-token deadline never fires on
it, since tokens keep coming. The benchmark (``bench/phase.py``) and the gate
(``gate/requests.py``) both end such a stream once it is past :func:`runaway_cap` (in tokens, or
in events: :func:`runs_away`), as the
config's protocol failure (:data:`PROTOCOL_VIOLATION`, recorded ``protocol_violation``), never
as a fault of the machine.
"""

from __future__ import annotations

#: the start of an error that is the config's protocol failure, not a fault
PROTOCOL_VIOLATION = "protocol violation"


#: answer-carrying events a stream may send per token of :func:`runaway_cap`: a token's text may
#: be split over a few events, so only a stream far past the cap is ended by its events
EVENTS_PER_TOKEN = 4


def runaway_cap(max_tokens: int) -> int:
    """The most tokens a stream may send for ``max_tokens`` before it is ended as a protocol
    violation: ``max_tokens`` plus a slack of max(8, 10%)."""
    return max_tokens + max(8, max_tokens // 10)


def runs_away(tokens: int, events: int, cap: int) -> bool:
    """Whether a stream that sent ``tokens`` tokens in ``events`` answer-carrying events is past
    ``cap`` (:func:`runaway_cap`). By its events too, whatever its token ids say: a stream that
    sends one id and then text-only (or finish-only) chunks for ever never raises its id count,
    and each chunk restarts the no-token deadline, so without this bound it never ended."""
    return tokens > cap or events > EVENTS_PER_TOKEN * cap
