"""What vLLM's compile cache saves a trial: a warm start against a cold one, counterbalanced.

Rerun (starts the real vLLM CPU server 1 + 4 x PAIRS times; a compiled start of the demo took
minutes on 2 cores, so expect about half an hour for the default)::

    .venv/bin/python benchmarks/startup_cache.py --pairs 3

autotune's trials of one study share one compile cache (``VLLM_CACHE_ROOT`` in the study's
artifact folder, ``compile-cache/``; ``VllmEngine.compile_cache_env``), so a config whose graph
an earlier trial compiled starts warm. This measures what that saves on the demo
(``studies/demo.yaml``, vLLM's CPU build, compiled: the spec's ``--enforce-eager`` removed if
present, since an eager start compiles nothing):

* **cold**: ``VLLM_CACHE_ROOT`` a new empty folder for every start (what every trial paid
  before the cache was shared);
* **warm**: ``VLLM_CACHE_ROOT`` one folder, filled by one start before the first measured one
  (that priming start is not counted).

Starts run in blocks ordered cold, warm, warm, cold (ABBA), so a slow drift of the machine (a
neighbour's benchmark, thermal state) weighs on both arms alike. Each start records its time to
ready (spawn to the first answered completion, ``ServerProcess.wait_ready``) and its parts as
vLLM's log states them (``engines/vllm/startup.py``: weights, compile, graph capture, KV cache).
Printed: each arm's median and quartiles, the median warm/cold ratio of the pairs inside each
block, and each part's median. Saved: ``benchmarks/results/startup_cache.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import secrets
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune._proc import free_port  # noqa: E402
from autotune.client.http import build_client  # noqa: E402
from autotune.engines import build_engine  # noqa: E402
from autotune.server.process import ServerProcess  # noqa: E402
from autotune.space.settings import ServerSettings  # noqa: E402
from autotune.spec.load import load_spec  # noqa: E402

RESULT_PATH = ROOT / "benchmarks" / "results" / "startup_cache.json"
COLD, WARM = "cold", "warm"
#: one block: cold, warm, warm, cold
ABBA = (COLD, WARM, WARM, COLD)


def start_once(spec: Any, cache_root: Path, log_path: Path) -> dict[str, Any]:
    """Start the spec's server with ``cache_root`` as vLLM's cache, wait until it answers, stop
    it. Returns the time to ready and the startup's parts from the log."""
    engine = build_engine(spec)
    settings = ServerSettings(env={**engine.compile_cache_env(cache_root)})
    launch = engine.build_launch(
        settings, host="127.0.0.1", port=free_port("127.0.0.1"), api_key=secrets.token_hex(24)
    )
    server = ServerProcess(
        launch,
        log_path,
        startup_timeout_s=spec.startup_timeout_s,
        classify=engine.classify_failure,
        root_cause=engine.root_cause,
    )

    async def ready() -> float:
        async with build_client(launch) as client:
            return (await server.wait_ready(client)).startup_s

    server.start()
    try:
        startup_s = asyncio.run(ready())
    finally:
        server.stop()
    return {
        "startup_s": round(startup_s, 3),
        "parts": engine.startup_parts(server.log_text().splitlines()),
        # what the product records on a trial (server.compile_cache), and vLLM's reason when
        # it could not read the cache back
        **_cache_reading(engine.compile_cache_state(server.log_text().splitlines())),
        "log": str(log_path),
    }


def _cache_reading(reading: Any) -> dict[str, Any]:
    if reading is None:
        return {"compile_cache": None}
    return {"compile_cache": reading.state, "compile_cache_failure": reading.load_failure}


def compiled(spec: Any) -> Any:
    """The spec without ``--enforce-eager`` (an eager start compiles nothing to cache)."""
    args = tuple(a for a in spec.engine.args if a != "--enforce-eager")
    return replace(spec, engine=replace(spec.engine, args=args))


def quartiles(values: list[float]) -> dict[str, float]:
    if len(values) < 2:
        return {"median": values[0] if values else float("nan")}
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": round(q2, 3), "q1": round(q1, 3), "q3": round(q3, 3), "n": len(values)}


def summarize(starts: list[dict[str, Any]]) -> dict[str, Any]:
    by_arm = {arm: [s for s in starts if s["arm"] == arm] for arm in (COLD, WARM)}
    summary: dict[str, Any] = {
        arm: quartiles([s["startup_s"] for s in rows]) for arm, rows in by_arm.items()
    }
    ratios = []
    for block in sorted({s["block"] for s in starts}):
        inside = [s for s in starts if s["block"] == block]
        cold = statistics.fmean(s["startup_s"] for s in inside if s["arm"] == COLD)
        warm = statistics.fmean(s["startup_s"] for s in inside if s["arm"] == WARM)
        ratios.append(warm / cold)
    summary["warm_over_cold_by_block"] = [round(r, 3) for r in ratios]
    summary["warm_over_cold_median"] = round(statistics.median(ratios), 3) if ratios else None
    parts: dict[str, dict[str, Any]] = {}
    for arm, rows in by_arm.items():
        names = sorted({p for s in rows for p in s["parts"]})
        parts[arm] = {p: quartiles([s["parts"][p] for s in rows if p in s["parts"]]) for p in names}
    summary["parts"] = parts
    # what the product reads in each arm's logs (engine.compile_cache_state): on vLLM 0.32 CPU
    # with torch 2.13 a "warm" arm's graph fails to load and is compiled again ("load failed")
    summary["compile_cache_by_arm"] = {
        arm: dict(Counter(str(s.get("compile_cache")) for s in rows))
        for arm, rows in by_arm.items()
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Warm vs cold vLLM starts of the demo, in ABBA blocks (cold, warm, warm, "
        "cold); saves benchmarks/results/startup_cache.json. Starts real vLLM servers.",
    )
    parser.add_argument("--spec", type=Path, default=ROOT / "studies" / "demo.yaml")
    parser.add_argument("--pairs", type=int, default=3, help="ABBA blocks (4 starts each)")
    parser.add_argument("--out", type=Path, default=RESULT_PATH)
    args = parser.parse_args(argv)
    spec = compiled(load_spec(args.spec))
    if spec.engine.kind != "vllm":
        parser.error("the compile cache is vLLM's: --spec must name a vllm engine")
    work = Path(tempfile.mkdtemp(prefix="startup-cache-"))
    shared = work / "shared-cache"
    print(f"priming the shared cache in {shared} (not counted)", flush=True)
    prime = start_once(spec, shared, work / "prime.log")
    print(f"  primed in {prime['startup_s']:.1f} s: {prime['parts']}", flush=True)
    starts: list[dict[str, Any]] = []
    for block in range(args.pairs):
        for index, arm in enumerate(ABBA):
            root = shared if arm == WARM else work / f"cold-{block}-{index}"
            result = start_once(spec, root, work / f"{arm}-{block}-{index}.log")
            starts.append({"block": block, "arm": arm, **result})
            print(
                f"block {block} {arm}: {result['startup_s']:.1f} s {result['parts']}, "
                f"log says {result['compile_cache']}",
                flush=True,
            )
    summary = summarize(starts)
    record = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "spec": str(args.spec),
        "engine_args": list(spec.engine.args),
        "design": "ABBA blocks: cold, warm, warm, cold; warm shares one primed VLLM_CACHE_ROOT",
        "prime": prime,
        "starts": starts,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
