"""End-to-end: patches applied by the vLLM general plugin inside a REAL vLLM CPU server.

Four server starts (about 25 s each, one at a time, always with a small fixed KV cache):

1. unpatched: the reference greedy completions;
2. ``attention_path=direct_call`` + ``noop_example=true``: the direct attention path runs in the
   process that runs the model (marker printed by the forward from a pid other than the API
   server's), and the text
   is unchanged (the path is semantically equivalent and the no-op does nothing);
3. ``qkv_shard_swap=true``: the server starts and answers, and the text is wrong;
4. a patch whose target does not exist: the server fails at start with
   ``AUTOTUNE_PATCH_FAILED`` naming the symbol.

Run: ``pytest -m e2e tests/test_patches_e2e.py``. Needs ``models/demo`` (built by
``autotune.testing.demo_model``) and autotune pip-installed (the plugin is an entry point).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from autotune import _proc

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "demo"
PATCHES = ROOT / "patches"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "patches"
PROMPTS = ("one two three", "17 18 19", "d e f")
MAX_TOKENS = 24
START_TIMEOUT_S = 240.0


@dataclass
class Server:
    """A vLLM server in its own process group; ``log`` holds stdout+stderr. It listens on the
    Unix socket ``uds`` (vLLM's ``--uds``): no TCP port to pick, so none can be taken."""

    proc: subprocess.Popen[bytes]
    uds: Path
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self, timeout: float) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.uds))
        return httpx.Client(transport=transport, base_url="http://localhost", timeout=timeout)

    def complete(self, prompt: str) -> str:
        body = {"model": "demo", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0}
        with self.client(60) as client:
            response = client.post("/v1/completions", json=body)
            response.raise_for_status()
            return str(response.json()["choices"][0]["text"])

    def stop(self) -> None:
        """SIGTERM the API server (it shuts its engine down cleanly), then SIGKILL the whole
        process group (API server, engine core, worker) and wait until the group is gone."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            # Zombies do not count: once an earlier test made this process a child subreaper
            # (autotune's ServerProcess does), the killed engine core is adopted here and waits
            # to be reaped.
            members = _proc.group_members(self.proc.pid)
            if not members:
                return
            for pid in members:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            time.sleep(0.2)
        raise AssertionError(f"process group {self.proc.pid} survived SIGKILL: {members}")


def _start(tmp_path: Path, tag: str, patches: dict[str, object] | None) -> Server:
    """Start the server; return once /health answers (or the process died: check .proc)."""
    uds = tmp_path / f"server-{tag}.sock"
    log = tmp_path / f"server-{tag}.log"
    env = dict(os.environ)
    env.pop("VLLM_PLUGINS", None)
    env.pop("AUTOTUNE_PATCHES", None)
    if patches is not None:
        env["AUTOTUNE_PATCHES"] = json.dumps(patches)
        env["AUTOTUNE_PATCH_DIRS"] = os.pathsep.join([str(PATCHES), str(FIXTURES)])
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL),
        "--served-model-name",
        "demo",
        "--uds",
        str(uds),
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        "134217728",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "8",
    ]
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Server(proc, uds, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            server.stop()
            return server
        with contextlib.suppress(httpx.HTTPError), server.client(2) as client:
            if client.get("/health").status_code == 200:
                return server
        time.sleep(0.5)
    server.stop()
    raise AssertionError(
        f"server {tag} not healthy in {START_TIMEOUT_S}s:\n{server.text()[-4000:]}"
    )


@pytest.fixture(scope="module")
def model() -> Path:
    # The demo model is committed (and `make test` rebuilds it if missing).
    assert (MODEL / "model.safetensors").exists(), "python -m autotune.testing.demo_model"
    return MODEL


@pytest.fixture(scope="module")
def tmp_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("patch_e2e")


@pytest.fixture(scope="module")
def reference(model: Path, tmp_logs: Path) -> Iterator[dict[str, str]]:
    server = _start(tmp_logs, "reference", None)
    try:
        assert server.proc.poll() is None, server.text()[-4000:]
        outputs = {p: server.complete(p) for p in PROMPTS}
        assert "AUTOTUNE_PATCH" not in server.text()
    finally:
        server.stop()
    yield outputs


def _pids(pattern: str, text: str) -> set[int]:
    return {int(m) for m in re.findall(pattern, text)}


def test_attention_direct_call_runs_in_engine_and_keeps_text(
    reference: dict[str, str], tmp_logs: Path
) -> None:
    server = _start(tmp_logs, "direct", {"attention_path": "direct_call", "noop_example": True})
    try:
        assert server.proc.poll() is None, server.text()[-4000:]
        outputs = {p: server.complete(p) for p in PROMPTS}
        log = server.text()
    finally:
        server.stop()
    applied = _pids(r"AUTOTUNE_PATCH_APPLIED name=attention_path value=direct_call pid=(\d+)", log)
    assert applied, log[-4000:]
    assert _pids(r"AUTOTUNE_PATCH_APPLIED name=noop_example value=true pid=(\d+)", log)
    taken = _pids(r"AUTOTUNE_ATTENTION_PATH path=direct_call pid=(\d+)", log)
    # The forward ran the direct path in a process that applied the patch itself and is not the
    # API server: vLLM 0.32 CPU runs the model in a worker process under the engine core.
    assert taken, log[-4000:]
    assert server.proc.pid not in taken
    assert taken <= applied, (taken, applied)
    print("direct_call outputs:", outputs)
    assert outputs == reference


def test_qkv_shard_swap_starts_answers_and_is_wrong(
    reference: dict[str, str], tmp_logs: Path
) -> None:
    server = _start(tmp_logs, "swap", {"qkv_shard_swap": True})
    try:
        assert server.proc.poll() is None, server.text()[-4000:]
        outputs = {p: server.complete(p) for p in PROMPTS}
        log = server.text()
    finally:
        server.stop()
    assert "AUTOTUNE_PATCH_APPLIED name=qkv_shard_swap value=true" in log
    swapped = _pids(r"AUTOTUNE_QKV_SHARD_SWAP swapping k<->v pid=(\d+)", log)
    assert swapped and server.proc.pid not in swapped  # weights load in the worker process
    print("reference:", reference, "\nswapped:", outputs)
    assert all(outputs[p] for p in PROMPTS)  # it answers ...
    assert outputs != reference  # ... and the text is wrong
    assert sum(outputs[p] != reference[p] for p in PROMPTS) >= 2, (outputs, reference)


def test_missing_target_makes_server_fail_to_start(model: Path, tmp_logs: Path) -> None:
    started = time.monotonic()
    server = _start(tmp_logs, "broken", {"broken_target_example": True})
    try:
        assert server.proc.poll() is not None, "server started despite a missing patch target"
    finally:
        server.stop()
    assert server.proc.returncode != 0
    log = server.text()
    assert (
        "AUTOTUNE_PATCH_FAILED name=broken_target_example reason=missing target "
        "vllm.model_executor.layers.linear.QKVParallelLinear.weight_loader_v9"
    ) in log, log[-4000:]
    assert "AUTOTUNE_PATCH_APPLIED" not in log
    assert time.monotonic() - started < START_TIMEOUT_S
