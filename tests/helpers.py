"""Shared test helpers that are not fixtures: the autotune command line, process lookups, and
whether a PostgreSQL server is available (the ``pg_url`` fixture itself is in conftest.py)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from autotune import names
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study

PG_ENV = "AUTOTUNE_TEST_POSTGRES_URL"
IN_CI = bool(os.environ.get("CI"))


def missing(reason: str) -> None:
    """A prerequisite ``make setup`` provides is absent: a failure saying why, never a skip
    (``make test`` runs ``make setup`` first, so a test that skipped here would have checked
    nothing where it is needed)."""
    pytest.fail(f"{reason}: `make setup` provides it; run the tests with `make test`")


def processes_matching(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def autotune_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", *args]


def run_autotune(
    *args: str,
    cwd: Path | None = None,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` as a user runs it (its own process, this interpreter), its output
    captured as text; a run past ``timeout`` raises instead of hanging the suite."""
    return subprocess.run(
        autotune_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=None if env is None else dict(env),
    )


def run_unconfirmed(
    spec_path: Path, trials: int, *extra: str, cwd: Path | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``autotune run --trials N`` without a confirmation, which must succeed (exit 0)."""
    result = run_autotune(
        "run", "--trials", str(trials), "--spec", str(spec_path), "--confirm-top", "0", *extra,
        cwd=cwd, timeout=timeout,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def show_wide(spec_path: Path, *extra: str, cwd: Path | None = None) -> str:
    """``autotune show``'s output at 250 columns (rich wraps tables to the terminal's width)."""
    result = run_autotune(
        "show", "--spec", str(spec_path), *extra, cwd=cwd, env={**os.environ, "COLUMNS": "250"}
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def export_unconfirmed(spec_path: Path, out: Path, *extra: str, cwd: Path | None = None) -> str:
    """``autotune export --allow-unconfirmed -o OUT``, which must succeed; OUT's text."""
    result = run_autotune(
        "export", "--spec", str(spec_path), *extra, "-o", str(out), "--allow-unconfirmed", cwd=cwd
    )
    assert result.returncode == 0, result.stderr
    return out.read_text(encoding="utf-8")


def measured_or_screened(trial: Any) -> bool:
    """A healthy searched trial's verdict: measured to the end (COMPLETE), or screened (PRUNED,
    correct, its one round clearly below the leader's). The same fake server measured twice on
    a busy host can land 7 % apart, so which of the two it gets is the host's noise, not the
    behaviour under test."""
    if trial.user_attrs.get(names.FAIL_REASON) == names.SCREENED:
        return trial.state == TrialState.PRUNED and trial.user_attrs.get(names.CORRECT) is True
    return trial.state == TrialState.COMPLETE


def pg_bin() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _can_start_pg() -> bool:
    if pg_bin() is None:
        return False
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return False
    if os.geteuid() != 0:
        return True
    try:  # PostgreSQL refuses to run as root; run it as the postgres user
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return shutil.which("runuser") is not None


HAVE_PG = bool(os.environ.get(PG_ENV)) or IN_CI or _can_start_pg()


def needs_pg(test):
    """A test against a real PostgreSQL (skipped locally without one, never in CI)."""
    test = pytest.mark.skipif(
        not HAVE_PG, reason=f"no PostgreSQL: set {PG_ENV} or install the postgresql server"
    )(test)
    return pytest.mark.postgres(test)


def run_baseline_then(spec_path: Path, params: dict) -> optuna.Study:
    """The baseline (records the reference), then exactly one trial with ``params``; returns
    the study as stored."""
    spec = load_spec(spec_path)
    study, created = open_study(spec, spec.default_storage())
    assert created
    study.enqueue_trial(params, user_attrs={names.ROLE: "search"})
    summary = run_study(spec, RunOptions(trials=2, seed=0, validate=False))
    assert summary.stopped_because is None, summary.stopped_because
    return optuna.load_study(study_name=spec.name, storage=spec.default_storage())
