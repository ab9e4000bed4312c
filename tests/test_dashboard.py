"""`autotune dashboard` serves the study (and its trials' attributes) through optuna-dashboard."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import optuna
import psutil

from autotune import names
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from tests.builders import write_fake_spec
from tests.helpers import autotune_cmd

SPACE = """
parameters:
  max_num_seqs: {type: categorical, choices: [2, 32], target: {flag: --max-num-seqs}}
"""


def listening_port(pid: int) -> int | None:
    """The TCP port that process ``pid`` or one of its children listens on, if any."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    for proc in procs:
        try:
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    return int(conn.laddr.port)
        except psutil.NoSuchProcess:
            continue
    return None


def test_dashboard_serves_the_study(tmp_path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="dash")
    spec = load_spec(spec_path)
    run_study(spec, RunOptions(trials=1, validate=False))  # the baseline, with its artifacts
    study, _ = open_study(spec, spec.default_storage())
    trial = study.ask()
    trial.set_user_attr(names.FAIL_REASON, "oom")
    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    # --port 0: the dashboard binds a port the OS picks, read back from the process itself
    proc = subprocess.Popen(
        autotune_cmd("dashboard", "--spec", str(spec_path), "--port", "0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        studies = None
        port = None
        while time.monotonic() < deadline and proc.poll() is None:
            port = port or listening_port(proc.pid)
            if port is None:
                time.sleep(0.3)
                continue
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/api/studies", trust_env=False)
                if response.status_code == 200:
                    studies = response.json()["study_summaries"]
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        assert studies is not None, proc.stdout.read1().decode() if proc.stdout else ""
        assert [s["study_name"] for s in studies] == ["dash"]
        detail = httpx.get(
            f"http://127.0.0.1:{port}/api/studies/{studies[0]['study_id']}", trust_env=False
        ).json()
        assert detail["name"] == "dash"
        by_number = {t["number"]: t for t in detail["trials"]}
        attrs = {a["key"]: a["value"] for a in by_number[trial.number]["user_attrs"]}
        assert attrs[names.FAIL_REASON] == "oom"
        # the baseline's server log and verified outputs are artifacts the dashboard can show
        files = sorted(a["filename"] for a in by_number[0]["artifacts"])
        assert len(files) == 2 and files[1] == "trial-00000.log", files
        artifact = by_number[0]["artifacts"][0]
        served = httpx.get(
            f"http://127.0.0.1:{port}/artifacts/{studies[0]['study_id']}/"
            f"{by_number[0]['trial_id']}/{artifact['artifact_id']}",
            trust_env=False,
        )
        assert served.status_code == 200 and served.content
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_dashboard_argv_carries_no_storage_password(tmp_path, monkeypatch):
    """optuna-dashboard's argv is readable by every user (/proc/PID/cmdline): a password in the
    storage URL's query (``?password=``, read by psycopg and libpq) goes to PGPASSWORD, and one
    no environment variable carries (``?sslpassword=``) is refused before anything starts.
    Nothing is launched: the call that would start optuna-dashboard is recorded instead."""
    from typer.testing import CliRunner

    from autotune.cli import dashboard as command
    from autotune.cli.app import app

    spec_path = write_fake_spec(tmp_path, SPACE, name="dash")
    calls = []

    def call(argv, env):
        calls.append((argv, env))
        return 0

    monkeypatch.setattr(command.subprocess, "call", call)
    monkeypatch.chdir(tmp_path)  # a PostgreSQL study's artifacts are below the working directory
    url = "postgresql+psycopg2://postgres@/rt?host=/tmp/x&password=SeCrEtPw123"
    args = ["dashboard", "--spec", str(spec_path), "--storage", url, "--port", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    [(argv, env)] = calls
    assert not any("SeCrEtPw123" in a for a in argv), argv
    assert "postgresql+psycopg2://postgres@/rt?host=%2Ftmp%2Fx" in argv
    assert env["PGPASSWORD"] == "SeCrEtPw123"
    calls.clear()
    result = CliRunner().invoke(app, [*args[:4], url.replace("&password", "&sslpassword")])
    assert result.exit_code == 2 and calls == []
    assert "sslpassword" in result.output and "SeCrEtPw123" not in result.output
