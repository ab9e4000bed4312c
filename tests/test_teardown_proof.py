"""Teardown proves what it claims (issue 31, item 5).

The server (tests/servers/forking_helper.py) starts a helper in its own session that re-forks
itself on SIGTERM: teardown must keep looking through the grace period, kill every copy,
record what it had to kill, and say ``stopped_cleanly`` only when nothing is left. A run that
died leaves a helper nobody recorded: ``autotune cleanup`` finds it by the launch's marker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune import _proc, names
from autotune.engines.base import LaunchConfig
from autotune.server.process import ServerProcess
from autotune.study import cleanup

SERVER = Path(__file__).resolve().parent / "servers" / "forking_helper.py"


def _pids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().split() if line.strip()]


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + 60  # "it happened at all", not a margin
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def forking_server(tmp_path: Path, pids_file: Path, **kwargs) -> ServerProcess:
    """A server whose helper writes its pid to ``pids_file`` and re-forks on SIGTERM."""
    launch = LaunchConfig(
        argv=(sys.executable, str(SERVER), str(pids_file)),
        env={},
        host="127.0.0.1",
        port=1,
        api_key="k",
        served_model="m",
    )
    return ServerProcess(
        launch, tmp_path / "server.log", startup_timeout_s=30, stop_grace_s=1.0, **kwargs
    )


def test_a_helper_that_reforks_on_sigterm_is_killed_and_recorded(tmp_path: Path) -> None:
    pids_file = tmp_path / "helper-pids"
    records: list[dict] = []
    server = forking_server(tmp_path, pids_file, on_record=records.append)
    server.start()
    try:
        _wait_for(lambda: _pids(pids_file), "the helper never started")
        _wait_for(lambda: _pids(pids_file)[0] in server.descendants_seen(), "helper never seen")
    finally:
        server.stop()
    helpers = _pids(pids_file)
    assert len(helpers) >= 2, "the helper re-forked on SIGTERM (else this tests nothing)"
    assert not [pid for pid in helpers if _proc.process_alive(pid)], "a helper survived"
    record = server.stop_record
    assert record["stopped_cleanly"] is True and server.stopped_cleanly is True
    assert record["survivors"] == []
    killed = {entry["pid"]: entry for entry in record["killed"]}
    assert killed, "a copy forked during the grace period had to be SIGKILLed"
    assert set(killed) <= set(helpers)
    for entry in killed.values():
        assert entry["signal"] == "SIGKILL" and "forking_helper.py" in entry["cmdline"]
    seen = {pid for pid, _ in record["descendants"]}
    assert set(killed) <= seen, "what was killed is in the record of what was seen"
    assert records[0] == {
        "env_marker": server.marker,
        "tmpdir": records[0]["tmpdir"],  # tests/test_server_tmpdir.py
        "descendants": [],
    }
    assert records[-1]["killed"] == record["killed"]


def test_cleanup_finds_a_helper_that_a_dead_run_never_recorded(tmp_path: Path) -> None:
    pids_file = tmp_path / "helper-pids"
    marker = f"test-{os.getpid()}-{time.time_ns()}"
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), str(pids_file)],
        env={**os.environ, _proc.MARKER_ENV: marker},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: _pids(pids_file), "the helper never started")
        helper = _pids(pids_file)[0]
        study = optuna.create_study()
        trial = study.ask()
        trial.set_user_attr(
            names.SERVER,
            {
                "pid": proc.pid,
                "pgid": proc.pid,
                "create_time": _proc.create_time(proc.pid),
                "machine": _proc.machine_id(),
                "descendants": [],  # the run died before it saw the helper
                "env_marker": marker,
            },
        )
        os.killpg(proc.pid, signal.SIGKILL)  # the run's server dies; its helper does not
        proc.wait(timeout=60)
        assert _proc.process_alive(helper)
        frozen = study.trials[0]
        lines = cleanup.stop_recorded_server(frozen)
        assert lines and "stopped its leftover server" in lines[0]
        left = [pid for pid in _pids(pids_file) if _proc.process_alive(pid)]
        assert left == []
    finally:
        for pid in _pids(pids_file):
            if _proc.process_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def test_a_signal_during_teardown_waits_until_the_server_is_gone(tmp_path: Path, monkeypatch):
    """SIGTERM (``timeout``, ``docker stop``, a second Ctrl-C) arriving while a server is being
    stopped raised inside the grace period: the stop was cut short, the server and its helper
    ran on for good, and the trial was recorded as ended, so nothing looked for them again.
    Held until the server is proved gone, the signal then does what it would have done. The
    signal is sent from inside the stop (no timing decides the verdict)."""
    pids_file = tmp_path / "helper-pids"
    server = forking_server(tmp_path, pids_file)
    real_stop_group = _proc.stop_group

    def signalled_mid_stop(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs at the next bytecode: it had every chance to
        return real_stop_group(*args, **kwargs)

    class Terminated(Exception):
        pass

    def terminate(_number, _frame):
        raise Terminated

    server.start()
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        _wait_for(lambda: _pids(pids_file), "the helper never started")
        _wait_for(lambda: _pids(pids_file)[0] in server.descendants_seen(), "helper never seen")
        monkeypatch.setattr(_proc, "stop_group", signalled_mid_stop)
        with pytest.raises(Terminated):
            server.stop()
        # the signal was delivered, after the stop had finished and proved the server gone
        assert server.stopped_cleanly is True
        assert not [pid for pid in _pids(pids_file) if _proc.process_alive(pid)]
        assert not _proc.process_alive(server.pid)
    finally:
        signal.signal(signal.SIGTERM, previous)
        monkeypatch.setattr(_proc, "stop_group", real_stop_group)
        if server.stopped_cleanly is not True:
            server.stop()
