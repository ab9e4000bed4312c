"""Several workers on one study: independent ``autotune run`` processes against one PostgreSQL
study, ``autotune run --parallel`` (device plan, exact trial split, Ctrl-C), and the refusal of
``--parallel`` on SQLite.

PostgreSQL comes from ``AUTOTUNE_TEST_POSTGRES_URL`` (``.ci/run`` starts one). Without it a
private cluster is started here when the PostgreSQL server binaries are installed; in CI
(``CI`` set) a missing URL fails the tests instead of skipping them.

The servers are the fake OpenAI-compatible test double (``autotune.testing.fake_server``) driven
through the ``command`` engine, so a trial takes a second or two.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from autotune import names
from autotune.engines.vllm.engine import VllmEngine
from autotune.engines.vllm.machine import CPU_BIND_ENV
from autotune.errors import SpecError
from autotune.storage import open_storage
from autotune.study.parallel import (
    GPU_ENV,
    DevicePlanSpec,
    build_plan,
    format_ids,
    parse_ids,
    split_trials,
    worker_seed,
)
from tests.builders import sigint_as_a_terminal_would
from tests.helpers import needs_pg  # the pg_url fixture is conftest.py's


def plan_for(*args: Any, **kwargs: Any) -> list[Any]:
    """The device plan for a vLLM study (its core-binding env var)."""
    return build_plan(*args, bind_cpus=VllmEngine.cpu_binding_env, **kwargs)


NOT_LAUNCHED = ("duplicate", "constraint_violated")
TUNING_ROLES = ("baseline", "search", "retry")
RUN_TIMEOUT_S = 300


# --- a study on the fake server -----------------------------------------------------------------


def write_spec(
    directory: Path, *, token: str, decode_ms: float | None = None, slow: bool = False
) -> Path:
    """A command-engine study on the fake server; ``token`` is in every server's argv."""
    space = directory / "space.yaml"
    space.write_text(
        "parameters:\n"
        "  max_num_seqs:\n"
        "    type: categorical\n"
        "    choices: [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]\n"
        "    target: {flag: --max-num-seqs}\n"
        + (
            ""
            if slow
            else "  batch_penalty:\n"
            "    type: categorical\n"
            "    choices: [0.0, 0.05]\n"
            "    target: {flag: --batch-penalty}\n"
        )
    )
    args = ["--decode-ms", str(decode_ms)] if decode_ms else []
    workload = (
        "  max_tokens: 32\n  concurrency: 2\n  num_requests: 24\n"
        if slow
        else "  max_tokens: 8\n  concurrency: 4\n  num_requests: 8\n"
    )
    spec = directory / "spec.yaml"
    spec.write_text(
        f"study: {token}\n"
        "engine:\n"
        "  kind: command\n"
        f"  command: [{sys.executable}, -m, autotune.testing.fake_server, --host, '{{host}}',"
        " --port, '{port}', --model, '{served_name}']\n"
        f"  args: {args!r}\n"
        "model:\n"
        f"  path: {token}\n"
        f"  served_name: {token}\n"
        "search_space: space.yaml\n"
        "check:\n"
        "  prompts: ['one two three', '1 2 3']\n"
        "  max_tokens: 8\n"
        "workload:\n"
        "  prompts: ['a b c', '4 5 6']\n" + workload + "  single_requests: 1\n"
        "  warmup_requests: 1\n"
        "  repeats: 1\n"
        "timeouts:\n"
        "  startup_s: 60\n"
    )
    return spec


def autotune_argv(spec: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", "run", "--spec", str(spec), *args]


def run_all(argvs: list[list[str]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Start every argv at once, wait for all; kill all and fail on timeout."""
    env = dict(os.environ, COLUMNS="200")
    procs = [
        subprocess.Popen(
            a, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for a in argvs
    ]
    results = []
    try:
        for argv, proc in zip(argvs, procs, strict=True):
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
            results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def load(url: str, name: str) -> optuna.Study:
    return optuna.load_study(storage=open_storage(url, heartbeat=False), study_name=name)


def counted(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """Tuning trials that launched a server and ended with a verdict on the config (what
    --trials counts): COMPLETE, or PRUNED for a config fault. The confirmation phase's trials
    (role "confirm", run after the tuning) are not among them."""
    return [
        t
        for t in trials
        if t.user_attrs.get(names.ROLE) in TUNING_ROLES
        and (
            t.state == TrialState.COMPLETE
            or (
                t.state == TrialState.PRUNED
                and t.user_attrs.get(names.FAIL_REASON) not in NOT_LAUNCHED
            )
        )
    ]


def fake_servers(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            cmdline = proc.info["cmdline"] or []
            if (
                proc.info["status"] != psutil.STATUS_ZOMBIE
                and token in cmdline
                and "autotune.testing.fake_server" in cmdline
            ):
                found.append(proc)
    return found


def _server_started(trial: optuna.trial.FrozenTrial, root: Path) -> datetime.datetime:
    """When the trial's fake server started, as it logged itself (``started_at``, this machine's
    clock to the microsecond; psutil's process start time is only good to about a second)."""
    [log] = root.rglob(f"trial-{trial.number:05d}.log")
    match = re.search(r"fake server \(TEST DOUBLE\) pid=\d+ started_at=([0-9.]+)", log.read_text())
    assert match, f"trial {trial.number}: no start line in {log}"
    return datetime.datetime.fromtimestamp(float(match.group(1)))


def assert_clean_study(
    url: str, name: str, *, launched: int, token: str, root: Path
) -> optuna.Study:
    """The invariants of a multi-worker study that ran to the end (server logs below ``root``)."""
    study = load(url, name)
    trials = study.get_trials(deepcopy=False)
    # nothing left running or queued
    assert [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)] == []
    # exactly the requested number of launched trials, the baseline among them
    assert len(counted(trials)) == launched, [
        (t.number, t.state.name, t.user_attrs.get(names.FAIL_REASON)) for t in trials
    ]
    # exactly one baseline trial and one reference
    baselines = [t for t in trials if t.user_attrs.get(names.ROLE) == "baseline"]
    assert len(baselines) == 1, [(t.number, t.state.name) for t in baselines]
    assert baselines[0].state == TrialState.COMPLETE
    assert study.user_attrs.get(names.REFERENCE) is not None
    # none half-written: a verdict on every finished trial
    for t in trials:
        if t.state == TrialState.COMPLETE:
            assert t.user_attrs.get(names.CORRECT) is True, t.number
            assert t.user_attrs.get(names.METRICS), t.number
            assert t.values is not None, t.number
        else:
            assert t.user_attrs.get(names.FAIL_REASON), (t.number, t.state.name)
    # no infrastructure faults either (e.g. a worker sampling a trial before the reference)
    assert [
        (t.number, t.user_attrs.get(names.FAIL_REASON), t.user_attrs.get(names.FAIL_DETAIL))
        for t in trials
        if t.state == TrialState.FAIL
    ] == []
    # no two servers with the same parameters ran at the same time (what the duplicate guard
    # promises). A trial's datetime_start is when it was asked for, before its parameters were
    # sampled and checked against the running trials; its server starts only after that check,
    # so the server's own start time is the start that counts. A trial asked while an equal
    # one was finishing (seen: 0.2 s) is no overlap of servers.
    launched_trials = [t for t in trials if t.user_attrs.get(names.FAIL_REASON) not in NOT_LAUNCHED]
    for i, a in enumerate(launched_trials):
        for b in launched_trials[i + 1 :]:
            if a.params == b.params:
                a_before_b = a.datetime_complete <= _server_started(b, root)
                b_before_a = b.datetime_complete <= _server_started(a, root)
                assert a_before_b or b_before_a, (a.number, b.number, a.params)
    # no server survives: neither a recorded pid nor any process of this test's servers
    for t in trials:
        pid = (t.user_attrs.get(names.SERVER) or {}).get("pid")
        if pid:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                created = t.user_attrs[names.SERVER].get("create_time")
                assert proc.status() == psutil.STATUS_ZOMBIE or (
                    created is not None and abs(proc.create_time() - created) > 1.0
                ), f"trial {t.number}'s server (pid {pid}) is still running"
    assert fake_servers(token) == []
    return study


# --- independent workers on one PostgreSQL study ------------------------------------------------


@needs_pg
def test_three_workers_share_one_postgres_study(pg_url: str, tmp_path: Path) -> None:
    token = f"mw{uuid.uuid4().hex[:10]}"
    spec = write_spec(tmp_path, token=token)
    # --confirm-top 0: three machines would each confirm the top configs at the end (the docs
    # say to confirm once, alone); this test is about the shared tuning
    argv = autotune_argv(
        spec, "--trials", "2", "--storage", pg_url, "--study", token, "--confirm-top", "0"
    )
    results = run_all([argv, argv, argv], cwd=tmp_path)
    for result in results:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = assert_clean_study(pg_url, token, launched=3 * 2, token=token, root=tmp_path)
    # every worker launched exactly its two trials (the baseline counts for whoever ran it)
    per_worker = collections.Counter(
        t.user_attrs[names.SERVER]["worker"] for t in counted(study.get_trials(deepcopy=False))
    )
    assert sorted(per_worker.values()) == [2, 2, 2], per_worker


# --- autotune run --parallel --------------------------------------------------------------------


@needs_pg
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores for 2 workers")
def test_parallel_runs_exact_trials_and_records_devices(pg_url: str, tmp_path: Path) -> None:
    token = f"mp{uuid.uuid4().hex[:10]}"
    spec = write_spec(tmp_path, token=token)
    argv = autotune_argv(
        spec,
        "--trials",
        "5",
        "--parallel",
        "2",
        "--storage",
        pg_url,
        "--study",
        token,
        "--seed",
        "7",
    )
    [result] = run_all([argv], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert "[w0]" in result.stdout and "[w1]" in result.stdout
    assert "contend" in result.stdout
    study = assert_clean_study(pg_url, token, launched=5, token=token, root=tmp_path)
    assert study.user_attrs[names.PARALLEL_CONTENTION]["workers"] == 2

    by_worker: dict[str, set[str]] = collections.defaultdict(set)
    for t in counted(study.get_trials(deepcopy=False)):
        server = t.user_attrs[names.SERVER]
        devices = server["devices"]
        assert set(devices) == {CPU_BIND_ENV}, devices
        assert server["env"][CPU_BIND_ENV] == devices[CPU_BIND_ENV]  # the server really got it
        by_worker[server["worker"]].add(devices[CPU_BIND_ENV])
    assert len(by_worker) == 2
    assert all(len(binds) == 1 for binds in by_worker.values()), by_worker  # one set per worker
    core_sets = [set(parse_ids(next(iter(b)), option="x")) for b in by_worker.values()]
    assert core_sets[0].isdisjoint(core_sets[1]), core_sets
    assert sorted(
        len(
            counted(
                [
                    t
                    for t in study.get_trials(deepcopy=False)
                    if t.user_attrs.get(names.SERVER, {}).get("worker") == w
                ]
            )
        )
        for w in by_worker
    ) == [2, 3]
    # a PostgreSQL study keeps its artifacts in studies/ below the working directory
    logs = sorted(
        p.name for p in (tmp_path / "studies" / f"{token}-artifacts" / "workers").iterdir()
    )
    assert logs == ["worker-0.log", "worker-1.log"]


@needs_pg
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores for 2 workers")
def test_parallel_ctrl_c_stops_every_worker_cleanly(pg_url: str, tmp_path: Path) -> None:
    token = f"mi{uuid.uuid4().hex[:10]}"
    spec = write_spec(tmp_path, token=token, decode_ms=15.0, slow=True)
    argv = autotune_argv(
        spec,
        "--trials",
        "40",
        "--parallel",
        "2",
        "--storage",
        pg_url,
        "--study",
        token,
        "--artifact-dir",
        str(tmp_path / "artifacts"),
    )
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_a_terminal_would,
    )
    try:
        # wait until both workers have a server up (a search trial beside another trial)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(KeyError):
                running = [
                    t
                    for t in load(pg_url, token).get_trials(
                        deepcopy=False, states=(TrialState.RUNNING,)
                    )
                    if (t.user_attrs.get(names.SERVER) or {}).get("pid")
                ]
                if len(running) >= 2:
                    running_at_signal = [t.number for t in running]
                    break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.3)
        else:
            pytest.fail("two trials never ran at once")
        proc.send_signal(signal.SIGINT)
        # a bound on a hang, not a speed verdict: three busy CI runs took longer than 120 s
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out[-3000:] + err[-3000:]
    assert "exit 130" in out
    study = load(pg_url, token)
    trials = study.get_trials(deepcopy=False)
    assert [t.number for t in trials if t.state == TrialState.RUNNING] == []
    # the trials that ran at the signal were stopped and recorded (one may have just finished)
    by_number = {t.number: t for t in trials}
    for number in running_at_signal:
        t = by_number[number]
        if t.state == TrialState.FAIL:
            assert t.user_attrs.get(names.FAIL_REASON) == "interrupted", number
            assert t.user_attrs[names.SERVER].get("stopped_cleanly") is not None, number
        else:
            assert t.state in (TrialState.COMPLETE, TrialState.PRUNED), number
    assert any(t.user_attrs.get(names.FAIL_REASON) == "interrupted" for t in trials)
    assert fake_servers(token) == []


# --- SQLite ------------------------------------------------------------------------------------


def test_parallel_on_sqlite_is_refused(tmp_path: Path) -> None:
    """SQLite cannot hand a queued trial to exactly one of several writers (see parallel.py)."""
    token = f"ms{uuid.uuid4().hex[:10]}"
    spec = write_spec(tmp_path, token=token)
    db = tmp_path / "study.db"
    [result] = run_all(
        [autotune_argv(spec, "--trials", "4", "--parallel", "2", "--storage", f"sqlite:///{db}")],
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--storage" in result.stderr and "SQLite" in result.stderr
    assert "PostgreSQL" in result.stderr
    assert not db.exists()  # refused before anything was written
    assert fake_servers(token) == []


# --- the device plan ---------------------------------------------------------------------------


def test_parse_and_format_ids() -> None:
    assert parse_ids("0-7", option="--gpus") == list(range(8))
    assert parse_ids("0,2,4,6", option="--gpus") == [0, 2, 4, 6]
    assert parse_ids("0-3,8-11", option="--cpus") == [0, 1, 2, 3, 8, 9, 10, 11]
    assert format_ids([0, 1, 2, 3, 8, 9, 10, 11]) == "0-3,8-11"
    assert format_ids([5]) == "5"
    assert format_ids([0, 2, 3]) == "0,2-3"
    for bad in ("a", "3-1", "0,,x", "-2", "0-3,2"):
        with pytest.raises(SpecError) as info:
            parse_ids(bad, option="--gpus")
        assert "--gpus" in str(info.value)


def test_gpu_plan_is_disjoint() -> None:
    plan = plan_for(DevicePlanSpec(gpus="0-7", gpus_per_trial=2), 4, available_cpus=range(8))
    assert [w.env for w in plan] == [
        {GPU_ENV: "0,1"},
        {GPU_ENV: "2,3"},
        {GPU_ENV: "4,5"},
        {GPU_ENV: "6,7"},
    ]
    plan = plan_for(DevicePlanSpec(gpus="0,2,4,6"), 3, available_cpus=range(8))
    sets = [set(w.gpus) for w in plan]
    assert all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1 :])
    # detected GPUs (no --gpus) are shared out the same way
    plan = plan_for(DevicePlanSpec(gpus_per_trial=2), 2, available_gpus=("0", "1", "2", "3"))
    assert [w.env for w in plan] == [{GPU_ENV: "0,1"}, {GPU_ENV: "2,3"}]
    # with GPUs the core binding is added only when asked for
    plan = plan_for(DevicePlanSpec(gpus="0-1", cpus="0-7"), 2, available_cpus=range(8))
    assert [w.env for w in plan] == [
        {GPU_ENV: "0", CPU_BIND_ENV: "0-3"},
        {GPU_ENV: "1", CPU_BIND_ENV: "4-7"},
    ]


def test_gpu_plan_errors() -> None:
    with pytest.raises(SpecError) as info:  # 8 GPUs / 2 per trial < 5 workers
        plan_for(DevicePlanSpec(gpus="0-7", gpus_per_trial=2), 5)
    text = str(info.value)
    assert "--parallel" in text and "--gpus" in text and "10" in text and "8" in text
    with pytest.raises(SpecError, match="--gpus"):
        plan_for(DevicePlanSpec(gpus="0,0,1"), 2)
    with pytest.raises(SpecError, match="--gpus"):
        plan_for(DevicePlanSpec(gpus_per_trial=2), 2, available_gpus=())


def test_cpu_plan_is_disjoint() -> None:
    plan = plan_for(DevicePlanSpec(), 3, available_gpus=(), available_cpus=range(16))
    assert [w.env for w in plan] == [
        {CPU_BIND_ENV: "0-4"},
        {CPU_BIND_ENV: "5-9"},
        {CPU_BIND_ENV: "10-14"},
    ]
    plan = plan_for(DevicePlanSpec(), 2, available_gpus=(), available_cpus=[0, 1])
    assert [w.env for w in plan] == [{CPU_BIND_ENV: "0"}, {CPU_BIND_ENV: "1"}]
    plan = plan_for(
        DevicePlanSpec(cpus="0-3,8-11", cpus_per_trial=4),
        2,
        available_gpus=(),
        available_cpus=range(16),
    )
    assert [w.env for w in plan] == [{CPU_BIND_ENV: "0-3"}, {CPU_BIND_ENV: "8-11"}]
    # the default uses this process's affinity
    mine = sorted(os.sched_getaffinity(0))
    plan = plan_for(DevicePlanSpec(), 1, available_gpus=())
    assert parse_ids(plan[0].env[CPU_BIND_ENV], option="x") == mine


def test_cpu_plan_errors() -> None:
    with pytest.raises(SpecError) as info:
        plan_for(DevicePlanSpec(), 3, available_gpus=(), available_cpus=[0, 1])
    assert "--parallel" in str(info.value) and "disjoint" in str(info.value)
    with pytest.raises(SpecError, match="--cpus-per-trial"):
        plan_for(DevicePlanSpec(cpus_per_trial=3), 2, available_gpus=(), available_cpus=range(4))
    with pytest.raises(SpecError, match="--cpus"):
        plan_for(DevicePlanSpec(cpus="0-7"), 2, available_gpus=(), available_cpus=range(4))


def test_split_trials_is_exact() -> None:
    assert split_trials(5, 2) == [3, 2]
    assert split_trials(6, 3) == [2, 2, 2]
    for total in range(1, 30):
        for workers in range(1, 8):
            shares = split_trials(total, workers)
            assert sum(shares) == total and max(shares) - min(shares) <= 1


def test_worker_seeds_are_distinct_and_within_the_range_run_accepts() -> None:
    """Each worker gets ``--seed`` plus its index; at the top of the range that wrapped past
    2**32 - 1, a seed the worker's own ``autotune run`` refuses (exit 2 in every worker)."""
    assert worker_seed(None, 3) is None
    top = 2**32 - 1
    seeds = [worker_seed(top - 1, index) for index in range(4)]
    assert seeds == [top - 1, top, 0, 1]
    assert [worker_seed(7, index) for index in range(3)] == [7, 8, 9]


@needs_pg
def test_a_parallel_workers_argv_carries_no_storage_password(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every user of the machine reads a process's argv (ps): a worker gets the storage URL
    without its password, and the password in PGPASSWORD, as the dashboard does. (The test's
    PostgreSQL trusts its socket, so a password in the URL is accepted and ignored.)"""
    from sqlalchemy.engine import make_url

    from autotune.study import parallel
    from autotune.study.loop import RunOptions

    secret = "s3cret-pw-for-the-test"
    url = make_url(pg_url).set(password=secret).render_as_string(hide_password=False)
    token = f"mp{uuid.uuid4().hex[:10]}"
    spec = write_spec(tmp_path, token=token)
    started: list[tuple[list[str], dict[str, str]]] = []

    class Stop(Exception):
        pass

    def popen(argv, **kwargs):
        started.append((list(argv), dict(kwargs.get("env") or {})))
        raise Stop

    monkeypatch.setattr(parallel.subprocess, "Popen", popen)
    # a PostgreSQL study's artifacts go to studies/ below the working directory: not the repo's
    monkeypatch.chdir(tmp_path)
    options = RunOptions(trials=2, storage_url=url, study_name=token)
    with contextlib.suppress(Stop):
        parallel.run_parallel(spec, options, workers=2, plan=DevicePlanSpec(), say=lambda *_: None)
    assert started, "no worker was started"
    argv, env = started[0]
    assert not any(secret in a for a in argv), argv
    assert env.get("PGPASSWORD") == secret
