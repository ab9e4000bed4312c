"""EXPERIMENTAL, does nothing: wraps the unquantized linear forward with an identical function.

A change with no effect, on a hot path, so that a study can show ablation reporting it as
unnecessary: enabling it must not change outputs, and any speed difference is noise. (In the
motivating story the MLA direct-call bypass was exactly such a passenger.)

Target: ``vllm.model_executor.layers.linear.UnquantizedLinearMethod.apply`` (vLLM 0.32): the
wrapper calls the original with the same arguments and returns its result.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from autotune.patching import PatchInfo

MODULE = "vllm.model_executor.layers.linear"

PATCH = PatchInfo(
    name="noop_example",
    kind="experimental",
    engine="vllm",
    versions=">=0.32",
    targets=(f"{MODULE}.UnquantizedLinearMethod.apply",),
    rationale="Identical pass-through wrapper around the unquantized linear forward (no effect).",
    choices=(False, True),
    default=False,
)

_state = {"done": False}


def apply(value: bool) -> None:
    """Wrap ``UnquantizedLinearMethod.apply`` with a pass-through (once per process)."""
    if not value or _state["done"]:
        return
    cls = importlib.import_module(MODULE).UnquantizedLinearMethod
    original = cls.apply

    @functools.wraps(original)
    def apply_passthrough(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    cls.apply = apply_passthrough
    _state["done"] = True
