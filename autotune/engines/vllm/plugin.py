"""The vLLM general plugin that applies autotune patches inside every vLLM process.

Registered in ``pyproject.toml`` as ``vllm.general_plugins: autotune_patches =
autotune.engines.vllm.plugin:register``. vLLM calls general plugins in the API server, the engine
core and every worker process, which is exactly where a monkeypatch has to live: a patch applied
only in the process autotune starts would never reach the engine core and the worker that runs
the model (vLLM 0.32 CPU: API server -> EngineCore process -> VllmWorker process, each loads
plugins).

Environment contract (set by autotune's engine module for a trial):

``AUTOTUNE_PATCHES``
    JSON object ``{"patch_name": value, ...}``. Absent, empty or ``{}``: do nothing (fast, no
    imports), so installing autotune never changes a vLLM server that did not ask for patches.
``AUTOTUNE_PATCH_DIRS``
    ``os.pathsep``-separated directories to discover patch modules in. Required when
    ``AUTOTUNE_PATCHES`` selects anything; patches are never looked up anywhere else.

A failure raises, which makes vLLM fail at start: ``load_general_plugins`` calls ``register()``
without catching. (vLLM only *logs* a failure to *import* this module, so this file,
``version.py`` and ``autotune.patching`` stay stdlib-only.) Note that ``VLLM_PLUGINS``, when
set, must include ``autotune_patches``, or vLLM skips this plugin and the patches are silently
not applied; the ``AUTOTUNE_PATCH_APPLIED`` markers in the server log are the evidence that
they were.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from autotune.engines.vllm.version import installed_vllm_version
from autotune.patching import (
    FAILED_MARKER,
    PATCH_DIRS_ENV,
    PATCHES_ENV,
    PatchError,
    apply_patches,
)

__all__ = ["engine_version", "register"]

_LOCK = threading.Lock()
_DONE_FOR: str | None = None  # the raw AUTOTUNE_PATCHES value already applied in this process


def engine_version() -> str:
    """The installed vLLM version (see ``version.py``); a patch cannot be checked without it."""
    version = installed_vllm_version()
    if version is None:
        raise PatchError("cannot determine the installed vLLM version")
    return version


def _fail(reason: str) -> PatchError:
    reason = " ".join(reason.split())
    print(f"{FAILED_MARKER} name=* reason={reason}", file=sys.stderr, flush=True)
    return PatchError(reason)


def register() -> None:
    """Apply the patches selected in ``AUTOTUNE_PATCHES``; idempotent within a process."""
    global _DONE_FOR
    raw = os.environ.get(PATCHES_ENV, "").strip()
    if not raw:
        return
    with _LOCK:
        if raw == _DONE_FOR:
            return
        try:
            selection = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _fail(f"{PATCHES_ENV} is not valid JSON: {exc}") from exc
        if not isinstance(selection, dict):
            raise _fail(f"{PATCHES_ENV} must be a JSON object name -> value")
        if not selection:
            _DONE_FOR = raw
            return
        dirs = [d for d in os.environ.get(PATCH_DIRS_ENV, "").split(os.pathsep) if d.strip()]
        if not dirs:
            raise _fail(f"{PATCHES_ENV} selects patches but {PATCH_DIRS_ENV} names no directory")
        apply_patches(selection, dirs, engine_version())
        _DONE_FOR = raw
