"""YAML loading that remembers where each key was written.

Error messages must name the file, the key and the line, so the loader keeps the line of every
mapping key (as a dotted path such as ``parameters.max_num_seqs.low``) beside the data.

It also keeps the words that YAML 1.1 turns into booleans (``on``, ``off``, ``yes``, ``no``,
unquoted): ``choices: [auto, off]`` reads as ``["auto", False]``, and a ``False`` flag value is
dropped from the command line without a word. Callers where a string was meant ask
:meth:`YamlDoc.refuse_yaml11_bool`, which names the key and says how to quote it.

YAML 1.1's other numbers have no such double use and are refused wherever they are written,
naming the key and saying how to quote them: octal (``0755`` read as 493, ``010`` as 8: an
``env`` value became "493") and base 60 (``1:2`` read as 62). So is a scalar PyYAML cannot
construct (a date such as ``2001-13-01``, ``!!int abc``, an integer of more digits than Python
converts to text), which raised a ValueError traceback.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune._files import MAX_YAML_BYTES, read_bounded
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
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
#: YAML 1.1's octal integer (PyYAML reads ``0755`` as 493); ``08`` is no octal, it stays text
_OCTAL = re.compile(r"[-+]?0[0-7_]+")
#: an integer in digits (decimal, ``0x``, ``0b``): one that fails to read has too many of them
_DIGITS = re.compile(r"[-+]?(?:[0-9_]+|0[xX][0-9a-fA-F_]+|0[bB][01_]+)")
#: a mapping key YAML cannot read or hash (``[a]: 1``): no duplicate check, safe_load refuses it
_UNREAD = object()
#: a lone surrogate (``"\\ud800"`` in a YAML or JSON escape): no text, no encoding can write it
SURROGATE = re.compile("[\ud800-\udfff]")
#: more key paths than this means aliases expand into a bomb (``&a [*b, *b, ...]``)
MAX_NODES = 100_000


class _TooLarge(Exception):
    pass


class _DuplicateKey(Exception):
    """A mapping that names one key twice: YAML keeps the last value without a word, so a
    second ``max_num_seqs:`` further down replaced the first one silently."""

    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _BadScalar(Exception):
    """A value with a NUL character: no command line, environment or file name can carry it
    (the launch raised ``ValueError: embedded null byte``, a traceback mid-study). Also a lone
    surrogate (``"\\ud800"``), which is no text: the launch and the export raised
    ``UnicodeEncodeError``; and a scalar read otherwise than written (:func:`_scalar_problem`)."""

    def __init__(self, key: str, line: int, why: str) -> None:
        super().__init__(key)
        self.key, self.line, self.why = key, line, why


def _bool_word(node: yaml.Node) -> bool:
    """A plain (unquoted) scalar that YAML 1.1 reads as a boolean but is not true/false."""
    return (
        isinstance(node, yaml.ScalarNode)
        and node.tag == _BOOL_TAG
        and node.style is None
        and node.value.lower() not in ("true", "false")
    )


def _key_value(node: yaml.Node) -> Any:
    """A mapping key (or a scalar) as YAML reads it. A fresh constructor each time: one kept
    would keep every node it ever read."""
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


def _hashed_key(node: yaml.Node) -> Any:
    """A mapping key as YAML reads it, or :data:`_UNREAD` for one it cannot read or hash
    (``[a]: 1``), which ``yaml.safe_load`` then refuses with its line."""
    try:
        value = _key_value(node)
        hash(value)
    except (ValueError, KeyError, TypeError, yaml.YAMLError):
        return _UNREAD
    return value


def _scalar_problem(node: yaml.ScalarNode) -> str | None:
    """Why a scalar is not read as it is written (YAML 1.1's octal and base 60), or cannot be
    read at all; None for the rest. Strings are what they are written as."""
    tag, value = node.tag, node.value
    if tag in (_STR_TAG, _MERGE_TAG):  # ``<<`` is no value: the mapping merges what it names
        return None
    shown = value if len(value) <= 40 else value[:40] + "..."
    if tag == _INT_TAG and _OCTAL.fullmatch(value):
        return (
            f"the YAML number {value} is read as the octal {_key_value(node)} (YAML 1.1); quote "
            f"it as '{value}' for text, or write it without the leading 0 for a decimal number"
        )
    if tag in (_INT_TAG, _FLOAT_TAG) and ":" in value:
        return (
            f"the YAML number {value} is read in base 60 as {_key_value(node)} (YAML 1.1); "
            f"quote it as '{value}' for text"
        )
    try:
        read = _key_value(node)
        if isinstance(read, int):
            str(read)  # Python writes (and reads) at most sys.get_int_max_str_digits() digits
    except Exception as exc:  # noqa: BLE001 - what PyYAML raises on it, safe_load raises too
        if tag == _INT_TAG and _DIGITS.fullmatch(value):
            return (
                f"the integer {shown} has more digits than can be read or written (at most "
                f"{sys.get_int_max_str_digits():,} decimal digits)"
            )
        kind = tag.rsplit(":", 1)[-1]
        problem = getattr(exc, "problem", None) or str(exc)
        if isinstance(exc, KeyError):  # ``!!bool maybe``: no word of the tag's
            problem = f"not a {kind}"
        return f"the YAML value {shown} cannot be read as {kind}: {problem}"
    return None


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
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            if isinstance(key_node, yaml.ScalarNode) and (why := _scalar_problem(key_node)):
                raise _BadScalar(prefix or "(the document)", key_node.start_mark.line + 1, why)
            if key_node.tag != _MERGE_TAG:  # ``<<: *base`` merges; the mapping's own keys win
                # the key as YAML reads it: ``1`` and ``0x1``, or ``on`` and ``yes``, are one key
                value = _hashed_key(key_node)
                if value is not _UNREAD and value in seen:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1, seen[value])
                if value is not _UNREAD:
                    seen[value] = key_node.start_mark.line + 1
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
    elif isinstance(node, yaml.ScalarNode) and (why := _scalar_problem(node)):
        raise _BadScalar(prefix or "(the document)", node.start_mark.line + 1, why)
    elif _bool_word(node):
        bool_words[prefix] = node.value
    elif isinstance(node, yaml.ScalarNode) and "\0" in node.value:
        why = "contains a NUL character, which no command line or environment can carry"
        raise _BadScalar(prefix or "(the document)", node.start_mark.line + 1, why)
    elif isinstance(node, yaml.ScalarNode) and SURROGATE.search(node.value):
        why = "contains a lone surrogate (an escape such as \\ud800), which is not text"
        raise _BadScalar(prefix or "(the document)", node.start_mark.line + 1, why)


def load_yaml(path: str | Path, *, what: str) -> YamlDoc:
    """Read ``path`` as YAML; any problem becomes one SpecError naming the file."""
    path = Path(path)
    raw = read_bounded(path, what=what, limit=MAX_YAML_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"not UTF-8 text: byte 0x{raw[exc.start]:02x} cannot be read (save the file as UTF-8)",
            file=str(path),
            line=raw[: exc.start].count(b"\n") + 1,
        ) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise _malformed(exc, path) from None
    except RecursionError:
        # PyYAML composes nested collections recursively: ``[[[[...]]]]`` a few hundred deep
        raise SpecError("the YAML is nested too deeply to read", file=str(path)) from None
    lines: dict[str, int] = {}
    bool_words: dict[str, str] = {}
    bool_keys: dict[str, dict[bool, str]] = {}
    if node is not None:  # before constructing: a scalar that cannot be read is named here
        try:
            _collect_lines(node, "", lines, bool_words, bool_keys)
        except (_TooLarge, RecursionError):
            raise SpecError(
                f"the YAML expands to more than {MAX_NODES} keys and items (aliases?)",
                file=str(path),
            ) from None
        except _DuplicateKey as dup:
            raise SpecError(
                f"duplicate key (also on line {dup.first}); YAML would keep only the last one",
                file=str(path),
                line=dup.line,
                key=dup.key,
            ) from None
        except _BadScalar as bad:
            raise SpecError(bad.why, file=str(path), line=bad.line, key=bad.key) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _malformed(exc, path) from None
    except (ValueError, KeyError, TypeError) as exc:  # a scalar inside a key such as [2001-13-01]
        raise SpecError(f"malformed YAML: {exc}", file=str(path)) from None
    if not isinstance(data, dict):
        raise SpecError(f"{what} must be a YAML mapping", file=str(path), line=1)
    return YamlDoc(path=path, data=data, lines=lines, bool_words=bool_words, bool_keys=bool_keys)


def _malformed(exc: yaml.YAMLError, path: Path) -> SpecError:
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = getattr(exc, "problem", None) or str(exc)
    if problem == "but found another document":  # PyYAML's words for a second ``---``
        problem = "a second document begins here; one file holds one document"
    return SpecError(f"malformed YAML: {problem}", file=str(path), line=line)


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


def check_text(doc: YamlDoc, key: str, value: Any) -> None:
    """A free-text field (``description``, ``help``): a string, or absent."""
    if value is not None and not isinstance(value, str):
        raise doc.error(key, f"must be text, got {value!r}")


#: bounds on counts (requests, tokens, concurrency, rounds) and on durations: ``num_requests:
#: 1e30`` built a list of that many requests (all memory), and a timeout over ~292 years
#: overflowed every socket and lock wait (OverflowError mid-trial)
MAX_COUNT = 1_000_000
MAX_SECONDS = 7 * 24 * 3600


def finite(value: float) -> bool:
    """Whether a number is finite, as a float: an integer over 1.8e308 is not (``math.isfinite``
    raised OverflowError on it, a traceback)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def number(
    doc: YamlDoc, key: str, value: Any, *, positive: bool = False, integer: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise doc.error(key, f"must be a number, got {value!r}")
    if not finite(value):  # NaN passes every comparison below
        raise doc.error(key, f"must be a finite number, got {value!r}")
    if integer and not float(value).is_integer():
        raise doc.error(key, f"must be an integer, got {value!r}")
    if positive and value <= 0:
        raise doc.error(key, f"must be > 0, got {value!r}")
    if value < 0:
        raise doc.error(key, f"must be >= 0, got {value!r}")
    return value


def count(doc: YamlDoc, key: str, value: Any, *, positive: bool = True) -> int:
    whole = int(number(doc, key, value, positive=positive, integer=True))
    if whole > MAX_COUNT:
        raise doc.error(key, f"at most {MAX_COUNT:,}, got {value!r}")
    return whole


def seconds(doc: YamlDoc, key: str, value: Any) -> float:
    duration = number(doc, key, value, positive=True)
    if duration > MAX_SECONDS:
        raise doc.error(key, f"at most {MAX_SECONDS:,} seconds (a week), got {value!r}")
    return duration
