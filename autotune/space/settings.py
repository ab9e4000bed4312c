"""What a trial asks of a server, before any engine spells it: ``ServerSettings``.

Engine-neutral on purpose: the search space resolves parameter values into these settings
(``space/model.py``) and every engine turns them into its own argv, env and config file
(``engines/``), so neither side has to import the other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ServerSettings:
    """What a trial asks of the server, resolved from parameter values, still engine-neutral.

    ``flags`` maps a flag to its value (``True`` for a bare flag), ``json_flags`` maps a flag
    that takes a JSON object to that object, ``env`` holds variables, ``patches`` patch choices.
    """

    flags: Mapping[str, Any] = field(default_factory=dict)
    json_flags: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    patches: Mapping[str, Any] = field(default_factory=dict)

    def flag_argv(self) -> list[str]:
        """Flags as an argv fragment, in a stable order. Values are never shell-quoted."""
        argv: list[str] = []
        for flag, value in self.flags.items():
            if value is True:
                argv.append(flag)
            elif value is None or value is False:
                continue
            elif isinstance(value, list | tuple):
                argv += [flag, *(str(v) for v in value)]  # argparse nargs="+" style
            else:
                argv += [flag, str(value)]
        for flag, obj in self.json_flags.items():
            argv += [flag, json.dumps(obj, sort_keys=True, separators=(",", ":"))]
        return argv


def merge_json_key(target: dict[str, Any], dotted_key: str, value: Any) -> None:
    """Set ``a.b.c`` inside a nested dict, creating levels as needed."""
    *parents, last = dotted_key.split(".")
    node = target
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
