"""Engines autotune can tune: ``build_engine`` picks the class a spec's ``engine.kind`` names
(``registry.py``); ``base.py`` is the seam every engine implements."""

from __future__ import annotations

from autotune.engines.base import Engine, LaunchConfig, ValidationIssue
from autotune.engines.registry import build_engine

__all__ = ["Engine", "LaunchConfig", "ValidationIssue", "build_engine"]
