"""Any OpenAI-compatible server, started from a command template.

``engine.command`` is a list such as ``["llama-server", "-m", "{model}", "--port", "{port}"]``;
placeholders ``{port}``, ``{host}``, ``{model}``, ``{served_name}``, ``{api_key}`` and
``{python}`` (the interpreter running autotune) are filled per trial, each inside its own argv
element (no shell, so a value can never become a command).
Parameters map to flags and env vars exactly as for vLLM. This lets SGLang, llama.cpp's server
or TGI be tuned, and lets the tests drive the whole loop with a fault-injecting test server.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from autotune.engines.base import Engine, LaunchConfig, ServerSettings, ValidationIssue

_PLACEHOLDERS = ("port", "host", "model", "served_name", "api_key", "python")


class CommandEngine(Engine):
    name = "command"

    def version(self) -> str:
        program = self.spec.engine.command[0]
        found = shutil.which(program) or program
        return f"command:{os.path.basename(found)}"

    def _fill(self, part: str, values: dict[str, str]) -> str:
        for name in _PLACEHOLDERS:
            part = part.replace("{" + name + "}", values[name])
        return part

    def build_launch(
        self, settings: ServerSettings, *, host: str, port: int, api_key: str
    ) -> LaunchConfig:
        values = {
            "port": str(port),
            "host": host,
            "model": self.spec.model.path,
            "served_name": self.spec.model.served_name,
            "api_key": api_key,
            "python": sys.executable,
        }
        argv = [self._fill(part, values) for part in self.spec.engine.command]
        argv += [self._fill(a, values) for a in self.spec.engine.args]
        argv += settings.flag_argv()
        env = {k: self._fill(v, values) for k, v in self.spec.engine.env.items()}
        return self._launch(
            argv, env, settings, host=host, port=port, api_key=api_key, key_env="AUTOTUNE_API_KEY"
        )

    def validate_space(self, space) -> list[ValidationIssue]:
        issues = []
        for param in space.parameters:
            error = None
            if param.target.kind == "patch":
                error = "patches need an engine that loads autotune's plugin (vllm)"
            issues.append(ValidationIssue(param.name, param.target.describe(), error))
        return issues

    def export_config(self, settings: ServerSettings) -> dict[str, Any]:
        config: dict[str, Any] = {}
        for flag, value in settings.flags.items():
            if value is None or value is False:
                continue
            config[flag.lstrip("-")] = value
        for flag, obj in settings.json_flags.items():
            config[flag.lstrip("-")] = obj
        return config

    def launch_command(self, settings: ServerSettings, config_file: str) -> list[str]:
        values = {
            "port": "8000",
            "host": "127.0.0.1",
            "model": self.spec.model.path,
            "served_name": self.spec.model.served_name,
            "api_key": "$API_KEY",
            "python": sys.executable,
        }
        argv = [self._fill(p, values) for p in self.spec.engine.command]
        argv += [self._fill(a, values) for a in self.spec.engine.args]
        return argv + settings.flag_argv()
