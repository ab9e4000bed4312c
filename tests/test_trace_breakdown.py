"""The step-time breakdown on a real vLLM CPU trace and on GPU traces built from the format.

The CPU fixture is the first ten engine steps of a real ``torch.profiler`` trace of the demo
model on vLLM 0.32's CPU build (worker rank 0, main thread, ``user_annotation`` and ``cpu_op``
events), trimmed by ``tests/fixtures/trim_profile_trace.py``. No GPU trace could be recorded here
(no GPU was lent), so the GPU traces are built from the Chrome-trace schema torch.profiler
writes (complete events ``ph: X`` with ``ts``/``dur`` in microseconds, kernels under
``cat: kernel`` on a device ``pid`` and stream ``tid``), with kernel names taken from NCCL,
vLLM's custom all-reduce, FlashAttention, CUTLASS and vLLM's fused MoE.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from autotune.analysis.trace import (
    BETWEEN_STEPS,
    GAPS,
    MEMCPY,
    MODEL_COMPUTE,
    OTHER_KERNELS,
    PYTHON_IN_STEP,
    breakdown,
    has_steps,
    load_trace,
)
from autotune.engines.vllm.profile import RECIPE
from autotune.errors import SpecError

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_cpu_profile_rank0.trace.json.gz"


def test_real_vllm_cpu_trace_is_partitioned_into_cpu_categories() -> None:
    trace = load_trace(FIXTURE)
    assert has_steps(trace, RECIPE)
    result = breakdown(trace, RECIPE, source=FIXTURE.name)
    assert result.device == "cpu"
    assert result.steps == 9  # ten steps, the first is prefill
    parts = result.categories_ms
    assert set(parts) == {MODEL_COMPUTE, PYTHON_IN_STEP, BETWEEN_STEPS}
    assert sum(parts.values()) == pytest.approx(result.window_ms, rel=1e-9)
    assert all(v > 0 for v in parts.values()), parts
    # the step annotations bound compute + python: recompute their total independently
    events = [e for e in trace["traceEvents"] if RECIPE.step.search(e["name"])]
    events.sort(key=lambda e: e["ts"])
    in_steps = sum(e["dur"] for e in events[1:]) / 1000
    assert parts[MODEL_COMPUTE] + parts[PYTHON_IN_STEP] == pytest.approx(in_steps, rel=1e-6)
    per_token = result.per_token_ms(result.steps)
    assert sum(per_token.values()) == pytest.approx(result.window_ms / result.steps)


STEP_NAMES = {
    True: "execute_context_1(4)_generation_0(0)",
    False: "execute_context_0(0)_generation_1(1)",
}


def _gpu_trace(steps: int, *, overlap: bool = False) -> dict:
    """A decode loop: per step, on stream 7: 2 all-reduces of 100 us, attention 50 us, GEMM
    200 us, fused MoE 80 us, sampling 10 us, an unknown kernel 5 us, a copy 5 us, each kernel
    followed by a 5 us gap (launch overhead). With ``overlap``, a second stream runs a GEMM
    under every all-reduce (the collective must keep that time)."""
    events = []
    kernels = [
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 100, "kernel"),
        ("flash_fwd_splitkv_kernel", 50, "kernel"),
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>", 100, "kernel"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 200, "kernel"),
        ("fused_moe_kernel", 80, "kernel"),
        ("sampling_from_probs_kernel", 10, "kernel"),
        ("elementwise_kernel_silu", 5, "kernel"),
        ("Memcpy DtoH (Device -> Pinned)", 5, "gpu_memcpy"),
    ]
    step_us = sum(d + 5 for _, d, _ in kernels)
    t = 1000.0
    for i in range(steps):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": STEP_NAMES[i == 0],
                "pid": 100,
                "tid": 100,
                "ts": t - 20,
                "dur": step_us,
            }
        )
        k = t
        for name, dur, cat in kernels:
            correlation = len(events)
            launch = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
            events.append(  # the CPU launches early in the step; the GPU runs it later
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": launch,
                    "pid": 100,
                    "tid": 100,
                    "ts": t - 19 + correlation % 50,
                    "dur": 1,
                    "args": {"correlation": correlation},
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "pid": 0,
                    "tid": 7,
                    "ts": k,
                    "dur": dur,
                    "args": {"correlation": correlation, "stream": 7},
                }
            )
            if overlap and "educe" in name:
                events.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "cutlass_gemm_overlap",
                        "pid": 0,
                        "tid": 9,
                        "ts": k + 10,
                        "dur": 50,
                    }
                )
            k += dur + 5
        t += step_us + 40
    return {"schemaVersion": 1, "traceEvents": events}


def test_gpu_trace_categories_gaps_and_collective_calls() -> None:
    result = breakdown(_gpu_trace(6), RECIPE)
    assert result.device == "gpu"
    assert result.steps == 5
    parts = result.categories_ms
    decode = 5  # steps in the window
    assert parts["collectives"] == pytest.approx(decode * 0.200)
    assert parts["attention/MLA"] == pytest.approx(decode * 0.050)
    assert parts["GEMM"] == pytest.approx(decode * 0.200)
    assert parts["MoE"] == pytest.approx(decode * 0.080)
    assert parts["sampling"] == pytest.approx(decode * 0.010)
    assert parts[OTHER_KERNELS] == pytest.approx(decode * 0.005)
    assert parts[MEMCPY] == pytest.approx(decode * 0.005)
    # gaps: 5 us after each of 8 kernels except the window's last, plus 40 us between steps
    assert parts[GAPS] == pytest.approx((decode * 8 - 1) * 0.005 + (decode - 1) * 0.040)
    assert sum(parts.values()) == pytest.approx(result.window_ms)
    assert result.collective_calls == 2 * decode
    per_token = result.per_token_ms(decode)
    assert per_token["collectives"] == pytest.approx(0.2)


def test_overlapping_streams_give_the_instant_to_the_collective() -> None:
    plain = breakdown(_gpu_trace(4), RECIPE).categories_ms
    overlapped = breakdown(_gpu_trace(4, overlap=True), RECIPE).categories_ms
    assert overlapped["collectives"] == pytest.approx(plain["collectives"])
    assert overlapped["GEMM"] == pytest.approx(plain["GEMM"])  # hidden under the collective
    assert sum(overlapped.values()) == pytest.approx(sum(plain.values()))


def test_too_few_steps_and_non_traces_are_named() -> None:
    with pytest.raises(ValueError, match="2 engine steps"):
        breakdown(_gpu_trace(2), RECIPE, source="x.json")
    assert not has_steps({"traceEvents": []}, RECIPE)


def test_unreadable_trace_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt.trace.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(SpecError, match="not a readable profiler trace"):
        load_trace(bad)
    plain = tmp_path / "other.json"
    plain.write_text(json.dumps({"hello": 1}))
    with pytest.raises(SpecError, match="no traceEvents"):
        load_trace(plain)
    good = tmp_path / "t.json.gz"
    with gzip.open(good, "wt") as handle:
        json.dump(_gpu_trace(3), handle)
    assert has_steps(load_trace(good), RECIPE)
