"""Process-group plumbing for server.py: free ports, group signals, proof that a group is gone.

vLLM renames its children (``VLLM::EngineCore``), so processes are found by process group and
by recorded descendant pids, never by name. A pid alone is not an identity (pids are reused), so
every remembered process is a ``(pid, create_time)`` pair and is only signalled while both match.

A helper that calls ``setsid`` and double-forks leaves the server's process group and, once its
parent exits, the server's tree; it can only be found by having been seen. Two things see it:
:class:`DescendantTracker` samples the server's descendants every few tenths of a second, and
:func:`become_subreaper` makes autotune the Linux "child subreaper" of what it starts, so an
orphaned helper is re-parented to autotune (not to init) and stays findable as an adopted child.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import psutil

#: seconds between two samples of a running server's descendants
TRACK_INTERVAL_S = 0.25
#: two create times of one process differ by less than this (psutil derives them from ticks)
_SAME_START_S = 1.0
_PR_SET_CHILD_SUBREAPER = 36


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago. The server may still lose a race for it; the caller
    treats 'address already in use' as an infrastructure fault and retries."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def machine_id() -> str:
    """Which process table a recorded pid belongs to: the hostname, the boot and the pid
    namespace (two containers on one host with host networking share a hostname, not pids)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            boot = handle.read().strip()[:8]
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}/{namespace}"


def on_this_machine(record: Mapping[str, object]) -> bool:
    """Whether a recorded process (a worker, a server) lives in this machine's process table:
    by ``machine`` where recorded, else (older records) by ``hostname``."""
    if record.get("machine"):
        return record.get("machine") == machine_id()
    return record.get("hostname") in (None, socket.gethostname())


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def same_process(pid: int, started: float | None) -> bool:
    """Whether ``pid`` is alive (not a zombie) and, when ``started`` is known, is still the
    process that was created then (not a later process that reused the pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - float(started)) < _SAME_START_S
    except (psutil.Error, ValueError, TypeError):
        return False


def live_tracked(tracked: Mapping[int, float | None]) -> set[int]:
    """The remembered ``pid -> create_time`` entries that are still the same live process."""
    return {pid for pid, started in tracked.items() if same_process(pid, started)}


def group_members(
    pgid: int | None,
    extra_pids: set[int] | frozenset[int] = frozenset(),
    tracked: Mapping[int, float | None] | None = None,
) -> list[int]:
    """Live pids in process group ``pgid`` plus any of ``extra_pids`` still alive, plus any of
    ``tracked`` (pid -> create time) that is still the same process."""
    members = live_tracked(tracked) if tracked else set()
    for proc in psutil.process_iter(["pid"]) if pgid is not None else ():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.add(proc.pid)
        except (ProcessLookupError, psutil.Error, PermissionError):
            continue
    for pid in extra_pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                members.add(pid)
        except psutil.Error:
            continue
    return sorted(members)


def descendants(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _signal_all(pgid: int | None, pids: list[int], sig: int) -> None:
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


#: set in every server's environment by ``ServerProcess`` (a token unique to that launch):
#: every process the server ever starts inherits it, also one that escaped into its own
#: session and was re-parented, so teardown and ``autotune cleanup`` find them in /proc
MARKER_ENV = "AUTOTUNE_SERVER_MARKER"


def marked_processes(marker: str | None) -> dict[int, float | None]:
    """Live processes whose environment carries ``MARKER_ENV=marker``: ``pid -> create_time``
    (this process excluded; processes whose environ cannot be read are skipped)."""
    if not marker:
        return {}
    needle = f"{MARKER_ENV}={marker}".encode()
    found: dict[int, float | None] = {}
    own = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            pid = int(entry)
            if process_alive(pid):
                found[pid] = create_time(pid)
    return found


def cmdline(pid: int) -> str:
    """A process's command line, for the record ("" when it is gone or unreadable)."""
    try:
        return " ".join(psutil.Process(pid).cmdline())[:300]
    except psutil.Error:
        return ""


def stop_group(
    pgid: int | None,
    *,
    extra_pids: set[int] | frozenset[int] = frozenset(),
    tracked: Mapping[int, float | None] | None = None,
    grace_s: float = 10.0,
    kill_wait_s: float = 5.0,
    discover: Callable[[], Mapping[int, float | None]] | None = None,
    killed: list[dict[str, object]] | None = None,
) -> list[int]:
    """SIGTERM the group (and stray descendants), SIGKILL what is left after ``grace_s``.

    ``pgid`` None signals no group (its number may belong to someone else now): only the pids.
    ``tracked`` (pid -> create time) are signalled only while they are the same process, so a
    reused pid is never hit. Adopted orphans (see :func:`become_subreaper`) are reaped.
    ``discover`` is asked for more processes on every look, during the grace period and after
    SIGKILL too (a helper may fork while it is being stopped): what it finds is tracked from
    then on and signalled like the rest. Each process that had to be SIGKILLed is appended to
    ``killed`` as ``{"pid", "cmdline", "signal"}``.

    Returns the pids that survived even SIGKILL (normally empty): the caller reports them.
    """
    tracked = dict(tracked or {})
    termed: set[int] = set()
    killed_pids: set[int] = set()

    def members_now() -> list[int]:
        # "None left" is proven by a look for more taken *after* every known one was gone: a
        # process forks its successor before it dies, so that look sees the successor.
        while True:
            _reap(tracked)
            members = group_members(pgid, extra_pids, tracked)
            if members or discover is None:
                return members
            before = set(tracked)
            with contextlib.suppress(Exception):  # finding more must never stop the stopping
                for pid, started in discover().items():
                    tracked.setdefault(pid, started)
            if not live_tracked({p: tracked[p] for p in set(tracked) - before}):
                return []

    def signal_new(members: list[int], sig: int, done: set[int]) -> None:
        fresh = [pid for pid in members if pid not in done]
        if sig == signal.SIGKILL and killed is not None:
            for pid in fresh:
                killed.append({"pid": pid, "cmdline": cmdline(pid), "signal": "SIGKILL"})
        _signal_all(None, fresh, sig)
        done.update(fresh)

    def finish(survivors: list[int]) -> list[int]:
        # the last look found none alive, but a tracked process that died since (a vLLM worker
        # whose engine core went first) is now our zombie: collect it, or it stays for the run
        _reap(tracked)
        return survivors

    members = members_now()
    if not members:
        return finish([])
    signal_new(members, signal.SIGTERM, termed)
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        members = members_now()
        if not members:
            return finish([])
        signal_new(members, signal.SIGTERM, termed)  # forked since: they get theirs
        time.sleep(0.05)
    deadline = time.monotonic() + kill_wait_s
    while True:
        members = members_now()
        if not members:
            return finish([])
        signal_new(members, signal.SIGKILL, killed_pids)
        _signal_all(pgid, members, signal.SIGKILL)  # again: a kill may race a fork
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return finish(members_now())


def _reap(tracked: Mapping[int, float | None] | None) -> None:
    """Collect the exit status of adopted orphans among ``tracked`` (they are our children
    once autotune is their subreaper); never touches a child a ``Popen`` object owns, since
    those are not in ``tracked`` unless they were adopted."""
    for pid in tracked or ():
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux >= 3.4): a helper that
    double-forks away from the server is re-parented here instead of to init, so it can still
    be found. Returns False where that is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class DescendantTracker:
    """Remembers every process seen below a server while it runs, as ``pid -> create_time``.

    A background thread samples every ``interval_s``; :meth:`sample` takes one more sample on
    demand (at readiness, at stop). Processes adopted by this (subreaper) process while the
    server runs, created after it and outside autotune's own session, count as the server's:
    they are helpers that double-forked out of its tree. ``on_new`` gets the whole map (a copy)
    whenever a new process appears, from the tracking thread.
    """

    def __init__(
        self,
        pid: int,
        *,
        interval_s: float = TRACK_INTERVAL_S,
        on_new: Callable[[dict[int, float | None]], None] | None = None,
    ) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.on_new = on_new
        self.seen: dict[int, float | None] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = create_time(pid) or time.time()
        self._own_sid = os.getsid(0)

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(
            target=self._loop, name=f"descendants-{self.pid}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.sample()

    def snapshot(self) -> dict[int, float | None]:
        with self._lock:
            return dict(self.seen)

    def add(self, found: Mapping[int, float | None]) -> None:
        """Remember processes found another way (``marked_processes``) as seen."""
        with self._lock:
            for pid, started in found.items():
                self.seen.setdefault(pid, started)

    def sample(self) -> None:
        found: dict[int, float | None] = {}
        for proc in self._candidates():
            with contextlib.suppress(psutil.Error):
                found[proc.pid] = proc.create_time()
        with self._lock:
            new = {pid: t for pid, t in found.items() if pid not in self.seen}
            self.seen.update(new)
            copy = dict(self.seen) if new else None
        if copy is not None and self.on_new is not None:
            with contextlib.suppress(Exception):  # recording is best effort; stop() still kills
                self.on_new(copy)

    def _candidates(self) -> list[psutil.Process]:
        procs: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            procs += psutil.Process(self.pid).children(recursive=True)
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(os.getpid()).children():
                if child.pid == self.pid or not self._adopted_from_server(child):
                    continue
                procs.append(child)
                with contextlib.suppress(psutil.Error):
                    procs += child.children(recursive=True)
        return procs

    def _adopted_from_server(self, child: psutil.Process) -> bool:
        try:
            return (
                child.create_time() >= self._started - 0.01
                and os.getsid(child.pid) != self._own_sid
                and child.status() != psutil.STATUS_ZOMBIE
            )
        except (psutil.Error, OSError):
            return False

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()


def process_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_captured(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run a short-lived program (an engine's ``--version`` or ``--help``) and capture its
    output as text: no stdin (it must never wait for a terminal), a timeout, no shell. Raises
    ``OSError`` or ``subprocess.TimeoutExpired``; a non-zero exit is the caller's to judge."""
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )


#: the signals that end autotune (Ctrl-C, ``kill``, a closed terminal), held back while a
#: server is being stopped
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold back Ctrl-C, SIGTERM and SIGHUP while the block runs, then deliver them.

    Stopping a server takes up to its grace period; a signal that arrived then (a second
    Ctrl-C, ``timeout``, ``docker stop``) raised inside the wait, unwound the stop half-done and
    left the server running for good: its trial was recorded as ended, so neither ``autotune
    cleanup`` nor a resumed run ever looked for it. Held, the signal is raised again once the
    server is proved gone, and does what it would have done. Only the main thread can set
    handlers (Python runs them there); elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}
    for sig in STOP_SIGNALS:
        with contextlib.suppress(ValueError, OSError):
            previous[sig] = signal.signal(sig, lambda number, _frame: caught.append(number))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: a handler not set from Python, left as it is
                signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)


def listening_addresses(port: int) -> list[str] | None:
    """The local addresses that listen on TCP ``port`` on this machine (None: the socket
    table could not be read)."""
    try:
        found = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return None
    return sorted(
        {c.laddr.ip for c in found if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    )
