"""The fault matrix: every way a candidate server can fail, through the real study loop.

One study runs the fake OpenAI-compatible server (a test double) from a command template. Its
search space has one categorical parameter ``fault`` (the ``--fault`` flag, ``null`` = healthy,
the baseline's value); the baseline records the reference, then one enqueued trial per fault
follows. Each trial must end with the right ``fail_reason`` and evidence, the loop must go on
to the next trial, and no process of any trial (server nor its ``--spawn-child`` child) may
survive it. Infrastructure faults (a port taken) are FAIL, retried once, never held against the
configuration, and K of them in a row stop the run. A broken baseline stops the study at once.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from optuna.trial import TrialState

import autotune.study.trial
from autotune import _proc, names
from autotune.errors import PreflightError
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from autotune.testing.fake_options import FAULTS as FAKE_FAULTS
from tests.builders import fake_spec, save_spec

EXPECTED = {
    "exit_at_start": "startup_failed",
    "unknown_flag": "invalid_config",
    "crash_mid_bench": "server_crashed",
    # SIGKILL with no evidence of OOM (no message, no kernel record, memory far from the limit)
    "self_sigkill": "server_crashed",
    "hang": "hang",
    "slow_start": "startup_timeout",
    "oom": "oom",
    # Every completion answers 500, so the readiness completion already fails: the server never
    # served a request, which is a failed start (like healthy_but_broken), not request errors.
    "http_500": "startup_failed",
    # one benchmark request in three fails while the server stays up: request errors
    "flaky_500": "request_errors",
    "healthy_but_broken": "startup_failed",
    "wrong_text": "incorrect_output",
    # fluent but wrong (sane text): only the comparison with the reference catches it
    "corrupt_words": "incorrect_output",
    # verified, then silent under load: one deadline, named in the detail
    "hang_in_bench": "hang",
    "ignore_sigterm": None,  # healthy apart from SIGTERM: the trial completes
}
#: the matrix: every fault whose verdict is asserted above, one trial each
FAULTS = tuple(EXPECTED)
# Deadlines a loaded 2-core machine meets with room (a fake server took over 4 s to start at
# load 10, and a 2 s token deadline called a healthy stream hung); the bounds below are the
# deadlines plus a fixed allowance for process start and teardown, not speed verdicts.
STARTUP_S = 15.0
REQUEST_TIMEOUT_S = 6.0
ALLOWANCE_S = 20.0


#: in the argv of every server and child these tests start (other tests may run fake servers)
TAG = f"faults{uuid.uuid4().hex[:10]}"


def write_spec(
    tmp: Path, *, baseline: str | None = None, name: str = "faults", max_infra: int = 2
) -> Path:
    """A study spec + space in ``tmp`` driving the fake server; returns the spec path."""
    space = {
        "parameters": {
            "fault": {
                "type": "categorical",
                "choices": [None, *FAULTS],
                "target": {"flag": "--fault"},
                "baseline": baseline,
            }
        }
    }
    spec = fake_spec(
        name,
        # crash after readiness + verification; slow_start sleeps past timeouts.startup_s
        args=[
            "--spawn-child",
            "--child-title",
            f"FAKE::EngineCore-{TAG}",
            "--fault-after",
            "8",
            "--startup-delay-s",
            str(STARTUP_S + 4),
        ],
        served_name=TAG,
        check={"prompts": ["1 2 3", "a b c"], "max_tokens": 8, "under_load_sample": 4},
        workload={
            "prompts": ["4 5 6", "d e f"],
            "max_tokens": 8,
            "concurrency": 2,
            "num_requests": 4,
            "single_requests": 1,
            "warmup_requests": 1,
            "repeats": 1,
            "request_timeout_s": REQUEST_TIMEOUT_S,
        },
        timeouts={"startup_s": STARTUP_S, "max_consecutive_infra_failures": max_infra},
        storage=f"sqlite:///{tmp / (name + '.db')}",
    )
    return save_spec(tmp, spec, space, file=f"{name}.yaml")


def trial_processes(port: int) -> list[psutil.Process]:
    """Live processes of the trial that used ``port``: the server (port in argv) and the
    child it spawned (same process group as the server)."""
    found = []
    groups = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if "autotune.testing.fake_server" in cmdline and str(port) in cmdline:
                groups.add(proc.pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
        except psutil.Error:
            continue
    for pgid in groups:
        for pid in _proc.group_members(pgid):
            if pid not in {p.pid for p in found}:
                found.append(psutil.Process(pid))
    return found


def fake_processes() -> list[int]:
    """Every live fake server and fake EngineCore child these tests started, of any trial."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            text = " ".join(proc.info["cmdline"] or [])
            if TAG in text and proc.status() != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


class Watcher:
    """``on_trial`` hook: right after each trial, note any process of it still alive."""

    def __init__(self) -> None:
        self.survivors: dict[int, list[str]] = {}
        self.seconds: dict[int, float] = {}
        self._last = time.monotonic()

    def __call__(self, outcome: Any, study: optuna.Study) -> None:
        now = time.monotonic()
        self.seconds[outcome.number] = now - self._last
        self._last = now
        trial = study.trials[outcome.number]
        server = trial.user_attrs.get(names.SERVER) or {}
        port = server.get("port")
        alive = {p.pid for p in trial_processes(port)} if port else set()
        if server.get("pgid"):
            alive |= set(_proc.group_members(server["pgid"], {server["pid"]}))
        alive_pids = alive | set(fake_processes())  # trials run one at a time
        self.survivors[outcome.number] = sorted(str(p) for p in alive_pids)


@pytest.fixture(scope="module")
def matrix(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[optuna.Study, dict[str, optuna.trial.FrozenTrial], Watcher]:
    """The baseline plus one trial per fault, run once for the whole module."""
    tmp = tmp_path_factory.mktemp("faults")
    spec = load_spec(write_spec(tmp))
    mp = pytest.MonkeyPatch()
    mp.setenv("AUTOTUNE_STOP_GRACE_S", "1")
    try:
        study, created = open_study(spec, spec.storage)
        assert created
        for fault in FAULTS:
            study.enqueue_trial({"fault": fault}, user_attrs={names.ROLE: "search"})
        watcher = Watcher()
        summary = run_study(spec, RunOptions(trials=1 + len(FAULTS), seed=1), on_trial=watcher)
    finally:
        mp.undo()
    assert summary.stopped_because is None
    study = optuna.load_study(study_name=spec.name, storage=spec.storage)
    by_fault = {t.params.get("fault"): t for t in study.trials if t.params.get("fault")}
    return study, by_fault, watcher


def test_baseline_is_healthy_and_every_fault_got_its_trial(matrix) -> None:
    study, by_fault, watcher = matrix
    baseline = study.trials[0]
    assert baseline.user_attrs[names.ROLE] == "baseline"
    assert baseline.state == TrialState.COMPLETE, baseline.user_attrs
    assert baseline.user_attrs[names.CORRECT] is True
    assert set(by_fault) == set(FAULTS), "the loop must go on after each failed trial"
    assert len(study.trials) == 1 + len(FAULTS)
    assert study.user_attrs.get(names.REFERENCE) is not None


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_reason_evidence_and_cleanup(matrix, fault: str) -> None:
    study, by_fault, watcher = matrix
    trial = by_fault[fault]
    attrs = trial.user_attrs
    expected = EXPECTED[fault]
    assert watcher.survivors[trial.number] == [], f"{fault}: processes survived the trial"
    assert attrs[names.SERVER].get("stopped_cleanly") is True
    if expected is None:
        # healthy: measured to the end, or screened (correct, and its one round happened to
        # land clearly below the baseline's: the same fake server on a busy host), never failed
        assert attrs[names.CORRECT] is True, attrs
        screened = attrs.get(names.FAIL_REASON) == names.SCREENED
        assert screened or names.FAIL_REASON not in attrs, attrs
        assert trial.state == (TrialState.PRUNED if screened else TrialState.COMPLETE), attrs
        return
    assert attrs.get(names.FAIL_REASON) == expected, (
        attrs.get(names.FAIL_REASON),
        attrs.get(names.FAIL_DETAIL),
    )
    # A configuration fault: PRUNED with the correctness constraint violated, never a made-up value.
    assert trial.state == TrialState.PRUNED
    assert trial.system_attrs.get("constraints:correct") == 1.0
    evidence = attrs[names.EVIDENCE]
    assert "log_tail" in evidence and evidence["log_tail"], evidence
    assert "fake_server" in evidence["log_tail"] or "usage:" in evidence["log_tail"]
    assert "exit_code" in evidence
    assert attrs[names.FAIL_DETAIL]
    if fault != "unknown_flag":  # the parser rejects the argv before anything starts
        assert "spawned child pid=" in evidence["log_tail"]  # so a child had to be stopped too


def test_fault_details(matrix) -> None:
    _study, by_fault, _watcher = matrix

    def attrs(fault: str) -> dict:
        return by_fault[fault].user_attrs

    assert attrs("exit_at_start")[names.EVIDENCE]["exit_code"] == 3
    assert "Engine core initialization failed" in attrs("exit_at_start")[names.EVIDENCE]["log_tail"]
    assert attrs("unknown_flag")[names.EVIDENCE]["exit_code"] == 2
    assert "unrecognized arguments" in attrs("unknown_flag")[names.EVIDENCE]["log_tail"]
    assert attrs("oom")[names.EVIDENCE]["exit_code"] == 1
    assert "CUDA out of memory" in attrs("oom")[names.EVIDENCE]["log_tail"]
    # the OOM verdict rests on the log's evidence, and the detail carries the engine's line
    oom_cause = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert attrs("oom")[names.EVIDENCE]["root_cause"].startswith(oom_cause)
    assert attrs("oom")[names.EVIDENCE]["oom_evidence"]["log"].startswith(oom_cause)
    assert attrs("oom")[names.FAIL_DETAIL].startswith(
        f"server exited with code 1 before ready: {oom_cause}"
    )
    crash = attrs("crash_mid_bench")
    assert crash[names.EVIDENCE]["exit_code"] == 1
    assert crash[names.FAIL_DETAIL].endswith(
        ": RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    killed = attrs("self_sigkill")
    assert killed[names.EVIDENCE]["exit_code"] == -9
    assert killed[names.EVIDENCE]["signal"] == 9
    assert killed[names.EVIDENCE]["signal_name"] == "SIGKILL"
    assert "oom_evidence" not in killed[names.EVIDENCE]
    assert "killed by SIGKILL (no evidence of OOM)" in killed[names.FAIL_DETAIL]
    assert killed.get(names.CHECK, {}).get("passed", True) is not False  # it died after the gate
    assert attrs("unknown_flag")[names.EVIDENCE]["root_cause"].endswith(
        ": error: unrecognized arguments: --fake-unknown-engine-arg"
    )
    assert crash.get(names.CHECK, {}).get("passed", True) is not False
    assert (
        f"{REQUEST_TIMEOUT_S:g}" in attrs("hang")[names.FAIL_DETAIL]
        or "timed out" in attrs("hang")[names.FAIL_DETAIL]
    )
    assert attrs("hang")[names.EVIDENCE]["exit_code"] is None  # alive, but silent
    assert "not ready within" in attrs("slow_start")[names.FAIL_DETAIL]
    assert "slow start" in attrs("slow_start")[names.EVIDENCE]["log_tail"]
    for fault in ("http_500", "healthy_but_broken"):
        assert (
            "healthy, but the first completion failed with 500" in attrs(fault)[names.FAIL_DETAIL]
        )
    assert "head_dim" in attrs("healthy_but_broken")[names.FAIL_DETAIL]
    wrong = attrs("wrong_text")
    assert wrong[names.CORRECT] is False
    divergence = wrong[names.EVIDENCE]["first_divergence"]
    assert divergence["position"] == 1
    assert divergence["expected_text"] and divergence["got_text"]
    assert divergence["expected_text"] != divergence["got_text"]
    assert divergence["prompt"] in ("1 2 3", "a b c")
    corrupt = attrs("corrupt_words")
    assert corrupt[names.CORRECT] is False and names.METRICS not in corrupt
    divergence = corrupt[names.EVIDENCE]["first_divergence"]
    assert (divergence["kind"], divergence["position"]) == ("token", 6)  # every 7th word
    # The first silent request ends the benchmark: one deadline, named with its phase.
    hung = attrs("hang_in_bench")
    assert hung[names.FAIL_DETAIL].startswith("warm-up phase: request 1 of 1")
    assert f"no token within {REQUEST_TIMEOUT_S:g} s" in hung[names.FAIL_DETAIL]
    assert hung[names.BENCH]["failed_requests"] == 1 and hung[names.BENCH]["hang"]
    assert hung[names.CHECK]["passed"] is True  # verified first, silent only under load


def test_hang_and_sigterm_are_bounded(matrix) -> None:
    """A hang costs about the request deadline, an ignored SIGTERM about the stop grace."""
    _study, by_fault, watcher = matrix
    assert (
        watcher.seconds[by_fault["hang"].number] < STARTUP_S + 2 * REQUEST_TIMEOUT_S + ALLOWANCE_S
    )
    assert watcher.seconds[by_fault["ignore_sigterm"].number] < ALLOWANCE_S  # stop grace 1 s
    assert watcher.seconds[by_fault["slow_start"].number] < STARTUP_S + ALLOWANCE_S


def test_no_fake_process_survives_the_matrix(matrix) -> None:
    assert fake_processes() == []


# --- a broken baseline ----------------------------------------------------------------------


def test_broken_baseline_stops_the_study_within_one_trial(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, baseline="exit_at_start"))
    started = time.monotonic()
    with pytest.raises(PreflightError) as caught:
        run_study(spec, RunOptions(trials=5, seed=1))
    message = str(caught.value)
    assert "baseline" in message and "startup_failed" in message
    assert "exited with code 3" in message
    study = optuna.load_study(study_name=spec.name, storage=spec.storage)
    assert len(study.trials) == 1
    assert study.trials[0].user_attrs[names.FAIL_REASON] == "startup_failed"
    assert time.monotonic() - started < STARTUP_S + ALLOWANCE_S
    assert fake_processes() == []


# --- infrastructure faults --------------------------------------------------------------------


@pytest.fixture
def held_port():
    """A port bound by the test (not listening, no SO_REUSEADDR): a server cannot bind it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_port_taken_is_infrastructure_retried_once(
    tmp_path: Path, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def flaky_free_port(host: str = "127.0.0.1") -> int:
        calls.append(host)
        return held_port if len(calls) == 2 else _proc.free_port(host)  # the first search trial

    monkeypatch.setattr(autotune.study.trial, "free_port", flaky_free_port)
    spec = load_spec(write_spec(tmp_path))
    study, _ = open_study(spec, spec.storage)
    study.enqueue_trial({"fault": "ignore_sigterm"}, user_attrs={names.ROLE: "search"})
    monkeypatch.setenv("AUTOTUNE_STOP_GRACE_S", "1")
    summary = run_study(spec, RunOptions(trials=2, seed=1))
    assert summary.stopped_because is None
    study = optuna.load_study(study_name=spec.name, storage=spec.storage)
    trials = study.trials
    failed, retry = trials[1], trials[2]
    # the retry is healthy: measured, or screened on a busy host (correct, one round only)
    retry_state = (
        TrialState.PRUNED
        if retry.user_attrs.get(names.FAIL_REASON) == names.SCREENED
        else TrialState.COMPLETE
    )
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, retry_state]
    assert retry.user_attrs[names.CORRECT] is True
    assert failed.user_attrs[names.FAIL_REASON] == "port_taken"
    assert "address already in use" in failed.user_attrs[names.EVIDENCE]["log_tail"].lower()
    assert "constraints:correct" not in failed.system_attrs  # not held against the config
    assert retry.params == failed.params
    assert retry.user_attrs[names.RETRY_OF] == failed.number
    retry_verdict = names.SCREENED if retry_state == TrialState.PRUNED else "correct"
    assert [o.verdict for o in summary.outcomes] == ["correct", "port_taken", retry_verdict]
    assert fake_processes() == []


def test_consecutive_infrastructure_faults_stop_the_run(
    tmp_path: Path, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def broken_free_port(host: str = "127.0.0.1") -> int:
        calls.append(host)
        return _proc.free_port(host) if len(calls) == 1 else held_port  # healthy baseline only

    monkeypatch.setattr(autotune.study.trial, "free_port", broken_free_port)
    spec = load_spec(write_spec(tmp_path, max_infra=2))
    study, _ = open_study(spec, spec.storage)
    for _ in range(4):
        study.enqueue_trial({"fault": None}, user_attrs={names.ROLE: "search"})
    summary = run_study(spec, RunOptions(trials=10, seed=1))
    assert summary.stopped_because is not None
    assert "2 infrastructure failures in a row" in summary.stopped_because
    assert "port_taken" in summary.stopped_because
    study = optuna.load_study(study_name=spec.name, storage=spec.storage)
    states = [t.state for t in study.trials if t.state != TrialState.WAITING]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL]
    assert all(t.user_attrs[names.FAIL_REASON] == "port_taken" for t in study.trials[1:3])
    assert fake_processes() == []


def test_every_matrix_fault_is_one_the_test_server_has() -> None:
    """A fault name the fake server does not know would make its trial fail for another reason."""
    assert set(FAULTS) <= set(FAKE_FAULTS)
