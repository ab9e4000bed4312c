"""The seam between autotune and an inference engine.

Everything engine-specific (how flags are spelled, which env vars exist, how requests ask for
token ids and scores, how a failure looks in the log, what a config file for the engine looks
like) lives behind :class:`Engine`, so adding SGLang or llama.cpp means adding one module beside
``vllm/`` and ``command.py`` and naming it in ``registry.py`` (or an ``autotune.engines`` entry
point).
"""

from __future__ import annotations

import abc
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.engines.dialect import OPENAI, RequestDialect
from autotune.engines.export_files import (
    ExportedSettings,
    ExportFiles,
    env_file_text,
    read_yaml_export,
    yaml_body,
)
from autotune.errors import visible
from autotune.patching import FAILED_MARKER, PATCH_DIRS_ENV, PATCHES_ENV
from autotune.space.settings import ServerSettings

if TYPE_CHECKING:
    from autotune.space.model import SearchSpace
    from autotune.spec.model import EngineSpec, ModelSpec


@dataclass(frozen=True)
class MetricsMap:
    """Generic metric name -> Prometheus family names (first present wins), per kind: how an
    engine names what :mod:`autotune.server.metrics` reads from its ``/metrics``."""

    gauges: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    counters: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class TraceRecipe:
    """An engine's names in a profiler trace (read by :mod:`autotune.analysis.trace`).

    Attributes:
        step: matches the event name of one engine step on the worker's main thread
            (for vLLM the ``user_annotation`` ``execute_context_N(n)_generation_M(m)``).
        empty_step: matches steps that scheduled nothing (left out of the window's step count).
        kernel_categories: ``(category, pattern)`` pairs tried in order on GPU kernel names; the
            first is the collectives category, counted per token as calls.
    """

    step: re.Pattern[str]
    empty_step: re.Pattern[str] | None = None
    kernel_categories: tuple[tuple[str, re.Pattern[str]], ...] = ()

    @property
    def collectives(self) -> str | None:
        return self.kernel_categories[0][0] if self.kernel_categories else None


@dataclass(frozen=True)
class LaunchConfig:
    """Exactly how one server process is started: argv (no shell), env additions, address."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    host: str
    port: int
    api_key: str
    served_model: str
    health_path: str = "/health"
    #: names of env vars whose values are secret and must never be stored or printed
    secret_env: tuple[str, ...] = ()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def is_secret(self, name: str) -> bool:
        """Whether env var ``name``'s value is secret: named in ``secret_env``, or a name that
        looks secret (:data:`SECRET_NAME`: ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ...)."""
        return name in self.secret_env or looks_secret(name)

    def secret_values(self) -> list[str]:
        """The secret strings of this launch (the API key, the secret env values), longest
        first so that a value containing another is redacted whole."""
        # short values (a "1" or "auto" under a KEY-looking name) are masked in the env but not
        # cut out of free text, where they would clobber everything else
        values = {v for k, v in self.env.items() if len(v) >= 8 and self.is_secret(k)}
        if self.api_key:
            values.add(self.api_key)
        return sorted(values, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """``text`` with every secret value of this launch replaced by ``***``."""
        for value in self.secret_values():
            text = text.replace(value, "***")
        return text

    def redacted_env(self) -> dict[str, str]:
        """The env as it may be stored: secret values ``***``; a value that embeds a secret
        (``Bearer {api_key}``) keeps its shape with the secret cut out."""
        return {k: ("***" if self.is_secret(k) else self.redact(v)) for k, v in self.env.items()}

    def redacted_argv(self) -> list[str]:
        return [self.redact(a) for a in self.argv]


#: env var names whose values are secret (case-insensitive): ``*TOKEN*``, ``*KEY*``,
#: ``*SECRET*``, ``*PASSWORD*`` (also ``PASSWD``, ``CREDENTIAL``)
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def looks_secret(name: str) -> bool:
    """Whether an env var's name says its value is a secret (:data:`SECRET_NAME`)."""
    return SECRET_NAME.search(name) is not None


@dataclass(frozen=True)
class ValidationIssue:
    """One line of ``autotune validate``: a parameter and what is wrong with it (or None)."""

    parameter: str
    target: str
    error: str | None
    #: why the engine could not check this parameter (it is not known to be wrong, nor right)
    unchecked: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class DroppedChoice:
    """A parameter value this machine cannot run (e.g. an fp8 KV cache on a CPU without
    AVX-512): dropped before any trial, so no launch is spent on it. ``value`` is the
    parameter's own value; ``reason`` names the root cause and the fact that was probed."""

    parameter: str
    value: Any
    reason: str

    def notice(self) -> str:
        return f"dropped {self.parameter}={self.value!r}: {self.reason}"


@dataclass(frozen=True)
class CompileCacheReading:
    """What a start's log says of the compile cache: ``state`` (for vLLM ``warm``, ``cold``,
    ``partly warm`` or ``load failed``) and, when an entry could not be read back, the engine's
    reason (a broken cache makes every start compile again: the user should know why)."""

    state: str
    load_failure: str | None = None


class Engine(abc.ABC):
    """An inference engine autotune can start, classify and export for."""

    #: short name used in specs (``engine.kind``)
    name: str = ""
    #: how requests ask this engine's server for token ids, fixed lengths and prompt scores
    dialect: RequestDialect = OPENAI
    #: the env var that carries the per-trial API key to the server (never argv, where ``ps``
    #: would show it)
    key_env: str = "AUTOTUNE_API_KEY"
    #: the argv that starts a server when the spec gives no ``engine.command`` (None: required)
    default_command: tuple[str, ...] | None = None
    #: whether ``engine.version_command`` means anything for this engine
    takes_version_command: bool = False
    #: flags this engine's launch sets itself, and why a search space may not tune them (a
    #: tuned ``--served-model-name`` made every request name a model the server did not serve)
    own_flags: Mapping[str, str] = {}
    #: the engine parser's short spellings of its long flags (llama.cpp's ``-m`` for
    #: ``--model``): ``engine.args`` may not set an own flag by its short name either
    short_flags: Mapping[str, str] = {}
    #: whether the server keeps a connection open after a streamed answer, as HTTP/1.1
    #: keep-alive promises. llama.cpp's server advertises keep-alive and closes the connection
    #: after each streamed answer, so a client that reuses it sees the next request dropped:
    #: False makes autotune's client open a new connection for every request to it.
    reuses_connections: bool = True
    #: environment variables this engine's launch sets itself, and why a search space may not
    #: tune them (the env forms of ``own_flags``; the API key's ``key_env`` is always refused)
    own_env: Mapping[str, str] = {}
    #: what to do when :meth:`version` says "not installed" (the preflight's message)
    install_hint: str = ""
    #: the suffix of the file ``autotune export`` writes when no ``-o`` names one
    export_suffix: str = ".yaml"

    def speculates(self, launch: LaunchConfig) -> bool:
        """Whether ``launch`` decodes speculatively: then a repeated prompt may really decode
        faster than a fresh one (``bench/replay.py``). False for an engine that cannot tell,
        so a server that replays answers is refused there."""
        return False

    @classmethod
    def command_problem(cls, command: Sequence[str]) -> str | None:
        """What is wrong with a spec's ``engine.command`` for this engine, or None."""
        return None

    @classmethod
    def cpu_binding_env(cls, cores: str) -> dict[str, str]:
        """The env that binds a server to ``cores`` (a Linux cpulist, ``"0-3,8-11"``), for
        parallel trials on one machine. Default: none (the engine has no such setting)."""
        return {}

    def __init__(self, engine: EngineSpec, model: ModelSpec) -> None:
        # the spec's engine and model sections only: an engine never reads the workload,
        # the gate or the search space from the spec it was built for
        self.engine_spec = engine
        self.model_spec = model

    def patch_env(self, settings: ServerSettings) -> dict[str, str]:
        """The env that makes autotune's plugin apply the trial's patches (empty if none)."""
        if not settings.patches:
            return {}
        return {
            PATCHES_ENV: json.dumps(dict(settings.patches), sort_keys=True),
            PATCH_DIRS_ENV: os.pathsep.join(str(d) for d in self.engine_spec.patch_dirs),
        }

    def _launch(
        self,
        argv: list[str],
        base_env: Mapping[str, str],
        settings: ServerSettings,
        *,
        host: str,
        port: int,
        api_key: str,
    ) -> LaunchConfig:
        """The parts every engine shares: env layering (spec, then the trial's settings, then
        the secret key and the patch selection) and the launch record itself."""
        env = dict(base_env)
        env.update(settings.env)
        env[self.key_env] = api_key
        env.update(self.patch_env(settings))
        return LaunchConfig(
            argv=tuple(argv),
            env=env,
            host=host,
            port=port,
            api_key=api_key,
            served_model=self.model_spec.served_name,
            health_path=self.engine_spec.health_path,
            # Each name once: the key's own name usually looks secret as well.
            secret_env=tuple(
                dict.fromkeys((self.key_env, *sorted(k for k in env if looks_secret(k))))
            ),
        )

    @abc.abstractmethod
    def version(self) -> str:
        """The installed engine's version, recorded in every trial."""

    def launch_settings(self, settings: ServerSettings) -> ServerSettings:
        """``settings`` as this engine's launch applies them: an engine that knows its own
        defaults leaves out a flag set to the value it takes anyway, so a proposal equal to the
        engine's default (llama.cpp's ``--cont-batching``, on unless turned off) launches
        exactly as the baseline does. Default: unchanged (no knowledge of defaults)."""
        return settings

    @abc.abstractmethod
    def build_launch(
        self, settings: ServerSettings, *, host: str, port: int, api_key: str
    ) -> LaunchConfig:
        """The argv and env that start a server with ``settings``; builds, starts nothing."""

    def classify_failure(self, log_tail: str) -> str | None:
        """A failure reason recognised in the server log, or None. Shared markers first."""
        return classify_common(log_tail)

    def root_cause(self, log_text: str) -> str | None:
        """The engine's own error line that explains a failure (see :func:`find_root_cause`)."""
        return find_root_cause(log_text)

    def verify_started(self, settings: ServerSettings, log_text: str) -> str | None:
        """After readiness: a reason the server is not running what was asked, or None."""
        return None

    def model_problem(self) -> str | None:
        """Why the installed engine cannot serve the spec's model on this machine (a format it
        has no loader for here), with what to do instead, or None. Asked at preflight, before
        any trial or baseline is spent. Default: no problem known."""
        return None

    def validate_space(self, space: SearchSpace) -> list[ValidationIssue]:
        """Check each parameter against the installed engine. Default: nothing to check."""
        return [ValidationIssue(p.name, p.target.describe(), None) for p in space.parameters]

    def machine_limits(self, space: SearchSpace) -> list[DroppedChoice]:
        """Choices of ``space`` this machine cannot run, learned from the machine where the
        engine exposes it. Default: none known."""
        return []

    def lossy_choice(self, target_name: str, value: Any) -> str | None:
        """Why setting ``target_name`` (a flag or env var) to ``value`` changes the model's
        numerics (so it is a poor first proposal: the gate may reject it), or None."""
        return None

    @abc.abstractmethod
    def export_config(self, settings: ServerSettings) -> dict[str, Any]:
        """The engine's own config-file form of ``settings`` (flags only; env kept apart)."""

    def launch_command(self, settings: ServerSettings, config_file: str) -> list[str]:
        """The command a user runs to start the exported config."""
        return [*self.engine_spec.command, "--config", config_file]

    def render_export(
        self, settings: ServerSettings, env: Mapping[str, str], out: Path
    ) -> ExportFiles:
        """The files ``autotune export`` writes to ``out`` (and its ``.env``) for ``settings``,
        in this engine's own terms; ``env`` is what the server's environment needs (the spec's,
        the trial's, the patch selection). Default: :meth:`export_config` as a YAML config
        file, the env as ``NAME=value`` lines, :meth:`launch_command` to start it."""
        config = self.export_config(settings)
        return ExportFiles(
            body=yaml_body(config),
            config=config,
            env=dict(env),
            env_text=env_file_text(env),
            command=self.launch_command(settings, str(out)),
            launch_env=dict(env),
        )

    def parse_export(self, text: str, env_text: str) -> ExportedSettings:
        """An export's main file (header and all) and its ``.env`` text read back, as
        ``autotune compare`` matches them: the same settings always read back the same from
        what :meth:`render_export` writes. Raises ``ExportFormatError`` (a ValueError) for a
        text this engine's export does not write."""
        return read_yaml_export(text, env_text)

    def exported_at(self, flag: str) -> tuple[str, str]:
        """Where an export holds ``flag``'s value, as :meth:`parse_export` reads it back:
        ``("config", key)`` or ``("env", variable)``. Default: the config key, the flag
        without its dashes."""
        return ("config", flag.lstrip("-"))

    def startup_parts(self, log_lines: Sequence[str]) -> dict[str, float]:
        """The server's startup broken into its parts, in seconds, as its own log says them
        (vLLM: weights, torch.compile, CUDA-graph capture, KV cache profiling). A part the log
        does not state is absent, never 0: a made-up zero would read as "free". Default: none
        (a server autotune does not know says nothing autotune can read)."""
        return {}

    def compile_cache_state(self, log_lines: Sequence[str]) -> CompileCacheReading | None:
        """Whether this start read its compiled graphs back from the compile cache, as the
        engine's log says it; None when the log does not say (an eager start, an engine
        without a cache): never a guess."""
        return None

    def compile_cache_env(self, cache_dir: Path) -> dict[str, str]:
        """The env that points the engine's compile cache at ``cache_dir``, shared by the
        trials of one study (a warm start reuses what an earlier trial compiled); empty when
        the engine has none, or the spec's own env already chose where it lives."""
        return {}

    def profiler(self, trace_dir: Any) -> Any:
        """How to profile this engine's server into ``trace_dir`` (``autotune profile``): an
        object with ``json_flag()``, ``recipe``, ``decode_body()``, ``start()`` and ``stop()``
        (see ``engines/vllm/profile.py``), or None when autotune cannot profile it."""
        return None

    def server_metrics_map(self) -> MetricsMap | None:
        """The engine's Prometheus ``/metrics`` names, or None when it exposes none autotune
        knows (the server's metrics are then recorded unavailable)."""
        return None

    async def evidence(self, client: Any, settings: ServerSettings) -> dict[str, Any]:
        """After the benchmark (and before an ``incorrect_output`` verdict): engine-specific
        evidence read from the running server, as ``{user_attr name: value}`` to store on the
        trial (vLLM: the speculative-decoding acceptance). ``client`` is the trial's
        ``httpx.AsyncClient``. It never fails a trial: a read that fails is recorded as such.
        Default: none."""
        return {}


#: text that is positive evidence of running out of memory, in any engine's log (an engine
#: adds its own in its ``classify_failure``, e.g. ``engines/vllm/logs.py``)
_OOM_MARKERS = (
    "out of memory",
    "outofmemoryerror",
    "cuda error: out of memory",
    "cannot allocate memory",
    "memoryerror",
    "insufficient memory",
)
_INVALID_MARKERS = (
    "unrecognized arguments",
    "invalid choice",
    "error: argument",
    "validationerror",
    "value error,",
    "invalid value",
)


#: a log line's level word (``INFO 12-01 ...``, ``[WARNING]``, ``level=info``): the first one in
#: the line is the line's level
_LEVEL_WORD = re.compile(
    r"(?<![A-Za-z])(TRACE|DEBUG|INFO|NOTICE|WARNING|WARN|ERROR|CRITICAL|FATAL|PANIC)(?![A-Za-z])",
    re.IGNORECASE,
)
_ERROR_LEVELS = frozenset({"error", "critical", "fatal", "panic"})
#: an unlevelled line is an error message when it names an error or an exception
_ERROR_WORD = re.compile(r"error|exception|terminate called|killed", re.IGNORECASE)


def is_error_message(line: str) -> bool:
    """Whether ``line`` is an error of the engine, not a remark: a line whose level is ERROR,
    CRITICAL or FATAL, or a line without a level that names an error or an exception (a
    traceback's last line, ``CUDA error: ...``, C++'s ``terminate called ...``). An INFO,
    DEBUG or WARNING line is never one, whatever its text says."""
    level = _LEVEL_WORD.search(line)
    if level is not None:
        return level.group(1).lower() in _ERROR_LEVELS
    return _ERROR_WORD.search(line) is not None


def error_message_with(log_text: str, markers: tuple[str, ...]) -> str | None:
    """The last error message (:func:`is_error_message`) of ``log_text`` that contains one of
    ``markers`` (lower case), stripped; None when no error-level line does. Evidence is the
    engine's error, never a word that happens to be in an informational line."""
    for line in reversed(log_text.splitlines()):
        lowered = line.lower()
        if any(m in lowered for m in markers) and is_error_message(line):
            return line.strip()
    return None


def classify_common(log_tail: str) -> str | None:
    """Markers every engine shares: autotune's patch marker, OOM (only in an error message of
    the engine, :func:`error_message_with`), argparse/pydantic rejection."""
    lowered = log_tail.lower()
    if FAILED_MARKER.lower() in lowered:
        return "patch_failed"
    if error_message_with(log_tail, _OOM_MARKERS) is not None:
        return "oom"
    if any(m in lowered for m in _INVALID_MARKERS):
        return "invalid_config"
    return None


# --- the root cause: the engine's own error line ----------------------------------------------
#
# An exit code says *that* a server failed; the line that says *why* is usually deep in its log:
# the exception that ended the last Python traceback, an argument parser's ``error:`` line, or
# autotune's own patch marker. Engines whose processes wrap each other's errors (vLLM: worker ->
# engine core -> API server, each adding "see root cause above") refine this in their module.

ROOT_CAUSE_MAX_CHARS = 500
TRACEBACK_HEADER = "Traceback (most recent call last):"
#: ``SomeError: message`` / ``pkg.mod.SomeError: message`` / ``Exception: message``
EXCEPTION_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Fault)"
    r"|Exception))(?:: (?P<message>.*))?$"
)
#: argparse: ``prog: error: message`` (a prog may hold spaces: ``python -m pkg.mod``)
PARSER_ERROR_LINE = re.compile(r"^[^:\s][^:]{0,120}: error: (?P<message>.+)$")
PATCH_FAILED_LINE = re.compile(re.escape(FAILED_MARKER) + r" name=\S+ reason=.*")
#: a message that only points elsewhere ("see root cause above"): never the root cause itself
POINTER_MESSAGE = re.compile(
    r"root cause above|stack trace above|see (?:the )?stack trace|see (?:the )?root cause",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class LogError:
    """One error line found in a log: where, what kind, and the text to report."""

    index: int
    kind: str  # "exception" (ends a traceback), "parser", "patch", "bare" (no traceback)
    text: str
    type: str = ""
    message: str = ""

    @property
    def is_pointer(self) -> bool:
        return bool(POINTER_MESSAGE.search(self.message or self.text))


def error_lines(lines: Sequence[str]) -> list[LogError]:
    """Every error line of a log, in order. ``lines`` are already stripped of any per-line
    prefix an engine's logger adds (timestamps, process names)."""
    found: list[LogError] = []
    in_traceback = False
    for index, raw in enumerate(lines):
        line = raw.rstrip()
        if line.strip() == TRACEBACK_HEADER:
            in_traceback = True
            continue
        if PATCH_FAILED_LINE.search(line):
            found.append(LogError(index, "patch", PATCH_FAILED_LINE.search(line).group(0)))
            continue
        if not line or line[0].isspace():
            continue  # a frame of a traceback, or a continuation line
        match = EXCEPTION_LINE.match(line)
        if match:
            kind = "exception" if in_traceback else "bare"
            found.append(
                LogError(index, kind, line, match.group("type"), match.group("message") or "")
            )
        elif PARSER_ERROR_LINE.match(line):
            found.append(LogError(index, "parser", line, "", line.split(": error: ", 1)[1]))
        in_traceback = False
    return found


def find_root_cause(log_text: str) -> str | None:
    """The line that explains a failure, engine-neutral.

    In order: autotune's own ``AUTOTUNE_PATCH_FAILED`` marker; else the last exception that
    ended a traceback or the argument parser's ``error:`` line, whichever came last, skipping
    messages that only point elsewhere ("see root cause above"); else the last bare
    ``SomeError: message`` line. None when the log names no error.
    """
    return pick_root_cause(error_lines(log_text.splitlines()))


def pick_root_cause(errors: Sequence[LogError]) -> str | None:
    """The generic choice among :func:`error_lines` (see :func:`find_root_cause`)."""
    patches = [e for e in errors if e.kind == "patch"]
    if patches:
        return clip(patches[-1].text)
    for kinds in (("exception", "parser"), ("bare",)):
        candidates = [e for e in errors if e.kind in kinds and not e.is_pointer]
        if candidates:
            return clip(candidates[-1].text)
    return None


def clip(text: str, limit: int = ROOT_CAUSE_MAX_CHARS) -> str:
    """One line of at most ``limit`` characters, its control characters written as escapes (a
    server's log line may carry terminal sequences: stored raw, they reached every terminal
    that showed the trial)."""
    text = visible(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."
