"""Shared fixtures: a PostgreSQL URL (``pg_url``) and fake servers started on a port the OS
picks (``fake_server``). Spec builders are in tests/builders.py, other helpers in
tests/helpers.py: this file is pytest's, never imported by a test.

No process a test starts outlives the session (tests/reaper.py): SIGTERM and SIGHUP
stop the session as Ctrl-C does (teardowns run), and once the fixtures are torn down every
process still carrying this session's token is stopped, group and all. A server started by a
SIGKILLed ``autotune run`` child, or one whose ``finally`` never ran, is found that way."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import reaper
from tests.fake_proc import FakeProc, launch, stop, wait_healthy
from tests.helpers import IN_CI, PG_ENV, pg_bin

_session: pytest.Session | None = None


#: the temp dir every process a test starts inherits (``TMPDIR``), removed when the session
#: ends: servers that tests launch themselves (vLLM for the export and patch checks, outside
#: autotune's ``ServerProcess``, which gives each launch its own) leave IPC sockets there
_SESSION_TMP = tempfile.mkdtemp(prefix="at-tests-")


def pytest_configure(config: pytest.Config) -> None:
    os.environ["TMPDIR"] = _SESSION_TMP

    def stop_session(name: str) -> None:
        # a test may swallow the KeyboardInterrupt (the in-process ``autotune run`` exits
        # 130): pytest still stops after it, as it would not on its own
        if _session is not None:
            _session.shouldstop = f"pytest was sent {name}"

    reaper.start_session(on_signal=stop_session)


def pytest_sessionstart(session: pytest.Session) -> None:
    global _session
    _session = session


_left: list[int] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """After every fixture's teardown (pytest's own sessionfinish runs them), stop what is
    left; the terminal summary (printed after this) names it: a test leaks, or was cut short."""
    _left.extend(reaper.reap_all())


def pytest_terminal_summary(terminalreporter) -> None:
    if _left:
        terminalreporter.write_sep("-", "processes the tests left running", yellow=True)
        terminalreporter.write_line(f"stopped {len(_left)} (SIGTERM, then SIGKILL): pids {_left}")


def pytest_unconfigure(config: pytest.Config) -> None:
    reaper.reap_all()  # where sessionfinish never ran (also registered with atexit)
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_url():
    url = os.environ.get(PG_ENV)
    if url:
        yield url
        return
    if IN_CI:
        pytest.fail(
            f"{PG_ENV} is not set in CI: .ci/run must start PostgreSQL (tests/pg_start.sh)"
            " before the multi-worker tests"
        )
    bindir = pg_bin()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, user="postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = root / "data"

    def pg(*argv: str) -> None:
        subprocess.run(as_user + list(argv), check=True, capture_output=True, timeout=120)

    pg(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust")
    pg(
        str(bindir / "pg_ctl"),
        "-D",
        str(data),
        "-l",
        str(root / "log"),
        "-w",
        "-o",
        # No TCP port at all (nothing to pick, nothing to collide with): a Unix socket in a
        # directory of its own.
        f"-c listen_addresses='' -c unix_socket_directories={root} -c max_connections=200",
        "start",
    )
    try:
        pg(
            str(bindir / "createdb"),
            "-h",
            str(root),
            "-U",
            "postgres",
            "autotune_test",
        )
        yield f"postgresql+psycopg2://postgres@/autotune_test?host={root}"
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[Callable[..., FakeProc]]:
    """Start fake servers (``fake_server(*args, model=..., api_key=...)``), each on ``--port 0``
    and healthy before it is returned; every one is killed (its whole group) at teardown."""
    started: list[FakeProc] = []

    def start(*args: str, **kwargs: str) -> FakeProc:
        proc = launch(tmp_path, *args, **kwargs)
        started.append(proc)
        wait_healthy(proc)
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(Exception):
            stop(proc)
