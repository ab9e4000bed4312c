"""How vLLM is profiled: its profiler flag, endpoints, trace files and names in a trace.

Measured on vLLM 0.32 (CPU build): ``--profiler-config '{"profiler": "torch",
"torch_profiler_dir": DIR}'`` enables ``POST /start_profile`` and ``POST /stop_profile``; stopping
writes one ``*.pt.trace.json.gz`` per profiled process (``rank<N>.*`` for each worker, and the API
server's unless ``ignore_frontend``). Each engine step is a ``user_annotation`` named
``execute_context_<prefill reqs>(<tokens>)_generation_<decode reqs>(<tokens>)`` on the worker's
main thread, present without Python stacks; autotune turns stacks off
(``torch_profiler_with_stack: false``) because they multiply the step time several-fold on a
CPU, which would leave nothing true to break down.

The GPU kernel categories name the kernels of the libraries vLLM calls: NCCL and vLLM's custom
all-reduce (``cross_device_reduce_*``, ``all_reduce``), FlashAttention/FlashInfer/FlashMLA and
vLLM's paged attention, cuBLAS/CUTLASS GEMMs, vLLM's fused MoE kernels, its sampler.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from autotune.engines.base import TraceRecipe

PROFILER_FLAG = "--profiler-config"

RECIPE = TraceRecipe(
    step=re.compile(r"^execute_context_\d+\(\d+\)_generation_\d+\(\d+\)$"),
    empty_step=re.compile(r"^execute_context_0\(0\)_generation_0\(0\)$"),
    kernel_categories=(
        (
            "collectives",
            re.compile(
                r"nccl|cross_device_reduce|all_?reduce|allgather|all_gather|reduce_scatter"
                r"|custom_ar|one_shot|two_shot|alltoall|all_to_all",
                re.I,
            ),
        ),
        (
            "attention/MLA",
            re.compile(r"flash|fmha|attn|attention|mla|paged|flashinfer|decode_kernel", re.I),
        ),
        ("MoE", re.compile(r"moe|expert|topk_gating|grouped_topk", re.I)),
        ("GEMM", re.compile(r"gemm|cutlass|cublas|xmma|matmul|sm\d+_|ampere_|hopper_|_mm_", re.I)),
        ("sampling", re.compile(r"sampl|argmax|top_?k|top_?p|softmax|multinomial|gumbel", re.I)),
    ),
)


@dataclass(frozen=True)
class VllmProfiler:
    """Profiling a running vLLM server started with :meth:`json_flag`'s flag."""

    trace_dir: Path

    def json_flag(self) -> tuple[str, dict[str, Any]]:
        """The JSON flag that enables the profiler endpoints, writing into ``trace_dir``."""
        return PROFILER_FLAG, {
            "profiler": "torch",
            "torch_profiler_dir": str(self.trace_dir),
            "torch_profiler_with_stack": False,
            "torch_profiler_record_shapes": False,
            "ignore_frontend": True,
        }

    @property
    def recipe(self) -> TraceRecipe:
        return RECIPE

    def decode_body(self, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        """One greedy streamed request that decodes exactly ``max_tokens`` tokens."""
        return {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    async def start(self, client: httpx.AsyncClient) -> None:
        (await client.post("/start_profile")).raise_for_status()

    async def stop(self, client: httpx.AsyncClient, *, timeout_s: float) -> list[Path]:
        """Stop profiling and wait for the worker traces to be written and complete."""
        before = set(self.trace_dir.glob("*.pt.trace.json*"))
        response = await client.post("/stop_profile", timeout=timeout_s)
        response.raise_for_status()
        deadline = time.monotonic() + timeout_s
        sizes: dict[Path, int] = {}
        while time.monotonic() < deadline:
            found = sorted(set(self.trace_dir.glob("rank*.pt.trace.json*")) - before)
            now = {p: p.stat().st_size for p in found}
            if found and now == sizes:  # written and no longer growing
                return found
            sizes = now
            await asyncio.sleep(1.0)
        raise TimeoutError(
            f"vLLM wrote no complete worker trace into {self.trace_dir} within {timeout_s:g} s"
        )
