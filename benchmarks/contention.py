"""How much do parallel trials disturb each other? One config alone vs. beside a twin (vLLM CPU).

Rerun (about 5-8 minutes on 2 cores; starts three real vLLM CPU servers)::

    .venv/bin/python benchmarks/contention.py --rounds 3

The demo (``studies/demo.yaml``: model ``models/demo``, its fixed arguments, engine defaults
otherwise) is served three times, through autotune's own ``VllmEngine.build_launch`` and
``ServerProcess``, each pinned with ``VLLM_CPU_OMP_THREADS_BIND`` as ``autotune run --parallel``
pins its workers' servers:

* server A on core 0, server B on core 1 (what ``--parallel 2`` gives each worker on 2 cores);
* server C on cores 0-1 (what a solo run may use).

Each round measures, in an order that alternates between rounds:

* ``solo_core0``: A alone (B and C idle); ``solo_core1``: B alone;
* ``pair``: A and B at the same time, the same workload each (what two parallel trials do);
* ``solo_2cores``: C alone.

A measurement is ``autotune.bench.loadcurve.run_benchmark`` with the demo's workload (exactly
what a trial measures), run in its own process per server, as each parallel worker runs its own
client.
Reported: medians over rounds of decode tok/s (the demo's objective), output tok/s, TTFT p50 and
ITL p50; the slowdown of each pinned server beside its twin vs. alone on the same core; and the
pair's summed output vs. one server on both cores. Only OpenMP compute threads are pinned: the
API-server and engine-core processes of both servers, and the two clients, share both cores, as
they do under ``--parallel``. Results go to ``benchmarks/results/contention.json``.
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
from autotune.bench.loadcurve import run_benchmark  # noqa: E402
from autotune.client.http import build_client  # noqa: E402
from autotune.engines import build_engine  # noqa: E402
from autotune.engines.base import LaunchConfig  # noqa: E402
from autotune.engines.vllm.dialect import VLLM_DIALECT  # noqa: E402
from autotune.server.process import ServerProcess  # noqa: E402
from autotune.space.settings import ServerSettings  # noqa: E402
from autotune.spec.load import load_spec  # noqa: E402

RESULT_PATH = ROOT / "benchmarks" / "results" / "contention.json"
METRICS = ("decode_tokens_per_s", "output_tokens_per_s", "ttft_p50_ms", "itl_p50_ms")
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
KEY_ENV = "CONTENTION_API_KEY"
SERVERS = {"A": "0", "B": "1", "C": "0-1"}
#: the clients of a measurement start together this long after being spawned (imports take
#: seconds on a loaded machine)
START_DELAY_S = 12.0


def machine_info() -> dict[str, Any]:
    from autotune.engines.vllm.version import installed_vllm_version

    return {
        "nproc": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "vllm": installed_vllm_version(),
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "note": "CPU-only machine (2 cores) shared with other engineers' concurrent work "
        "(tests, other benchmarks): absolute figures vary run to run and the load of "
        "others adds to the measured contention; the alternating order and the "
        "medians are there to compare the conditions under the same background",
    }


# --- one measurement, in its own process ------------------------------------------------------


def measure_main(spec_path: str, port: int, model: str, start_at: float) -> int:
    """Child mode: at ``start_at`` (so that paired clients start together, whatever their import
    time), benchmark the server on ``port`` like a trial does; print JSON metrics."""
    spec = load_spec(spec_path)
    launch = LaunchConfig(
        argv=(),
        env={},
        host="127.0.0.1",
        port=port,
        api_key=os.environ[KEY_ENV],
        served_model=model,
    )

    async def go() -> dict[str, Any]:
        workload = spec.workload
        async with build_client(
            launch, max_connections=workload.concurrency + 8, timeout_s=workload.request_timeout_s
        ) as client:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            started = time.time()
            bench = await run_benchmark(client, model, workload, dialect=VLLM_DIALECT)
            return {
                "metrics": bench.metrics,
                "failed": bench.failed_requests,
                "start": started,
                "end": time.time(),
            }

    print(json.dumps(asyncio.run(go())))
    return 0


def measure(spec_path: str, launches: list[LaunchConfig]) -> list[dict[str, Any]]:
    """Benchmark the given servers at the same time, one client process each."""
    procs = []
    start_at = time.time() + START_DELAY_S
    for launch in launches:
        argv = [
            sys.executable,
            __file__,
            "--measure-port",
            str(launch.port),
            "--measure-model",
            launch.served_model,
            "--measure-start-at",
            str(start_at),
            "--spec",
            spec_path,
        ]
        env = dict(os.environ, **{KEY_ENV: launch.api_key})
        procs.append(
            subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
        )
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"measurement failed ({proc.returncode}): {err[-2000:]}")
        result = json.loads(out.strip().splitlines()[-1])
        if result["failed"]:
            raise RuntimeError(f"{result['failed']} requests failed")
        results.append(result)
    return results


def overlap(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Fraction of the longer measurement during which both ran."""
    shared = max(0.0, min(a["end"], b["end"]) - max(a["start"], b["start"]))
    return shared / max(a["end"] - a["start"], b["end"] - b["start"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spec", default=str(ROOT / "studies" / "demo.yaml"))
    parser.add_argument("--out", type=Path, default=RESULT_PATH)
    parser.add_argument("--measure-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--measure-model", help=argparse.SUPPRESS)
    parser.add_argument("--measure-start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_port:
        return measure_main(args.spec, args.measure_port, args.measure_model, args.measure_start_at)

    spec = load_spec(args.spec)
    engine = build_engine(spec)
    workdir = Path(tempfile.mkdtemp(prefix="contention-"))
    launches: dict[str, LaunchConfig] = {}
    servers: dict[str, ServerProcess] = {}
    startup: dict[str, float] = {}
    rounds: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        for name, bind in SERVERS.items():  # one at a time: starts compete for CPU too
            launch = engine.build_launch(
                ServerSettings(env={BIND_ENV: bind}),
                host="127.0.0.1",
                port=free_port("127.0.0.1"),
                api_key=secrets.token_hex(24),
            )
            server = ServerProcess(
                launch,
                workdir / f"server-{name}.log",
                startup_timeout_s=spec.startup_timeout_s,
                classify=engine.classify_failure,
            )
            launches[name], servers[name] = launch, server
            server.start()

            async def ready(launch: LaunchConfig = launch, server: ServerProcess = server) -> float:
                async with build_client(launch) as client:
                    return (await server.wait_ready(client)).startup_s

            startup[name] = asyncio.run(ready())
            print(f"server {name} ({BIND_ENV}={bind}) ready in {startup[name]:.1f} s", flush=True)
        conditions = ["solo_core0", "pair", "solo_core1", "solo_2cores"]
        for index in range(args.rounds):
            order = conditions if index % 2 == 0 else conditions[::-1]
            row: dict[str, Any] = {
                "round": index + 1,
                "order": order,
                "load_average_1min": os.getloadavg()[0],
            }
            for condition in order:
                if condition == "pair":
                    a, b = measure(args.spec, [launches["A"], launches["B"]])
                    row["pair_core0"], row["pair_core1"] = a["metrics"], b["metrics"]
                    row["pair_overlap"] = round(overlap(a, b), 3)
                else:
                    name = {"solo_core0": "A", "solo_core1": "B", "solo_2cores": "C"}[condition]
                    row[condition] = measure(args.spec, [launches[name]])[0]["metrics"]
            rounds.append(row)
            print(
                f"round {index + 1}: decode tok/s core0 alone "
                f"{row['solo_core0']['decode_tokens_per_s']:.1f} / beside twin "
                f"{row['pair_core0']['decode_tokens_per_s']:.1f}; core1 alone "
                f"{row['solo_core1']['decode_tokens_per_s']:.1f} / beside twin "
                f"{row['pair_core1']['decode_tokens_per_s']:.1f}; 2 cores alone "
                f"{row['solo_2cores']['decode_tokens_per_s']:.1f} "
                f"(overlap {row['pair_overlap']:.0%})",
                flush=True,
            )
    finally:
        for server in servers.values():
            server.stop()

    keys = ("solo_core0", "pair_core0", "solo_core1", "pair_core1", "solo_2cores")
    medians = {
        k: {m: round(statistics.median(r[k][m] for r in rounds), 3) for m in METRICS} for k in keys
    }

    def ratio(a: str, b: str, metric: str) -> float:
        return round(medians[a][metric] / medians[b][metric], 4)

    summary = {
        "decode_beside_twin_vs_alone_same_core": {
            "core0": ratio("pair_core0", "solo_core0", "decode_tokens_per_s"),
            "core1": ratio("pair_core1", "solo_core1", "decode_tokens_per_s"),
        },
        "output_beside_twin_vs_alone_same_core": {
            "core0": ratio("pair_core0", "solo_core0", "output_tokens_per_s"),
            "core1": ratio("pair_core1", "solo_core1", "output_tokens_per_s"),
        },
        "ttft_p50_beside_twin_vs_alone_same_core": {
            "core0": ratio("pair_core0", "solo_core0", "ttft_p50_ms"),
            "core1": ratio("pair_core1", "solo_core1", "ttft_p50_ms"),
        },
        "decode_1core_beside_twin_vs_2cores_alone": {
            "core0": ratio("pair_core0", "solo_2cores", "decode_tokens_per_s"),
            "core1": ratio("pair_core1", "solo_2cores", "decode_tokens_per_s"),
        },
        "pair_summed_output_vs_2cores_alone": round(
            (
                medians["pair_core0"]["output_tokens_per_s"]
                + medians["pair_core1"]["output_tokens_per_s"]
            )
            / medians["solo_2cores"]["output_tokens_per_s"],
            4,
        ),
    }
    result = {
        "what": "one fixed config (demo defaults) alone vs. beside a twin running the same "
        "workload at the same time; real vLLM CPU servers pinned with "
        f"{BIND_ENV}, alternating order, medians over rounds",
        "servers": {
            name: {
                "bind": SERVERS[name],
                "startup_s": round(startup[name], 2),
                "argv": list(launches[name].redacted_argv()),
            }
            for name in SERVERS
        },
        "workload": {
            "spec": str(Path(args.spec).resolve().relative_to(ROOT)),
            "num_requests": spec.workload.num_requests,
            "concurrency": spec.workload.concurrency,
            "max_tokens": spec.workload.max_tokens,
            "single_requests": spec.workload.single_requests,
            "repeats": spec.workload.repeats,
        },
        "rounds": rounds,
        "medians": medians,
        "summary": summary,
        "load_average_before_after": [list(load_before), list(os.getloadavg())],
        "machine": machine_info(),
        "total_wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\n{'median of ' + str(len(rounds)) + ' rounds':<22}"
        + "".join(f"{m:>22}" for m in METRICS)
    )
    for key in keys:
        print(f"{key:<22}" + "".join(f"{medians[key][m]:>22.2f}" for m in METRICS))
    print()
    for name, value in summary.items():
        print(f"{name}: {value}")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
