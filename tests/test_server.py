"""Unit tests of autotune.server.process.ServerProcess: start, readiness, failure reasons, stop.

The server is the fake one (autotune.testing.fake_server) on ``--port 0``: the OS picks the
port and the server writes it to ``--port-file`` once it listens; the test builds its client
from that, so no port is guessed. Where no port will ever exist (the server dies first, or is
never found), the client's transport refuses every connection instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from autotune.engines.base import LaunchConfig, classify_common
from autotune.errors import CandidateError
from autotune.server.process import ServerProcess, ServerStart
from tests.builders import ROOT

KEY = "server-test-key"


def launch_config(tmp_path: Path, *args: str) -> LaunchConfig:
    argv = (
        sys.executable,
        "-m",
        "autotune.testing.fake_server",
        "--port",
        "0",
        "--port-file",
        str(tmp_path / "port"),
        "--model",
        "toy",
        *args,
    )
    env = {"AUTOTUNE_API_KEY": KEY, "PYTHONPATH": str(ROOT), "FAKE_FAULT": ""}
    return LaunchConfig(
        argv=argv, env=env, host="127.0.0.1", port=0, api_key=KEY, served_model="toy"
    )


def server(tmp_path: Path, *args: str, **kwargs) -> ServerProcess:
    kwargs.setdefault("startup_timeout_s", 30)
    kwargs.setdefault("classify", classify_common)
    return ServerProcess(launch_config(tmp_path, *args), tmp_path / "server.log", **kwargs)


def bound_url(tmp_path: Path, proc: ServerProcess) -> str:
    """The URL the server reports once it listens (bounded wait: a hang fails, not a verdict)."""
    port_file = tmp_path / "port"
    deadline = time.monotonic() + 30
    while not port_file.exists():
        assert proc.alive(), proc.log_text()
        assert time.monotonic() < deadline, "the fake server never reported its port"
        time.sleep(0.02)
    return f"http://127.0.0.1:{int(port_file.read_text())}"


def wait_ready(proc: ServerProcess, url: str, *, timeout_s: float = 10.0) -> ServerStart:
    async def go() -> ServerStart:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s) as client:
            return await proc.wait_ready(client)

    return asyncio.run(go())


def wait_ready_refused(proc: ServerProcess) -> ServerStart:
    """``wait_ready`` with a client every connection of which is refused (no port exists)."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def go() -> ServerStart:
        transport = httpx.MockTransport(refuse)
        async with httpx.AsyncClient(base_url="http://server.invalid", transport=transport) as c:
            return await proc.wait_ready(c)

    return asyncio.run(go())


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_start_ready_stop(tmp_path: Path) -> None:
    spawned: list[tuple[int, int]] = []
    records: list[dict] = []
    proc = server(tmp_path, on_spawn=lambda pid, pgid: spawned.append((pid, pgid)))
    proc.on_record = records.append
    with proc:
        start = wait_ready(proc, bound_url(tmp_path, proc))
        assert start.pid == proc.pid and start.pgid == proc.pgid == proc.pid  # own session
        assert spawned == [(proc.pid, proc.pgid)]
        assert start.startup_s > 0
        assert Path(start.log_path) == tmp_path / "server.log"
        assert "fake server (TEST DOUBLE)" in proc.log_text()
        pid = proc.pid
    assert gone(pid)
    assert proc.stopped_cleanly is True
    assert proc.stop_record["survivors"] == []
    assert records[-1]["stopped_cleanly"] is True


def test_stop_takes_the_child_in_the_group_too(tmp_path: Path) -> None:
    title = f"FAKE::EngineCore-{tmp_path.name}"
    with server(tmp_path, "--spawn-child", "--child-title", title) as proc:
        wait_ready(proc, bound_url(tmp_path, proc))
        children = psutil.Process(proc.pid).children()
        assert len(children) == 1
        child = children[0].pid
    assert gone(child)
    assert child in [pid for pid, _ in proc.stop_record["descendants"]]


def test_sigterm_ignored_is_escalated_to_sigkill(tmp_path: Path) -> None:
    with server(tmp_path, "--fault", "ignore_sigterm", stop_grace_s=0.5) as proc:
        wait_ready(proc, bound_url(tmp_path, proc))
        pid = proc.pid
    assert gone(pid)
    assert proc.stopped_cleanly is True
    assert proc.exit_code() == -9


def test_exit_before_ready_is_startup_failed_with_the_log(tmp_path: Path) -> None:
    with (
        server(tmp_path, "--fault", "exit_at_start") as proc,
        pytest.raises(CandidateError) as info,
    ):
        wait_ready_refused(proc)
    assert info.value.reason == "startup_failed"
    assert info.value.evidence["exit_code"] == 3
    assert "Engine core initialization failed" in info.value.evidence["log_tail"]


def test_out_of_memory_at_start_is_named_oom(tmp_path: Path) -> None:
    with (
        server(tmp_path, "--fault", "oom") as proc,
        pytest.raises(CandidateError) as info,
    ):
        wait_ready_refused(proc)
    assert info.value.reason == "oom"
    assert "CUDA out of memory" in info.value.evidence["log_tail"]


def test_missing_program_is_startup_failed(tmp_path: Path) -> None:
    launch = LaunchConfig(
        argv=(str(tmp_path / "no-such-engine"),),
        env={},
        host="127.0.0.1",
        port=0,
        api_key="",
        served_model="toy",
    )
    proc = ServerProcess(launch, tmp_path / "server.log", startup_timeout_s=5)
    with pytest.raises(CandidateError) as info:
        proc.start()
    assert info.value.reason == "startup_failed"
    assert "engine command not found" in str(info.value)
    proc.stop()  # nothing started: nothing to do, no error


def test_healthy_but_silent_first_completion_is_a_hang(tmp_path: Path) -> None:
    with (
        server(tmp_path, "--fault", "hang") as proc,
        pytest.raises(CandidateError) as info,
    ):
        wait_ready(proc, bound_url(tmp_path, proc), timeout_s=1.0)
    assert info.value.reason == "hang"
    assert "first one-token completion got no answer" in str(info.value)


def test_healthy_but_failing_first_completion_is_startup_failed(tmp_path: Path) -> None:
    with (
        server(tmp_path, "--fault", "healthy_but_broken") as proc,
        pytest.raises(CandidateError) as info,
    ):
        wait_ready(proc, bound_url(tmp_path, proc))
    assert info.value.reason == "startup_failed"
    assert "first completion failed with 500" in str(info.value)


def test_never_healthy_is_a_startup_timeout(tmp_path: Path) -> None:
    # /health answers 503 for 60 s (if the server is even listening by then); the deadline is
    # 1 s: the verdict is the deadline's, and the server was alive when it passed
    with (
        server(tmp_path, "--ready-delay-s", "60", startup_timeout_s=1) as proc,
        pytest.raises(CandidateError) as info,
    ):
        wait_ready(proc, bound_url(tmp_path, proc))
    assert info.value.reason == "startup_timeout"
    assert "not ready within 1 s" in str(info.value)
    assert info.value.evidence["exit_code"] is None


def test_a_server_listening_on_every_interface_is_refused(tmp_path: Path) -> None:
    """A program that ignores the address it is given (here: told 127.0.0.1 by the launch,
    bound to 0.0.0.0) answered and was tuned while it served the network; it is refused at
    readiness, by the socket table, whatever its flags said."""
    from autotune import _proc

    port = _proc.free_port()
    argv = (sys.executable, "-m", "autotune.testing.fake_server", "--host", "0.0.0.0")
    argv += ("--port", str(port), "--model", "toy")
    env = {"AUTOTUNE_API_KEY": KEY, "PYTHONPATH": str(ROOT), "FAKE_FAULT": ""}
    launch = LaunchConfig(
        argv=argv, env=env, host="127.0.0.1", port=port, api_key=KEY, served_model="toy"
    )
    proc = ServerProcess(launch, tmp_path / "server.log", startup_timeout_s=30)
    with proc, pytest.raises(CandidateError) as raised:
        wait_ready(proc, f"http://127.0.0.1:{port}")
    assert raised.value.reason == "startup_failed"
    assert f"listens on 0.0.0.0 port {port}" in str(raised.value)
    assert proc.stopped_cleanly is True


def test_a_crash_after_readiness_is_not_blamed_on_a_startup_warning(tmp_path: Path) -> None:
    """A harmless startup warning that mentions 'Address already in use' turned every later
    crash into ``port_taken``, an infrastructure fault retried three times until the run
    stopped: a server that answered on its port lost no race for it."""
    import os
    import signal

    launch = launch_config(tmp_path)
    warn = 'echo "WARNING: [Errno 98] Address already in use (a side port; ignored)" >&2'
    argv = ("/bin/sh", "-c", f'{warn}; exec "$0" "$@"', *launch.argv)
    proc = ServerProcess(
        dataclasses.replace(launch, argv=argv), tmp_path / "server.log", startup_timeout_s=30
    )
    with proc:
        wait_ready(proc, bound_url(tmp_path, proc))
        os.kill(proc.pid, signal.SIGKILL)
        proc._popen.wait(timeout=30)
        failure = proc.failure("server_crashed", "server died during the benchmark")
    assert isinstance(failure, CandidateError) and failure.reason == "server_crashed"
    assert "Address already in use" in proc.log_text()  # the warning was there to mislead


def test_a_huge_log_is_read_by_its_start_and_its_end(tmp_path: Path) -> None:
    """A server that logged 1.5 GB took autotune to 3.3 GB of memory, read whole at each
    trial's end: the start (the start's parts) and the end (the latest statistics) are read,
    the middle is said to be left out."""
    from autotune.server import log

    path = tmp_path / "server.log"
    lines = [f"line {i:06d}\n" for i in range(30_000)]  # 12 bytes a line
    path.write_text("".join(lines))
    assert log.bounded(path, part_bytes=1_000_000) == "".join(lines)
    text = log.bounded(path, part_bytes=1200)
    assert text.startswith("line 000000\n") and text.endswith("line 029999\n")
    assert len(text) < 3000
    kept = [line for line in text.splitlines() if line.startswith("line ")]
    assert 190 < len(kept) <= 200 and all(len(line) == 11 for line in kept)  # whole lines
    assert "bytes of the log left out" in text


def test_a_listen_check_that_cannot_run_says_so(tmp_path: Path, monkeypatch) -> None:
    """Where the socket table cannot be read, the loopback-only check is recorded as not run,
    never as passed."""
    from autotune import _proc

    records: list[dict] = []
    monkeypatch.setattr(_proc, "listening_addresses", lambda _port: None)
    with server(tmp_path, on_record=records.append) as proc:
        wait_ready(proc, bound_url(tmp_path, proc))
    assert proc.listen_check == "not run: the socket table could not be read"
    assert {"listen_check": proc.listen_check} in records
