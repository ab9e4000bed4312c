"""FIX: use the canonical (sorted) shard order for fused GGUF projections in in-tree vLLM GGUF.

The motivating case's real root cause. A GGUF file may store the parts of a fused projection
(``gate``/``up`` of ``MergedColumnParallelLinear``, or numbered slots like GLM-5's
``fused_qkv_a_proj``) in any order. In-tree vLLM GGUF (``vllm/model_executor/layers/quantization/
gguf.py``, vLLM before 0.24) records integer shard ids in the order the file streams them
(``qweight.shard_id``), and ``GGUFLinearMethod.apply`` concatenates the per-shard matmul outputs
in that order::

    shard_id = ["q", "k", "v"] if "q" in shard_id else shard_id      # stream order
    ...
    out = torch.cat(result, axis=1)

so a file that streams slot 1 before slot 0 yields columns ``[1, 0]`` and garbage text. String
QKV ids were already forced to ``q, k, v``. The fix is ``sorted(shard_id)`` (the per-shard offsets
in ``shard_offset_map`` are keyed by id, so only the iteration order needs fixing).

Upstream record (found with the code/issue search of vllm-project/vllm and vllm-gguf-plugin):

* ``vllm-project/vllm`` ``vllm/model_executor/layers/quantization/gguf.py``
  ``GGUFLinearMethod.apply`` (e.g. commit 00620f91ea18): the stream-order code above.
* vllm-project/vllm PR #35019 "[GGUF] Fix loading of fused/shard-less quantized weights"
  (2026-02, closed, not merged): "Sort numeric shard IDs in apply()".
* vllm-project/vllm PR #41053 (closed) / #41057 (open) "GGUF: sort merged-column slots by index,
  not stream order": the same fix in ``_create_padded_weight_param`` and ``apply``.
* Since vLLM 0.24, GGUF lives out of tree in ``vllm-gguf-plugin`` (PyPI), whose
  ``vllm_gguf_plugin/quantization/linear.py`` ``GGUFLinearMethod._create_padded_weight_param``
  already lays shards out by ``_gguf_ordered_shard_ids(shard_id)`` (sorted), so the fix is in
  place there and this patch is not needed (nor applicable).

Hence ``versions="<0.24"`` and the in-tree target below. On vLLM 0.32 (no in-tree GGUF),
selecting ``true`` fails with ``AUTOTUNE_PATCH_FAILED`` naming both the version and the missing
target ``vllm.model_executor.layers.quantization.gguf...``, the honest answer on that engine.

How it is applied: ``GGUFLinearMethod.process_weights_after_loading`` is wrapped; after the
original runs, the layer's integer ``qweight.shard_id`` list is sorted in place, which fixes the
order ``apply`` iterates without copying ``apply`` (whose body differs between versions).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from autotune.patching import PatchInfo

MODULE = "vllm.model_executor.layers.quantization.gguf"

PATCH = PatchInfo(
    name="gguf_shard_order",
    kind="fix",
    engine="vllm",
    versions="<0.24",
    targets=(
        f"{MODULE}.GGUFLinearMethod.process_weights_after_loading",
        f"{MODULE}.GGUFLinearMethod.apply",
    ),
    rationale=(
        "Sort fused GGUF shard ids (in-tree GGUF, vLLM <0.24; vllm-gguf-plugin already sorts)."
    ),
    choices=(False, True),
    default=False,
)

_state = {"done": False}


def sort_fused_shard_ids(layer: Any) -> bool:
    """Sort ``layer.qweight.shard_id`` in place when it holds integer ids; True if it changed.

    String ids (``q``/``k``/``v``) are left alone: upstream already orders them explicitly.
    """
    qweight = getattr(layer, "qweight", None)
    ids = getattr(qweight, "shard_id", None)
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        return False
    ordered = sorted(ids)
    if ordered == ids:
        return False
    ids[:] = ordered
    return True


def apply(value: bool) -> None:
    """Wrap ``GGUFLinearMethod.process_weights_after_loading`` (once per process)."""
    if not value or _state["done"]:
        return
    cls = importlib.import_module(MODULE).GGUFLinearMethod
    original = cls.process_weights_after_loading

    @functools.wraps(original)
    def process_weights_after_loading(self: Any, layer: Any) -> Any:
        result = original(self, layer)
        sort_fused_shard_ids(layer)
        return result

    cls.process_weights_after_loading = process_weights_after_loading
    _state["done"] = True
