"""YAML loading that remembers where each key was written.

Error messages must name the file, the key and the line, so the loader keeps the line of every
mapping key (as a dotted path such as ``parameters.max_num_seqs.low``) beside the data.

It also keeps the words that YAML 1.1 turns into booleans (``on``, ``off``, ``yes``, ``no``,
unquoted): ``choices: [auto, off]`` reads as ``["auto", False]``, and a ``False`` flag value is
dropped from the command line without a word. Callers where a string was meant ask
:meth:`YamlDoc.refuse_yaml11_bool`, which names the key and says how to quote it.
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
    #: key path -> the plain word (``off``, ``Yes``...) that YAML 1.1 read as a boolean
    bool_words: dict[str, str] = field(default_factory=dict)
    #: the same for mapping KEYS: parent path -> {the boolean read: the word written}
    bool_keys: dict[str, dict[bool, str]] = field(default_factory=dict)

    def line(self, key: str) -> int | None:
        """The line of ``key``, or of its closest written parent."""
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key.rpartition(".")[0]
        return None

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(message, file=str(self.path), key=key or None, line=self.line(key))

    def refuse_yaml11_bool(self, key: str, value: Any) -> None:
        """Refuse ``value`` at ``key`` if it is a boolean that was written as on/off/yes/no."""
        word = self.bool_words.get(key)
        if word is None or not isinstance(value, bool):
            return
        read = "true" if value else "false"
        raise self.error(
            key,
            f"the YAML value {word} was read as {read}; quote it as '{word}' "
            f"(or write {read} for a boolean)",
        )

    def name(self, prefix: str, key: Any, what: str) -> str:
        """A mapping key that names something (a parameter), as the string written: a key
        YAML 1.1 read as a boolean (``on:``, ``no:``) is refused, naming the word and how to
        quote it; any other non-string key (``123:``, ``null:``) is refused too."""
        if isinstance(key, str):
            return key
        where = f"{prefix}.{key}" if prefix else str(key)
        word = self.bool_keys.get(prefix, {}).get(key) if isinstance(key, bool) else None
        if word is not None:
            raise self.error(
                f"{prefix}.{word}" if prefix else word,
                f"the YAML key {word} was read as {str(key).lower()}; quote it as '{word}' "
                f"to use it as a {what}",
            )
        raise self.error(where, f"a {what} must be a string, got {key!r}")


_BOOL_TAG = "tag:yaml.org,2002:bool"
#: more key paths than this means aliases expand into a bomb (``&a [*b, *b, ...]``)
MAX_NODES = 100_000


class _TooLarge(Exception):
    pass


class _NulCharacter(Exception):
    """A value with a NUL character: no command line, environment or file name can carry it
    (the launch raised ``ValueError: embedded null byte``, a traceback mid-study)."""

    def __init__(self, key: str, line: int) -> None:
        super().__init__(key)
        self.key, self.line = key, line


def _bool_word(node: yaml.Node) -> bool:
    """A plain (unquoted) scalar that YAML 1.1 reads as a boolean but is not true/false."""
    return (
        isinstance(node, yaml.ScalarNode)
        and node.tag == _BOOL_TAG
        and node.style is None
        and node.value.lower() not in ("true", "false")
    )


def _collect_lines(
    node: yaml.Node,
    prefix: str,
    lines: dict[str, int],
    bool_words: dict[str, str],
    bool_keys: dict[str, dict[bool, str]],
) -> None:
    if len(lines) > MAX_NODES:
        raise _TooLarge
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            lines[key] = key_node.start_mark.line + 1
            if _bool_word(key_node):
                read = key_node.value.lower() in ("yes", "on")  # PyYAML's true words
                bool_keys.setdefault(prefix, {})[read] = key_node.value
            _collect_lines(value_node, key, lines, bool_words, bool_keys)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            key = f"{prefix}[{index}]"
            lines[key] = item.start_mark.line + 1
            _collect_lines(item, key, lines, bool_words, bool_keys)
    elif _bool_word(node):
        bool_words[prefix] = node.value
    elif isinstance(node, yaml.ScalarNode) and "\0" in node.value:
        raise _NulCharacter(prefix or "(the document)", node.start_mark.line + 1)


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
    bool_words: dict[str, str] = {}
    bool_keys: dict[str, dict[bool, str]] = {}
    if node is not None:
        try:
            _collect_lines(node, "", lines, bool_words, bool_keys)
        except (_TooLarge, RecursionError):
            raise SpecError(
                f"the YAML expands to more than {MAX_NODES} keys and items (aliases?)",
                file=str(path),
            ) from None
        except _NulCharacter as nul:
            raise SpecError(
                "contains a NUL character, which no command line or environment can carry",
                file=str(path),
                line=nul.line,
                key=nul.key,
            ) from None
    if not isinstance(data, dict):
        raise SpecError(f"{what} must be a YAML mapping", file=str(path), line=1)
    return YamlDoc(path=path, data=data, lines=lines, bool_words=bool_words, bool_keys=bool_keys)


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
