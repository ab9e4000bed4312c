"""How ``autotune`` ends when it is told to stop by a signal rather than by Ctrl-C."""

from __future__ import annotations

import signal


def stop_on_termination() -> None:
    """SIGTERM and SIGHUP stop a command the way Ctrl-C does (KeyboardInterrupt): the trial
    is stopped and recorded and every server the command started is stopped. Without this a
    ``timeout``, ``docker stop``, a batch scheduler's preemption or a closed SSH session
    ended the process at once, and the vLLM server it had started lived on, re-parented to
    init. A second signal while the first is being handled is ignored, so the cleanup is not
    cut short (SIGKILL still ends everything; the next ``run`` stops what that leaves)."""

    def again(_signum: int, _frame: object) -> None:
        # a Python no-op, not SIG_IGN: an ignored signal would be inherited by any process
        # started from here on, which could then not be stopped with SIGTERM
        return

    def handler(signum: int, _frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, again)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
