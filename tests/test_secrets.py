"""Secrets stay secret (issue 31, item 9): the per-trial key and secret-looking env values are
redacted from the stored log and launch record, the dashboard gets no password on argv, and a
SIGTERM is named as SIGTERM."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from autotune.engines.base import LaunchConfig, looks_secret
from autotune.errors import SpecError
from autotune.server.process import ServerProcess
from autotune.storage import dashboard_command
from autotune.study.parallel import DevicePlanSpec
from tests.builders import write_fake_spec
from tests.helpers import needs_pg

#: a study space for the --parallel tests (the fake server's engine)
SPACE = """
parameters:
  max_num_seqs: {type: categorical, choices: [2, 32], target: {flag: --max-num-seqs}}
"""

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-trial-4f9c2e1b7a"
HF = "hf_AbCdEfGhIjKlMnOp"

#: a server that prints its key and its HF token (split across writes), then waits
_PRINTS_SECRETS = """
import os, sys, time
key = os.environ["MY_KEY"]
sys.stdout.write("INFO serving with key " + key[:5]); sys.stdout.flush()
sys.stdout.write(key[5:] + " and token " + os.environ["HF_TOKEN"] + "\\n"); sys.stdout.flush()
print("x" * 3000 + key, flush=True)
print("ready", flush=True)
time.sleep(600)
"""


def _launch(argv, env) -> LaunchConfig:
    return LaunchConfig(
        argv=tuple(argv),
        env=env,
        host="127.0.0.1",
        port=1,
        api_key=KEY,
        served_model="m",
        secret_env=("MY_KEY",),
    )


def test_a_server_that_prints_its_key_leaves_no_key_in_the_stored_log(tmp_path: Path) -> None:
    launch = _launch(
        [sys.executable, "-c", _PRINTS_SECRETS],
        {"MY_KEY": KEY, "HF_TOKEN": HF, "VLLM_LOGGING_LEVEL": "INFO"},
    )
    server = ServerProcess(launch, tmp_path / "trial.log", startup_timeout_s=30)
    server.start()
    try:
        deadline = time.monotonic() + 60
        while "ready" not in server.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert KEY in server.log_path.read_bytes().decode()  # it did print it
    finally:
        server.stop()
    stored = server.log_path.read_text()
    assert KEY not in stored and HF not in stored
    assert "INFO serving with key *** and token ***" in stored
    assert "x" * 3000 + "***" in stored
    assert not list(tmp_path.glob("*.redacting"))


def test_secret_looking_env_values_are_stored_redacted() -> None:
    launch = _launch(
        ["vllm", "serve", "--api-key-file", "/k", f"--x={HF}"],
        {
            "MY_KEY": KEY,
            "HF_TOKEN": HF,
            "aws_secret_access_key": "abcdefgh12345",
            "DB_PASSWORD": "pw123456789",
            "VLLM_CPU_KVCACHE_SPACE": "4",
            "AUTH_HEADER": f"Bearer {KEY}",
        },
    )
    env = launch.redacted_env()
    assert env["MY_KEY"] == env["HF_TOKEN"] == "***"
    assert env["aws_secret_access_key"] == env["DB_PASSWORD"] == "***"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["AUTH_HEADER"] == "Bearer ***"
    assert launch.redacted_argv()[-1] == "--x=***"
    for name in ("HF_TOKEN", "openai_api_key", "MySecret", "PGPASSWORD"):
        assert looks_secret(name)
    assert not looks_secret("VLLM_CPU_KVCACHE_SPACE")


def test_a_spec_secret_in_engine_env_is_stored_redacted(tmp_path: Path) -> None:
    import yaml

    from autotune.engines import build_engine
    from autotune.spec.load import load_spec
    from tests.builders import write_fake_spec

    spec_path = write_fake_spec(tmp_path, "parameters:\n  x: {type: bool, target: {flag: --y}}\n")
    raw = yaml.safe_load(spec_path.read_text())
    raw["engine"]["env"] = {"HF_TOKEN": HF, "OMP_NUM_THREADS": "2"}
    spec_path.write_text(yaml.safe_dump(raw))
    spec = load_spec(spec_path)
    launch = build_engine(spec).build_launch(
        spec.space.resolve({}), host="127.0.0.1", port=1, api_key=KEY
    )
    assert launch.env["HF_TOKEN"] == HF  # the server still gets it
    stored = launch.redacted_env()
    assert stored["HF_TOKEN"] == "***" and stored["OMP_NUM_THREADS"] == "2"
    assert HF not in repr(stored) and KEY not in repr(stored)


def test_the_dashboard_gets_no_password_on_argv(tmp_path: Path) -> None:
    url = "postgresql+psycopg2://tuner:s3cr3t-pw@db.example:5432/autotune"
    argv, env = dashboard_command(url, tmp_path, 8080)
    assert not any("s3cr3t-pw" in a for a in argv)
    assert "postgresql+psycopg2://tuner@db.example:5432/autotune" in argv
    assert env == {"PGPASSWORD": "s3cr3t-pw"}
    argv, env = dashboard_command("sqlite:///x.db", tmp_path, 8080)
    assert "sqlite:///x.db" in argv and env == {}
    with pytest.raises(SpecError, match="--storage"):
        dashboard_command("postgresql+pg8000://u:pw@h/db", tmp_path, 8080)


def test_the_dashboard_gets_no_query_password_on_argv(tmp_path: Path) -> None:
    """psycopg and libpq read ``?password=`` too: it leaves argv for PGPASSWORD, winning over
    ``user:pass@`` as it does in the driver; the rest of the query (the socket) stays."""
    url = "postgresql+psycopg2://postgres@/rt?host=/tmp/x&password=SeCrEtPw123"
    argv, env = dashboard_command(url, tmp_path, 8080)
    assert not any("SeCrEtPw123" in a for a in argv)
    assert "postgresql+psycopg2://postgres@/rt?host=%2Ftmp%2Fx" in argv
    assert env == {"PGPASSWORD": "SeCrEtPw123"}
    argv, env = dashboard_command("postgresql://u:old@h/db?password=SeCrEtPw123", tmp_path, 1)
    assert "postgresql://u@h/db" in argv and env == {"PGPASSWORD": "SeCrEtPw123"}
    argv, env = dashboard_command("mysql+mysqldb://u@h/db?passwd=SeCrEtPw123", tmp_path, 1)
    assert "mysql+mysqldb://u@h/db" in argv and env == {"MYSQL_PWD": "SeCrEtPw123"}
    # no environment variable carries these: refused, never put on argv
    for refused in (
        "postgresql+psycopg2://u@h/db?sslpassword=SeCrEtPw123",
        "postgresql+psycopg2://u@h/db?PASSWORD=SeCrEtPw123",
        "postgresql+psycopg2://u@h/db?password=SeCrEtPw123&password=2",
        "postgresql+pg8000://u@h/db?password=SeCrEtPw123",
    ):
        with pytest.raises(SpecError, match="--storage") as caught:
            dashboard_command(refused, tmp_path, 8080)
        assert "SeCrEtPw123" not in str(caught.value)


@needs_pg
def test_a_parallel_worker_gets_no_query_password_on_argv(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``--parallel`` worker's argv is readable by every user: ``?password=`` goes to its
    PGPASSWORD, and the URL it gets still reaches the database (its socket kept). The workers
    are recorded, not started. (The test's PostgreSQL trusts its socket: the password is
    accepted and ignored; tests/test_multiworker.py runs real workers.)"""
    from sqlalchemy import create_engine, text

    from autotune.study import parallel
    from autotune.study.loop import RunOptions

    started: list[tuple[list[str], dict[str, str]]] = []

    class Stop(Exception):
        pass

    def popen(argv, **kwargs):
        started.append((list(argv), dict(kwargs.get("env") or {})))
        raise Stop

    monkeypatch.setattr(parallel.subprocess, "Popen", popen)
    monkeypatch.chdir(tmp_path)  # a PostgreSQL study's artifacts are below the working directory
    spec = write_fake_spec(tmp_path, SPACE, name=f"qpw-{uuid.uuid4().hex[:10]}")
    options = RunOptions(trials=2, storage_url=f"{pg_url}&password=SeCrEtPw123")
    with contextlib.suppress(Stop):
        parallel.run_parallel(spec, options, workers=2, plan=DevicePlanSpec(), say=lambda *_: None)
    assert started, "no worker was started"
    argv, env = started[0]
    assert not any("SeCrEtPw123" in a for a in argv), argv
    assert env["PGPASSWORD"] == "SeCrEtPw123"
    worker_url = argv[argv.index("--storage") + 1]
    engine = create_engine(worker_url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_a_parallel_run_refuses_an_sslpassword_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No environment variable carries ``?sslpassword=``: refused before the study is opened,
    a worker started or a folder made, and never printed."""
    from autotune.study import parallel
    from autotune.study.loop import RunOptions

    monkeypatch.setattr(parallel.subprocess, "Popen", lambda *a, **k: pytest.fail("started"))
    monkeypatch.chdir(tmp_path)
    spec = write_fake_spec(tmp_path, SPACE, name="sslpw")
    before = sorted(tmp_path.rglob("*"))
    url = "postgresql+psycopg2://postgres@/rt?host=/nonexistent&sslpassword=SeCrEtPw123"
    with pytest.raises(SpecError, match="sslpassword") as caught:
        parallel.run_parallel(
            spec, RunOptions(trials=2, storage_url=url), workers=2, plan=DevicePlanSpec()
        )
    assert "SeCrEtPw123" not in str(caught.value)
    assert sorted(tmp_path.rglob("*")) == before


_TERMINATED = """
import os, signal
from autotune.study import termination
termination.stop_on_termination()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
except KeyboardInterrupt as exc:
    print(termination.interrupted_detail(exc))
    print(termination.interrupted_detail(KeyboardInterrupt()))
"""


def test_sigterm_is_recorded_as_sigterm() -> None:
    from autotune.study import termination

    assert termination.interrupted_detail(KeyboardInterrupt()) == (
        "stopped by the user (Ctrl-C) while this trial ran"
    )
    out = subprocess.run(
        [sys.executable, "-c", _TERMINATED],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout.splitlines()
    assert out == ["stopped by SIGTERM while this trial ran"] * 2


def test_the_outputs_artifact_carries_no_secret(tmp_path) -> None:
    """A server that echoes its key into an answer (kept as evidence) leaves no key in the
    trial's outputs artifact either: the upload cuts the launch's secrets out."""
    import optuna
    from optuna.artifacts import FileSystemArtifactStore

    from autotune import names
    from autotune.engines.base import LaunchConfig
    from autotune.study.record import upload_trial_files

    key = "k" * 24 + "secret"
    launch = LaunchConfig(
        argv=("srv",), env={}, host="127.0.0.1", port=1, api_key=key, served_model="m"
    )
    store = FileSystemArtifactStore(str(tmp_path / "artifacts"))
    (tmp_path / "artifacts").mkdir()
    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr(names.EVIDENCE, {"log_tail": f"the answer was: Bearer {key}"})
    log = tmp_path / "server.log"
    log.write_text("started\n")
    upload_trial_files(store, trial, log, launch.redact)
    written = [p.read_text() for p in (tmp_path / "artifacts").rglob("*") if p.is_file()]
    assert len(written) == 2 and any("Bearer ***" in text for text in written)
    assert not any(key in text for text in written)
