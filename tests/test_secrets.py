"""Secrets stay secret (issue 31, item 9): the per-trial key and secret-looking env values are
redacted from the stored log and launch record, the dashboard gets no password on argv, and a
SIGTERM is named as SIGTERM."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.engines.base import LaunchConfig, looks_secret
from autotune.errors import SpecError
from autotune.server.process import ServerProcess
from autotune.storage import dashboard_command

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
