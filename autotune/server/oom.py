"""Positive evidence that a server ran out of memory.

A server that dies by SIGKILL was not necessarily killed by the kernel's OOM killer: a user's
``kill -9``, a container runtime, a watchdog or the server itself send it too. Calling every
such death ``oom`` teaches the sampler that memory was the problem when it was not, so autotune
names ``oom`` only with evidence (the engine's own out-of-memory message is the first kind,
found in its log by the engine module). This module gathers the other kinds, each read without
failing where the machine does not allow it:

* the kernel's OOM record: a ``dmesg`` line that names one of the server's processes
  (``Out of memory: Killed process 1234 ...``), newer than the server's start;
* the memory cgroup's ``oom_kill`` counter (cgroup v2 ``memory.events``, v1
  ``memory.oom_control``) having risen while the server ran (not process-specific, so only
  trusted for a SIGKILL);
* memory near the limit at the last sample: the server tree's resident memory at least
  ``NEAR_LIMIT_FRACTION`` of the memory limit (the machine's memory or a smaller cgroup limit),
  or the machine's available memory below ``LOW_AVAILABLE_FRACTION`` of its total (also only
  trusted for a SIGKILL). :class:`MemoryWatch` samples every ``SAMPLE_INTERVAL_S`` while the
  server lives.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

NEAR_LIMIT_FRACTION = 0.9
LOW_AVAILABLE_FRACTION = 0.03
SAMPLE_INTERVAL_S = 0.5
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_DMESG_TIMEOUT_S = 3.0
_KILLED = re.compile(r"(?:Killed process (?P<a>\d+)|oom-kill:.*?\bpid=(?P<b>\d+))")
_STAMP = re.compile(r"^\[\s*(?P<seconds>\d+\.\d+)\]\s*")


def _own_cgroups() -> list[tuple[str, str]]:
    """(controllers, path) of this process's cgroups; the server inherits them."""
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            found.append((parts[1], parts[2]))
    return found


def _cgroup_files(v2_name: str, v1_name: str) -> list[Path]:
    """Candidate files of this process's memory cgroup, most specific first."""
    files = []
    for controllers, path in _own_cgroups():
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2
            files += [_CGROUP_ROOT / rel / v2_name, _CGROUP_ROOT / "unified" / rel / v2_name]
        elif "memory" in controllers.split(","):
            files.append(_CGROUP_ROOT / "memory" / rel / v1_name)
    files += [_CGROUP_ROOT / v2_name, _CGROUP_ROOT / "memory" / v1_name]
    return files


def oom_kill_count() -> int | None:
    """The memory cgroup's count of OOM kills, or None where it cannot be read."""
    for path in _cgroup_files("memory.events", "memory.oom_control"):
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def memory_limit() -> int:
    """Bytes the server may use: the machine's memory, or a smaller cgroup limit."""
    total = psutil.virtual_memory().total
    for path in _cgroup_files("memory.max", "memory.limit_in_bytes"):
        try:
            value = path.read_text().strip()
        except OSError:
            continue
        if value.isdigit():
            return min(total, int(value))
    return total


def kernel_oom_record(pids: set[int], since_s: float | None = None) -> str | None:
    """The kernel log's OOM-kill line for one of ``pids``, or None (also where dmesg is not
    readable). ``since_s``: only lines stamped at or after this many seconds since boot."""
    if not pids:
        return None
    try:
        done = subprocess.run(
            ["dmesg"], capture_output=True, text=True, timeout=_DMESG_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    for line in reversed(done.stdout.splitlines()):
        match = _KILLED.search(line)
        if not match or int(match.group("a") or match.group("b")) not in pids:
            continue
        stamp = _STAMP.match(line)
        if since_s is not None and stamp and float(stamp.group("seconds")) < since_s:
            continue
        return _STAMP.sub("", line).strip()
    return None


def seconds_since_boot() -> float | None:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class MemorySample:
    tree_rss: int  # bytes resident in the server and its descendants
    available: int  # bytes the machine had available
    total: int  # the machine's memory
    limit: int  # the smaller of the machine's memory and the cgroup's limit
    at: float  # time.monotonic() of the sample

    def pressure(self) -> str | None:
        """Why this sample is evidence of memory exhaustion, or None."""
        if self.tree_rss >= NEAR_LIMIT_FRACTION * self.limit:
            return (
                f"the server's processes held {self.tree_rss / 2**30:.2f} GiB of a "
                f"{self.limit / 2**30:.2f} GiB limit at the last sample"
            )
        if self.available < LOW_AVAILABLE_FRACTION * self.total:
            return (
                f"the machine had {self.available / 2**30:.2f} GiB of "
                f"{self.total / 2**30:.2f} GiB available at the last sample"
            )
        return None


class MemoryWatch:
    """Samples the memory of a process tree in a daemon thread until the process is gone."""

    def __init__(self, pid: int, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.last: MemorySample | None = None
        self.pids: set[int] = {pid}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"memwatch-{pid}", daemon=True)

    def start(self) -> MemoryWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def sample(self) -> MemorySample | None:
        """One sample now (None once the process is gone)."""
        try:
            proc = psutil.Process(self.pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            procs = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            return None
        rss = 0
        for member in procs:
            try:
                rss += member.memory_info().rss
                self.pids.add(member.pid)
            except psutil.Error:
                continue
        memory = psutil.virtual_memory()
        sample = MemorySample(rss, memory.available, memory.total, memory_limit(), time.monotonic())
        self.last = sample
        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.sample() is None:
                return
            self._stop.wait(self.interval_s)


@dataclass
class OomBaseline:
    """What is read when a server starts, to compare with when it dies."""

    oom_kills: int | None
    boot_seconds: float | None


def baseline() -> OomBaseline:
    return OomBaseline(oom_kill_count(), seconds_since_boot())


def gather(
    pids: set[int],
    start: OomBaseline | None,
    watch: MemoryWatch | None,
    *,
    sigkill: bool,
) -> dict[str, Any] | None:
    """Evidence that the server tree ran out of memory, or None.

    ``sigkill``: the server itself died by SIGKILL; only then do the evidence kinds that do not
    name one of its processes (the cgroup counter, memory pressure) count.
    """
    since = start.boot_seconds - 1.0 if start and start.boot_seconds is not None else None
    record = kernel_oom_record(pids, since)
    if record:
        return {"kernel_log": record}
    if not sigkill:
        return None
    if start is not None and start.oom_kills is not None:
        now = oom_kill_count()
        if now is not None and now > start.oom_kills:
            return {"cgroup_oom_kills": {"at_start": start.oom_kills, "at_death": now}}
    sample = watch.last if watch is not None else None
    if sample is not None:
        why = sample.pressure()
        if why:
            return {"memory": why, "last_sample": asdict(sample)}
    return None


def describe(evidence: dict[str, Any]) -> str:
    """One phrase for a failure's detail."""
    if "kernel_log" in evidence:
        return f"the kernel's OOM killer: {evidence['kernel_log']}"
    if "cgroup_oom_kills" in evidence:
        counts = evidence["cgroup_oom_kills"]
        return (
            f"the memory cgroup's oom_kill count rose from {counts['at_start']} to "
            f"{counts['at_death']} while it ran"
        )
    return str(evidence.get("memory", "memory near the limit"))
