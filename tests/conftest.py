"""Shared fixtures: a PostgreSQL URL (``pg_url``) and fake servers started on a port the OS
picks (``fake_server``). Spec builders are in tests/builders.py, other helpers in
tests/helpers.py: this file is pytest's, never imported by a test."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fake_proc import FakeProc, launch, stop, wait_healthy
from tests.helpers import IN_CI, PG_ENV, pg_bin


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
