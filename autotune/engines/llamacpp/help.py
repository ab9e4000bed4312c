"""What the installed ``llama-server`` says about its own flags: its ``--help``, parsed.

llama.cpp has no machine-readable description of its arguments; its ``--help`` is the one
place that lists, for the very binary that will run, every flag with its spellings, whether it
takes a value, the values it accepts (``allowed values: f32, f16, ...``, a hint such as
``[on|off|auto]`` or ``{none,linear,yarn}``), its default (``(default: 2048)``) and its
environment variable (``(env: LLAMA_ARG_BATCH)``). Validation (``validate.py``) and the launch's
default dropping (``engine.py``) read it from here, so neither keeps a copy of llama.cpp's rules.

The layout this parser relies on (``common_arg::to_string`` in llama.cpp's ``common/arg.cpp``):
an entry starts at column 0 with its spellings, ``", "``-separated, the last one followed by the
value hint; its help text starts at column 40 (or on the next line, indented 40 spaces, when the
spellings are long) and continues on lines indented 40 spaces. A switch lists its negative
spellings after its positive ones (``-cb, --cont-batching, -nocb, --no-cont-batching``).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass

from autotune._proc import run_captured
from autotune.errors import AutotuneError

#: the column where an entry's help text starts
_HELP_COLUMN = 40
_HELP_TIMEOUT_S = 60
#: a section title: ``----- common params -----``
_SECTION = "-----"
_ENV = re.compile(r"\(env: (?P<name>[A-Z0-9_]+)\)")
_ALLOWED = re.compile(r"allowed values: (?P<values>[^()\n]+?)(?: \(|$)")
#: ``(default: X)``, ``default: 'X')``, ``(default: X, meaning...)``: one plain word
_DEFAULT = re.compile(r"default: '?(?P<value>[^,()' ]+)'?(?P<rest>[^)]*)\)")
#: a hint that lists the values: ``[on|off|auto]``, ``<0|1>``, ``{none,linear,yarn}``, ``a|b``
_HINT_CHOICES = re.compile(r"^[\[<{]?(?P<body>[\w.-]+(?:\s*[|,]\s*[\w.-]+)+)[\]>}]?$")
#: the spellings of a switch's state in its help's default
_ON_WORDS = frozenset({"enabled", "true", "on"})
_OFF_WORDS = frozenset({"disabled", "false", "off"})
#: values llama.cpp reads as on / off where it parses a boolean (``common_arg_utils::is_truthy``
#: and ``is_falsey``); an ``[on|off]`` hint names only the first of each
TRUTHY = ("on", "enabled", "true", "1")
FALSEY = ("off", "disabled", "false", "0")


class HelpError(AutotuneError):
    """The installed ``llama-server --help`` could not be read."""


@dataclass(frozen=True)
class HelpFlag:
    """One entry of ``llama-server --help``.

    Attributes:
        names: every spelling that sets it (``-b``, ``--batch-size``), as help lists them.
        negations: the spellings that turn a switch off (``-nocb``, ``--no-cont-batching``).
        value_hint: what follows the flag (``N``, ``TYPE``, ``[on|off|auto]``); None for a
            switch, which takes no value.
        accepted: the values help lists for it; empty when it lists none.
        takes_list: its value is a comma-separated list of such values (``--spec-type``).
        default: the default help states, as help writes it (``2048``, ``f16``, ``auto``,
            ``enabled``); None when it states none or a sentence.
        default_is_sentinel: help gives the default value a meaning of its own (``default: 0,
            0 = loaded from model``): a mode, which passing it explicitly may not reproduce
            (``--ctx-size 0`` also turns off llama.cpp's context fitting).
        env: its environment variable (``LLAMA_ARG_BATCH``), or None.
        text: its help text, one line.
    """

    names: tuple[str, ...]
    negations: tuple[str, ...] = ()
    value_hint: str | None = None
    accepted: tuple[str, ...] = ()
    takes_list: bool = False
    default: str | None = None
    default_is_sentinel: bool = False
    env: str | None = None
    text: str = ""

    @property
    def takes_value(self) -> bool:
        return self.value_hint is not None

    @property
    def long_name(self) -> str:
        """The first ``--`` spelling (the one messages use), else the first spelling."""
        return next((n for n in self.names if n.startswith("--")), self.names[0])

    @property
    def env_names(self) -> tuple[str, ...]:
        """Its environment variables: the one help names and, for a switch that can be turned
        off, the ``LLAMA_ARG_NO_`` form llama.cpp also reads."""
        if self.env is None:
            return ()
        if self.negations and self.env.startswith("LLAMA_ARG_"):
            return (self.env, self.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1))
        return (self.env,)

    def switch_default(self) -> bool | None:
        """A switch's default state (True: on), or None when help does not say it plainly."""
        if self.takes_value or self.default is None or self.default_is_sentinel:
            return None
        word = self.default.lower()
        return True if word in _ON_WORDS else False if word in _OFF_WORDS else None


@dataclass(frozen=True)
class ServerHelp:
    """Every flag of one ``llama-server`` binary, looked up by spelling or env var."""

    flags: tuple[HelpFlag, ...]

    def flag(self, spelling: str) -> HelpFlag | None:
        """The entry ``spelling`` sets (positively or negatively). llama.cpp reads ``_`` as
        ``-`` in a ``--`` spelling, so ``--cache_type_k`` is ``--cache-type-k``."""
        wanted = canonical(spelling)
        for entry in self.flags:
            if wanted in entry.names or wanted in entry.negations:
                return entry
        return None

    def by_env(self, name: str) -> HelpFlag | None:
        for entry in self.flags:
            if name in entry.env_names:
                return entry
        return None

    def spellings(self) -> list[str]:
        """Every ``--`` spelling, for close-match suggestions."""
        return [n for e in self.flags for n in (*e.names, *e.negations) if n.startswith("--")]

    def env_names(self) -> list[str]:
        return [n for e in self.flags for n in e.env_names]


def canonical(spelling: str) -> str:
    """A flag as help lists it: llama.cpp reads ``_`` as ``-`` in a ``--`` spelling."""
    return "--" + spelling[2:].replace("_", "-") if spelling.startswith("--") else spelling


def parse_help(text: str) -> ServerHelp:
    """``llama-server --help``'s text -> its entries, in the order help lists them."""
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("-") and not line.startswith(_SECTION):
            head, first = _split_head(line)
            entries.append((head, [first] if first else []))
        elif entries and line.startswith(" " * _HELP_COLUMN):
            entries[-1][1].append(line.strip())
        # anything else (section titles, blank lines, backend logs) ends nothing: skipped
    return ServerHelp(tuple(_entry(head, " ".join(lines)) for head, lines in entries))


def _split_head(line: str) -> tuple[str, str]:
    """An entry's first line -> (spellings and hint, start of its help text)."""
    if len(line) > _HELP_COLUMN and line[:_HELP_COLUMN].endswith(" "):
        return line[:_HELP_COLUMN].strip(), line[_HELP_COLUMN:].strip()
    return line.strip(), ""


def _entry(head: str, text: str) -> HelpFlag:
    parts = [p.strip() for p in head.split(", ")]
    last = parts[-1].split(None, 1)
    names = [*parts[:-1], last[0]]
    hint = last[1] if len(last) > 1 else None
    positive, negative = _split_negations(names) if hint is None else (names, [])
    env = _ENV.search(text)
    default, sentinel = _default(text)
    return HelpFlag(
        names=tuple(positive),
        negations=tuple(negative),
        value_hint=hint,
        accepted=_accepted(hint, text),
        takes_list="comma-separated list" in text,
        default=default,
        default_is_sentinel=sentinel,
        env=env.group("name") if env else None,
        text=text,
    )


def _split_negations(names: list[str]) -> tuple[list[str], list[str]]:
    """A switch's spellings -> (positive, negative). help lists the positive ones first; the
    negative ones start after the last ``--X`` whose ``--no-X`` is also listed."""
    longs = [i for i, n in enumerate(names) if n.startswith("--") and f"--no-{n[2:]}" in names]
    if not longs:
        return names, []
    cut = longs[-1] + 1
    return names[:cut], names[cut:]


def _accepted(hint: str | None, text: str) -> tuple[str, ...]:
    allowed = _ALLOWED.search(text)
    if allowed:
        return tuple(v.strip() for v in allowed.group("values").split(",") if v.strip())
    if hint:
        listed = _HINT_CHOICES.match(hint)
        if listed and ".." not in listed.group("body"):  # "n0,n1,..." is a format, no list
            return tuple(v.strip() for v in re.split(r"[|,]", listed.group("body")) if v.strip())
    return ()


def _default(text: str) -> tuple[str | None, bool]:
    """(the default help states, whether help gives that value a meaning of its own)."""
    found = _DEFAULT.search(text)
    if found is None:
        return None, False
    value, rest = found.group("value"), found.group("rest")
    if rest.strip() and not rest.lstrip().startswith(","):
        return None, False  # "default: enabled if number of slots is auto": a condition
    # "0 = loaded from model", "-1 - no limit": the default value names a mode
    return value, bool(re.search(rf"(?<![\w.-]){re.escape(value)}\s*(?:=|-\s)", rest))


# --- the installed binary's help, read once per binary --------------------------------------


def server_help(program: str) -> ServerHelp:
    """The parsed ``--help`` of the binary at ``program`` (a path), read once per binary
    version: the cache key is the resolved path and its modification time, so a rebuilt binary
    is read again. Raises :class:`HelpError` when it cannot be run or says nothing usable."""
    real = os.path.realpath(program)
    try:
        mtime_ns = os.stat(real).st_mtime_ns
    except OSError as exc:
        raise HelpError(f"cannot read {program}: {exc}") from None
    return _read_help(real, mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_help(path: str, mtime_ns: int) -> ServerHelp:
    try:
        done = run_captured([path, "--help"], _HELP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HelpError(f"`{path} --help` failed: {type(exc).__name__}: {exc}") from None
    parsed = parse_help(done.stdout)
    if done.returncode != 0 or not parsed.flags:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise HelpError(
            f"`{path} --help` exited {done.returncode} with no flag list: {tail[0][:200]}"
        )
    return parsed
