"""FAULT: load the K and V shards of every fused QKV projection into each other's slots.

This reproduces the class of bug behind the motivating case (GGUF fused-projection shards
concatenated in the wrong order): the server starts, answers quickly, and the text is wrong.
It exists so that a test can prove autotune's correctness gate rejects a configuration that is
fast but wrong, on any model with a ``QKVParallelLinear`` (the demo Llama included).

Targets: ``vllm.model_executor.layers.linear.QKVParallelLinear.weight_loader`` and
``.weight_loader_v2`` (vLLM 0.32; unquantized weights use ``weight_loader_v2``, bound when the
layer is built, which is after the plugin ran). The wrapper swaps ``loaded_shard_id`` ``"k"`` and
``"v"``. K and V have the same shape whenever ``head_size_v == head_size`` (Llama and most
models), so loading succeeds and only the numbers are wrong; q/k would not fit under GQA.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Any

from autotune.patching import PatchInfo

MODULE = "vllm.model_executor.layers.linear"
_SWAP = {"k": "v", "v": "k"}

PATCH = PatchInfo(
    name="qkv_shard_swap",
    kind="fault",
    engine="vllm",
    versions=">=0.32",
    targets=(
        f"{MODULE}.QKVParallelLinear.weight_loader",
        f"{MODULE}.QKVParallelLinear.weight_loader_v2",
    ),
    rationale="Deliberately swap the K and V shards of fused QKV weights: starts, answers, wrong.",
    choices=(False, True),
    default=False,
)

_state = {"swapped": 0, "done": False}


def _swapping(original: Any) -> Any:
    @functools.wraps(original)
    def loader(self: Any, param: Any, loaded_weight: Any, loaded_shard_id: Any = None) -> Any:
        if isinstance(loaded_shard_id, str) and loaded_shard_id in _SWAP:
            _state["swapped"] += 1
            if _state["swapped"] == 1:
                print(
                    f"AUTOTUNE_QKV_SHARD_SWAP swapping k<->v pid={os.getpid()}",
                    file=sys.stderr,
                    flush=True,
                )
            loaded_shard_id = _SWAP[loaded_shard_id]
        return original(self, param, loaded_weight, loaded_shard_id)

    return loader


def apply(value: bool) -> None:
    """Wrap both QKV weight loaders (once per process)."""
    if not value or _state["done"]:
        return
    cls = importlib.import_module(MODULE).QKVParallelLinear
    cls.weight_loader = _swapping(cls.weight_loader)
    cls.weight_loader_v2 = _swapping(cls.weight_loader_v2)
    _state["done"] = True
