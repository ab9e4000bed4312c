"""YAML loading that remembers where each key was written.

Error messages must name the file, the key and the line, so the loader keeps the line of every
mapping key (as a dotted path such as ``parameters.max_num_seqs.low``) beside the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune.errors import SpecError


@dataclass(frozen=True)
class YamlDoc:
    """A parsed YAML file with the 1-based line of each key path."""

    path: Path
    data: Any
    lines: dict[str, int] = field(default_factory=dict)

    def line(self, key: str) -> int | None:
        """The line of ``key``, or of its closest written parent."""
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key.rpartition(".")[0]
        return None

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(message, file=str(self.path), key=key or None, line=self.line(key))


def _collect_lines(node: yaml.Node, prefix: str, lines: dict[str, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            lines[key] = key_node.start_mark.line + 1
            _collect_lines(value_node, key, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            key = f"{prefix}[{index}]"
            lines[key] = item.start_mark.line + 1
            _collect_lines(item, key, lines)


def load_yaml(path: str | Path, *, what: str) -> YamlDoc:
    """Read ``path`` as YAML; any problem becomes one SpecError naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{what} file not found", file=str(path)) from None
    except OSError as exc:
        raise SpecError(f"cannot read {what} file: {exc.strerror}", file=str(path)) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"malformed YAML: {problem}", file=str(path), line=line) from None
    lines: dict[str, int] = {}
    if node is not None:
        _collect_lines(node, "", lines)
    if not isinstance(data, dict):
        raise SpecError(f"{what} must be a YAML mapping", file=str(path), line=1)
    return YamlDoc(path=path, data=data, lines=lines)


def check_keys(
    doc: YamlDoc, mapping: Any, prefix: str, allowed: set[str], required: set[str] = frozenset()
) -> dict:
    """Reject unknown keys and missing required ones, naming the first offender."""
    if not isinstance(mapping, dict):
        raise doc.error(prefix, "must be a mapping")
    for key in mapping:
        if key not in allowed:
            hint = ", ".join(sorted(allowed))
            raise doc.error(
                f"{prefix}.{key}" if prefix else str(key), f"unknown key (allowed: {hint})"
            )
    for key in sorted(required):
        if key not in mapping:
            raise doc.error(prefix, f"missing required key {key!r}")
    return mapping
