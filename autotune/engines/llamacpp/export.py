"""llama.cpp's export: a launch script, and the ``LLAMA_ARG_*`` variables it hands the server.

llama-server reads no config file; what its user runs is a command line and an environment.
Every flag's variable is in its ``--help`` (``help.py``), and the binary reads them itself
(measured on llama-server 0.6.0-dev): a value flag takes its value (``LLAMA_ARG_N_PARALLEL=2``),
a switch ``true``/``false`` (also ``1``/``0``; anything else is refused: ``invalid boolean
value``), so ``--no-cont-batching`` is written ``LLAMA_ARG_CONT_BATCHING=false`` (one variable
per setting; the binary also reads ``LLAMA_ARG_NO_CONT_BATCHING=1``), and a flag on the command
line overrides its variable (with a warning). So the export is two files:

* the main file, a POSIX ``sh`` script: autotune's ``#`` header, then a check that ``API_KEY``
  is set, ``set -a; . <its .env>; set +a``, and ``exec llama-server -m MODEL --alias NAME
  --host 127.0.0.1 --port 8080 [engine.args] [flags with no variable] "$@"``: a ``--host`` or
  ``--port`` (or any flag) after the script's name overrides what it sets;
* the ``.env`` beside it, which the script sources: the spec's and the trial's variables, the
  trial's tuned flags as ``LLAMA_ARG_*`` variables, and ``LLAMA_API_KEY="${API_KEY}"`` (the
  user's key, never the trial's).

A flag stays on the command line when help names no variable for it, when ``engine.args`` set
it too (the last one given wins, as in the trial's launch), when it has more than one value or
an optional value left out, or when its value does not fit one line. Every value is quoted with
``shlex`` (dash, Debian's ``sh``, has no ``$'...'``). Read back (``compare``), the script's
``exec`` line is ``{flag without dashes: value}`` and the ``.env`` its variables.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.engines.export_files import (
    ENV_FILE_API_KEY,
    EXPORT_API_KEY,
    ExportedSettings,
    ExportFormatError,
    bash_word,
    is_one_line,
    posix_word,
)
from autotune.engines.llamacpp.help import HelpFlag, ServerHelp, canonical

#: where the exported script's server listens unless its caller says otherwise
HOST = "127.0.0.1"
PORT = "8080"
#: a word that starts a flag on the command line (``-1`` is a value)
_FLAG_WORD = re.compile(r"^--?[A-Za-z]")


def flag_env(
    found: ServerHelp | None, flag: str, args: Sequence[str]
) -> tuple[HelpFlag, str] | None:
    """``flag``'s help entry and the variable that can set it, or None when the flag must stay
    on the command line whatever its value (help unread or silent, or ``args`` set it too)."""
    if found is None:
        return None
    entry = found.flag(flag)
    if entry is None or entry.env is None:
        return None
    if any(word.startswith("-") and found.flag(word) == entry for word in args):
        return None
    return entry, entry.env


def env_setting(
    found: ServerHelp | None, flag: str, value: Any, args: Sequence[str]
) -> tuple[str, str] | None:
    """The ``(variable, value)`` that sets ``flag`` to ``value`` as the command line would, or
    None when it stays on the command line (see the module docstring)."""
    located = flag_env(found, flag, args)
    if located is None:
        return None
    entry, name = located
    if value is True:
        if entry.takes_value:
            return None  # an optional value left out: only the bare flag says that
        return name, "false" if canonical(flag) in entry.negations else "true"
    if not entry.takes_value or isinstance(value, list | tuple):
        return None
    text = str(value)
    return (name, text) if is_one_line(text) else None


def script_body(argv: Sequence[str], *, script: Path, env_file: Path) -> str:
    """The script after autotune's header: it checks ``API_KEY``, sources ``env_file`` (found
    beside the script, wherever both are moved) and ``exec``s ``argv`` with the caller's own
    arguments after it."""
    groups: list[list[str]] = []  # the program, then one line per flag and its value
    for word in argv:
        if len(groups) > 1 and not _FLAG_WORD.match(word):
            groups[-1].append(word)
        else:
            groups.append([word])
    lines = [" ".join(posix_word(w) for w in group) for group in groups]
    return "\n".join(
        [
            f"# Run: API_KEY=<the key clients must send> sh {bash_word(script.name)} "
            "[more llama-server flags]",
            f"#   It listens on {HOST}:{PORT}; --host and --port after the script's name move it.",
            f"#   The tuned flags are llama-server's own variables, in {bash_word(env_file.name)};",
            "#   a flag given after the script's name overrides its variable.",
            ': "${API_KEY:?set it to the key clients must send}"',
            "set -a",
            f'. "$(dirname -- "$0")"/{posix_word(env_file.name)}',
            "set +a",
            "exec " + " \\\n  ".join([*lines, '"$@"']),
            "",
        ]
    )


def env_text(env: Mapping[str, str], script: Path) -> str:
    """The ``.env`` the script sources: one ``NAME=value`` a line, each value quoted for
    ``sh``, the user's key as ``"${API_KEY}"``."""
    head = f"# llama-server's environment for {bash_word(script.name)}, which sources it\n"
    return head + "".join(f"{name}={posix_word(value)}\n" for name, value in env.items())


def read_export(text: str, env_file_text: str) -> ExportedSettings:
    """The script's ``exec`` line as ``{flag without dashes: value}`` (the program left out: it
    differs from machine to machine) and the ``.env``'s variables; ExportFormatError for a
    text this export does not write."""
    words = _words(text, "the script")
    if "exec" not in words:
        raise ExportFormatError("no `exec llama-server ...` line: not a llama.cpp export")
    command = words[words.index("exec") + 1 :]
    if len(command) < 2 or command[-1] != "$@":
        raise ExportFormatError('the `exec` line does not end with "$@"')
    config: dict[str, Any] = {}
    key: str | None = None
    for word in command[1:-1]:
        if _FLAG_WORD.match(word):
            key = word.lstrip("-")
            config[key] = True
        elif key is None:
            raise ExportFormatError(f"{word!r} on the `exec` line follows no flag")
        elif config[key] is True:
            config[key] = word
        else:
            previous = config[key]
            config[key] = [*(previous if isinstance(previous, list) else [previous]), word]
    env: dict[str, str] = {}
    for word in _words(env_file_text, "the .env"):
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise ExportFormatError(f"{word!r} in the .env is not NAME=value")
        env[name] = value.replace(ENV_FILE_API_KEY, EXPORT_API_KEY)
    return ExportedSettings(config, env)


def _words(text: str, what: str) -> list[str]:
    """``text``'s words as ``sh`` reads them, comments left out. A line continuation (a
    backslash that ends a line outside quotes) is a word of one line break to ``shlex``: it
    is dropped (``shlex.quote`` writes a value of a lone line break as such a word too; that
    value reads back as no value)."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError as exc:
        raise ExportFormatError(f"cannot read {what} as sh words: {exc}") from None
    return [word for word in words if word != "\n"]
