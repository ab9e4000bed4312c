"""No server survives autotune, and a dead run's trial is reclaimed at once.

* Teardown finds what escaped the process group: a helper that calls ``setsid`` and
  double-forks (its own session and group, re-parented away from the server) is remembered while
  the server runs, recorded as it appears, killed at stop, and named in the stop record (the
  fake OpenAI-compatible test double with ``--spawn-detached``).
* A RUNNING trial whose worker on this machine is gone is reclaimed at once (not after the
  heartbeat grace); one whose worker lives is never touched. Waiters (a duplicate proposal, a
  worker waiting for the baseline) keep checking their holder and take over when it dies; a
  duplicate of a live holder waits and takes its outcome instead of writing junk trials. Here
  the "workers" and "servers" are plain sleeping processes, killed like ``kill -9`` would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import optuna
import psutil
from optuna.trial import TrialState

from autotune import _proc, names
from autotune.engines.base import LaunchConfig
from autotune.server.process import ServerProcess
from autotune.storage import open_storage
from autotune.study.cleanup import cleanup_stale, enqueue_retry
from autotune.study.loop import _wait_for_reference
from autotune.study.record import running_duplicate
from autotune.study.trial import TrialRunner


def launch_config(tag: str, *extra: str) -> LaunchConfig:
    port = _proc.free_port()
    argv = (
        sys.executable,
        "-m",
        "autotune.testing.fake_server",
        "--port",
        str(port),
        "--api-key",
        "k",
        "--model",
        tag,
        "--child-title",
        f"FAKE::EngineCore-{tag}",
        *extra,
    )
    return LaunchConfig(
        argv=argv, env={}, host="127.0.0.1", port=port, api_key="k", served_model=tag
    )


def detached_pid(log: Path) -> int:
    found = re.search(r"spawned detached helper pid=(\d+)", log.read_text())
    assert found, log.read_text()
    return int(found.group(1))


def live(pid: int) -> bool:
    return _proc.same_process(pid, None)


async def start_ready(server: ServerProcess) -> None:
    async with httpx.AsyncClient(
        base_url=server.launch.base_url, headers={"Authorization": "Bearer k"}, timeout=10
    ) as client:
        await server.wait_ready(client)


def test_detached_helper_is_found_killed_and_recorded(tmp_path: Path) -> None:
    tag = f"proc{uuid.uuid4().hex[:8]}"
    records: list[dict] = []
    log = tmp_path / "server.log"
    server = ServerProcess(
        launch_config(tag, "--spawn-child", "--spawn-detached"),
        log,
        startup_timeout_s=30,
        on_record=records.append,
        stop_grace_s=5,
    )
    helper = None
    try:
        server.start()
        asyncio.run(start_ready(server))
        helper = detached_pid(log)
        helper_started = _proc.create_time(helper)
        assert live(helper)
        # it really escaped: another session, another group, not below the server
        assert os.getsid(helper) != server.pgid and os.getpgid(helper) != server.pgid
        assert helper not in _proc.descendants(server.pid)
        assert helper in server.descendants_seen()
        # recorded while the server ran, before any stop
        assert any(helper in [pid for pid, _ in r["descendants"]] for r in records)
        server.stop()
        assert not live(helper), "the detached helper survived teardown"
        record = server.stop_record
        assert [helper, helper_started] in record["descendants"]
        assert record["survivors"] == []
        assert record["stopped_cleanly"] is True and server.stopped_cleanly is True
        assert record["kill_method"] == "process_group+tracked_pids"
        assert records[-1] == record
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        if helper is not None:
            with contextlib.suppress(OSError):
                os.kill(helper, signal.SIGKILL)


def test_tracked_pid_reused_by_another_process_is_not_signalled() -> None:
    """A remembered pid whose create time no longer matches is someone else's process."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = _proc.create_time(bystander.pid)
        assert started is not None
        survivors = _proc.stop_group(None, tracked={bystander.pid: started - 100.0}, grace_s=1)
        assert survivors == []
        assert bystander.poll() is None, "a pid with another start time was signalled"
        survivors = _proc.stop_group(None, tracked={bystander.pid: started}, grace_s=5)
        assert survivors == []
        assert not _proc.same_process(bystander.pid, started)
    finally:
        if bystander.poll() is None:
            bystander.kill()
            bystander.wait()


def test_same_process_needs_the_same_start_time() -> None:
    me = os.getpid()
    started = _proc.create_time(me)
    assert _proc.same_process(me, started)
    assert _proc.same_process(me, None)
    assert not _proc.same_process(me, (started or time.time()) - 3600)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert not _proc.same_process(gone.pid, None)


# --- liveness of a trial's holder: reclaim at once, wait without junk ---------------------------


class _Ctx:
    """What ``TrialRunner``'s waiting code uses of a ``TrialContext``."""

    study: optuna.Study | None = None

    @staticmethod
    def on_phase(_number: int, _phase: str) -> None:
        return None


def sleeper(*, new_session: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=new_session
    )


def record_of(proc: subprocess.Popen[bytes]) -> dict:
    return {
        "machine": _proc.machine_id(),
        "hostname": socket.gethostname(),
        "pid": proc.pid,
        "create_time": _proc.create_time(proc.pid),
    }


def new_study(tmp_path: Path) -> optuna.Study:
    # no heartbeats at all: only the recorded worker can tell that it is dead
    storage = open_storage(f"sqlite:///{tmp_path / 'liveness.db'}", heartbeat=False)
    return optuna.create_study(storage=storage, study_name="liveness")


def holding(study: optuna.Study, worker: dict, *, role: str = "search", server=None):
    """A RUNNING trial held by ``worker``, with parameters {"x": 1}."""
    trial = study.ask()
    trial.suggest_categorical("x", [1, 2])
    trial.set_user_attr(names.PARAMS_RESOLVED, {"x": trial.params["x"]})
    trial.set_user_attr(names.ROLE, role)
    trial.set_user_attr(names.WORKER, worker)
    if server is not None:
        trial.set_user_attr(names.SERVER, server)
    return trial


def proposing(study: optuna.Study, holder: optuna.Trial) -> optuna.Trial:
    """A new trial with the holder's parameters, as the sampler would propose them."""
    study.enqueue_trial(dict(holder.params))
    trial = study.ask()
    trial.suggest_categorical("x", [1, 2])
    return trial


def frozen(study: optuna.Study, trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    return study._storage.get_trial(trial._trial_id)


def in_thread(fn) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def wait_until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_cleanup_reclaims_a_dead_workers_trial_at_once_and_spares_a_live_one(
    tmp_path: Path,
) -> None:
    study = new_study(tmp_path)
    live_worker, dead_worker = sleeper(), sleeper()
    server = sleeper(new_session=True)  # the dead run's leftover "server"
    try:
        alive = holding(study, record_of(live_worker))
        server_record = {**record_of(server), "pgid": server.pid, "descendants": []}
        dead = holding(study, record_of(dead_worker), server=server_record)
        dead_worker.kill()
        dead_worker.wait()
        # well within Optuna's heartbeat grace: the dead worker's pid decides
        lines = cleanup_stale(study)
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"trial {dead.number}: its worker (pid {dead_worker.pid}")
        assert "stopped its leftover server" in lines[0]
        assert lines[0].endswith("marked interrupted, re-enqueued")
        server.wait(timeout=10)
        record = frozen(study, dead)
        assert record.state == TrialState.FAIL
        assert record.user_attrs[names.FAIL_REASON] == "interrupted"
        assert frozen(study, alive).state == TrialState.RUNNING
        waiting = study.get_trials(states=(TrialState.WAITING,))
        assert [t.user_attrs.get(names.RETRY_OF) for t in waiting] == [dead.number]
        assert cleanup_stale(study) == []  # nothing twice
    finally:
        for proc in (live_worker, dead_worker, server):
            proc.kill()
            proc.wait()


def test_a_duplicate_waits_for_its_live_holder_and_takes_its_outcome(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    worker = sleeper()
    try:
        holder = holding(study, record_of(worker))
        runner = TrialRunner(_Ctx())  # type: ignore[arg-type]
        trial = proposing(study, holder)
        assert running_duplicate(trial, {"x": holder.params["x"]}).number == holder.number
        thread, result = in_thread(
            lambda: runner._settle_duplicate(trial, "search", frozen(study, holder))
        )
        wait_until(
            lambda: frozen(study, trial).user_attrs.get(names.DUPLICATE_OF) == holder.number,
            "the duplicate to wait",
        )
        # a waiter is never taken for a holder by a third proposal
        third = proposing(study, holder)
        assert running_duplicate(third, {"x": holder.params["x"]}).number == holder.number
        study.tell(third, state=TrialState.FAIL)
        assert thread.is_alive(), result  # the holder lives and runs: keep waiting
        holder.set_constraint(names.CORRECTNESS_CONSTRAINT, 0.0)
        holder.set_user_attr(names.CORRECT, True)
        study.tell(holder, 12.5)
        thread.join(timeout=30)
        assert isinstance(result.get("error"), optuna.TrialPruned), result
        record = frozen(study, trial)
        assert record.user_attrs[names.FAIL_REASON] == "duplicate"
        assert record.user_attrs[names.EVIDENCE]["duplicate_of"] == holder.number
        assert record.user_attrs[names.EVIDENCE]["outcome"] == "correct"
        assert record.system_attrs[f"constraints:{names.CORRECTNESS_CONSTRAINT}"] == 0.0
        assert runner.last is not None and runner.last.verdict == "duplicate"
        assert runner.notes == []
    finally:
        worker.kill()
        worker.wait()


def test_a_duplicate_takes_over_when_its_holders_worker_dies_while_it_waits(
    tmp_path: Path,
) -> None:
    study = new_study(tmp_path)
    worker = sleeper()
    server = sleeper(new_session=True)
    try:
        server_record = {**record_of(server), "pgid": server.pid, "descendants": []}
        holder = holding(study, record_of(worker), server=server_record)
        runner = TrialRunner(_Ctx())  # type: ignore[arg-type]
        trial = proposing(study, holder)
        thread, result = in_thread(
            lambda: runner._settle_duplicate(trial, "search", frozen(study, holder))
        )
        wait_until(
            lambda: frozen(study, trial).user_attrs.get(names.DUPLICATE_OF) == holder.number,
            "the duplicate to wait",
        )
        worker.kill()  # kill -9 of the holder's autotune: its server stays up
        worker.wait()
        thread.join(timeout=30)
        assert result.get("value") == "retry", result
        server.wait(timeout=10)  # the leftover server was stopped
        assert frozen(study, holder).state == TrialState.FAIL
        assert frozen(study, holder).user_attrs[names.FAIL_REASON] == "interrupted"
        record = frozen(study, trial)
        assert record.user_attrs[names.RETRY_OF] == holder.number
        assert record.user_attrs[names.ROLE] == "retry"
        assert record.user_attrs[names.DUPLICATE_OF] is None
        # it runs the parameters itself: nothing queued, so they run once
        assert study.get_trials(states=(TrialState.WAITING,)) == []
        assert len(runner.notes) == 1 and runner.notes[0].endswith(
            f"marked interrupted, taken over by trial {trial.number}"
        )
    finally:
        for proc in (worker, server):
            proc.kill()
            proc.wait()


def test_waiting_for_the_baseline_reclaims_it_when_its_worker_dies(tmp_path: Path) -> None:
    study = new_study(tmp_path)
    worker = sleeper()
    try:
        baseline = holding(study, record_of(worker), role="baseline")
        notes: list[str] = []
        thread, result = in_thread(lambda: _wait_for_reference(study, notes, poll_s=0.1))
        wait_until(lambda: thread.is_alive() or result, "the wait to start")
        assert thread.is_alive(), result  # a live baseline holder: keep waiting
        worker.kill()
        worker.wait()
        thread.join(timeout=30)
        assert not thread.is_alive() and "error" not in result, result
        assert frozen(study, baseline).state == TrialState.FAIL
        waiting = study.get_trials(states=(TrialState.WAITING,))
        assert [
            (t.user_attrs.get(names.ROLE), t.user_attrs.get(names.RETRY_OF)) for t in waiting
        ] == [("baseline", baseline.number)]
        assert len(notes) == 1 and notes[0].endswith("marked interrupted, re-enqueued")
    finally:
        worker.kill()
        worker.wait()


def test_two_workers_that_found_each_other_do_not_wait_forever(tmp_path: Path) -> None:
    """Both checked for a running twin before either marked itself a waiter: each found the
    other. The lower trial number runs its server; the higher waits on it."""
    study = new_study(tmp_path)
    worker = sleeper()  # both trials' worker: alive throughout
    try:
        low = holding(study, record_of(worker))
        high = proposing(study, low)
        high.set_user_attr(names.PARAMS_RESOLVED, {"x": high.params["x"]})
        high.set_user_attr(names.WORKER, record_of(worker))
        assert low.number < high.number
        runner_low, runner_high = TrialRunner(_Ctx()), TrialRunner(_Ctx())  # type: ignore[arg-type]
        high_thread, high_result = in_thread(
            lambda: runner_high._settle_duplicate(high, "search", frozen(study, low))
        )
        wait_until(
            lambda: frozen(study, high).user_attrs.get(names.DUPLICATE_OF) == low.number,
            "the higher trial to wait",
        )
        low_thread, low_result = in_thread(
            lambda: runner_low._settle_duplicate(low, "search", frozen(study, high))
        )
        low_thread.join(timeout=30)
        assert not low_thread.is_alive(), "the lower trial must stop waiting and run"
        assert low_result == {"value": "search"}
        assert frozen(study, low).user_attrs.get(names.DUPLICATE_OF) is None
        assert high_thread.is_alive(), high_result  # still waiting on the lower one
        low.set_constraint(names.CORRECTNESS_CONSTRAINT, 0.0)
        low.set_user_attr(names.CORRECT, True)
        study.tell(low, 3.0)
        high_thread.join(timeout=30)
        assert isinstance(high_result.get("error"), optuna.TrialPruned), high_result
        assert frozen(study, high).user_attrs[names.EVIDENCE]["duplicate_of"] == low.number
    finally:
        worker.kill()
        worker.wait()


def test_a_retry_of_a_pinned_trial_keeps_its_pin(tmp_path: Path) -> None:
    """An early one-change neighbour leaves parameters out on purpose; its retry (after a kill
    or an infrastructure fault) must be the same config, not the sampler's fill-in."""

    study = new_study(tmp_path)
    trial = study.ask()
    trial.suggest_categorical("x", [1, 2])
    trial.set_user_attr(names.PINNED, {"x": trial.params["x"]})
    trial.set_user_attr(names.ROLE, "search")
    study.tell(trial, state=TrialState.FAIL)
    enqueue_retry(study, frozen(study, trial))
    (queued,) = study.get_trials(states=(TrialState.WAITING,))
    assert queued.user_attrs[names.PINNED] == {"x": trial.params["x"]}
    assert queued.user_attrs[names.RETRY_OF] == trial.number
    assert queued.user_attrs[names.ROLE] == "retry"


def test_no_zombie_of_a_stopped_server_is_left_behind(tmp_path: Path) -> None:
    """autotune is the subreaper of what it starts: a server's child that outlives its parent
    is re-parented here, and when it dies it is autotune's zombie. Every process the tracker
    saw is collected by the end of stop(), whenever it died (before, one that died after the
    last look stayed a zombie for the rest of the run: one per vLLM worker per trial)."""
    for round_ in range(3):
        tag = f"zomb{round_}{uuid.uuid4().hex[:6]}"
        server = ServerProcess(
            launch_config(tag, "--spawn-child"), tmp_path / f"{tag}.log", startup_timeout_s=30
        )
        try:
            server.start()
            asyncio.run(start_ready(server))
            seen = set(server.descendants_seen())
            assert seen, "the fake server's child was not seen"
        finally:
            server.stop()
        me = psutil.Process()
        zombies = {
            c.pid for c in me.children() if c.pid in seen and c.status() == psutil.STATUS_ZOMBIE
        }
        assert not zombies, f"round {round_}: zombies of the stopped server {zombies}"
