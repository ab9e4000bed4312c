"""Where a trial's time goes: seconds per phase, stored as the trial's ``time_s``.

A launch costs what it costs (a demo start is seconds, a GLM-5 start minutes of weights,
torch.compile and CUDA-graph capture), and a short screen is worth only what it saves of the
measurement. So each trial records how long it spent starting its server, in the gate,
measuring and stopping, and ``show`` and the report add them up over the study ("Where the time
went", ``results.time_spent``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: the phases of one trial, in the order they happen
STARTUP = "startup"  # spawn -> the server answered its first completion
GATE = "gate"  # the reference recorded or the trial's outputs compared with it
MEASUREMENT = "measurement"  # the benchmark and the check of its answers under load
TEARDOWN = "teardown"  # the server's group stopped and proven gone, its files stored
PHASES = (STARTUP, GATE, MEASUREMENT, TEARDOWN)


class PhaseClock:
    """One phase at a time: starting a phase ends the one before. Seconds add up per phase
    (a phase entered twice counts both times)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._seconds: dict[str, float] = {}
        self._current: str | None = None
        self._since = 0.0

    def start(self, phase: str) -> None:
        self.stop()
        self._current, self._since = phase, self._clock()

    def stop(self) -> None:
        if self._current is not None:
            spent = self._clock() - self._since
            self._seconds[self._current] = self._seconds.get(self._current, 0.0) + spent
            self._current = None

    def seconds(self) -> dict[str, float]:
        """Each phase entered so far, with its seconds (the running one up to now)."""
        out = dict(self._seconds)
        if self._current is not None:
            out[self._current] = out.get(self._current, 0.0) + self._clock() - self._since
        return {phase: round(value, 3) for phase, value in out.items()}
