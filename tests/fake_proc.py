"""The fake server as a real subprocess, for tests that talk to it over HTTP: started on
``--port 0`` (the OS picks the port; the server writes it to ``--port-file`` once it listens, so
no port is guessed), killed with its whole process group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests import reaper
from tests.builders import ROOT

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class FakeProc:
    """A fake server started with ``--port 0``: the OS picks its port, the server reports it
    in ``port_file`` once it listens (no pick-a-free-port-then-bind race)."""

    popen: subprocess.Popen[bytes]
    port_file: Path
    log: Path

    @property
    def port(self) -> int:
        deadline = time.monotonic() + 15
        while not self.port_file.exists():
            if self.popen.poll() is not None:
                raise AssertionError(f"server exited {self.popen.returncode}: {self.stderr()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no port reported in 15 s: {self.stderr()}")
            time.sleep(0.02)
        return int(self.port_file.read_text())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def launch(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    model: str = "toy",
    api_key: str = KEY,
) -> FakeProc:
    """Start ``python -m autotune.testing.fake_server --port 0`` (not waiting for it); its log
    is a file under ``tmp_path``, it runs in a session of its own (``stop`` kills the group;
    registered with the reaper, so the session's end kills it where ``stop`` never ran)."""
    tag = uuid.uuid4().hex[:8]
    log = tmp_path / f"server-{tag}.log"
    port_file = tmp_path / f"server-{tag}.port"
    argv = [sys.executable, "-m", "autotune.testing.fake_server", "--port", "0"]
    argv += ["--port-file", str(port_file)]
    argv += ["--api-key", api_key, "--model", model, *args]
    full_env = {k: v for k, v in os.environ.items() if k != "FAKE_FAULT"}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    with log.open("wb") as fh:
        popen = subprocess.Popen(
            argv, cwd=ROOT, env=full_env, stdout=fh, stderr=fh, start_new_session=True
        )
    reaper.own(popen)
    return FakeProc(popen, port_file, log)


def wait_healthy(proc: FakeProc, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise AssertionError(f"server exited {proc.popen.returncode}: {proc.stderr()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(proc.url + "/health", timeout=0.5).status_code == 200:
                return
        time.sleep(0.05)
    raise AssertionError("server never became healthy")


def stop(proc: FakeProc) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.popen.pid, signal.SIGKILL)
    proc.popen.wait(timeout=5)
    reaper.release(proc.popen)


@contextlib.contextmanager
def server(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[FakeProc]:
    """A healthy fake server for the ``with`` block (module-scoped fixtures use this; a test
    uses the ``fake_server`` fixture)."""
    proc = launch(tmp_path, *args, env=env)
    try:
        wait_healthy(proc)
        yield proc
    finally:
        stop(proc)
