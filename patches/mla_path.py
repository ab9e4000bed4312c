"""Choose how vLLM's MLA attention layer reaches its backend: custom op or direct call.

This is the motivating case's patch. Serving GLM-5 (``GlmMoeDsaForCausalLM``, MLA attention) as
GGUF produced garbage; a "phantom output tensor" theory led to bypassing the custom op
``torch.ops.vllm.unified_mla_attention_with_output`` and calling ``forward_impl`` directly, at
the same time as the real fix (GGUF fused-shard ordering, see ``gguf_shard_order``). The output
became correct and the bypass got the credit; it then broke CUDA graphs, and only later was it
shown to be unnecessary. As a search dimension, ablation answers that question in one run.

Target: ``vllm.model_executor.layers.attention.mla_attention.MLAAttention`` (vLLM 0.32).
``__init__`` sets ``self.use_direct_call = not current_platform.opaque_attention_op()``;
``forward`` branches on it: ``custom_op`` goes through
``torch.ops.vllm.unified_mla_kv_cache_update`` and
``torch.ops.vllm.unified_mla_attention_with_output``; ``direct_call`` updates the KV cache and
calls ``self.forward_impl`` in Python. The switch pins the flag with a class-level property
(``autotune.patching.pin_attribute``).

No MLA model runs on the CPU demo, so the effect is proven in ``tests/test_patching.py`` against
the installed vLLM source: the targets resolve, and ``MLAAttention.forward`` on a minimally built
layer (forward context and backend mocked) calls ``forward_impl`` directly once patched, and the
custom op before.
"""

from __future__ import annotations

import importlib
import inspect

from autotune.patching import PatchError, PatchInfo, pin_attribute

MODULE = "vllm.model_executor.layers.attention.mla_attention"

PATCH = PatchInfo(
    name="mla_path",
    kind="experimental",
    engine="vllm",
    versions=">=0.32",
    targets=(
        f"{MODULE}.MLAAttention",
        f"{MODULE}.MLAAttention.forward",
        f"{MODULE}.MLAAttention.forward_impl",
        f"{MODULE}.unified_mla_attention_with_output",
    ),
    rationale="Bypass the MLA custom op and call forward_impl directly (the GLM-5 story's patch).",
    choices=("custom_op", "direct_call"),
    default="custom_op",
)


def apply(value: str) -> None:
    """Pin ``MLAAttention.use_direct_call`` to the chosen path."""
    module = importlib.import_module(MODULE)
    forward_src = inspect.getsource(module.MLAAttention.forward)
    if "self.use_direct_call" not in forward_src or "self.forward_impl(" not in forward_src:
        raise PatchError(
            f"{MODULE}.MLAAttention.forward no longer branches on use_direct_call", PATCH.name
        )
    pin_attribute(module.MLAAttention, "use_direct_call", value == "direct_call")
