"""How long a stream may run on: the max_tokens cap every request of autotune enforces.

A server that ignores ``max_tokens`` streams on for ever; the no-token deadline never fires on
it, since tokens keep coming. The benchmark (``bench/phase.py``) and the gate
(``gate/requests.py``) both end such a stream once it is past :func:`runaway_cap`, as the
config's protocol failure (:data:`PROTOCOL_VIOLATION`, recorded ``protocol_violation``), never
as a fault of the machine.
"""

from __future__ import annotations

#: the start of an error that is the config's protocol failure, not a fault
PROTOCOL_VIOLATION = "protocol violation"


def runaway_cap(max_tokens: int) -> int:
    """The most tokens a stream may send for ``max_tokens`` before it is ended as a protocol
    violation: ``max_tokens`` plus a slack of max(8, 10%)."""
    return max_tokens + max(8, max_tokens // 10)
