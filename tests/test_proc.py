"""Teardown finds what escaped the process group: a helper that calls ``setsid`` and double-forks
(its own session and group, re-parented away from the server) is remembered while the server
runs, recorded as it appears, killed at stop, and named in the stop record.

The server is the fake OpenAI-compatible test double with ``--spawn-detached``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from autotune import _proc
from autotune.engines.base import LaunchConfig
from autotune.server import ServerProcess


def launch_config(tag: str, *extra: str) -> LaunchConfig:
    port = _proc.free_port()
    argv = (
        sys.executable,
        "-m",
        "autotune.testing.fake_server",
        "--port",
        str(port),
        "--api-key",
        "k",
        "--model",
        tag,
        "--child-title",
        f"FAKE::EngineCore-{tag}",
        *extra,
    )
    return LaunchConfig(
        argv=argv, env={}, host="127.0.0.1", port=port, api_key="k", served_model=tag
    )


def detached_pid(log: Path) -> int:
    found = re.search(r"spawned detached helper pid=(\d+)", log.read_text())
    assert found, log.read_text()
    return int(found.group(1))


def live(pid: int) -> bool:
    return _proc.same_process(pid, None)


async def start_ready(server: ServerProcess) -> None:
    async with httpx.AsyncClient(
        base_url=server.launch.base_url, headers={"Authorization": "Bearer k"}, timeout=10
    ) as client:
        await server.wait_ready(client)


def test_detached_helper_is_found_killed_and_recorded(tmp_path: Path) -> None:
    tag = f"proc{uuid.uuid4().hex[:8]}"
    records: list[dict] = []
    log = tmp_path / "server.log"
    server = ServerProcess(
        launch_config(tag, "--spawn-child", "--spawn-detached"),
        log,
        startup_timeout_s=30,
        on_record=records.append,
        stop_grace_s=5,
    )
    helper = None
    try:
        server.start()
        asyncio.run(start_ready(server))
        helper = detached_pid(log)
        helper_started = _proc.create_time(helper)
        assert live(helper)
        # it really escaped: another session, another group, not below the server
        assert os.getsid(helper) != server.pgid and os.getpgid(helper) != server.pgid
        assert helper not in _proc.descendants(server.pid)
        assert helper in server.descendants_seen()
        # recorded while the server ran, before any stop
        assert any(helper in [pid for pid, _ in r["descendants"]] for r in records)
        server.stop()
        assert not live(helper), "the detached helper survived teardown"
        record = server.stop_record
        assert [helper, helper_started] in record["descendants"]
        assert record["survivors"] == []
        assert record["stopped_cleanly"] is True and server.stopped_cleanly is True
        assert record["kill_method"] == "process_group+tracked_pids"
        assert records[-1] == record
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        if helper is not None:
            with contextlib.suppress(OSError):
                os.kill(helper, signal.SIGKILL)


def test_tracked_pid_reused_by_another_process_is_not_signalled() -> None:
    """A remembered pid whose create time no longer matches is someone else's process."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = _proc.create_time(bystander.pid)
        assert started is not None
        survivors = _proc.stop_group(None, tracked={bystander.pid: started - 100.0}, grace_s=1)
        assert survivors == []
        assert bystander.poll() is None, "a pid with another start time was signalled"
        survivors = _proc.stop_group(None, tracked={bystander.pid: started}, grace_s=5)
        assert survivors == []
        assert not _proc.same_process(bystander.pid, started)
    finally:
        if bystander.poll() is None:
            bystander.kill()
            bystander.wait()


def test_same_process_needs_the_same_start_time() -> None:
    me = os.getpid()
    started = _proc.create_time(me)
    assert _proc.same_process(me, started)
    assert _proc.same_process(me, None)
    assert not _proc.same_process(me, (started or time.time()) - 3600)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not _proc.same_process(gone.pid, None)
