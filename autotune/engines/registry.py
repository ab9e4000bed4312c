"""Engines by name: ``engine.kind`` in a spec -> the :class:`~autotune.engines.base.Engine` class.

The built-in engines are listed here; another package adds one with an entry point in the
``autotune.engines`` group (``sglang = "my_pkg.sglang:SglangEngine"``), so SGLang or llama.cpp
is one more module, not an edit to the spec loader. An entry point is loaded only when a spec
names it, so a broken third-party engine cannot break specs that do not use it.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from autotune.engines.base import Engine
from autotune.engines.command import CommandEngine
from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.engines.vllm.engine import VllmEngine
from autotune.errors import SpecError

if TYPE_CHECKING:
    from autotune.spec.model import StudySpec

ENTRY_POINT_GROUP = "autotune.engines"
BUILTIN: dict[str, type[Engine]] = {
    cls.name: cls for cls in (VllmEngine, CommandEngine, LlamaCppEngine)
}


def _entry_points() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def engine_names() -> tuple[str, ...]:
    """Every engine kind a spec may name: the built-in ones first, then installed plugins."""
    extra = sorted(n for n in _entry_points() if n not in BUILTIN)
    return (*BUILTIN, *extra)


def engine_class(kind: str) -> type[Engine]:
    """The engine class for ``kind``; :class:`SpecError` (key ``engine.kind``) when unknown."""
    if kind in BUILTIN:
        return BUILTIN[kind]
    entry = _entry_points().get(kind)
    if entry is None:
        raise SpecError(f"unknown engine {kind!r} (one of {engine_names()})", key="engine.kind")
    try:
        cls = entry.load()  # type: ignore[attr-defined]
    except Exception as exc:
        raise SpecError(
            f"engine {kind!r} ({entry.value}) cannot be loaded: {exc}",  # type: ignore[attr-defined]
            key="engine.kind",
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise SpecError(
            f"engine {kind!r} ({entry.value}) is not an autotune Engine class",  # type: ignore[attr-defined]
            key="engine.kind",
        )
    return cls


def build_engine(spec: StudySpec) -> Engine:
    """The engine a spec names (``engine.kind``), built from the spec's engine and model
    sections, ready to build launches for it."""
    return engine_class(spec.engine.kind)(spec.engine, spec.model)
