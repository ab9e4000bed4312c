"""Any OpenAI-compatible server, started from a command template.

``engine.command`` is a list such as
``["llama-server", "-m", "{model}", "--host", "{host}", "--port", "{port}"]``; placeholders
``{port}``, ``{host}`` (both required), ``{model}``, ``{served_name}`` and ``{python}`` (the
interpreter running autotune) are filled per trial, each inside its own argv element (no shell,
so a value can never become a command).
The per-trial API key never goes on the command line, where ``ps`` shows it: the server gets it
in ``AUTOTUNE_API_KEY``, and ``{api_key}`` is filled in ``engine.env`` values only (e.g.
``env: {MY_SERVER_API_KEY: "{api_key}"}``); the spec loader refuses it in ``command``/``args``.
Parameters map to flags and env vars exactly as for vLLM. This lets SGLang, llama.cpp's server
or TGI be tuned, and lets the tests drive the whole loop with a fault-injecting test server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune._proc import run_captured
from autotune.engines.base import (
    Engine,
    LaunchConfig,
    MetricsMap,
    ValidationIssue,
)
from autotune.engines.export_files import EXPORT_API_KEY
from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.engines.vllm.machine import CPU_BIND_ENV
from autotune.engines.vllm.metrics import VLLM_METRICS
from autotune.space.settings import ServerSettings

if TYPE_CHECKING:
    from autotune.spec.model import EngineSpec, ModelSpec

_PLACEHOLDERS = ("port", "host", "model", "served_name", "api_key", "python")
KEY_ENV = "AUTOTUNE_API_KEY"
#: what an exported launch command puts where the key goes (expanded by the user's shell)
_VERSION_TIMEOUT_S = 20


class CommandEngine(Engine):
    name = "command"
    #: Servers started from a template are most often vLLM-compatible (vLLM itself, SGLang's
    #: OpenAI server, the test double), so requests carry vLLM's extensions. A server that does
    #: not know them answers with less (the baseline records what its answers carry) or refuses
    #: (HTTP 400/422: the gate asks again with the plain OpenAI body); the plain dialect is
    #: ``engines.dialect.OPENAI``.
    dialect = VLLM_DIALECT
    key_env = KEY_ENV
    takes_version_command = True

    @classmethod
    def cpu_binding_env(cls, cores: str) -> dict[str, str]:
        """vLLM's variable, as the dialect: a vLLM CPU server started from a template (and the
        test double, which records it) binds to these cores; other servers ignore it."""
        return {CPU_BIND_ENV: cores}

    @classmethod
    def command_problem(cls, command: Sequence[str]) -> str | None:
        """The template places the server where autotune looks for it: ``{port}``, and
        ``{host}`` (127.0.0.1), without which the server picks its own address, often every
        interface (``python -m http.server {port}`` listened on 0.0.0.0)."""
        text = " ".join(command)
        if "{port}" not in text:
            return "the template must contain {port}"
        if "{host}" not in text:
            return (
                "the template must contain {host} (e.g. --host {host}): autotune's servers "
                "listen on 127.0.0.1 only, and a server not told its address may listen on "
                "every network interface"
            )
        return None

    def __init__(self, engine: EngineSpec, model: ModelSpec) -> None:
        super().__init__(engine, model)
        self._version: str | None = None

    def version(self) -> str:
        """What really runs: the program's resolved path (for ``{python} -m module``, the
        module's distribution and Python's version) and, when the spec gives
        ``engine.version_command``, the first line that command prints. Computed once."""
        if self._version is None:
            self._version = self._program_version()
            answer = self._version_command_answer()
            if answer:
                self._version = f"{answer} [{self._version}]"
        return self._version

    def _program_version(self) -> str:
        command = self.engine_spec.command
        program = command[0].replace("{python}", sys.executable)
        found = shutil.which(program)
        if found is None:
            return f"{program} (not found)"
        found = os.path.abspath(found)
        if found != os.path.abspath(sys.executable):
            return f"{os.path.basename(found)} ({found})"
        text = f"python {platform.python_version()} ({found})"
        if len(command) > 2 and command[1] == "-m":
            module = command[2]
            dists = importlib.metadata.packages_distributions().get(module.split(".")[0], [])
            owner = ""
            with contextlib.suppress(importlib.metadata.PackageNotFoundError, IndexError):
                owner = f" ({dists[0]} {importlib.metadata.version(dists[0])})"
            text = f"python -m {module}{owner} on {text}"
        return text

    def _version_command_answer(self) -> str:
        argv = [p.replace("{python}", sys.executable) for p in self.engine_spec.version_command]
        if not argv:
            return ""
        try:
            done = run_captured(argv, _VERSION_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"version_command failed: {type(exc).__name__}"
        lines = [line.strip() for line in (done.stdout + done.stderr).splitlines()]
        first = next((line for line in lines if line), "")
        if done.returncode != 0:
            return f"version_command exited {done.returncode}: {first[:200]}"
        return first[:200]

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
            "model": self.model_spec.path,
            "served_name": self.model_spec.served_name,
            "api_key": api_key,
            "python": sys.executable,
        }
        # The key is filled into env values only; argv gets an empty string should a spec
        # built without the loader still name it there.
        argv_values = {**values, "api_key": ""}
        argv = [self._fill(part, argv_values) for part in self.engine_spec.command]
        argv += [self._fill(a, argv_values) for a in self.engine_spec.args]
        argv += settings.flag_argv()
        env = {k: self._fill(v, values) for k, v in self.engine_spec.env.items()}
        launch = self._launch(argv, env, settings, host=host, port=port, api_key=api_key)
        secret = tuple(k for k, v in self.engine_spec.env.items() if "{api_key}" in v)
        if secret:
            launch = dataclasses.replace(
                launch, secret_env=tuple(dict.fromkeys((*launch.secret_env, *secret)))
            )
        return launch

    def validate_space(self, space) -> list[ValidationIssue]:
        """Patches are refused; nothing else can be checked: the template starts a server
        autotune knows nothing about, so every other parameter is reported unchecked."""
        issues = []
        for param in space.parameters:
            error = unchecked = None
            if param.target.kind == "patch":
                error = "patches need an engine that loads autotune's plugin (vllm)"
            else:
                unchecked = "the command engine cannot check parameters against its server"
            issues.append(ValidationIssue(param.name, param.target.describe(), error, unchecked))
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
            "model": self.model_spec.path,
            "served_name": self.model_spec.served_name,
            "api_key": EXPORT_API_KEY,
            "python": sys.executable,
        }
        argv = [self._fill(p, values) for p in self.engine_spec.command]
        argv += [self._fill(a, values) for a in self.engine_spec.args]
        return argv + settings.flag_argv()

    def server_metrics_map(self) -> MetricsMap:
        """vLLM's names: most OpenAI-compatible servers that expose Prometheus metrics (and the
        test double) use them; a server without them is recorded unavailable."""
        return VLLM_METRICS
