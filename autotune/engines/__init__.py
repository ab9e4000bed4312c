"""Engines autotune can tune. ``build_engine`` picks the module for a spec's ``engine.kind``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.engines.base import Engine, LaunchConfig, ValidationIssue
from autotune.settings import ServerSettings

if TYPE_CHECKING:
    from autotune.spec import StudySpec

__all__ = ["Engine", "LaunchConfig", "ServerSettings", "ValidationIssue", "build_engine"]


def build_engine(spec: StudySpec) -> Engine:
    if spec.engine.kind == "vllm":
        from autotune.engines.vllm import VllmEngine

        return VllmEngine(spec)
    from autotune.engines.command import CommandEngine

    return CommandEngine(spec)
