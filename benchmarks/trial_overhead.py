"""What autotune adds to a trial beyond the server's own start-up and the benchmark traffic.

Rerun (about a minute per trial on 2 cores; starts the real vLLM CPU server once per trial;
>= 10 trials reach the strategy's model-based phase)::

    .venv/bin/python benchmarks/trial_overhead.py --trials 12

It runs the real loop, ``autotune.study.loop.run_study`` on ``studies/demo.yaml`` (real vLLM CPU
server, baseline + search trials, a throw-away SQLite study), and times the phases by wrapping
autotune's own functions (nothing in autotune is changed):

* server start-up (the server's own time): spawn -> first ``/health`` 200 seen by an
  *independent* poller (raw HTTP every 10 ms in a thread); the log line "Application startup
  complete" is timed too, by tailing the log every 10 ms;
* readiness detection latency: first ``/health`` 200 (independent poller) -> ``wait_ready``
  returns. It includes autotune's deliberate one-token completion (a server can be healthy and
  fail its first request), timed separately. Target <= 0.25 s;
* verification: the ``verifying`` -> ``benchmarking`` phases (greedy outputs vs the reference;
  the baseline records the reference instead);
* benchmark traffic: ``run_benchmark`` (warm-up, single-request and load phases);
* teardown: ``ServerProcess.stop`` (SIGTERM to the group -> every process of it gone);
* storage writes: every call into Optuna's ``RDBStorage`` (SQLite) plus artifact uploads;
* the sampler's ask: ``optuna.Study.ask`` (where ``auto`` plans the whole config) plus every
  ``sample_independent`` call of the study's sampler (where TPE/random draw a value), with
  the sampler's phase per trial (``design``/``sweep``/``model`` for ``auto``; ``enqueued`` for the
  baseline, retries and confirmation, which the sampler does not choose).

Overhead = trial wall time - server start-up - benchmark traffic. Figures are medians and
quartiles over the trials. Results go to ``benchmarks/results/trial_overhead.json``.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import autotune.study.record as record  # noqa: E402
import autotune.study.trial as trial_module  # noqa: E402
from autotune.server.process import ServerProcess  # noqa: E402
from autotune.spec.load import load_spec  # noqa: E402
from autotune.study.loop import RunOptions, run_study  # noqa: E402

RESULT_PATH = ROOT / "benchmarks" / "results" / "trial_overhead.json"
POLL_S = 0.01
READY_LINE = "Application startup complete"

now = time.monotonic


class Recorder:
    """Per-trial timestamps and accumulated durations, filled in by the wrappers below."""

    def __init__(self) -> None:
        self.trials: list[dict[str, Any]] = []
        self.current: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.begin()

    def begin(self) -> None:
        self.current = {
            "t_begin": now(),
            "storage_s": 0.0,
            "storage_calls": 0,
            "artifact_s": 0.0,
            "phases": {},
        }

    def add(self, key: str, seconds: float) -> None:
        with self.lock:
            self.current[key] = self.current.get(key, 0.0) + seconds


REC = Recorder()


def timed(owner: Any, name: str, key: str, *, count_key: str | None = None) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = now()
        try:
            return original(*args, **kwargs)
        finally:
            REC.add(key, now() - start)
            if count_key:
                REC.add(count_key, 1)

    setattr(owner, name, wrapper)


def watch_server(host: str, port: int, log_path: Path, stop: threading.Event) -> None:
    """Independent readiness observer: first /health 200 and the startup log line."""
    health_at = line_at = None
    while not stop.is_set() and (health_at is None or line_at is None):
        if health_at is None:
            try:
                conn = http.client.HTTPConnection(host, port, timeout=1.0)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    health_at = now()
                conn.close()
            except OSError:
                pass
        if line_at is None:
            try:
                if READY_LINE in log_path.read_text(errors="replace"):
                    line_at = now()
            except OSError:
                pass
        time.sleep(POLL_S)
    REC.current["t_health_200"] = health_at
    REC.current["t_log_ready_line"] = line_at


def install_wrappers() -> threading.Event:
    stop_watch = threading.Event()
    original_start = ServerProcess.start

    def start(self: ServerProcess) -> None:
        REC.current["t_spawn_call"] = now()
        original_start(self)
        REC.current["t_spawned"] = now()
        thread = threading.Thread(
            target=watch_server,
            daemon=True,
            args=(self.launch.host, self.launch.port, self.log_path, stop_watch),
        )
        REC.current["watcher"] = thread
        thread.start()

    original_ready = ServerProcess.wait_ready

    async def wait_ready(self: ServerProcess, client: Any) -> Any:
        result = await original_ready(self, client)
        REC.current["t_autotune_ready"] = now()
        return result

    original_first = ServerProcess._first_completion

    async def first_completion(self: ServerProcess, client: Any) -> None:
        start = now()
        try:
            await original_first(self, client)
        finally:
            REC.add("first_completion_s", now() - start)

    original_stop = ServerProcess.stop

    def stop(self: ServerProcess) -> None:
        start = now()
        try:
            original_stop(self)
        finally:
            REC.add("teardown_s", now() - start)

    original_bench = trial_module.run_benchmark

    async def run_benchmark(*args: Any, **kwargs: Any) -> Any:
        start = now()
        try:
            return await original_bench(*args, **kwargs)
        finally:
            REC.add("benchmark_traffic_s", now() - start)

    ServerProcess.start = start
    ServerProcess.wait_ready = wait_ready
    ServerProcess._first_completion = first_completion
    ServerProcess.stop = stop
    trial_module.run_benchmark = run_benchmark
    timed(record, "upload_artifact", "artifact_s")
    storage_cls = optuna.storages.RDBStorage
    for name in (
        "create_new_trial",
        "set_trial_param",
        "set_trial_state_values",
        "set_trial_intermediate_value",
        "set_trial_user_attr",
        "set_trial_system_attr",
        "set_study_user_attr",
        "set_study_system_attr",
        "record_heartbeat",
    ):
        if hasattr(storage_cls, name):
            timed(storage_cls, name, "storage_s", count_key="storage_calls")
    return stop_watch


def install_ask_timer() -> None:
    """Time each ask, and the sampler's per-parameter draws, whatever the sampler is."""
    original_ask = optuna.Study.ask
    wrapped: set[type] = set()

    @functools.wraps(original_ask)
    def ask(self: optuna.Study, *args: Any, **kwargs: Any) -> Any:
        sampler_cls = type(self.sampler)
        if sampler_cls not in wrapped:
            wrapped.add(sampler_cls)
            timed(sampler_cls, "sample_independent", "sample_independent_s")
        start = now()
        try:
            return original_ask(self, *args, **kwargs)
        finally:
            REC.add("ask_s", now() - start)

    optuna.Study.ask = ask


def sampler_phase(study: optuna.Study, number: int) -> str:
    """``neighbour`` (the guide's early one-change neighbours), the strategy's own phase
    (``design``/``sweep``/``model`` for ``auto``), ``sampled`` for a sampler without phases, or
    ``enqueued`` (baseline, retry, confirmation: no sampler chose it)."""
    from autotune import names

    trial = study.trials[number]
    if trial.user_attrs.get(names.EARLY_PROPOSAL):
        return "neighbour"
    if "fixed_params" in trial.system_attrs or trial.user_attrs.get(names.ROLE) not in (
        None,
        names.SEARCH,
    ):
        return "enqueued"
    sampler: Any = study.sampler
    while sampler is not None:
        phase = getattr(sampler, "phase_of", {}).get(number)
        if phase:
            return phase
        sampler = getattr(sampler, "_base", None)
    return "sampled"


def on_phase(_number: int, phase: str) -> None:
    REC.current["phases"].setdefault(phase, now())


def finish_trial(outcome: Any, study: optuna.Study) -> None:
    cur = REC.current
    watcher = cur.pop("watcher", None)
    if watcher is not None:
        watcher.join(timeout=5)
    end = now()
    row: dict[str, Any] = {
        "number": outcome.number,
        "role": outcome.role,
        "verdict": outcome.verdict,
        "wall_s": end - cur["t_begin"],
        "sampler_phase": sampler_phase(study, outcome.number),
        "ask_s": cur.get("ask_s", 0.0) + cur.get("sample_independent_s", 0.0),
    }
    spawn = cur.get("t_spawn_call")
    health = cur.get("t_health_200")
    ready = cur.get("t_autotune_ready")
    phases = cur["phases"]
    if spawn is not None and health is not None:
        row["server_startup_s"] = health - spawn
    if cur.get("t_log_ready_line") is not None and spawn is not None:
        row["log_ready_line_after_spawn_s"] = cur["t_log_ready_line"] - spawn
    if health is not None and ready is not None:
        row["readiness_latency_s"] = ready - health
        row["readiness_latency_without_first_completion_s"] = (
            ready - health - cur.get("first_completion_s", 0.0)
        )
    row["first_completion_s"] = cur.get("first_completion_s")
    if "verifying" in phases and "benchmarking" in phases:
        row["verification_s"] = phases["benchmarking"] - phases["verifying"]
    row["benchmark_traffic_s"] = cur.get("benchmark_traffic_s")
    row["teardown_s"] = cur.get("teardown_s")
    row["storage_write_s"] = cur["storage_s"]
    row["storage_calls"] = cur["storage_calls"]
    row["artifact_upload_s"] = cur["artifact_s"]
    if "launching" in phases:
        row["before_launch_s"] = phases["launching"] - cur["t_begin"]
    if "stopping" in phases:
        row["after_stop_call_s"] = end - phases["stopping"]
    if row.get("server_startup_s") is not None and row["benchmark_traffic_s"] is not None:
        row["autotune_overhead_s"] = (
            row["wall_s"] - row["server_startup_s"] - row["benchmark_traffic_s"]
        )
    REC.trials.append({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    print(
        f"trial {outcome.number} ({outcome.role}, {outcome.verdict}): "
        + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if isinstance(v, float)),
        flush=True,
    )
    REC.begin()


def quartiles_of(values: list[float]) -> list[float] | None:
    if len(values) < 2:
        return None  # one trial of a phase (the baseline) has no quartiles
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [round(q1, 4), round(q3, 4)]


def summary_sampler(url: str) -> str | None:
    """The strategy the study recorded (``--sampler``'s default unless the spec says)."""
    from autotune.search.strategy import SAMPLER_ATTR

    study = optuna.load_study(study_name="overhead", storage=url)
    return study.user_attrs.get(SAMPLER_ATTR)


def machine_info() -> dict[str, Any]:
    from autotune.engines.vllm.version import installed_vllm_version

    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "vllm": installed_vllm_version(),
        "optuna": optuna.__version__,
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "note": "CPU-only machine shared with other concurrent work (2 cores); server "
        "start-up and traffic times vary with the load, figures are medians",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--spec", default=str(ROOT / "studies" / "demo.yaml"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULT_PATH)
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    workdir = Path(tempfile.mkdtemp(prefix="trial-overhead-"))
    url = f"sqlite:///{workdir / 'study.db'}"
    stop_watch = install_wrappers()
    install_ask_timer()
    started = time.perf_counter()
    REC.begin()
    try:
        summary = run_study(
            spec,
            RunOptions(
                trials=args.trials,
                storage_url=url,
                study_name="overhead",
                seed=args.seed,
                artifact_dir=str(workdir / "artifacts"),
            ),
            on_phase=on_phase,
            on_trial=finish_trial,
            log_dir=workdir / "logs",
        )
    finally:
        stop_watch.set()
    launched = [t for t in REC.trials if "server_startup_s" in t]
    keys = (
        "wall_s",
        "server_startup_s",
        "log_ready_line_after_spawn_s",
        "readiness_latency_s",
        "readiness_latency_without_first_completion_s",
        "first_completion_s",
        "verification_s",
        "benchmark_traffic_s",
        "teardown_s",
        "storage_write_s",
        "storage_calls",
        "artifact_upload_s",
        "before_launch_s",
        "autotune_overhead_s",
    )
    medians = {
        k: round(statistics.median(t[k] for t in launched if t.get(k) is not None), 4)
        for k in keys
        if any(t.get(k) is not None for t in launched)
    }
    quartiles = {
        k: quartiles_of([t[k] for t in launched if t.get(k) is not None])
        for k in keys
        if sum(t.get(k) is not None for t in launched) >= 2
    }
    ask_by_phase = {
        phase: {
            "n": len(rows),
            "median_s": round(statistics.median(rows), 4),
            "quartiles_s": quartiles_of(rows),
            "max_s": round(max(rows), 4),
            "median_fraction_of_trial_wall": round(
                statistics.median(
                    t["ask_s"] / t["wall_s"]
                    for t in REC.trials
                    if t["sampler_phase"] == phase and t["wall_s"] > 0
                ),
                5,
            ),
        }
        for phase in sorted({t["sampler_phase"] for t in REC.trials})
        if (rows := [t["ask_s"] for t in REC.trials if t["sampler_phase"] == phase])
    }
    result = {
        "what": "time autotune adds to a trial on the real vLLM CPU demo (run_study, "
        "studies/demo.yaml)",
        "trials": REC.trials,
        "medians": medians,
        "quartiles": quartiles,
        "sampler": summary_sampler(url),
        "ask_by_sampler_phase": ask_by_phase,
        "readiness_target_s": 0.25,
        "readiness_within_target": medians.get("readiness_latency_s", 1e9) <= 0.25,
        "stopped_because": summary.stopped_because,
        "figures_are": "medians and [q1, q3] over the launched trials; ask time per sampler "
        "phase over all trials",
        "definitions": {
            "server_startup_s": "spawn -> first /health 200 seen by an independent 10 ms poller",
            "readiness_latency_s": "first /health 200 (independent) -> autotune's wait_ready "
            "returns (includes its one-token completion)",
            "verification_s": "'verifying' -> 'benchmarking' phase callbacks",
            "teardown_s": "ServerProcess.stop: SIGTERM to the group -> no member left",
            "storage_write_s": "time inside optuna RDBStorage write calls (SQLite)",
            "autotune_overhead_s": "trial wall - server_startup_s - benchmark_traffic_s",
            "ask_s": "optuna.Study.ask + the sampler's sample_independent calls for the trial",
        },
        "machine": machine_info(),
        "total_wall_s": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nmedians over {len(launched)} launched trials:")
    for k, v in medians.items():
        print(f"  {k:<48}{v:>10.3f}")
    for phase, row in ask_by_phase.items():
        print(
            f"  ask, {phase:<10} n={row['n']:<3} median {row['median_s'] * 1000:8.1f} ms, "
            f"max {row['max_s'] * 1000:8.1f} ms, "
            f"{row['median_fraction_of_trial_wall']:.2%} of the trial's wall time"
        )
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
