"""Each launch runs with a temp folder of its own, removed once the server is proved gone.

Servers leave files in the temp dir that nothing removes when they are stopped (vLLM: a ZMQ IPC
socket or two and a ``vllm_dist_*`` folder per start); the child here does the same (a Unix
socket and a file), then waits to be stopped. A spec that sets ``TMPDIR`` keeps its folder, and
``autotune cleanup`` removes the folder a killed run left, but never a folder autotune did not
make.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import optuna

from autotune import _proc, names
from autotune.engines.base import LaunchConfig
from autotune.server.process import TMPDIR_PREFIX, ServerProcess
from autotune.study import cleanup

#: a "server" that litters its temp dir like vLLM does, says where it is, then waits
LITTERER = """
import os, socket, sys, tempfile, time
here = tempfile.gettempdir()
sock = socket.socket(socket.AF_UNIX)
sock.bind(os.path.join(here, "ipc-endpoint"))
with open(os.path.join(here, "left-behind.txt"), "w") as handle:
    handle.write("x")
with open(sys.argv[1] + ".part", "w") as handle:
    handle.write(here)
os.replace(sys.argv[1] + ".part", sys.argv[1])
time.sleep(600)
"""


def _server(tmp_path: Path, report: Path, env: dict[str, str] | None = None) -> ServerProcess:
    launch = LaunchConfig(
        argv=(sys.executable, "-c", LITTERER, str(report)),
        env=env or {},
        host="127.0.0.1",
        port=1,
        api_key="k",
        served_model="m",
    )
    return ServerProcess(launch, tmp_path / f"{report.name}.log", startup_timeout_s=30)


def _reported(server: ServerProcess, report: Path) -> Path:
    deadline = time.monotonic() + 60  # "it happened at all", not a margin
    while not report.exists():
        assert server.alive(), server.log_text()
        assert time.monotonic() < deadline, "the child never reported its temp dir"
        time.sleep(0.05)
    return Path(report.read_text())


def test_each_launch_runs_in_a_temp_folder_of_its_own_removed_at_stop(tmp_path: Path) -> None:
    folders = []
    for n in range(2):
        report = tmp_path / f"where-{n}"
        server = _server(tmp_path, report)
        server.start()
        try:
            folder = _reported(server, report)
            assert (folder / "ipc-endpoint").is_socket()
            assert (folder / "left-behind.txt").exists()
        finally:
            server.stop()
        assert server.stopped_cleanly is True
        assert folder.name.startswith(TMPDIR_PREFIX)
        assert folder.parent.resolve() == Path(tempfile.gettempdir()).resolve()
        assert str(folder) == server.tmpdir
        assert not folder.exists(), "the launch's temp folder outlived its server"
        folders.append(folder)
    assert folders[0] != folders[1]


def test_a_spec_that_sets_tmpdir_keeps_its_folder(tmp_path: Path) -> None:
    own = tmp_path / "own-tmp"
    own.mkdir()
    report = tmp_path / "where"
    server = _server(tmp_path, report, env={"TMPDIR": str(own)})
    server.start()
    try:
        folder = _reported(server, report)
    finally:
        server.stop()
    assert folder == own and server.tmpdir is None
    assert (own / "left-behind.txt").exists(), "autotune removed a folder the spec chose"


def test_the_start_record_names_the_temp_folder(tmp_path: Path) -> None:
    records: list[dict] = []
    report = tmp_path / "where"
    server = _server(tmp_path, report)
    server.on_record = records.append
    server.start()
    try:
        folder = _reported(server, report)
    finally:
        server.stop()
    assert records[0]["tmpdir"] == str(folder)


def test_cleanup_removes_the_temp_folder_a_killed_run_left(tmp_path: Path) -> None:
    made = Path(tempfile.mkdtemp(prefix=TMPDIR_PREFIX))
    (made / "ipc-endpoint").write_text("")
    foreign = tmp_path / "not-autotunes"  # a damaged record must not remove this
    foreign.mkdir()
    study = optuna.create_study()
    for folder in (made, foreign):
        trial = study.ask()
        trial.set_user_attr(
            names.SERVER,
            {
                "pid": 2**22 + 1,  # above pid_max's default: no such process
                "pgid": 2**22 + 1,
                "create_time": 1.0,
                "machine": _proc.machine_id(),
                "descendants": [],
                "env_marker": f"gone-{os.getpid()}-{time.time_ns()}",
                "tmpdir": str(folder),
            },
        )
    for frozen in study.trials:
        assert cleanup.stop_recorded_server(frozen) == []  # nothing of the server was left
    assert not made.exists(), "the dead run's temp folder was left"
    assert foreign.exists()
