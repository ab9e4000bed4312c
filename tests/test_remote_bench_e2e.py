"""`autotune bench --url` against a real vLLM demo server the test starts itself (not autotune):
the JSON carries the metric names with positive throughput, and vLLM's own /metrics evidence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.builders import DEMO_MODEL, write_demo_spec
from tests.helpers import autotune_cmd

pytestmark = pytest.mark.e2e


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process ``pid`` listens on at 127.0.0.1 (the HTTP one among them)."""
    return sorted(
        conn.laddr.port
        for conn in psutil.Process(pid).net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr.ip == "127.0.0.1"
    )


SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [4, 16]
    target: {flag: --max-num-seqs}
"""


def test_bench_url_measures_a_running_vllm_server(tmp_path) -> None:
    spec_path = write_demo_spec(tmp_path, SPACE, name="remote_e2e")
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]
    argv += [str(DEMO_MODEL), "--served-model-name", "demo", "--host", "127.0.0.1"]
    argv += ["--port", "0", "--max-model-len", "512", "--enforce-eager"]
    argv += ["--kv-cache-memory-bytes", "268435456", "--dtype", "bfloat16"]
    env = {**os.environ, "VLLM_API_KEY": "e2e-key"}
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        port = None
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            # --port 0: the kernel picks the port (no guessing); vLLM's API server process binds
            # it before it starts the engine; the one that answers /health is the HTTP port.
            for candidate in listening_ports(proc.pid):
                try:
                    url = f"http://127.0.0.1:{candidate}/health"
                    if httpx.get(url, timeout=5).status_code == 200:
                        port = candidate
                except httpx.HTTPError:
                    pass
            time.sleep(0.5)
        assert port is not None, (tmp_path / "server.log").read_text()[-3000:]
        out = tmp_path / "bench.json"
        done = subprocess.run(
            autotune_cmd(
                "bench",
                "--spec",
                str(spec_path),
                "--url",
                f"http://127.0.0.1:{port}",
                "--json",
                str(out),
            ),  # fmt: skip
            env={**os.environ, "AUTOTUNE_API_KEY": "e2e-key"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        data = json.loads(out.read_text())
        for name in ("output_tokens_per_s", "decode_tokens_per_s", "requests_per_s"):
            assert data[name] > 0, name
        for name in ("ttft_p50_ms", "e2e_p99_ms"):
            assert name in data
        # vLLM's CPU server streams in bursts under load: then its ITL percentiles time a
        # flush, and are absent with the shape saying why, never 0.0
        assert data.get("itl_p95_ms", 0) > 0 or data["stream_shape"].get("itl") == "bursty"
        assert data["stream_shape"]["single"]["tokens_per_s"] > 0
        evidence = data["server_metrics"]
        assert evidence["available"] is True, evidence
        total = evidence["total"]
        # 1 warm-up + 1 single + 1 fresh-prompt control + 8 load requests of 32 tokens,
        # counted by vLLM itself
        assert total["generation_tokens"] == 11 * 32, total
        assert {"preemptions", "requests_running_max", "kv_cache_usage_max"} <= set(total)
        assert "load at 4 (round 1)" in evidence["phases"]
        # the real server decodes a fresh prompt as fast as a repeated one: no cache replay
        replay = data["bench"]["replay_check"]
        assert replay["checked"] and not replay["flagged"], replay
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
