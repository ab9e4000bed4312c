"""llama.cpp's ``llama-server``: how it is started, checked, read and exported.

The launch is ``<llama-server> -m <model.path> --host H --port P --alias <served_name>
--metrics --log-prefix``, then ``engine.args``, then the trial's flags. ``--metrics`` makes its
Prometheus ``/metrics`` the trial's server-side evidence (``metrics.py``); ``--log-prefix``
puts each logged line's level in the log, so a failure is read from the engine's error lines
only (``logs.py``). The per-trial API key travels in ``LLAMA_API_KEY``, never in argv. The
binary is found as ``binary.py`` says; every flag is checked against its own ``--help``
(``help.py``, ``validate.py``). Its export is a launch script and the ``LLAMA_ARG_*``
variables it hands the server (``export.py``).

A flag whose value equals the default the binary's help states is left out of the launch
(:meth:`LlamaCppEngine.launch_settings`): ``--cont-batching`` is on unless turned off, so a
proposal of it starts the very server the baseline started. llama.cpp also reads
``/etc/llama.cpp/config.ini`` and a per-user ``config.ini`` before its arguments; a machine
with one runs other defaults than its help states, for the baseline as for every trial.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.engines.base import Engine, LaunchConfig, MetricsMap, ValidationIssue
from autotune.engines.export_files import (
    EXPORT_API_KEY,
    ExportedSettings,
    ExportFiles,
    env_path_for,
)
from autotune.engines.llamacpp import binary, export, logs, startup, validate
from autotune.engines.llamacpp.dialect import LLAMACPP_DIALECT
from autotune.engines.llamacpp.help import HelpError, ServerHelp, canonical, server_help
from autotune.engines.llamacpp.metrics import LLAMACPP_METRICS
from autotune.space.settings import ServerSettings

if TYPE_CHECKING:
    from autotune.space.model import SearchSpace
    from autotune.spec.model import EngineSpec, ModelSpec

_KEY = "LLAMA_API_KEY"
#: KV-cache types that store the cache at lower precision than the model computes in
_FULL_PRECISION_CACHE = frozenset({"f32", "f16", "bf16"})
_CACHE_TYPE_FLAGS = frozenset({"--cache-type-k", "--cache-type-v", "-ctk", "-ctv"})


#: llama-server's spellings (build 11434) of a draft model for speculative decoding
_DRAFT_MODEL = frozenset(
    {"--spec-draft-model", "-md", "--model-draft", "--spec-draft-hf", "-hfd", "-hfrd"}
    | {"--hf-repo-draft"}
)


def _speculative_type(value: str) -> bool:
    """``--spec-type`` names a kind of speculation (``none`` alone is none)."""
    return any(kind.strip() not in ("", "none") for kind in value.split(","))


class LlamaCppEngine(Engine):
    name = "llamacpp"
    dialect = LLAMACPP_DIALECT
    key_env = _KEY
    default_command = (binary.PROGRAM,)
    install_hint = binary.INSTALL_HINT
    export_suffix = ".sh"
    #: llama-server advertises keep-alive but closes the connection after a streamed answer
    reuses_connections = False
    own_flags = {
        "--model": "autotune launches the spec's model.path",
        "--alias": "autotune's requests name the spec's model.served_name",
        "--host": "autotune gives each server its address",
        "--port": "autotune gives each server its address",
        "--api-key": f"autotune gives each server its API key (through {_KEY})",
        "--api-key-file": f"autotune gives each server its API key (through {_KEY})",
        "--metrics": "autotune turns /metrics on: the trial's server-side evidence",
        "--log-prefix": "autotune reads failures from the log's level prefixes",
        "--no-log-prefix": "autotune reads failures from the log's level prefixes",
        # another source of weights: the server would serve a model other than model.path
        "--model-url": "autotune launches the spec's model.path",
        "--hf-repo": "autotune launches the spec's model.path",
        "--docker-repo": "autotune launches the spec's model.path",
    }
    #: ``llama-server --help`` (build 11434): the short names of the flags above
    short_flags = {
        "-m": "--model",
        "-a": "--alias",
        "-mu": "--model-url",
        "-hf": "--hf-repo",
        "-hfr": "--hf-repo",
        "-dr": "--docker-repo",
    }
    own_env = {
        "LLAMA_ARG_MODEL": "autotune launches the spec's model.path (--model)",
        "LLAMA_ARG_MODEL_URL": "autotune launches the spec's model.path (--model-url)",
        "LLAMA_ARG_HF_REPO": "autotune launches the spec's model.path (--hf-repo)",
        "LLAMA_ARG_DOCKER_REPO": "autotune launches the spec's model.path (--docker-repo)",
        "LLAMA_ARG_ALIAS": "autotune's requests name the spec's model.served_name (--alias)",
        "LLAMA_ARG_HOST": "autotune gives each server its address (--host)",
        "LLAMA_ARG_PORT": "autotune gives each server its address (--port)",
        "LLAMA_ARG_ENDPOINT_METRICS": "autotune turns /metrics on (--metrics)",
        "LLAMA_ARG_LOG_PREFIX": "autotune reads failures from the log's level prefixes",
        "LLAMA_ARG_NO_LOG_PREFIX": "autotune reads failures from the log's level prefixes",
    }

    def speculates(self, launch: LaunchConfig) -> bool:
        """A draft model, or a ``--spec-type`` other than ``none`` (n-gram lookups, the
        n-gram cache, MTP ...), on the command line or in its ``LLAMA_ARG_*`` variable."""
        argv = launch.argv
        for index, word in enumerate(argv):
            flag, given, value = word.partition("=")
            flag = canonical(flag)
            if flag in _DRAFT_MODEL:
                return True
            if flag == "--spec-type":
                value = value if given else (argv[index + 1] if index + 1 < len(argv) else "")
                if _speculative_type(value):
                    return True
        env = launch.env
        return bool(
            env.get("LLAMA_ARG_SPEC_DRAFT_MODEL")
            or env.get("LLAMA_ARG_SPEC_DRAFT_HF_REPO")
            or _speculative_type(env.get("LLAMA_ARG_SPEC_TYPE", ""))
        )

    def __init__(self, engine: EngineSpec, model: ModelSpec) -> None:
        super().__init__(engine, model)
        self._version: str | None = None

    # --- the binary ------------------------------------------------------------------------

    def program(self) -> str | None:
        """The server binary's absolute path, or None when there is none (``binary.py``)."""
        return binary.resolve_program(self.engine_spec.command[0])

    def version(self) -> str:
        """``--version``'s first line and the binary's path; "not installed" without one.
        Computed once per engine."""
        if self._version is None:
            program = self.program()
            if program is None:
                self._version = "not installed"
            else:
                self._version = f"llama-server {binary.version_line(program)} ({program})"
        return self._version

    def server_help(self) -> ServerHelp:
        """The installed binary's parsed ``--help``; :class:`HelpError` when unreadable."""
        program = self.program()
        if program is None:
            raise HelpError(f"no {binary.PROGRAM} found: {binary.INSTALL_HINT}")
        return server_help(program)

    # --- the launch ------------------------------------------------------------------------

    def _argv(self, settings: ServerSettings, host: str, port: int) -> list[str]:
        command = list(self.engine_spec.command)
        command[0] = self.program() or command[0]
        return [
            *command,
            "-m",
            self.model_spec.path,
            "--host",
            host,
            "--port",
            str(port),
            "--alias",
            self.model_spec.served_name,
            "--metrics",
            "--log-prefix",
            *self.engine_spec.args,
            *self.launch_settings(settings).flag_argv(),
        ]

    def build_launch(
        self, settings: ServerSettings, *, host: str, port: int, api_key: str
    ) -> LaunchConfig:
        argv = self._argv(settings, host, port)
        return self._launch(
            argv, self.engine_spec.env, settings, host=host, port=port, api_key=api_key
        )

    def launch_settings(self, settings: ServerSettings) -> ServerSettings:
        """``settings`` without the flags whose value is the default the binary's help states
        (a switch turned to its default state, a value equal to its stated default). A default
        that help gives a meaning of its own (``0 = loaded from model``) is kept: passing it
        may not equal leaving it out. Unchanged when help cannot be read."""
        try:
            found = self.server_help()
        except HelpError:
            return settings
        kept = {
            flag: value
            for flag, value in settings.flags.items()
            if value is not None and value is not False and not is_default(found, flag, value)
        }  # None and False are never launched: left out, the settings say what runs
        if len(kept) == len(settings.flags):
            return settings
        return dataclasses.replace(settings, flags=kept)

    # --- failures, validation, evidence ----------------------------------------------------

    def classify_failure(self, log_tail: str) -> str | None:
        return logs.classify(log_tail)

    def root_cause(self, log_text: str) -> str | None:
        return logs.root_cause(log_text)

    def startup_parts(self, log_lines: Sequence[str]) -> dict[str, float]:
        """Model load (weights, KV cache), warm-up and slots, from the log's timestamps."""
        return startup.startup_parts(log_lines)

    def validate_space(self, space: SearchSpace) -> list[ValidationIssue]:
        try:
            found = self.server_help()
        except HelpError as exc:
            reason = f"cannot read llama-server's flags to validate against: {exc}"
            return [ValidationIssue(p.name, p.target.describe(), reason) for p in space.parameters]
        return validate.validate_space(space, found, self.program() or binary.PROGRAM)

    def lossy_choice(self, target_name: str, value: Any) -> str | None:
        """A quantized KV cache (``--cache-type-k q8_0``) stores keys or values at lower
        precision than the model computes in: the gate may reject it."""
        if (
            target_name in _CACHE_TYPE_FLAGS
            and isinstance(value, str)
            and value not in _FULL_PRECISION_CACHE
        ):
            return f"{target_name} {value} stores the KV cache below full precision"
        return None

    def server_metrics_map(self) -> MetricsMap:
        return LLAMACPP_METRICS

    # --- export: a launch script and its LLAMA_ARG_* variables (``export.py``) -----------

    def export_config(self, settings: ServerSettings) -> dict[str, Any]:
        """The trial's flags as ``{flag without dashes: value}`` (llama-server reads no config
        file of its own; :meth:`render_export` writes what starts it)."""
        config: dict[str, Any] = {}
        for flag, value in self.launch_settings(settings).flags.items():
            if value is None or value is False:
                continue
            config[flag.lstrip("-")] = value
        return config

    def launch_command(self, settings: ServerSettings, config_file: str) -> list[str]:
        """The exported script, run by ``sh`` (it needs no execute bit)."""
        return ["sh", config_file]

    def render_export(
        self, settings: ServerSettings, env: Mapping[str, str], out: Path
    ) -> ExportFiles:
        """A ``sh`` script that sources the ``.env`` beside it and starts llama-server, the
        tuned flags in that ``.env`` as llama-server's own variables (``export.py``)."""
        found = self._help_or_none()
        kept = self.launch_settings(settings)
        variables: dict[str, str] = {}
        on_line: dict[str, Any] = {}
        for flag, value in kept.flags.items():
            if value is None or value is False:
                continue
            setting = export.env_setting(found, flag, value, self.engine_spec.args)
            if setting is None:
                on_line[flag] = value
            else:
                variables[setting[0]] = setting[1]
        command = list(self.engine_spec.command)
        command[0] = self.program() or command[0]
        argv = [
            *command,
            "-m",
            self.model_spec.path,
            "--alias",
            self.model_spec.served_name,
            "--host",
            export.HOST,
            "--port",
            export.PORT,
            *self.engine_spec.args,
            *ServerSettings(flags=on_line, json_flags=kept.json_flags).flag_argv(),
        ]
        env_file = env_path_for(out)
        full_env = {**env, **variables, _KEY: EXPORT_API_KEY}
        return ExportFiles(
            body=export.script_body(argv, script=out, env_file=env_file),
            config=self.export_config(settings),
            env=full_env,
            env_text=export.env_text(full_env, out),
            command=self.launch_command(settings, str(out)),
        )

    def parse_export(self, text: str, env_text: str) -> ExportedSettings:
        return export.read_export(text, env_text)

    def exported_at(self, flag: str) -> tuple[str, str]:
        """The flag's ``LLAMA_ARG_*`` variable when the export can set it there, else its place
        on the script's command line."""
        located = export.flag_env(self._help_or_none(), flag, self.engine_spec.args)
        return ("env", located[1]) if located else ("config", flag.lstrip("-"))

    def _help_or_none(self) -> ServerHelp | None:
        try:
            return self.server_help()
        except HelpError:
            return None


def is_default(found: ServerHelp, flag: str, value: Any) -> bool:
    """Whether ``flag`` set to ``value`` (as :class:`ServerSettings` holds it) is what the
    binary does anyway, by the default its help states."""
    entry = found.flag(flag)
    if entry is None or value is None or value is False:
        return False
    if value is True:  # a switch: on, unless ``flag`` is one of its negative spellings
        return entry.switch_default() is (canonical(flag) not in entry.negations)
    if not entry.takes_value or entry.default is None or entry.default_is_sentinel:
        return False
    if isinstance(value, list | tuple):
        return False
    if str(value) == entry.default:
        return True
    try:
        return float(value) == float(entry.default)
    except (TypeError, ValueError):
        return False
