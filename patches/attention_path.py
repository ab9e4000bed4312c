"""Choose how vLLM's standard attention layer reaches its backend: custom op or direct call.

Target: ``vllm.model_executor.layers.attention.attention.Attention`` (vLLM 0.32). Its
``__init__`` sets ``self.use_direct_call = not current_platform.opaque_attention_op()`` and
``forward`` branches on it:

* ``custom_op`` (upstream on CUDA, ROCm, XPU and CPU, whose platforms return ``True`` from
  ``opaque_attention_op()``): attention runs through
  ``torch.ops.vllm.unified_attention_with_output`` (and
  ``torch.ops.vllm.unified_kv_cache_update``), one opaque op that torch.compile and CUDA
  graph splitting treat as a black box.
* ``direct_call`` (upstream on other platforms): ``forward`` calls the Python function
  ``unified_attention_with_output`` in the same module directly, bypassing the op registry.

This is the standard-attention twin of the motivating case's MLA bypass (``mla_path``). On the
CPU demo it can actually run, so it proves the whole mechanism end to end.

How the switch is made: ``autotune.patching.pin_attribute`` installs a class-level property
``use_direct_call`` that returns the chosen constant, overriding the assignment in ``__init__``
without copying it. How it is observed: for ``direct_call`` the module-level function
``unified_attention_with_output`` is wrapped; the custom op keeps the function object it
registered at import time, so the wrapper runs *only* on the direct path. The first call prints
``AUTOTUNE_ATTENTION_PATH path=direct_call pid=<pid> layer=<name>`` to stderr (on vLLM 0.32 CPU
the model runs in the VllmWorker process under the EngineCore; its stderr is the server log) and
``observed_calls()`` counts calls. The wrapper does not count while torch.compile traces
(compiled graphs do not re-run Python), so the marker is proven with ``--enforce-eager``; with
compilation the pinned flag still decides what is traced.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any

from autotune.patching import PatchError, PatchInfo, pin_attribute

MODULE = "vllm.model_executor.layers.attention.attention"

PATCH = PatchInfo(
    name="attention_path",
    kind="optimization",
    engine="vllm",
    versions=">=0.32",
    targets=(
        f"{MODULE}.Attention",
        f"{MODULE}.Attention.forward",
        f"{MODULE}.unified_attention_with_output",
        f"{MODULE}.unified_kv_cache_update",
    ),
    rationale="Call the attention backend directly instead of through the opaque torch custom op.",
    choices=("custom_op", "direct_call"),
    default="custom_op",
)

_state: dict[str, Any] = {"calls": 0, "original": None}


def observed_calls() -> int:
    """How many times the direct path ran in this process (eager mode only)."""
    return int(_state["calls"])


def _observe(original: Any) -> Any:
    import torch

    @functools.wraps(original)
    def unified_attention_with_output(*args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling():
            _state["calls"] += 1
            if _state["calls"] == 1:
                layer = args[4] if len(args) > 4 else kwargs.get("layer_name")
                print(
                    f"AUTOTUNE_ATTENTION_PATH path=direct_call pid={os.getpid()} layer={layer}",
                    file=sys.stderr,
                    flush=True,
                )
        return original(*args, **kwargs)

    unified_attention_with_output.__autotune_original__ = original  # type: ignore[attr-defined]
    return unified_attention_with_output


def apply(value: str) -> None:
    """Pin ``Attention.use_direct_call`` and, for ``direct_call``, observe the direct path."""
    import importlib

    module = importlib.import_module(MODULE)
    forward_src = inspect.getsource(module.Attention.forward)
    # Pinning the flag only changes anything if forward still branches on it; otherwise the
    # server would run unchanged while the study believes it tested the other path.
    if "self.use_direct_call" not in forward_src or "unified_attention_with_output(" not in (
        forward_src
    ):
        raise PatchError(
            f"{MODULE}.Attention.forward no longer branches on use_direct_call", PATCH.name
        )
    direct = value == "direct_call"
    pin_attribute(module.Attention, "use_direct_call", direct)
    if direct and _state["original"] is None:
        _state["original"] = module.unified_attention_with_output
        module.unified_attention_with_output = _observe(_state["original"])
