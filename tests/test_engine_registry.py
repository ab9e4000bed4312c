"""The engine registry: ``engine.kind`` -> engine class, built-ins and entry points, and the
spec loader asking it (no hard-coded engine list)."""

from __future__ import annotations

import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import yaml

from autotune.engines import registry
from autotune.engines.base import Engine, LaunchConfig
from autotune.engines.command import CommandEngine
from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.engines.registry import build_engine, engine_class, engine_names
from autotune.engines.vllm.engine import VllmEngine
from autotune.engines.vllm.machine import CPU_BIND_ENV
from autotune.errors import SpecError
from autotune.space.settings import ServerSettings
from autotune.spec.load import load_spec

ROOT = Path(__file__).resolve().parents[1]


class ToyEngine(Engine):
    """A third-party engine, as an ``autotune.engines`` entry point would provide it."""

    name = "toy"
    default_command = ("toy-server",)

    def version(self) -> str:
        return "toy 1"

    def build_launch(
        self, settings: ServerSettings, *, host: str, port: int, api_key: str
    ) -> LaunchConfig:
        return self._launch(["toy-server"], {}, settings, host=host, port=port, api_key=api_key)

    def export_config(self, settings: ServerSettings) -> dict:
        return {}


def _entry_points(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    found = {
        name: EntryPoint(name=name, value=value, group=registry.ENTRY_POINT_GROUP)
        for name, value in values.items()
    }
    monkeypatch.setattr(registry, "_entry_points", lambda: found)


def test_builtin_engines() -> None:
    assert engine_names()[:3] == ("vllm", "command", "llamacpp")
    assert engine_class("vllm") is VllmEngine and engine_class("command") is CommandEngine
    assert engine_class("llamacpp") is LlamaCppEngine


def test_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(SpecError) as info:
        engine_class("sglang")
    assert info.value.key == "engine.kind" and "vllm" in str(info.value)


def test_an_entry_point_adds_an_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    _entry_points(monkeypatch, toy=f"{__name__}:ToyEngine")
    assert engine_names() == ("vllm", "command", "llamacpp", "toy")
    assert engine_class("toy") is ToyEngine


def test_a_broken_entry_point_fails_only_its_own_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    _entry_points(monkeypatch, broken="no_such_module_xyz:Engine", odd=f"{__name__}:Path")
    assert engine_class("vllm") is VllmEngine  # never loaded for another kind
    with pytest.raises(SpecError, match="cannot be loaded"):
        engine_class("broken")
    with pytest.raises(SpecError, match="not an autotune Engine"):
        engine_class("odd")


def _spec(tmp_path: Path, engine: dict) -> Path:
    """The demo spec with another ``engine`` section."""
    spec = yaml.safe_load((ROOT / "studies" / "demo.yaml").read_text())
    spec["engine"] = engine
    spec["model"]["path"] = str(ROOT / "models" / "demo")
    spec["search_space"] = str(ROOT / "search_spaces" / "cpu-demo.yaml")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_the_spec_asks_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_spec(_spec(tmp_path, {"kind": "vllm"}))
    assert spec.engine.command == VllmEngine.default_command
    assert isinstance(build_engine(spec), VllmEngine)
    with pytest.raises(SpecError, match="command template"):
        load_spec(_spec(tmp_path, {"kind": "command"}))
    with pytest.raises(SpecError, match="must contain \\{port\\}"):
        load_spec(_spec(tmp_path, {"kind": "command", "command": ["srv"]}))
    _entry_points(monkeypatch, toy=f"{__name__}:ToyEngine")
    spec = load_spec(_spec(tmp_path, {"kind": "toy"}))
    assert spec.engine.command == ("toy-server",)
    engine = build_engine(spec)
    assert isinstance(engine, ToyEngine)
    launch = engine.build_launch(ServerSettings(), host="127.0.0.1", port=1, api_key="k")
    assert launch.env[Engine.key_env] == "k" and launch.secret_env == (Engine.key_env,)


def test_engines_say_how_they_read_their_key_and_cores() -> None:
    assert VllmEngine.key_env == "VLLM_API_KEY"
    assert VllmEngine.cpu_binding_env("0-3") == {CPU_BIND_ENV: "0-3"}
    assert ToyEngine.cpu_binding_env("0-3") == {}
    assert VllmEngine.default_command[0] == sys.executable
