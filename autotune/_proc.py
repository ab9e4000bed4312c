"""Process-group plumbing for server.py: free ports, group signals, proof that a group is gone.

vLLM renames its children (``VLLM::EngineCore``), so processes are found by process group and
by recorded descendant pids, never by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

import psutil


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago. The server may still lose a race for it; the caller
    treats 'address already in use' as an infrastructure fault and retries."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def group_members(pgid: int, extra_pids: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Live pids in process group ``pgid`` plus any of ``extra_pids`` still alive."""
    members = set()
    for proc in psutil.process_iter(["pid"]):
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


def _signal_all(pgid: int, pids: list[int], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_group(
    pgid: int,
    *,
    extra_pids: set[int] | frozenset[int] = frozenset(),
    grace_s: float = 10.0,
    kill_wait_s: float = 5.0,
) -> list[int]:
    """SIGTERM the group (and stray descendants), SIGKILL what is left after ``grace_s``.

    Returns the pids that survived even SIGKILL (normally empty): the caller reports them.
    """
    members = group_members(pgid, extra_pids)
    if not members:
        return []
    _signal_all(pgid, members, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        members = group_members(pgid, extra_pids)
        if not members:
            return []
        time.sleep(0.05)
    _signal_all(pgid, members, signal.SIGKILL)
    deadline = time.monotonic() + kill_wait_s
    while time.monotonic() < deadline:
        members = group_members(pgid, extra_pids)
        if not members:
            return []
        time.sleep(0.05)
    return members


def process_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
