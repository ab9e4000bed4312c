"""Killed and interrupted runs: nothing leaks, nothing completed is lost, the study resumes.

* ``kill -9`` of ``autotune run`` while a trial's server is up leaves that server running (it is
  in its own session). The next ``autotune run``, started at once, knows the trial's worker
  (recorded pid and start time on this machine) is gone, so it does not wait for the heartbeat
  grace: it stops the server (group and every descendant recorded while it ran, a detached
  ``setsid`` helper included) before any new trial starts, marks the trial ``interrupted`` (FAIL,
  not held against the config) and re-enqueues its parameters, and writes no ``duplicate`` junk.
  Shown on the real vLLM CPU server (``e2e``) and, fast, on the fake server (a test double).
* ``kill -9`` while the baseline's server is still starting, then the same command at once: the
  baseline is reclaimed and retried, nothing hangs.
* Ctrl-C (SIGINT) of ``autotune run`` exits 130, stops the server, records the current trial
  ``interrupted`` and re-enqueues it; the study stays intact. SIGTERM and SIGHUP do the same.

The reruns set ``AUTOTUNE_HEARTBEAT_GRACE_S`` to ten minutes (``NO_GRACE_ENV``): a test that
passes cannot have waited for the heartbeat.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import optuna
import psutil
import pytest
import yaml
from optuna.trial import TrialState

from autotune import _proc, names
from autotune.names import CANDIDATE_REASONS
from tests.builders import fake_spec, save_spec, sigint_as_a_terminal_would
from tests.helpers import measured_or_screened

ROOT = Path(__file__).resolve().parents[1]
HEARTBEAT_ENV = {
    "AUTOTUNE_HEARTBEAT_INTERVAL_S": "1",
    "AUTOTUNE_HEARTBEAT_GRACE_S": "3",
    "AUTOTUNE_STOP_GRACE_S": "5",
    "PYTHONUNBUFFERED": "1",
}
#: the heartbeat grace far beyond the test's bounds: only the recorded worker can tell it dead
NO_GRACE_ENV = {**HEARTBEAT_ENV, "AUTOTUNE_HEARTBEAT_GRACE_S": "600"}
NOT_LAUNCHED = ("duplicate", "constraint_violated")


def vllm_spec(tmp: Path, tag: str) -> Path:
    """studies/demo.yaml and its space, copied with absolute paths, storage in ``tmp``, a small
    workload, and ``--enforce-eager`` fixed (no torch.compile: a faster start)."""
    spec = yaml.safe_load((ROOT / "studies" / "demo.yaml").read_text())
    space = yaml.safe_load((ROOT / "search_spaces" / "cpu-demo.yaml").read_text())
    # Only parameters every value of which starts a healthy server: the trial that is killed
    # and retried is sampled at random, and these tests are about cleanup and resume, not about
    # the gate (a sampled fault patch or a refused flag would keep the retry from starting).
    keep = ("max_num_seqs", "attention_path")  # enforce_eager is fixed below instead
    space["parameters"] = {k: v for k, v in space["parameters"].items() if k in keep}
    space.pop("constraints", None)  # they name parameters left out
    (tmp / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    spec["study"] = "resume"
    spec["model"]["path"] = str(ROOT / "models" / "demo")
    spec["model"]["served_name"] = tag  # in every server's argv: finds this test's processes
    spec["engine"]["patch_dirs"] = [str(ROOT / "patches")]
    spec["engine"]["args"] = [*spec["engine"]["args"], "--enforce-eager"]
    spec["search_space"] = "space.yaml"
    spec["check"]["prompts"] = spec["check"]["prompts"][:3]
    spec["check"]["under_load_sample"] = 4
    spec["workload"].update(
        {
            "num_requests": 4,
            "concurrency": 2,
            "single_requests": 1,
            "warmup_requests": 1,
            "repeats": 1,
            "max_tokens": 16,
        }
    )
    spec["storage"] = f"sqlite:///{tmp / 'resume.db'}"
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def write_resume_spec(
    tmp: Path, tag: str, *, decode_ms: float = 2.0, extra: tuple[str, ...] = ()
) -> Path:
    """The fake server (a test double) through the command engine; ``--spawn-child`` so the
    leftover server has a child to be found too; ``extra`` more fake server arguments."""
    space = {
        "parameters": {
            "max_num_seqs": {
                "type": "categorical",
                "choices": [2, 4, 8, 16],
                "target": {"flag": "--max-num-seqs"},
            }
        }
    }
    spec = fake_spec(
        "resume",
        args=[
            "--spawn-child",
            "--child-title",
            f"FAKE::EngineCore-{tag}",
            "--decode-ms",
            str(decode_ms),
            *extra,
        ],
        served_name=tag,
        check={"prompts": ["1 2 3", "a b c"], "max_tokens": 8, "under_load_sample": 4},
        workload={
            "prompts": ["4 5 6", "d e f"],
            "max_tokens": 16,
            "concurrency": 2,
            "num_requests": 4,
            "single_requests": 1,
            "warmup_requests": 1,
            "repeats": 1,
            "request_timeout_s": 30,
        },
        storage=f"sqlite:///{tmp / 'resume.db'}",
    )
    return save_spec(tmp, spec, space, file="spec.yaml")


def tagged(tag: str) -> list[psutil.Process]:
    """Live processes of this test's servers: the tag is in every server's (and fake child's)
    argv; vLLM's renamed children are found through the server's process group."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if (
                any(tag in part for part in proc.info["cmdline"] or [])
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found[proc.pid] = proc
        except psutil.Error:
            continue
    for proc in list(found.values()):
        try:
            pgid = os.getpgid(proc.pid)
        except OSError:
            continue
        for other in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(other.pid) == pgid and other.status() != psutil.STATUS_ZOMBIE:
                    found[other.pid] = other
            except (OSError, psutil.Error):
                continue
    return list(found.values())


def kill_tagged(tag: str) -> None:
    """Last resort so a failing test leaves nothing behind."""
    for proc in tagged(tag):
        with contextlib.suppress(OSError, psutil.Error):
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)


def start_run(
    spec: Path, trials: int, log: Path, env_extra: dict[str, str] = HEARTBEAT_ENV
) -> subprocess.Popen[bytes]:
    env = {**os.environ, **env_extra}
    with open(log, "wb") as out:
        return subprocess.Popen(
            # no confirmation phase: these tests are about resuming, and on real vLLM the
            # confirmation's interleaved rounds made one rerun take over 400 s in CI
            [
                sys.executable,
                "-m",
                "autotune",
                "run",
                "--trials",
                str(trials),
                "--spec",
                str(spec),
                "--confirm-top",
                "0",
            ],
            cwd=spec.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigint_as_a_terminal_would,
        )


def load(spec: Path) -> optuna.Study:
    """The study, once the run has created it. Opening an SQLite file with Optuna while the
    run is still creating its tables stamps the schema version from this process too, and one
    of the two stamps fails (a CI run: ``UNIQUE constraint failed: alembic_version``). So the
    file is read first, read-only, and the study is opened only when the run has written it;
    KeyError ("not yet") otherwise."""
    url = yaml.safe_load(spec.read_text())["storage"]
    path = url.removeprefix("sqlite:///")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            names_ = db.execute("SELECT study_name FROM studies").fetchall()
            stamped = db.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:
        raise KeyError("the run has not created its storage yet") from None
    if ("resume",) not in names_ or not stamped:
        raise KeyError("the run has not created the study yet")
    return optuna.load_study(study_name="resume", storage=url)


def wait_for(
    predicate: Callable[[], object], timeout: float, proc: subprocess.Popen, log: Path, what: str
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (KeyError, ValueError, optuna.exceptions.StorageInternalError):
            value = None
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(
                f"autotune exited ({proc.returncode}) before {what}:\n" + log.read_text()[-3000:]
            )
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}:\n" + log.read_text()[-3000:])


def running_with_server(spec: Path, min_number: int) -> optuna.trial.FrozenTrial | None:
    """A RUNNING trial numbered >= min_number whose server pid is recorded and alive."""
    for trial in load(spec).get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        server = trial.user_attrs.get(names.SERVER) or {}
        if trial.number >= min_number and server.get("pid") and psutil.pid_exists(server["pid"]):
            return trial
    return None


def with_descendants(
    spec: Path, number: int, count: int, tag: str
) -> optuna.trial.FrozenTrial | None:
    """Trial ``number`` once at least ``count`` of its server's *live* descendants are recorded.

    Counting recorded pids alone is not enough: the intermediate process of a double fork is
    recorded and exits at once, so two recorded pids can be the child and that intermediate,
    before the detached helper itself has been seen. A CI run saw exactly that: the middle was
    still alive when this was asked, so it counted, and it was gone a moment later. The middle
    is the only session leader among the descendants (it calls ``setsid`` and forks; the helper
    and the in-group child are not leaders), so leaders are not counted."""
    trial = load(spec).trials[number]
    server = trial.user_attrs.get(names.SERVER) or {}
    recorded = {pid for pid, _ in server.get("descendants") or []}
    live = {p.pid for p in tagged(tag) if not _session_leader(p.pid)} - {server.get("pid")}
    return trial if len(recorded & live) >= count else None


def _session_leader(pid: int) -> bool:
    try:
        return os.getsid(pid) == pid
    except OSError:  # gone: not live either
        return True


def kill9_then_resume(
    tmp: Path,
    spec: Path,
    tag: str,
    *,
    startup_wait: float,
    run_timeout: float,
    descendants: int = 0,
) -> None:
    log = tmp / "run1.log"
    first = start_run(spec, 3, log)
    try:
        # the baseline completes, then the next trial's server is spawned
        trial = wait_for(
            lambda: running_with_server(spec, 1),
            startup_wait,
            first,
            log,
            "trial 1 to be RUNNING with its server spawned",
        )
        if descendants:
            trial = wait_for(
                lambda: with_descendants(spec, trial.number, descendants, tag),
                startup_wait,
                first,
                log,
                f"{descendants} descendants of trial {trial.number}'s server to be recorded",
            )
        completed_before = [t.number for t in load(spec).trials if t.state == TrialState.COMPLETE]
        assert 0 in completed_before
        server = trial.user_attrs[names.SERVER]
        assert trial.user_attrs[names.WORKER]["pid"] == first.pid
        os.kill(first.pid, signal.SIGKILL)  # autotune only, not its server
        first.wait(timeout=10)
        assert psutil.pid_exists(server["pid"]), "the server must outlive a kill -9 of autotune"
        leftover = {p.pid for p in tagged(tag)}
        assert server["pid"] in leftover
        recorded = {pid for pid, _ in server.get("descendants") or []}
        # the child in the group and the detached helper are alive, and recorded
        assert len(recorded & leftover) >= descendants, (recorded, leftover)

        # at once: the heartbeat grace is ten minutes, only the dead worker's pid can tell
        second_log = tmp / "run2.log"
        # --trials counts the study's launches: the baseline made, one more (the retry)
        second = start_run(spec, 2, second_log, NO_GRACE_ENV)
        try:
            second.wait(timeout=run_timeout)
        except subprocess.TimeoutExpired:
            second.kill()
            raise AssertionError(
                f"the rerun did not end within {run_timeout} s:\n" + second_log.read_text()[-3000:]
            ) from None
        output = second_log.read_text()
        assert second.returncode == 0, output[-3000:]
        line = next(
            (x for x in output.splitlines() if f"trial {trial.number}: its worker" in x), ""
        )
        assert f"(pid {first.pid} on this machine) is gone" in line, output[-3000:]
        assert "stopped its leftover server" in line and "marked interrupted, re-enqueued" in line
        assert not leftover & {p.pid for p in tagged(tag)}, "the leftover server survived"
        for pid in recorded:  # a detached helper too: found only by having been seen
            assert not _proc.same_process(pid, None), f"recorded descendant {pid} survived"

        study = load(spec)
        stale = study.trials[trial.number]
        assert stale.state == TrialState.FAIL
        assert stale.user_attrs[names.FAIL_REASON] == "interrupted"
        assert "constraints:correct" not in stale.system_attrs  # not held against the config
        retries = [t for t in study.trials if t.user_attrs.get(names.RETRY_OF) == trial.number]
        assert len(retries) == 1 and retries[0].params == stale.params
        # cleanup ran before the new trial: the retry was the next trial, and its server ran
        # (its verdict is the correctness gate's business: COMPLETE, or PRUNED as a config fault)
        retry = retries[0]
        later = [
            t
            for t in study.trials
            if t.datetime_start
            and t.number != trial.number
            and t.datetime_start > stale.datetime_start
        ]
        assert min(later, key=lambda t: t.datetime_start).number == retry.number, [
            (
                t.number,
                t.state.name,
                t.user_attrs.get(names.ROLE),
                t.user_attrs.get(names.FAIL_REASON),
            )
            for t in study.trials
        ]
        assert retry.state in (TrialState.COMPLETE, TrialState.PRUNED), retry.user_attrs
        assert retry.user_attrs.get(names.FAIL_REASON) in (None, *CANDIDATE_REASONS)
        assert retry.user_attrs[names.SERVER].get("startup_s"), retry.user_attrs
        assert retry.datetime_start > stale.datetime_start
        for number in completed_before:  # no completed trial lost
            assert study.trials[number].state == TrialState.COMPLETE
        assert study.user_attrs.get(names.REFERENCE) is not None
        # no junk: nothing proposed was left unlaunched, nothing left running or queued
        assert [
            (t.number, t.user_attrs.get(names.FAIL_REASON))
            for t in study.trials
            if t.user_attrs.get(names.FAIL_REASON) in NOT_LAUNCHED
        ] == []
        assert [t.number for t in study.trials if t.state == TrialState.RUNNING] == []
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
        kill_tagged(tag)
    assert tagged(tag) == []


def test_kill9_then_resume_fake_server(tmp_path: Path) -> None:
    tag = f"resume{uuid.uuid4().hex[:10]}"
    # the server has a child in its group and a detached (setsid, double-forked) helper
    # slow decode: on a loaded machine a 2 ms/token trial ended before its detached helper
    # was recorded (three CI runs); the trial must still be running when the test looks
    spec = write_resume_spec(tmp_path, tag, decode_ms=50, extra=("--spawn-detached",))
    kill9_then_resume(tmp_path, spec, tag, startup_wait=60, run_timeout=120, descendants=2)


def test_kill9_during_baseline_startup_then_rerun_at_once(tmp_path: Path) -> None:
    tag = f"basekill{uuid.uuid4().hex[:10]}"
    # /health answers 503 for a while: the baseline's server is up but not ready yet
    spec = write_resume_spec(tmp_path, tag, extra=("--ready-delay-s", "4"))
    log = tmp_path / "run1.log"
    first = start_run(spec, 2, log)
    second = None
    try:
        baseline = wait_for(
            lambda: running_with_server(spec, 0),
            60,
            first,
            log,
            "the baseline to be RUNNING with its server spawned",
        )
        assert baseline.number == 0 and not baseline.user_attrs[names.SERVER].get("startup_s")
        server_pid = baseline.user_attrs[names.SERVER]["pid"]
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        leftover = {p.pid for p in tagged(tag)}
        assert server_pid in leftover

        second_log = tmp_path / "run2.log"
        second = start_run(spec, 1, second_log, NO_GRACE_ENV)
        try:
            second.wait(timeout=240)  # generous: a hang is what this test is about
        except subprocess.TimeoutExpired:
            raise AssertionError("the rerun hung:\n" + second_log.read_text()[-3000:]) from None
        output = second_log.read_text()
        assert second.returncode == 0, output[-3000:]
        assert "trial 0: its worker" in output and "marked interrupted, re-enqueued" in output
        assert not leftover & {p.pid for p in tagged(tag)}, "the leftover server survived"

        study = load(spec)
        killed = study.trials[0]
        assert killed.state == TrialState.FAIL
        assert killed.user_attrs[names.FAIL_REASON] == "interrupted"
        retries = [t for t in study.trials if t.user_attrs.get(names.RETRY_OF) == 0]
        assert len(retries) == 1, [(t.number, t.user_attrs) for t in study.trials]
        assert retries[0].user_attrs[names.ROLE] == "baseline"
        assert retries[0].state == TrialState.COMPLETE
        assert study.user_attrs.get(names.REFERENCE) is not None
        assert [t.number for t in study.trials if t.state == TrialState.RUNNING] == []
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
        kill_tagged(tag)
    assert tagged(tag) == []


@pytest.mark.e2e
def test_kill9_then_resume_vllm(tmp_path: Path) -> None:
    tag = f"resume{uuid.uuid4().hex[:10]}"
    spec = vllm_spec(tmp_path, tag)
    # bounds on a hang, not speed verdicts: a loaded CI run needed more than 400 s for the rerun
    kill9_then_resume(tmp_path, spec, tag, startup_wait=900, run_timeout=1200)


@pytest.mark.parametrize(
    "sig",
    # SIGTERM (timeout, docker stop, a scheduler's preemption) and SIGHUP (a closed session)
    # used to end autotune at once and leave the vLLM server running, re-parented to init
    [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
    ids=["ctrl-c", "sigterm", "sighup"],
)
def test_ctrl_c_exits_130_and_records_interrupted(tmp_path: Path, sig: signal.Signals) -> None:
    tag = f"sig{sig.name.lower()}{uuid.uuid4().hex[:10]}"
    spec = write_resume_spec(tmp_path, tag, decode_ms=25)  # slow decode: the trial is still running
    log = tmp_path / "run.log"
    proc = start_run(spec, 5, log)
    try:
        trial = wait_for(
            lambda: running_with_server(spec, 1),
            60,
            proc,
            log,
            "trial 1 to be RUNNING with its server spawned",
        )
        server_pid = trial.user_attrs[names.SERVER]["pid"]
        time.sleep(0.5)
        os.kill(proc.pid, sig)
        # a bound on a hang, not a speed verdict: three busy CI runs took longer than 30 s
        proc.wait(timeout=300)
        output = log.read_text()
        assert proc.returncode == 130, output[-3000:]
        assert "interrupted" in output
        assert (
            not psutil.pid_exists(server_pid)
            or psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE
        )
        assert tagged(tag) == []

        study = load(spec)
        stopped = study.trials[trial.number]
        assert stopped.state == TrialState.FAIL
        assert stopped.user_attrs[names.FAIL_REASON] == "interrupted"
        # the record names what stopped it: Ctrl-C, or the signal itself
        who = "the user (Ctrl-C)" if sig == signal.SIGINT else sig.name
        assert f"stopped by {who}" in stopped.user_attrs[names.FAIL_DETAIL]
        assert stopped.user_attrs[names.SERVER].get("stopped_cleanly") is True
        assert study.trials[0].state == TrialState.COMPLETE
        assert study.user_attrs.get(names.REFERENCE) is not None
        waiting = [t for t in study.trials if t.state == TrialState.WAITING]
        assert [
            (t.system_attrs.get("fixed_params"), t.user_attrs.get(names.RETRY_OF)) for t in waiting
        ] == [(stopped.params, trial.number)]
        assert not [t for t in study.trials if t.state == TrialState.RUNNING]
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_tagged(tag)
    # the study resumes: the re-enqueued trial runs first
    log2 = tmp_path / "run2.log"
    again = start_run(spec, 2, log2)  # the study's launches: the baseline made, then the retry
    again.wait(timeout=120)
    assert again.returncode == 0, log2.read_text()[-3000:]
    study = load(spec)
    retry = next(t for t in study.trials if t.user_attrs.get(names.RETRY_OF) == trial.number)
    assert measured_or_screened(retry), retry.user_attrs
    assert tagged(tag) == []
