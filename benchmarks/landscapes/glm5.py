"""The GLM-5 8-GPU SIMULATION (``glm5_sim``) as a search-efficiency landscape.

``landscape(params)`` is the harness's landscape protocol (``benchmarks/search/landscape.py``):
the noise-free single-request decode tok/s of a point of ``search_spaces/glm5-8gpu.yaml``, with
``"correct": False`` in the fast-but-wrong region and ``{"failure": kind}`` where the simulated
server does not start. A parameter missing from ``params`` is left at vLLM's default (the
baseline trial sets only the parameters that have a ``baseline``).

Mapping: ``cudagraph_mode: FULL_DECODE_ONLY`` is modelled as ``FULL`` (single-request decode
captures the same graphs); ``NCCL_MAX_NCHANNELS`` acts only through the space's constraint
MIN <= MAX; the parameters in :data:`NOT_MODELLED` have no effect (the harness holds them at
the baseline when it enumerates the true best).
"""

from __future__ import annotations

from typing import Any

from autotune.testing import glm5_sim
from autotune.testing.glm5_sim import Glm5Config

#: accepted, no effect in the simulation
NOT_MODELLED = (*glm5_sim.NOT_MODELLED, "NCCL_MAX_NCHANNELS", "attention_backend")
#: measurement noise the harness adds by default (users report 5-20 % run to run)
NOISE = 0.05
#: per-launch cost model in minutes (see the harness): a 400 GB GGUF over 8 GPUs loads, compiles
#: and captures in about 15 minutes; a start that dies (OOM at capture, a refused flag) costs
#: about half of that; the correctness check is a minute; the benchmark three.
COST_MINUTES = {"load": 15.0, "failed_start": 7.0, "check": 1.0, "bench": 3.0}


def to_sim(params: dict[str, Any]) -> Glm5Config:
    """The simulated config for a point of the GLM-5 space (see the module docstring)."""
    mapped: dict[str, Any] = {}
    for name, value in params.items():
        if name in ("NCCL_MAX_NCHANNELS", "attention_backend"):
            continue
        if name == "cudagraph_mode" and value == "FULL_DECODE_ONLY":
            value = "FULL"
        mapped[name] = value
    return Glm5Config.from_mapping(mapped)


def landscape(params: dict[str, Any]) -> dict[str, Any]:
    """Noise-free outcome of one config: tok/s, correctness, or why it did not start."""
    config = to_sim(params)
    failure = glm5_sim.startup_failure(config)
    if failure is not None:
        return {"failure": failure.kind}
    result: dict[str, Any] = {"tok_s": glm5_sim.decode_tok_s(config, 1)}
    if not glm5_sim.is_correct(config):
        result["correct"] = False
    return result
