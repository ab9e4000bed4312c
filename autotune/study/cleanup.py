"""Reclaiming what a dead run left behind: RUNNING trials whose worker is gone, their servers.

Each trial records its worker (machine, pid, process create time, :func:`worker_record`) before
anything is launched, so on the same machine a gone worker is certain at once; on another
machine Optuna's heartbeat decides. Reclaiming stops the recorded server group and every
descendant recorded while it ran, marks the trial ``interrupted`` (FAIL) and queues its
parameters again (a baseline stays the baseline). The run loop (``study.py``), every wait of a
trial on another (``trial.py``) and ``autotune cleanup`` use this one module, so no wait trusts a
holder that is gone.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Collection
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune import _proc, names
from autotune.server.process import remove_tmpdir


def worker_record() -> dict[str, Any]:
    """This autotune process, as a trial records its worker: a later run on this machine knows
    it dead the moment the pid is gone or belongs to a process started at another time."""
    pid = os.getpid()
    return {
        "machine": _proc.machine_id(),
        "hostname": socket.gethostname(),
        "pid": pid,
        "create_time": _proc.create_time(pid),
    }


def cleanup_stale(study: optuna.Study, *, this_host_only: bool = True) -> list[str]:
    """Reclaim every RUNNING trial whose worker is dead; one line per trial reclaimed.

    Dead means: the worker recorded on this machine is gone (no such pid, or the pid now
    belongs to a process started at another time), or, for a worker elsewhere (or one that had
    not recorded itself yet), Optuna's heartbeat is older than the grace. A trial whose worker
    lives is never touched, however long it runs.
    """
    stale = _stale_ids(study)
    messages: list[str] = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = dead_reason(trial, stale)
        if why is not None:
            messages += reclaim_trial(study, trial, why, this_host_only=this_host_only)
    return messages


def dead_reason(trial: optuna.trial.FrozenTrial, stale_ids: Collection[int]) -> str | None:
    """Why a RUNNING trial's worker is known dead, or None while it may be alive."""
    if trial.state != TrialState.RUNNING:
        return None
    worker = _worker_of(trial)
    if worker is not None and worker.get("pid") and _proc.on_this_machine(worker):
        if _proc.same_process(int(worker["pid"]), worker.get("create_time")):
            return None
        return f"its worker (pid {worker['pid']} on this machine) is gone"
    if trial._trial_id in stale_ids:  # noqa: SLF001
        return "its worker's heartbeat stopped"
    return None


def trial_dead_reason(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> str | None:
    """:func:`dead_reason` for one trial, reading the heartbeats only when they decide."""
    worker = _worker_of(trial)
    if worker is not None and worker.get("pid") and _proc.on_this_machine(worker):
        return dead_reason(trial, ())
    return dead_reason(trial, _stale_ids(study))


def _worker_of(trial: optuna.trial.FrozenTrial) -> dict[str, Any] | None:
    worker = trial.user_attrs.get(names.WORKER)
    if isinstance(worker, dict):
        return worker
    # older records: only the server's "hostname:pid" worker string
    server = trial.user_attrs.get(names.SERVER) or {}
    host, _, pid = str(server.get("worker") or "").rpartition(":")
    if host and pid.isdigit():
        return {"hostname": host, "pid": int(pid)}
    return None


def _stale_ids(study: optuna.Study) -> set[int]:
    try:
        return set(study._storage._get_stale_trial_ids(study._study_id))  # noqa: SLF001
    except (AttributeError, NotImplementedError, AssertionError):
        return set()


def reclaim_trial(
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    why: str,
    *,
    this_host_only: bool = True,
) -> list[str]:
    """Stop a dead trial's leftover processes, mark it ``interrupted`` (FAIL), queue its
    parameters again; one line (none if another worker did it first, nothing left to stop)."""
    return reclaim(study, trial, why, this_host_only=this_host_only)[1]


def reclaim(
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    why: str,
    *,
    taken_over_by: int | None = None,
    this_host_only: bool = True,
) -> tuple[bool, list[str]]:
    """:func:`reclaim_trial`, also saying whether this call marked the trial (False: another
    worker was first). With ``taken_over_by`` nothing is queued: that trial runs the
    parameters instead (see ``TrialRunner._settle_duplicate`` in ``trial.py``)."""
    storage = study._storage  # noqa: SLF001
    stopped = _stop_leftovers(trial, this_host_only=this_host_only)
    marked = False
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
        storage.set_trial_user_attr(trial._trial_id, names.FAIL_REASON, "interrupted")  # noqa: SLF001
        storage.set_trial_user_attr(
            trial._trial_id,  # noqa: SLF001
            names.FAIL_DETAIL,
            f"the run was killed while this trial ran ({why})",
        )
        marked = bool(storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL))  # noqa: SLF001
    parts = [stopped] if stopped else []
    if marked:
        parts.append("marked interrupted")
        if taken_over_by is None:
            enqueue_retry(study, trial)
            parts.append("re-enqueued")
        else:
            parts.append(f"taken over by trial {taken_over_by}")
    if not parts:
        return marked, []
    return marked, [f"trial {trial.number}: {why}: " + ", ".join(parts)]


def stop_recorded_server(
    trial: optuna.trial.FrozenTrial, *, this_host_only: bool = True
) -> list[str]:
    """Stop what a trial recorded (its server group and tracked descendants), if still there."""
    stopped = _stop_leftovers(trial, this_host_only=this_host_only)
    return [f"trial {trial.number}: {stopped}"] if stopped else []


def _stop_leftovers(trial: optuna.trial.FrozenTrial, *, this_host_only: bool = True) -> str | None:
    """Stop the server group and every descendant recorded for ``trial``.

    Pids are reused, so each is signalled only while its create time matches the record; a
    process that escaped into its own session unseen is found by the launch's environment
    marker (``_proc.MARKER_ENV``, recorded as ``env_marker``). The group is signalled unless
    its leader's pid now belongs to another process (then the group id cannot be the server's
    any more: Linux never reuses a pid that is still a group id).
    """
    server = trial.user_attrs.get(names.SERVER) or {}
    pid, pgid = server.get("pid"), server.get("pgid")
    tracked: dict[int, float | None] = {}
    for entry in server.get("descendants") or []:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            tracked[int(entry[0])] = None if entry[1] is None else float(entry[1])
    marker = server.get("env_marker")
    if not pid and not tracked and not marker:
        return None
    if this_host_only and not _proc.on_this_machine(server):
        return "its server is on another machine (run `autotune cleanup` there)"
    # what escaped into its own session and was never seen still carries the launch's marker
    marked = _proc.marked_processes(marker) if _proc.on_this_machine(server) else {}
    tracked.update(marked)
    group = pgid
    if pid:
        if _proc.same_process(int(pid), server.get("create_time")):
            tracked[int(pid)] = server.get("create_time")
        elif _proc.create_time(int(pid)) is not None:
            group = None  # the pid was reused: not our group
    if not _proc.group_members(group, tracked=tracked):
        _remove_recorded_tmpdir(server)
        return None
    survivors = _proc.stop_group(
        group,
        tracked=tracked,
        grace_s=5.0,
        discover=(lambda: _proc.marked_processes(marker)) if marked else None,
    )
    if survivors:
        return f"could not stop pids {survivors}"
    _remove_recorded_tmpdir(server)
    escaped = len(set(tracked) - {pid})
    extra = f" and {escaped} tracked descendant(s)" if escaped else ""
    return f"stopped its leftover server (pgid {pgid}){extra}"


def _remove_recorded_tmpdir(server: dict[str, Any]) -> None:
    """The launch's own temp folder (``ServerProcess.tmpdir``), once nothing of it runs: left
    behind when autotune was killed before its stop. Only on the machine that made it."""
    tmpdir = server.get("tmpdir")
    if isinstance(tmpdir, str) and _proc.on_this_machine(server):
        remove_tmpdir(tmpdir)


def on_optuna_stale(
    messages: list[str],
) -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    """Optuna fails a stale trial itself at the start of ``optimize``; should that beat
    :func:`cleanup_stale` to it, still stop its leftover server and queue it again, unless its
    worker is alive on this machine (only its heartbeat was late): its server is left alone."""

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        worker = _worker_of(trial)
        if (
            worker is not None
            and worker.get("pid")
            and _proc.on_this_machine(worker)
            and _proc.same_process(int(worker["pid"]), worker.get("create_time"))
        ):
            messages.append(
                f"trial {trial.number}: failed by Optuna for a late heartbeat; its worker "
                f"(pid {worker['pid']}) lives, so its server was left to it"
            )
            return
        messages.extend(stop_recorded_server(trial))
        enqueue_retry(study, trial)
        messages.append(f"trial {trial.number}: heartbeat stopped: failed by Optuna, re-enqueued")

    return callback


def enqueue_retry(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Queue ``trial``'s exact configuration again. A pinned trial (an early one-change
    neighbour, an ablation or confirmation variant) leaves parameters out on purpose: its pin
    travels with the retry, or the sampler would fill the gaps with other values."""
    role = trial.user_attrs.get(names.ROLE, names.SEARCH)
    user_attrs = {
        names.ROLE: names.BASELINE if role == names.BASELINE else names.RETRY,
        names.RETRY_OF: trial.number,
    }
    for key in (names.PINNED, names.VARIANT):
        if trial.user_attrs.get(key) is not None:
            user_attrs[key] = trial.user_attrs[key]
    study.enqueue_trial(dict(trial.params), user_attrs=user_attrs)
