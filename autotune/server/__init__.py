"""The server's lifecycle: start, readiness, and a teardown that proves no process survives.

* :mod:`~autotune.server.process` -- :class:`ServerProcess`;
* :mod:`~autotune.server.oom` -- out-of-memory evidence (kernel, cgroup, memory);
* :mod:`~autotune.server.metrics` -- the engine's ``/metrics`` read around each phase.
"""

from __future__ import annotations

from autotune.server.process import ServerProcess

__all__ = ["ServerProcess"]
