"""Known measurement traps (issue #31 item 11): a warmed prefix cache, batches vLLM ran eagerly
outside its captured CUDA-graph sizes, a client that could not keep up."""

from __future__ import annotations

import asyncio
import time

import pytest

from autotune import names
from autotune.bench.traps import (
    LoopLagProbe,
    client_lag,
    eager_batches,
    parse_cudagraph_stats,
    prefix_cache_trap,
)

# What vLLM 0.32 logs with --cudagraph-metrics (compilation/cuda_graph.py, CUDAGraphLogging:
# settings_header + generate_metric_table, through the API server's logger.info), with the log
# prefix vLLM puts on the first line of a message. Batches of 3 and 600 tokens ran in mode NONE:
# 3 is padded to 4 elsewhere, but here graphs were off for it; 600 is above the largest size.
PREFIX = "(APIServer pid=4242) INFO 12-03 11:40:02 [loggers.py:257] "
CUDAGRAPH_LOG = (
    "(APIServer pid=4242) INFO 12-03 11:40:01 [api_server.py:1] Starting vLLM API server\n"
    + PREFIX
    + "**CUDAGraph Config Settings:**\n\n"
    "- Mode: FULL_AND_PIECEWISE\n"
    "- Capture sizes: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]\n\n"
    "**CUDAGraph Stats:**\n\n"
    "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |\n"
    "|-----------------|---------------|--------------|--------------|-------|\n"
    "| 8               | 8             | 0            | FULL         | 120   |\n"
    "| 600             | 600           | 0            | NONE         | 7     |\n"
    "| 3               | 4             | 1            | PIECEWISE    | 5     |\n"
    "| 3               | 3             | 0            | NONE         | 2     |\n"
    "(APIServer pid=4242) INFO 12-03 11:40:12 [loggers.py:250] Engine 000: Avg prompt "
    "throughput: 0.0 tokens/s\n"
)


def test_the_cudagraph_table_is_parsed_with_its_capture_sizes() -> None:
    (table,) = parse_cudagraph_stats(CUDAGRAPH_LOG)
    assert table["mode"] == "FULL_AND_PIECEWISE"
    assert table["capture_sizes"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert [r["runtime_mode"] for r in table["rows"]] == ["FULL", "NONE", "PIECEWISE", "NONE"]
    assert table["rows"][1] == {
        "unpadded": 600, "padded": 600, "paddings": 0, "runtime_mode": "NONE", "count": 7,
    }  # fmt: skip


def test_batches_run_eagerly_under_graphs_are_flagged_with_the_sizes() -> None:
    found = eager_batches(CUDAGRAPH_LOG)
    assert found is not None and found["flagged"]
    assert found["eager_sizes"] == [3, 600] and found["eager_count"] == 9
    assert found["batches"] == 134
    assert found["capture_sizes"][-1] == 512 and "[3, 600]" in found["reason"]


def test_eager_by_choice_and_no_table_are_not_flagged() -> None:
    eager_mode = CUDAGRAPH_LOG.replace("FULL_AND_PIECEWISE", "NONE").replace(
        "[1, 2, 4, 8, 16, 32, 64, 128, 256, 512]", "[]"
    )
    found = eager_batches(eager_mode)
    assert found is not None and not found["flagged"] and found["graphs_on"] is False
    only_graphs = "\n".join(ln for ln in CUDAGRAPH_LOG.splitlines() if "NONE" not in ln)
    assert eager_batches(only_graphs)["flagged"] is False
    # a log without --cudagraph-metrics: not measured (None), never "0 eager batches"
    assert eager_batches("INFO Starting vLLM API server\n") is None


def test_the_parser_reads_what_vllms_own_logger_writes() -> None:
    """The table as the installed vLLM writes it (skipped where vLLM's module cannot load)."""
    cuda_graph = pytest.importorskip("vllm.compilation.cuda_graph")
    from vllm.config import CUDAGraphMode

    logging = cuda_graph.CUDAGraphLogging(CUDAGraphMode.PIECEWISE, [1, 2, 4, 8])
    for tokens, padded, mode in ((2, 2, "PIECEWISE"), (9, 9, "NONE"), (9, 9, "NONE")):
        logging.observe(cuda_graph.CUDAGraphStat(tokens, padded, padded - tokens, mode))
    lines: list[str] = []
    logging.log(lambda text: lines.append(PREFIX + text))
    found = eager_batches("\n".join(lines))
    assert found["capture_sizes"] == [1, 2, 4, 8]
    assert found["eager_sizes"] == [9] and found["eager_count"] == 2 and found["flagged"]


def _metrics(hits: float, queries: float) -> dict:
    return {
        "available": True,
        "total": {"prefix_cache_hits": hits, "prefix_cache_queries": queries},
        "phases": {
            "warm-up": {"prefix_cache_hits": 0, "prefix_cache_queries": 1000},
            "load at 8": {"prefix_cache_hits": hits, "prefix_cache_queries": queries - 1000},
        },
    }


def test_a_warm_prefix_cache_is_flagged_with_its_hit_rate() -> None:
    warm = prefix_cache_trap(_metrics(9000, 10000))
    assert warm["flagged"] and warm["hit_rate"] == 0.9
    assert warm["phases"] == {"warm-up": 0.0, "load at 8": 1.0}
    assert "repeated prompts" in warm["reason"]
    cold = prefix_cache_trap(_metrics(500, 10000))
    assert not cold["flagged"] and cold["hit_rate"] == 0.05
    # never measured: absent, not a 0 % hit rate
    assert prefix_cache_trap(None) is None
    assert prefix_cache_trap({"available": False, "reason": "404"}) is None
    assert prefix_cache_trap({"available": True, "total": {}}) is None


def test_a_client_that_could_not_keep_up_is_flagged() -> None:
    busy = client_lag(cpu_s=9.5, wall_s=10.0, output_tokens=5000, lag_samples_ms=[1.0] * 100)
    assert busy["flagged"] and "95% of a core" in busy["reason"]
    assert busy["cpu_ms_per_token"] == 1.9
    lagging = client_lag(cpu_s=1.0, wall_s=10.0, lag_samples_ms=[1.0] * 90 + [200.0] * 10)
    assert lagging["flagged"] and "lagged 200 ms" in lagging["reason"]
    fine = client_lag(cpu_s=1.0, wall_s=10.0, output_tokens=5000, lag_samples_ms=[2.0] * 100)
    assert not fine["flagged"] and fine["loop_lag_p99_ms"] == 2.0
    assert client_lag(cpu_s=None, wall_s=None) is None


def test_the_lag_probe_sees_a_loop_blocked_by_the_client() -> None:
    """A blocking call inside the loop (a client parsing on the loop's thread) delays the
    probe's timer by at least as long: the probe's largest sample is at least the block."""

    async def main() -> list[float]:
        async with LoopLagProbe(interval_s=0.01) as probe:
            await asyncio.sleep(0.05)
            time.sleep(0.3)  # the loop is blocked
            await asyncio.sleep(0.05)
        return probe.samples_ms

    samples = asyncio.run(main())
    assert samples and max(samples) >= 250.0
    assert client_lag(cpu_s=None, wall_s=None, lag_samples_ms=samples)["loop_lag_max_ms"] >= 250


def test_the_client_meter_measures_the_loops_own_cpu_and_lag() -> None:
    """Spinning on the loop's thread is the client's CPU and blocks the loop: both show."""
    from autotune.bench.traps import ClientMeter

    async def main() -> ClientMeter:
        async with ClientMeter(interval_s=0.01) as meter:
            await asyncio.sleep(0.02)
            end = time.thread_time() + 0.3
            while time.thread_time() < end:  # 0.3 s of this thread's CPU, loop blocked
                pass
            await asyncio.sleep(0.02)
        return meter

    meter = asyncio.run(main())
    assert meter.cpu_s is not None and meter.cpu_s >= 0.3 and meter.wall_s >= meter.cpu_s
    found = meter.report(output_tokens=100)
    assert found["loop_lag_max_ms"] >= 250 and found["cpu_ms_per_token"] >= 3.0
    assert found["flagged"]  # its event loop lagged by the spin


def test_a_trials_traps_hold_only_what_was_recorded() -> None:
    from autotune.bench.traps import trial_traps

    found = trial_traps(server_metrics=_metrics(9000, 10000), server_log=CUDAGRAPH_LOG)
    assert set(found) == {"prefix_cache", "eager_batches", "flagged"}
    assert len(found["flagged"]) == 2
    assert trial_traps() == {"flagged": []}
    quiet = trial_traps(
        server_metrics=_metrics(100, 10000),
        client=client_lag(cpu_s=1.0, wall_s=10.0, lag_samples_ms=[1.0]),
    )
    assert quiet["flagged"] == [] and quiet["client"]["cpu_busy"] == 0.1


def test_the_report_shows_a_trials_flagged_traps(tmp_path) -> None:
    import optuna

    from autotune.bench.traps import trial_traps
    from autotune.report.html import build_report
    from autotune.study.results import ReportSource

    assert names.TRAPS == names.TRAPS
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(storage=url, study_name="traps", direction="maximize")
    dist = {"x": optuna.distributions.CategoricalDistribution([1])}
    attrs = {
        names.CORRECT: True,
        names.ROLE: names.BASELINE,
        names.PARAMS_RESOLVED: {"x": 1},
        names.METRICS: {"decode_tokens_per_s": 10.0},
        names.CHECK: {"passed": True},
    }
    system = {f"constraints:{names.CORRECTNESS_CONSTRAINT}": 0.0}
    study.add_trial(
        optuna.trial.create_trial(
            params={"x": 1}, distributions=dist, value=10.0, user_attrs=attrs, system_attrs=system
        )
    )
    assert "measurement traps" not in build_report(study, ReportSource(url))
    traps = trial_traps(server_metrics=_metrics(9000, 10000))
    study.add_trial(
        optuna.trial.create_trial(
            params={"x": 1},
            distributions=dist,
            value=20.0,
            system_attrs=system,
            user_attrs={**attrs, names.ROLE: names.SEARCH, names.TRAPS: traps},
        )
    )
    page = build_report(study, ReportSource(url))
    assert "measurement traps" in page and "prefix cache hit 90%" in page


def test_every_vllm_launch_asks_for_its_cudagraph_table(tmp_path) -> None:
    """The eager-batch trap reads vLLM's CUDA-graph table from the log: a launch without
    --cudagraph-metrics never prints it, and the trap could never fire."""
    from autotune.engines.vllm.engine import VllmEngine
    from autotune.space.settings import ServerSettings
    from autotune.spec.model import EngineSpec, ModelSpec

    engine = VllmEngine(
        EngineSpec(kind="vllm", command=VllmEngine.default_command),
        ModelSpec(path=str(tmp_path), served_name="m"),
    )
    launch = engine.build_launch(ServerSettings(), host="127.0.0.1", port=1, api_key="k" * 32)
    assert "--cudagraph-metrics" in launch.argv
    assert "cudagraph-metrics" not in engine.export_config(ServerSettings())
