"""An interrupted pytest run leaves no server behind.

Each case runs a small pytest session in a subprocess (the suite's real conftest, loaded with
``-p tests.conftest``) whose one test starts a fake server and then blocks; once the server is
up (its pid is in a file, written only after it listens) the session is sent SIGINT (Ctrl-C)
or SIGTERM (``timeout``, a CI job cancelled), and the server's pid must be gone after pytest
exits. Two ways a test starts a server:

* ``fixture``: the ``fake_server`` fixture. On SIGINT pytest tears fixtures down anyway; on
  SIGTERM Python's default action ended pytest at once, no teardown ran, and the server (in a
  session of its own, so the signal never reached it) lived on.
* ``grandchild``: a child the test runs (``subprocess.run``, as the tests that run
  ``autotune run`` do) starts the server in a session of its own. On an interrupt
  ``subprocess.run`` SIGKILLs its child, which so never stops the server: the orphan seen
  after a Ctrl-C of the suite (``--model fake-fake``, a fake spec's server). Only a sweep at
  the end of the session finds it.

The verdict never rests on a fixed sleep: readiness is a file, and the pid is polled with a
deadline far longer than a clean exit needs (a busy two-core machine).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.builders import ROOT, sigint_as_a_terminal_would

#: seconds for the inner session to start and its server to come up, for pytest to exit
#: after the signal, and for the server's pid to disappear: generous, only a failure waits
DEADLINE_S = 120.0

INNER = '''
import os
import subprocess
import sys
import time
from pathlib import Path

READY = Path(os.environ["NO_ORPHANS_READY"])


def test_fixture(fake_server):
    proc = fake_server(model="fake-fake")
    READY.write_text(str(proc.popen.pid))
    time.sleep(3600)


STARTER = """
import subprocess, sys, time
from pathlib import Path
server = subprocess.Popen(
    [sys.executable, "-m", "autotune.testing.fake_server", "--port", "0",
     "--port-file", sys.argv[1] + ".port", "--model", "fake-fake"],
    start_new_session=True,
)
deadline = time.monotonic() + 100
while not Path(sys.argv[1] + ".port").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
Path(sys.argv[1]).write_text(str(server.pid))
time.sleep(3600)
"""


def test_grandchild():
    subprocess.run([sys.executable, "-c", STARTER, str(READY)], check=False)
'''

#: the inner session: pytest with SIGINT's default handler (KeyboardInterrupt) even where
#: this run was started with SIGINT ignored
RUN_PYTEST = (
    "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.exit(pytest.main(sys.argv[1:]))"
)


def _wait_for(predicate, what: str, inner: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if inner.poll() is not None and not predicate():
            raise AssertionError(f"the inner session exited before {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} in {DEADLINE_S} s:\n{log.read_text()}")
        time.sleep(0.05)


def _alive(pid: int, started: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and abs(proc.create_time() - started) < 1
    except psutil.Error:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("how", ["fixture", "grandchild"])
def test_an_interrupted_session_leaves_no_server(tmp_path: Path, how: str, sig: int) -> None:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    ready = tmp_path / "ready"
    log = tmp_path / "inner.log"
    argv = [sys.executable, "-c", RUN_PYTEST, "-p", "tests.conftest", "-p", "no:cacheprovider"]
    argv += ["--rootdir", str(tmp_path), "-q", f"{tmp_path / 'test_inner.py'}::test_{how}"]
    with log.open("wb") as out:
        inner = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**os.environ, "NO_ORPHANS_READY": str(ready)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_a_terminal_would,
        )
    server_pid, started = None, 0.0
    try:
        _wait_for(lambda: ready.exists() and ready.read_text().strip(), "server", inner, log)
        server_pid = int(ready.read_text())
        started = psutil.Process(server_pid).create_time()
        inner.send_signal(sig)
        try:
            inner.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"pytest did not exit after {sig!r}:\n{log.read_text()}") from None
        deadline = time.monotonic() + DEADLINE_S
        while _alive(server_pid, started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server_pid, started), (
            f"the fake server (pid {server_pid}) outlived pytest, sent {sig!r}:\n" + log.read_text()
        )
    finally:
        # never the verdict, only tidying: what a failed case left (the server checked by its
        # create time, so a reused pid is never hit)
        groups = [inner.pid] + ([server_pid] if server_pid and _alive(server_pid, started) else [])
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            inner.wait(timeout=10)
