"""How ``autotune`` ends when it is told to stop by a signal rather than by Ctrl-C, and what a
stopped trial then says stopped it (SIGTERM is recorded as SIGTERM, not as Ctrl-C)."""

from __future__ import annotations

import signal

#: the signal that ended this command, once one did (None: Ctrl-C, or nothing yet)
_received: str | None = None


class Terminated(KeyboardInterrupt):
    """A KeyboardInterrupt raised by a termination signal; ``args[0]`` is its name."""

    @property
    def signal_name(self) -> str:
        return str(self.args[0]) if self.args else "a signal"


def stopped_by(exc: BaseException | None = None) -> str:
    """Who stopped the command, as a trial's record says it: ``SIGTERM`` (or ``SIGHUP``) when
    a termination signal did, else ``the user (Ctrl-C)``. ``exc`` is the interruption caught
    (it may be a bare KeyboardInterrupt or asyncio's CancelledError that the signal turned
    into on its way up); the signal received is remembered either way."""
    if isinstance(exc, Terminated):
        return exc.signal_name
    return _received or "the user (Ctrl-C)"


def interrupted_detail(exc: BaseException | None = None) -> str:
    """The detail of a trial an interruption ended (``names`` reason ``interrupted``)."""
    return f"stopped by {stopped_by(exc)} while this trial ran"


def terminated_by(signum: int) -> Terminated:
    """Remember that signal ``signum`` stops this command; the exception to raise for it."""
    global _received
    _received = signal.Signals(signum).name
    return Terminated(_received)


def stop_on_termination() -> None:
    """SIGTERM and SIGHUP stop a command the way Ctrl-C does (KeyboardInterrupt): the trial
    is stopped and recorded and every server the command started is stopped. Without this a
    ``timeout``, ``docker stop``, a batch scheduler's preemption or a closed SSH session
    ended the process at once, and the vLLM server it had started lived on, re-parented to
    init. A second signal while the first is being handled is ignored, so the cleanup is not
    cut short (SIGKILL still ends everything; the next ``run`` stops what that leaves). The
    signal is remembered (:func:`stopped_by`), so the record names it."""

    def again(_signum: int, _frame: object) -> None:
        # a Python no-op, not SIG_IGN: an ignored signal would be inherited by any process
        # started from here on, which could then not be stopped with SIGTERM
        return

    def handler(signum: int, _frame: object) -> None:
        global _received
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, again)
        _received = signal.Signals(signum).name
        raise Terminated(_received)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
