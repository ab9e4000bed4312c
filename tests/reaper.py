"""TEST HARNESS: no process a test started outlives the pytest session that started it.

The servers tests start run in sessions of their own (``start_new_session``), so neither a
Ctrl-C in the terminal nor the end of pytest reaches them; each must be stopped by name. Three
ways one was not:

* pytest sent SIGTERM (``timeout``, a cancelled CI job): Python's default action ends the
  process at once, no ``finally`` and no fixture teardown runs;
* a server started by a child the test runs: ``subprocess.run`` SIGKILLs its child on
  KeyboardInterrupt (``autotune run``, which never gets to stop its server), so the server's
  only owner is gone;
* an interrupt between ``Popen`` returning and the ``try`` that stops it.

So, once per session (:func:`start_session`, from tests/conftest.py):

* SIGTERM and SIGHUP become KeyboardInterrupt, exactly as Ctrl-C: the current test's
  ``finally`` blocks and every fixture's teardown run, and the session stops (also when a test
  swallows the KeyboardInterrupt, as the in-process ``autotune run`` does: it exits 130);
* a token in the environment (:data:`ENV`) that every process started from the session
  inherits, through any number of children, sessions and double forks; at the end of the
  session (and at exit) :func:`reap_all` stops every process that carries it, group and all,
  and every group registered with :func:`own`.

:func:`own` registers a group a helper started (``tests/fake_proc.py``), so it is stopped
even where its owner never ran its teardown. Processes are remembered as ``(pid, create time)``
and signalled only while both match (``autotune._proc``): a reused pid is never hit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import psutil

from autotune import _proc

#: the environment variable naming the pytest sessions a process was started from (a
#: nested session adds its token after its parent's: each one finds what any inner one left)
ENV = "AUTOTUNE_TEST_SESSION"
#: seconds a reaped process gets between SIGTERM and SIGKILL
GRACE_S = 3.0

_owned: dict[int, float | None] = {}
_token: str | None = None


def own(popen: subprocess.Popen) -> subprocess.Popen:
    """Remember ``popen``'s process group (it must lead one: ``start_new_session=True``) so
    :func:`reap_all` stops it should its owner never get to; returns ``popen``."""
    _owned[popen.pid] = _proc.create_time(popen.pid)
    return popen


def release(popen: subprocess.Popen) -> None:
    """Forget ``popen``: its owner stopped it."""
    _owned.pop(popen.pid, None)


def start_session(on_signal: Callable[[str], None] | None = None) -> str:
    """Tag this process's environment with a fresh token, stop what carries it at exit, and
    turn SIGTERM and SIGHUP into KeyboardInterrupt (``on_signal`` is called first, with the
    signal's name: pytest stops the session). A second signal while the first is handled is
    ignored, so the teardown is not cut short (SIGKILL still ends everything). Returns the
    token. A nested pytest session (a test that runs pytest) adds a token of its own."""
    global _token
    _token = uuid.uuid4().hex
    os.environ[ENV] = " ".join([*os.environ.get(ENV, "").split(), _token])
    atexit.register(reap_all)

    def again(_signum: int, _frame: object) -> None:
        # a Python no-op, not SIG_IGN: an ignored signal is inherited by every process
        # started from here on, which could then not be stopped with it
        return

    def handler(signum: int, _frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, again)
        name = signal.Signals(signum).name
        if on_signal is not None:
            on_signal(name)
        raise KeyboardInterrupt(name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    return _token


def carrying_token(token: str) -> dict[int, float | None]:
    """Every process (but this one and its ancestors) whose environment holds ``token``, as
    ``pid -> create time``. Other users' processes cannot be read, and are not ours."""
    mine = {os.getpid()} | {p.pid for p in _ancestors()}
    found: dict[int, float | None] = {}
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in mine:
            continue
        with contextlib.suppress(psutil.Error, OSError):
            if token in proc.environ().get(ENV, "").split():
                found[proc.pid] = proc.create_time()
    return found


def reap_all() -> list[int]:
    """Stop every registered group and every process started from this session (by the
    token), SIGTERM first and SIGKILL after :data:`GRACE_S`; Ctrl-C cannot cut this short.
    Returns the pids that were still running (leftovers: a test leaked them, or was
    interrupted). Safe to call again."""
    previous = signal.getsignal(signal.SIGINT)
    with contextlib.suppress(ValueError):  # not the main thread: nothing to hold off
        signal.signal(signal.SIGINT, lambda _s, _f: None)
    try:
        tracked = {pid: t for pid, t in _owned.items() if _proc.same_process(pid, t)}
        if _token is not None:
            tracked.update(carrying_token(_token))
        _owned.clear()
        if tracked:
            _stop(tracked)
        return sorted(tracked)
    finally:
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGINT, previous)


def _stop(tracked: dict[int, float | None]) -> None:
    """SIGTERM every tracked process and the group it leads or belongs to (never this
    process's own group, nor an ancestor's), SIGKILL what is left after the grace."""
    keep = {os.getpgid(0)} | {_pgid(p.pid) for p in _ancestors()}
    groups = {_pgid(pid) for pid in tracked} - keep - {None}
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        for pid in _proc.live_tracked(tracked):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap_children(tracked)
            if not _proc.live_tracked(tracked) and not _any_member(groups):
                return
            time.sleep(0.05)
    left = _proc.live_tracked(tracked)
    if left:
        print(f"tests/reaper.py: could not stop pids {sorted(left)}", file=sys.stderr)


def _any_member(groups: set[int | None]) -> bool:
    return any(_proc.group_members(pgid) for pgid in groups if pgid is not None)


def _reap_children(tracked: dict[int, float | None]) -> None:
    """Collect the exit status of our own children among ``tracked`` (a zombie is gone)."""
    for pid in tracked:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _ancestors() -> list[psutil.Process]:
    try:
        return psutil.Process().parents()
    except psutil.Error:
        return []
