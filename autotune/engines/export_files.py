"""An exported config as files, in any engine's terms, and the shell quoting they need.

``autotune export`` writes a main file (autotune's ``#`` header, then a body the engine owns)
and a ``.env`` beside it. What the body and the ``.env`` say is the engine's business
(:meth:`Engine.render_export`): vLLM reads a YAML config file, llama.cpp's server has none and
is started by a shell script whose flags live in its own ``LLAMA_ARG_*`` variables. ``autotune
compare`` reads both files back through the same engine (:meth:`Engine.parse_export`), so a
config is matched in the terms it was written in. This module holds what every engine shares:
the files' shape, the default (YAML and ``NAME=value``) texts, and the quoting.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: the API key as an exported config spells it: a shell variable the user sets, never the
#: per-trial key (``autotune export`` writes it; ``compare`` and ``recheck`` read it back)
EXPORT_API_KEY = "$API_KEY"
#: how a ``.env`` file spells :data:`EXPORT_API_KEY` (the braces end the name in any text)
ENV_FILE_API_KEY = "${API_KEY}"
#: the text of a ``.env`` whose config needs no variable (the file is written all the same, so
#: an older export's ``.env`` never stands beside a config it does not belong to)
NO_ENV_TEXT = "# this configuration needs no environment variables\n"


class ExportFormatError(ValueError):
    """An exported file is not what this engine's export writes (the message says what)."""


@dataclass(frozen=True)
class ExportFiles:
    """One export in the engine's own terms (:meth:`Engine.render_export`).

    Attributes:
        body: the main file's text after autotune's header (a config file, a launch script).
        config: the settings as the body holds them (``ExportResult.config``).
        env: the ``.env`` file's variables, :data:`EXPORT_API_KEY` where the user's key goes;
            the header lists them.
        env_text: the ``.env`` file's text.
        command: what a user runs to start the server (printed, and on the header's
            ``# Launch:`` line).
        launch_env: the variables the header's ``# Launch:`` line sets before ``command``.
    """

    body: str
    config: dict[str, Any]
    env: dict[str, str]
    env_text: str
    command: list[str]
    launch_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportedSettings:
    """An export read back (:meth:`Engine.parse_export`), as ``compare`` matches it against the
    exports of the search space's values: the body's entries and the ``.env``'s variables."""

    config: dict[str, Any]
    env: dict[str, str]


def env_path_for(out: Path) -> Path:
    """The ``.env`` written beside the main file ``out``."""
    return out.with_suffix(".env")


# --- the default: a YAML config file and a NAME=value .env ---------------------------------


def yaml_body(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=False)


#: the first line of a non-empty ``.env`` of this format: it is not shell (a value such as
#: ``{"a": "b"}`` or ``x; y`` runs as a command when the file is sourced), and says so
ENV_FILE_NOTE = (
    "# NAME=value lines for `docker run --env-file` or systemd's EnvironmentFile, not for "
    "a shell's `source`: the config's `# Launch:` line is the quoted shell form\n"
)


def env_file_text(env: Mapping[str, str]) -> str:
    """``NAME=value`` lines, unquoted (the format of ``docker --env-file`` and systemd's
    ``EnvironmentFile``) after a line that says so; :data:`EXPORT_API_KEY` as
    ``${API_KEY}``."""
    text = "".join(f"{k}={v.replace(EXPORT_API_KEY, ENV_FILE_API_KEY)}\n" for k, v in env.items())
    return ENV_FILE_NOTE + text if text else NO_ENV_TEXT


def read_yaml_export(text: str, env_text: str) -> ExportedSettings:
    """:func:`yaml_body` and :func:`env_file_text` read back."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ExportFormatError(f"cannot read the config: {exc}".splitlines()[0]) from None
    if not isinstance(config, dict):
        raise ExportFormatError("not a mapping of engine options")
    env = {}
    for line in env_text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            name, value = line.split("=", 1)
            env[name.strip()] = value.replace(ENV_FILE_API_KEY, EXPORT_API_KEY)
    return ExportedSettings(config, env)


# --- quoting --------------------------------------------------------------------------------


def bash_word(text: str) -> str:
    """``text`` quoted for bash on one line, except ``$API_KEY``, left to expand (in double
    quotes): ``Bearer $API_KEY`` -> ``'Bearer '"$API_KEY"``, one word once expanded. For the
    header's ``# Launch:`` comment, which must stay one line."""
    if EXPORT_API_KEY not in text:
        return _one_line_quote(text)
    return f'"{EXPORT_API_KEY}"'.join(
        _one_line_quote(part) if part else "" for part in text.split(EXPORT_API_KEY)
    )


def posix_word(text: str) -> str:
    """``text`` quoted for any POSIX ``sh`` (dash has no ``$'...'``), except ``$API_KEY``, left
    to expand as ``"${API_KEY}"``. A line break stays inside single quotes: the word may span
    lines, so it belongs in a script's body, never in a ``#`` comment."""
    if EXPORT_API_KEY not in text:
        return shlex.quote(text)
    return f'"{ENV_FILE_API_KEY}"'.join(
        shlex.quote(part) if part else "" for part in text.split(EXPORT_API_KEY)
    )


def is_one_line(text: str) -> bool:
    """Whether ``text`` is printable on one line (no line break, no control character)."""
    return all(c == " " or c.isprintable() for c in text)


def _one_line_quote(text: str) -> str:
    """``shlex.quote``, on one line: a word with a line break or another character that is not
    printable (``python -c`` with a two-line script, a choice written ``"a\\nb"``) is written
    ``$'...'`` with that character escaped. shlex kept the line break, which ended the header's
    ``#`` comment: the rest of the word was read as YAML (a broken file, or a stray key)."""
    if is_one_line(text):
        return shlex.quote(text)
    return "$'" + "".join(_escaped(c) for c in text) + "'"


def _escaped(char: str) -> str:
    """One character inside ``$'...'`` (bash, zsh, ksh, POSIX 2024): ``\\xHH`` is a byte, so
    characters past ASCII are ``\\uHHHH`` (UTF-8 in a UTF-8 locale)."""
    if char in "\\'":
        return "\\" + char
    if char == " " or char.isprintable():
        return char
    if ord(char) < 128:
        return f"\\x{ord(char):02x}"
    return f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}"
