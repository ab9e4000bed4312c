"""Does autotune's benchmark client measure what ``vllm bench serve`` measures? (real vLLM CPU)

A counterbalanced, paired comparison on ONE real vLLM CPU server::

    flock /tmp/autotune-vllm.lock env PYTHONPATH=$PWD .venv/bin/python \\
        benchmarks/client_accuracy.py --blocks 12 --arms autotune,vllm,vllm_ids
    # the same with the server pinned to core 0 and both clients to core 1:
    ... benchmarks/client_accuracy.py --blocks 10 --pin \
        --out benchmarks/results/client_accuracy_pinned.json

One server is started with the demo's fixed arguments (``studies/demo.yaml``) through autotune's
own ``VllmEngine.build_launch`` and ``ServerProcess``. Every arm sends the same requests: the
workload's prompts round-robin (the same order), ``max_tokens`` 64 with ``ignore_eos``, greedy,
streaming, concurrency 16, ``--num-requests`` per round. Arms:

* ``autotune``: autotune's client, ``autotune.bench.phase.run_phase`` (the load phase of
  ``run_benchmark``) through ``autotune.client.http.build_client``, in this process; metrics from
  ``autotune.bench.phase.summarize``. It sends ``return_token_ids: true`` (autotune needs the ids
  for its correctness-under-load check).
* ``vllm``: ``vllm bench serve`` (``--backend vllm`` on ``/v1/completions``, a custom JSONL dataset
  of the same prompts, ``--disable-shuffle --skip-chat-template --ignore-eos --temperature 0
  --max-concurrency 16 --request-rate inf``), run by a long-lived worker process
  (``benchmarks/_vllm_cli.py serve-worker``) so vLLM is imported once, not per round.
* ``vllm_ids``: ``vllm`` plus ``--extra-body '{"return_token_ids": true}'``: vLLM's client asking
  for what autotune's asks for. Separates a server-side cost of the field from a client error.
* ``autotune_noids``: ``autotune`` with ``return_token_ids`` removed from the request body (the
  same client otherwise): the same question from the other side.

Design: one unrecorded warm-up round of every arm, then ``--blocks`` blocks; each block runs
every arm once, in an order drawn per block from a seeded RNG (``--seed``), so neither order nor
drift can favour an arm. A pair is one block's (arm, ``vllm``) rounds. Per metric and arm:
the per-block ratio arm / ``vllm``, the geometric mean of the ratios with a 95% t interval on
their logarithms, and each arm's median.

Per round it also records: the client's CPU seconds (autotune: ``time.process_time`` of this
process around ``run_phase``; vLLM: the worker's ``time.process_time`` around vLLM's
``benchmark()`` coroutine) and per streamed token; the server's CPU (every process of its tree,
psutil) per token; the whole machine's busy CPU and what the rest of the machine (other work
on a shared machine) took; the load average before and after.

``--pin`` sets the CPU affinity of every thread of the server's processes to core 0 and of both
clients to core 1 (a client then cannot take CPU from the server; the rest of the machine still
can). ``--client-nice`` renices the clients' threads; ``--client-autogroup-nice`` renices this
session's scheduler autogroup (with ``kernel.sched_autogroup_enabled`` CPU is shared between
sessions, so thread nice values do not reach across them; the server has a session of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import platform
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune._proc import free_port  # noqa: E402
from autotune._stats import t_quantile  # noqa: E402
from autotune.bench.phase import PhaseResult, percentile, run_phase, summarize  # noqa: E402
from autotune.client.http import build_client  # noqa: E402
from autotune.engines import build_engine  # noqa: E402
from autotune.engines.vllm.dialect import VLLM_DIALECT  # noqa: E402
from autotune.server.process import ServerProcess  # noqa: E402
from autotune.space.settings import ServerSettings  # noqa: E402
from autotune.spec.load import load_spec  # noqa: E402

RESULT_PATH = ROOT / "benchmarks" / "results" / "client_accuracy.json"
VLLM_CLI = ROOT / "benchmarks" / "_vllm_cli.py"
METRICS = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
ARMS = ("autotune", "vllm", "vllm_ids", "autotune_noids", "autotune_proc")
#: event-loop lag probe period (autotune arms): how late the loop wakes up says how long the
#: client could not read a token or send a request
LAG_PROBE_S = 0.02
REFERENCE = "vllm"


def machine_info() -> dict[str, Any]:
    from autotune.engines.vllm.version import installed_vllm_version

    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "vllm": installed_vllm_version(),
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# --- CPU accounting -------------------------------------------------------------------------


def tree_cpu_s(root_pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants."""
    total = 0.0
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return math.nan
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def machine_busy_s() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def renice_threads(pid: int, nice: int) -> int:
    """Set the nice value of every thread of one process (not its children: the server is a
    child of this process and keeps its priority). Threads created later inherit it."""
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            count += 1
        except (ProcessLookupError, PermissionError):
            pass
    return count


def pin_tree(root_pid: int, cpus: set[int]) -> int:
    """Set the affinity of every thread of a process tree (new threads inherit it)."""
    count = 0
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for proc in procs:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
                count += 1
            except (ProcessLookupError, PermissionError):
                pass
    return count


# --- the clients ----------------------------------------------------------------------------


#: for the ``autotune_noids`` arm: the same client, with no field asking for token ids
NOIDS_DIALECT = dataclasses.replace(VLLM_DIALECT, token_ids_field=None)


async def autotune_round(
    launch, prompts: list[str], n: int, concurrency: int, max_tokens: int, *, token_ids: bool
) -> dict[str, float]:
    async with build_client(launch, max_connections=concurrency + 8) as client:
        lags: list[float] = []
        probe = asyncio.ensure_future(_lag_probe(lags))
        cpu0 = time.process_time()
        load = await run_phase(
            client,
            launch.served_model,
            prompts,
            n,
            concurrency,
            max_tokens,
            dialect=VLLM_DIALECT if token_ids else NOIDS_DIALECT,
            read_timeout_s=60.0,
        )
        metrics = summarize(PhaseResult(records=(), wall_s=0.0), load)
        cpu = time.process_time() - cpu0
        probe.cancel()
    failed = [r for r in load.records if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} autotune requests failed: {failed[0].error}")
    tokens = sum(r.output_tokens for r in load.records)
    # vllm bench's ITL is per *chunk* (one gap per streamed event); autotune's is per token (a
    # chunk of k tokens adds k-1 zero gaps). The per-chunk figure makes the two comparable.
    chunk_gaps = []
    for r in load.records:
        times = sorted(set(r.token_times_s))
        chunk_gaps += [(b - a) * 1000 for a, b in zip(times, times[1:], strict=False)]
    return {
        "output_tokens_per_s": metrics["output_tokens_per_s"],
        "ttft_p50_ms": metrics["ttft_p50_ms"],
        "ttft_p99_ms": metrics["ttft_p99_ms"],
        "itl_p50_ms": metrics["itl_p50_ms"],
        "itl_p99_ms": metrics["itl_p99_ms"],
        "itl_chunk_p50_ms": percentile(chunk_gaps, 50),
        "itl_chunk_p99_ms": percentile(chunk_gaps, 99),
        "output_tokens": float(tokens),
        "completed": float(len(load.records)),
        "duration_s": load.wall_s,
        "client_cpu_s": cpu,
        # mean number of requests in flight (closed loop: 16 unless the client is slow to send)
        "mean_in_flight": sum(r.e2e_s or 0.0 for r in load.records) / load.wall_s,
        "loop_lag_p50_ms": percentile(lags, 50) * 1000,
        "loop_lag_p99_ms": percentile(lags, 99) * 1000,
        "loop_lag_max_ms": max(lags, default=0.0) * 1000,
        # wall time the loop woke up > 5 ms late, over the round: when it could not run
        "loop_stalled_share": sum(x for x in lags if x > 0.005) / load.wall_s,
    }


async def _lag_probe(lags: list[float]) -> None:
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(LAG_PROBE_S)
        lags.append(max(0.0, time.perf_counter() - t0 - LAG_PROBE_S))


def autotune_worker() -> None:
    """``--autotune-worker``: autotune's client in a process of its own, one round per stdin line
    (the same protocol as ``_vllm_cli.py serve-worker``). Without ``ServerProcess``'s background
    threads (descendant tracking, memory watch) that share the client's process in a trial."""
    print("@@READY", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        launch = argparse.Namespace(**job.pop("launch"))
        try:
            row = asyncio.run(autotune_round(launch, **job))
            answer = {"ok": True, "result": row}
        except Exception as exc:  # reported to the caller, which stops the run
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print("@@RESULT " + json.dumps(answer), flush=True)


class Worker:
    """A client in a long-lived process of its own: one JSON line in, one ``@@RESULT`` line out
    (``_vllm_cli.py serve-worker``: ``vllm bench serve``; ``--autotune-worker``: autotune's)."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        self._expect("@@READY")

    def _expect(self, marker: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(marker):
                return line[len(marker) :].strip()
        raise RuntimeError(f"vllm bench worker exited ({self.proc.wait()}); see {self._log.name}")

    def run(self, job: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self._expect("@@RESULT"))
        if not answer["ok"]:
            raise RuntimeError(f"client worker failed: {answer['error']} (see {self._log.name})")
        return answer

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def vllm_argv(launch, dataset: Path, n: int, conc: int, max_tokens: int, tokenizer: str, ids: bool):
    argv = [
        "--backend", "vllm",
        "--base-url", launch.base_url,
        "--endpoint", "/v1/completions",
        "--model", launch.served_model,
        "--tokenizer", tokenizer,
        "--dataset-name", "custom",
        "--dataset-path", str(dataset),
        "--disable-shuffle",
        "--skip-chat-template",
        "--custom-output-len", str(max_tokens),
        "--ignore-eos",
        "--temperature", "0",
        "--num-prompts", str(n),
        "--max-concurrency", str(conc),
        "--request-rate", "inf",
        "--percentile-metrics", "ttft,itl",
        "--metric-percentiles", "50,99",
        "--disable-tqdm",
    ]  # fmt: skip
    if ids:
        argv += ["--extra-body", json.dumps({"return_token_ids": True})]
    return argv


def vllm_round(worker: Worker, argv: list[str]) -> dict[str, float]:
    answer = worker.run(argv)
    data = answer["result"]
    if data.get("failed"):
        raise RuntimeError(f"vllm bench: {data['failed']} failed requests")
    return {
        "output_tokens_per_s": data["output_throughput"],
        "ttft_p50_ms": data["p50_ttft_ms"],
        "ttft_p99_ms": data["p99_ttft_ms"],
        "itl_p50_ms": data["p50_itl_ms"],
        "itl_p99_ms": data["p99_itl_ms"],
        "output_tokens": float(data["total_output_tokens"]),
        "completed": float(data["completed"]),
        "duration_s": data["duration"],
        "client_cpu_s": answer["benchmark_cpu_s"],
        "client_call_cpu_s": answer["call_cpu_s"],
        "mean_in_flight": answer["sum_latency_s"] / data["duration"],
    }


# --- statistics -----------------------------------------------------------------------------


def paired_ratio(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """Geometric mean of a/b over pairs and its 95% t interval (on the log ratios)."""
    logs = [math.log(a / b) for a, b in pairs if a > 0 and b > 0]
    out: dict[str, Any] = {"n": len(logs), "skipped_zero": len(pairs) - len(logs)}
    if not logs:
        return out
    mean = statistics.fmean(logs)
    out["geomean"] = round(math.exp(mean), 4)
    out["ratios"] = [round(math.exp(x), 4) for x in logs]
    if len(logs) >= 2:
        half = t_quantile(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        out["ci95"] = [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)]
    return out


def analyse(blocks: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    keys = (
        *METRICS,
        "itl_chunk_p50_ms",
        "itl_chunk_p99_ms",
        "mean_in_flight",
        "loop_lag_p99_ms",
        "loop_lag_max_ms",
        "loop_stalled_share",
    )
    medians = {
        arm: {
            k: round(statistics.median(b[arm][k] for b in blocks), 4)
            for k in (*keys, "duration_s", "client_cpu_us_per_token", "server_cpu_us_per_token",
                      "server_cpu_share", "client_cpu_share", "other_cpu_share")
            if all(k in b[arm] for b in blocks)
        }
        for arm in arms
    }  # fmt: skip
    ratios: dict[str, dict[str, Any]] = {}
    refs = [REFERENCE] + (["vllm_ids"] if "vllm_ids" in arms else [])
    for arm in arms:
        for ref in refs:
            if arm == ref or (ref == "vllm_ids" and not arm.startswith("autotune")):
                continue
            name = f"{arm}/{ref}"
            ratios[name] = {
                m: paired_ratio([(b[arm][m], b[ref][m]) for b in blocks]) for m in METRICS
            }
            if arm.startswith("autotune"):  # per-chunk ITL: vllm bench's definition
                for m in ("itl_p50_ms", "itl_p99_ms"):
                    chunk = m.replace("itl_", "itl_chunk_")
                    ratios[name][chunk] = paired_ratio([(b[arm][chunk], b[ref][m]) for b in blocks])
    return {"medians": medians, "paired_ratios": ratios}


# --- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=10, help="blocks (pairs); >= 10 for a CI")
    parser.add_argument("--num-requests", type=int, default=256, help="requests per round")
    parser.add_argument("--arms", default="autotune,vllm", help=f"comma list of {ARMS}")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--pin", action="store_true", help="server on core 0, clients on core 1")
    parser.add_argument(
        "--client-nice",
        type=int,
        default=None,
        help="nice value for both clients' processes (e.g. -10: a client that is never starved "
        "of CPU by the rest of a busy machine; the server keeps its priority)",
    )
    parser.add_argument(
        "--client-autogroup-nice",
        type=int,
        default=None,
        help="nice value of this session's scheduler autogroup (Linux with autogroups: CPU is "
        "shared between sessions, so thread nice values do not reach across them); the server "
        "runs in a session of its own and keeps its priority",
    )
    parser.add_argument("--spec", default=str(ROOT / "studies" / "demo.yaml"))
    parser.add_argument("--out", type=Path, default=RESULT_PATH)
    parser.add_argument("--autotune-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.autotune_worker:
        autotune_worker()
        return 0
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if REFERENCE not in arms or any(a not in ARMS for a in arms):
        parser.error(f"--arms must include {REFERENCE!r} and name only {ARMS}")

    spec = load_spec(args.spec)
    engine = build_engine(spec)
    workload = spec.workload
    n, conc, max_tokens = args.num_requests, workload.concurrency, workload.max_tokens
    prompts = list(workload.prompts)
    launch = engine.build_launch(
        ServerSettings(),
        host="127.0.0.1",
        port=free_port("127.0.0.1"),
        api_key=secrets.token_urlsafe(24),
    )
    workdir = Path(tempfile.mkdtemp(prefix="client-accuracy-"))
    dataset = workdir / "prompts.jsonl"
    dataset.write_text(
        "".join(json.dumps({"prompt": prompts[i % len(prompts)]}) + "\n" for i in range(n))
    )
    tokenizer = spec.model.path
    argvs = {
        "vllm": vllm_argv(launch, dataset, n, conc, max_tokens, tokenizer, ids=False),
        "vllm_ids": vllm_argv(launch, dataset, n, conc, max_tokens, tokenizer, ids=True),
    }
    # vllm bench's backends send OPENAI_API_KEY as the bearer token
    env = dict(
        os.environ,
        OPENAI_API_KEY=launch.api_key,
        NO_PROXY="127.0.0.1,localhost",
        PYTHONUNBUFFERED="1",
    )
    started = time.perf_counter()
    # The worker first: importing vLLM is CPU the server's start-up may share, not a round.
    worker = Worker([sys.executable, str(VLLM_CLI), "serve-worker"], workdir / "vllm.log", env)
    print(f"vllm bench worker ready after {time.perf_counter() - started:.0f} s", flush=True)
    own = None
    if "autotune_proc" in arms:
        own = Worker([sys.executable, __file__, "--autotune-worker"], workdir / "autotune.log", env)
    server = ServerProcess(
        launch, workdir / "server.log", startup_timeout_s=400, classify=engine.classify_failure
    )
    rng = random.Random(args.seed)
    blocks: list[dict[str, Any]] = []
    pinned: dict[str, Any] | None = None
    reniced: dict[str, Any] | None = None
    server.start()
    try:

        async def ready() -> float:
            async with build_client(launch) as client:
                return (await server.wait_ready(client)).startup_s

        startup_s = asyncio.run(ready())
        print(f"server ready in {startup_s:.1f} s (log {workdir / 'server.log'})", flush=True)
        if args.pin:
            pinned = {
                "server_cpus": [0],
                "client_cpus": [1],
                "server_threads": pin_tree(server.pid, {0}),
                "client_threads": pin_tree(os.getpid(), {1})
                + pin_tree(worker.proc.pid, {1})
                + (pin_tree(own.proc.pid, {1}) if own else 0),
            }
            print(f"pinned: {pinned}", flush=True)
        if args.client_nice is not None:
            pids = [os.getpid(), worker.proc.pid] + ([own.proc.pid] if own else [])
            reniced = {
                "nice": args.client_nice,
                "threads": sum(renice_threads(pid, args.client_nice) for pid in pids),
            }
            print(f"clients reniced: {reniced}", flush=True)
        if args.client_autogroup_nice is not None:
            Path("/proc/self/autogroup").write_text(str(args.client_autogroup_nice))
            reniced = {
                **(reniced or {}),
                "autogroup": Path("/proc/self/autogroup").read_text().strip(),
                "server_autogroup": Path(f"/proc/{server.pid}/autogroup").read_text().strip(),
            }
            print(f"client session's autogroup: {reniced}", flush=True)

        def one_round(arm: str) -> dict[str, float]:
            load0 = os.getloadavg()
            srv0, busy0, wall0 = tree_cpu_s(server.pid), machine_busy_s(), time.perf_counter()
            if arm == "autotune_proc":
                assert own is not None
                job = {
                    "launch": {
                        "base_url": launch.base_url,
                        "api_key": launch.api_key,
                        "served_model": launch.served_model,
                    },
                    "prompts": prompts,
                    "n": n,
                    "concurrency": conc,
                    "max_tokens": max_tokens,
                    "token_ids": True,
                }
                row = own.run(job)["result"]
            elif arm.startswith("autotune"):
                row = asyncio.run(
                    autotune_round(
                        launch, prompts, n, conc, max_tokens, token_ids=arm == "autotune"
                    )
                )
            else:
                row = vllm_round(worker, argvs[arm])
            wall = time.perf_counter() - wall0
            srv, busy = tree_cpu_s(server.pid) - srv0, machine_busy_s() - busy0
            tokens = row["output_tokens"]
            row["client_cpu_us_per_token"] = row["client_cpu_s"] / tokens * 1e6
            row["server_cpu_s"] = srv
            row["server_cpu_us_per_token"] = srv / tokens * 1e6
            # shares of the machine's CPU capacity over the round (cores x wall), whole call
            capacity = (os.cpu_count() or 1) * wall
            row["round_wall_s"] = wall
            row["server_cpu_share"] = srv / capacity
            row["client_cpu_share"] = row["client_cpu_s"] / capacity
            row["other_cpu_share"] = max(0.0, busy - srv - row["client_cpu_s"]) / capacity
            row["loadavg_1m_before"], row["loadavg_1m_after"] = load0[0], os.getloadavg()[0]
            return row

        for arm in arms:  # warm-up, unrecorded
            one_round(arm)
        for index in range(1, args.blocks + 1):
            order = arms[:]
            rng.shuffle(order)
            block: dict[str, Any] = {"block": index, "order": order}
            for arm in order:
                block[arm] = one_round(arm)
            blocks.append(block)
            print(
                f"block {index:2d} ({'>'.join(order)}): tok/s "
                + ", ".join(f"{a} {block[a]['output_tokens_per_s']:.0f}" for a in arms)
                + f"; load {block[order[0]]['loadavg_1m_before']:.1f}",
                flush=True,
            )
    finally:
        server.stop()
        worker.close()
        if own is not None:
            own.close()

    analysis = analyse(blocks, arms)
    loads = [b[a][k] for b in blocks for a in arms for k in ("loadavg_1m_before",)]
    result = {
        "what": "autotune.bench.phase client vs `vllm bench serve`, same real vLLM CPU server, "
        "counterbalanced blocks (arm order drawn per block)",
        "command": "flock /tmp/autotune-vllm.lock env PYTHONPATH=$PWD .venv/bin/python "
        "benchmarks/client_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "server": {
            "spec": str(Path(args.spec).resolve().relative_to(ROOT)),
            "argv": list(launch.redacted_argv()),
            "startup_s": round(startup_s, 2),
            "pinned": pinned,
            "clients_reniced": reniced,
        },
        "workload": {
            "prompts": prompts,
            "num_requests_per_round": n,
            "concurrency": conc,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "request_rate": "inf",
        },
        "design": {"arms": arms, "blocks": args.blocks, "seed": args.seed, "warmup": "one round "
                   "of every arm, unrecorded", "reference": REFERENCE},
        **analysis,
        "loadavg_1m": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "blocks": blocks,
        "machine": machine_info(),
        "note": "2-core machine shared with other work while this ran (see loadavg_1m and "
        "other_cpu_share per round): absolute figures are this machine's at that time; the "
        "per-block pairing and random order are what make the ratios comparable",
        "total_wall_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_summary(result, arms)
    print(f"\nwrote {args.out}")
    return 0


def print_summary(result: dict[str, Any], arms: list[str]) -> None:
    med, ratios = result["medians"], result["paired_ratios"]
    pinned = bool(result["server"]["pinned"])
    nice = result["server"]["clients_reniced"]
    print(f"\nmedians over {result['design']['blocks']} blocks (pinned: {pinned}; clients: {nice})")
    keys = (
        *METRICS,
        "client_cpu_us_per_token",
        "server_cpu_us_per_token",
        "other_cpu_share",
        "mean_in_flight",
        "loop_lag_p99_ms",
        "loop_stalled_share",
    )
    print(f"{'metric':<28}" + "".join(f"{a:>16}" for a in arms))
    for k in keys:
        print(f"{k:<28}" + "".join(f"{med[a].get(k, math.nan):>16.3f}" for a in arms))
    print("\npaired ratio, geometric mean [95% CI] (n)")
    for name, row in ratios.items():
        print(name)
        for metric, r in row.items():
            ci = r.get("ci95", [math.nan, math.nan])
            print(
                f"  {metric:<26}{r.get('geomean', math.nan):>8.3f}  [{ci[0]:.3f}, {ci[1]:.3f}]"
                f"  n={r['n']}" + (f" ({r['skipped_zero']} zero)" if r["skipped_zero"] else "")
            )
    load = result["loadavg_1m"]
    print(f"\nload average (1 min) at round starts: {load['min']:.1f} .. {load['max']:.1f}, "
          f"median {load['median']:.1f}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
