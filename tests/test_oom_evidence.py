"""OOM is named from evidence, never from a word (issue 31, item 6).

A real process stands in for the server: it logs its lines, waits until the memory watch has
sampled it, then kills itself with a signal. A harmless INFO line that contains "out of
memory" followed by a SIGSEGV is a crash with the signal named; an error-level out-of-memory
line of the engine (an exception, an ERROR line) still makes it ``oom``.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from autotune.engines.base import LaunchConfig, classify_common, is_error_message
from autotune.engines.vllm import logs as vllm_logs
from autotune.server.process import ServerProcess

#: prints its lines to stderr, waits for the go file, then kills itself with argv[2]
_SELF_SIGNAL = """
import os, pathlib, signal, sys, time
for line in sys.argv[3:]:
    print(line, file=sys.stderr, flush=True)
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.02)
signal.signal(int(sys.argv[2]), signal.SIG_DFL)
os.kill(os.getpid(), int(sys.argv[2]))
time.sleep(60)
"""

INFO_OOM = (
    "INFO 12-01 03:00:16 [allocator.py:88] probing: no out of memory condition seen, "
    "cannot allocate memory checks passed"
)
VLLM_INFO_OOM = (
    "(EngineCore pid=12) INFO 12-01 03:00:16 [worker.py:201] a smaller model would leave "
    "more room; out of memory is not expected"
)


def died(tmp_path: Path, signum: int, *lines: str, classify=classify_common):
    go = tmp_path / "go"
    server = ServerProcess(
        LaunchConfig(
            argv=(sys.executable, "-c", _SELF_SIGNAL, str(go), str(int(signum)), *lines),
            env={},
            host="127.0.0.1",
            port=1,
            api_key="k",
            served_model="m",
        ),
        tmp_path / "server.log",
        startup_timeout_s=30,
        classify=classify,
    )
    server.start()
    try:
        deadline = time.monotonic() + 60
        while server._memory.last is None and time.monotonic() < deadline:
            time.sleep(0.05)  # waits for a fact (one sample taken), not for a margin
        assert server._memory.last is not None, "the memory watch never sampled the server"
        go.touch()
        server._popen.wait(timeout=60)
        assert server.exit_code() == -int(signum)
        return server.failure("server_crashed", "server died during the benchmark")
    finally:
        server.stop()


def test_an_info_line_saying_out_of_memory_then_sigsegv_is_a_crash(tmp_path: Path) -> None:
    failure = died(tmp_path, signal.SIGSEGV, "serving", INFO_OOM, "still serving")
    assert failure.reason == "server_crashed"
    assert failure.evidence["signal"] == signal.SIGSEGV
    assert failure.evidence["signal_name"] == "SIGSEGV"
    assert "oom_evidence" not in failure.evidence
    assert "killed by SIGSEGV (no evidence of OOM)" in failure.detail


def test_the_same_with_vllms_classifier_and_prefix(tmp_path: Path) -> None:
    failure = died(tmp_path, signal.SIGSEGV, VLLM_INFO_OOM, classify=vllm_logs.classify)
    assert failure.reason == "server_crashed"
    assert failure.evidence["signal_name"] == "SIGSEGV"
    assert "killed by SIGSEGV" in failure.detail


@pytest.mark.parametrize(
    "line",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "(EngineCore pid=12) ERROR 12-01 03:00:16 [core.py:1510] CUDA error: out of memory",
        "RuntimeError: CUDA error: out of memory",
    ],
)
def test_an_error_level_oom_line_before_a_signal_is_still_oom(tmp_path: Path, line: str) -> None:
    failure = died(tmp_path, signal.SIGSEGV, "serving", INFO_OOM, line, classify=vllm_logs.classify)
    assert failure.reason == "oom"
    assert "oom_evidence" in failure.evidence


def test_vllm_memory_checks_count_only_as_errors() -> None:
    check = "Available memory on node 0 (1/2 GiB) is less than requested memory for kv (9 GiB)."
    assert vllm_logs.classify(
        f"(VllmWorker-0 pid=3) ERROR 12-01 03:27:15 [x.py:9] ValueError: {check}"
    )
    assert vllm_logs.classify(f"(VllmWorker-0 pid=3) INFO 12-01 03:27:15 [x.py:9] {check}") is None
    assert classify_common(INFO_OOM) is None
    assert classify_common("WARNING [mem] out of memory soon") is None


def test_what_an_error_message_is() -> None:
    assert is_error_message("ERROR 12-01 [a.py:1] out of memory")
    assert is_error_message("[CRITICAL] out of memory")
    assert is_error_message("MemoryError")
    assert is_error_message(
        "terminate called after throwing an instance of 'c10::OutOfMemoryError'"
    )
    assert not is_error_message("INFO 12-01 [a.py:1] MemoryError would be raised if ...")
    assert not is_error_message("level=warning msg=out of memory soon")
    assert not is_error_message("the pool is out of memory")  # no level, names no error
