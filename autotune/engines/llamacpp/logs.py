"""How llama-server's failures look in its log: the reason and the root-cause line.

Learned from the real server (``tests/fixtures/llamacpp/``, each with the command that made
it). Facts this module relies on:

* Its argument parser prints one bare line to stderr and exits with code 1, before any logging:
  ``error: invalid argument: --no-mmap`` (an unknown flag), ``error while handling argument
  "--cache-type-k": Unsupported cache type: q8`` (a value its handler refused; a usage excerpt
  follows), ``error while handling environment variable "LLAMA_ARG_...": ...``, ``expected
  value for argument``. These are ``invalid_config``: the engine rejected its arguments.
* Everything else goes through llama.cpp's logger. autotune launches it with ``--log-prefix``,
  so every logged line carries its level: ``I `` (info), ``W `` (warning), ``E `` (error),
  ``D `` (debug), after a ``M.ss.mmm.uuu`` timestamp. Only an ``E`` line is the engine's error;
  a failure is reported as a chain of them, the most specific first (``E gguf_init_from_file:
  failed to open GGUF file '...' (No such file or directory)``, then ``E llama_model_load: error
  loading model: ...``, ..., ``E srv  llama_server: exiting due to model loading error``).
* Running out of memory is named only by an ``E`` line (``E ggml_aligned_malloc: insufficient
  memory (attempted to allocate 87890.62 MB)``, ``failed to allocate ... buffer``) or by C++'s
  bare ``terminate called after throwing an instance of 'std::bad_alloc'``; an info or warning
  line that mentions memory is never evidence.
"""

from __future__ import annotations

import re

from autotune.engines.base import clip, find_root_cause

#: the argument parser's own error lines (bare, printed before the logger starts)
_ARGUMENT_ERROR = re.compile(
    r"^(?:error: invalid argument: .+"
    r"|error while handling argument \".+\": .+"
    r"|error while handling environment variable \".+\": .+"
    r"|expected value for argument.*"
    r"|error: unknown value for --[\w-]+: .+)$"
)
#: ``--log-prefix``'s level letter, optionally after ``--log-timestamps``' ``M.s.ms.us``
_LEVEL_PREFIX = re.compile(r"^(?:\d+\.\d+\.\d+\.\d+ )?(?P<level>[IWED]) (?P<text>.*)$")
#: C++'s end for an uncaught exception: ``terminate called after throwing an instance of 'X'``
_TERMINATE = re.compile(r"^terminate called (?:after throwing an instance of .+|recursively)$")
_WHAT = re.compile(r"^\s*what\(\):\s*(?P<what>.+)$")
#: llama.cpp's and ggml's "not enough memory" wording, in an error line
OOM_MARKERS = (
    "failed to allocate",
    "out of memory",
    "cannot allocate memory",
    "bad_alloc",
    "unable to allocate",
    "insufficient memory",
)
#: a model that could not be read (missing, truncated, not a GGUF): the chain's most specific
#: lines, tried in this order
_MODEL_LOAD = (
    re.compile(r"^gguf_\w+: "),
    re.compile(r"error loading model: "),
    re.compile(r"failed to load model"),
)


def argument_error(log_text: str) -> str | None:
    """The parser's error line, when the server refused its arguments."""
    for line in log_text.splitlines():
        if _ARGUMENT_ERROR.match(line.strip()):
            return line.strip()
    return None


def error_lines(log_text: str) -> list[str]:
    """The engine's error messages, in order: every ``E`` line (prefix stripped), and C++'s
    ``terminate called ...`` joined with the ``what():`` line after it."""
    found: list[str] = []
    lines = log_text.splitlines()
    for index, raw in enumerate(lines):
        line = raw.rstrip()
        levelled = _LEVEL_PREFIX.match(line)
        if levelled is not None:
            if levelled.group("level") == "E" and levelled.group("text").strip():
                found.append(levelled.group("text").strip())
            continue
        if _TERMINATE.match(line.strip()):
            what = next(
                (m.group("what") for m in map(_WHAT.match, lines[index + 1 : index + 3]) if m),
                None,
            )
            found.append(f"{line.strip()}: {what}" if what else line.strip())
    return found


def classify(log_text: str) -> str | None:
    """llama-server's reason for a failure: its argument errors are ``invalid_config``; an out
    of memory error message is ``oom``; anything else is left to the caller's default."""
    if argument_error(log_text) is not None:
        return "invalid_config"
    if any(m in e.lower() for e in error_lines(log_text) for m in OOM_MARKERS):
        return "oom"
    return None


def root_cause(log_text: str) -> str | None:
    """The line that explains why llama-server failed: the argument parser's error; else the
    memory error; else the most specific line of a model-load failure; else its first error
    message; else whatever the engine-neutral reader finds (a signal's note, a traceback)."""
    refused = argument_error(log_text)
    if refused is not None:
        return clip(refused)
    errors = error_lines(log_text)
    for error in errors:
        if any(m in error.lower() for m in OOM_MARKERS):
            return clip(error)
    for pattern in _MODEL_LOAD:
        for error in errors:
            if pattern.search(error):
                return clip(error)
    if errors:
        return clip(errors[0])
    return find_root_cause(log_text)
