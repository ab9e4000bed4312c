"""``autotune validate`` for llama.cpp: a search space against the installed ``llama-server``.

Each parameter is checked against the binary's own ``--help`` (``help.py``), never a copy of
its rules, before the first trial (a trial that dies on a misspelled flag teaches the sampler
nothing; a misspelled ``LLAMA_ARG_*`` variable is silently ignored, so a whole dimension would
measure noise):

* **flag** targets: the flag (and a bool's ``false_flag``) must be one of its spellings (an
  unknown one gets a close-match suggestion); a bool parameter needs a switch (no value), any
  other type a flag that takes a value; a value must be among those help lists, where it lists
  them (cache types, ``[on|off|auto]``; llama.cpp also reads ``enabled``/``true``/``1`` and
  ``disabled``/``false``/``0`` where it reads ``on``/``off``).
* **env** targets named ``LLAMA_ARG_*``: the variable must exist (each flag's, and a switch's
  ``LLAMA_ARG_NO_*`` form), with the same value checks. Other variables (``OMP_NUM_THREADS``,
  ``GGML_*``) are not in help: reported as not checked, never as valid.
* **json** targets: llama.cpp has no flag that takes a JSON object autotune could merge keys
  into; refused. **patch** targets: llama.cpp loads no plugin; refused.
"""

from __future__ import annotations

import difflib
from typing import Any

from autotune.engines.base import ValidationIssue
from autotune.engines.llamacpp.help import FALSEY, TRUTHY, HelpFlag, ServerHelp
from autotune.space.model import Parameter, SearchSpace

ENV_PREFIX = "LLAMA_ARG_"
_BOOLEAN_WORDS = (*TRUTHY, *FALSEY)


def validate_space(space: SearchSpace, server: ServerHelp, program: str) -> list[ValidationIssue]:
    """One :class:`ValidationIssue` per parameter, in declaration order; messages name the
    binary (``program``) whose help was read."""
    issues = []
    for param in space.parameters:
        target = param.target
        unchecked = None
        if target.kind == "flag":
            errors = _check_flag(server, program, param)
        elif target.kind == "env":
            if target.name.startswith(ENV_PREFIX):
                errors = _check_env(server, program, param)
            else:
                errors = []
                unchecked = f"{target.name} is not a {ENV_PREFIX}* variable of llama-server"
        elif target.kind == "json":
            errors = [
                "llama-server takes no JSON-object flag whose keys autotune could set; "
                "target the flag itself"
            ]
        else:
            errors = ["llama.cpp loads no plugin, so patches cannot apply (they need vllm)"]
        issues.append(
            ValidationIssue(
                param.name,
                target.describe(),
                "; ".join(dict.fromkeys(errors)) or None,
                unchecked=None if errors else unchecked,
            )
        )
    return issues


def _check_flag(server: ServerHelp, program: str, param: Parameter) -> list[str]:
    target = param.target
    entry = server.flag(target.name)
    if entry is None:
        return [_unknown(target.name, server.spellings(), program, "flag")]
    errors = []
    if param.type == "bool":
        if entry.takes_value:
            errors.append(
                f"{target.name} takes a value ({entry.value_hint}); a bool parameter passes "
                "it bare: make it categorical"
            )
        if target.false_flag:
            other = server.flag(target.false_flag)
            if other is None:
                errors.append(_unknown(target.false_flag, server.spellings(), program, "flag"))
            elif other is not entry:
                errors.append(f"{target.false_flag} is not the negation of {target.name}")
        return errors
    if not entry.takes_value:
        return [f"{target.name} is a switch (it takes no value); make the parameter bool"]
    errors += [_not_accepted(target.name, entry, v) for v in _values(param)]
    return [e for e in errors if e]


def _check_env(server: ServerHelp, program: str, param: Parameter) -> list[str]:
    name = param.target.name
    entry = server.by_env(name)
    if entry is None:
        return [_unknown(name, server.env_names(), program, "environment variable")]
    if param.type == "bool":
        return []  # autotune writes 1 / 0, which llama.cpp reads as on / off
    if not entry.takes_value:
        return [
            f"{_show(v)}: {name} is read as on/off ({', '.join(_BOOLEAN_WORDS)})"
            for v in _values(param)
            if _show(v) not in _BOOLEAN_WORDS
        ]
    return [e for e in (_not_accepted(name, entry, v) for v in _values(param)) if e]


def _values(param: Parameter) -> list[Any]:
    """The values to check against a listed set: the choices (None leaves the flag out). Numeric
    ranges are not listed values; llama.cpp checks their type when it starts."""
    if param.type in ("categorical", "int_list"):
        return [c for c in param.choices if c is not None]
    return []


def _not_accepted(where: str, entry: HelpFlag, value: Any) -> str | None:
    accepted = entry.accepted
    if not accepted:
        return None
    text = _show(value)
    words = text.split(",") if entry.takes_list else [text]
    allowed = set(accepted)
    if {"on", "off"} <= allowed:
        allowed |= set(_BOOLEAN_WORDS)  # llama.cpp reads its on/off values this way
    if all(word in allowed for word in words):
        return None
    listed = "a comma-separated list of" if entry.takes_list else "one of"
    return f"{text}: not a value {where} accepts ({listed}: {', '.join(accepted)})"


def _unknown(name: str, known: list[str], program: str, what: str) -> str:
    close = difflib.get_close_matches(name.replace("_", "-") if what == "flag" else name, known)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{name} is not a{'n' if what[0] in 'aeiou' else ''} {what} of {program}{hint}"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)
