"""How vLLM's failures look in its log: the reason and the root-cause line.

Learned from real logs of the vLLM 0.32 CPU server (``tests/fixtures/vllm_logs``, with the
commands that produced them). Facts this module relies on:

* Lines of vLLM's logger carry a prefix, ``(EngineCore pid=123) ERROR 12-01 03:00:16
  [core.py:1510] ``, also on every line of a logged traceback; it is stripped first.
* A failure travels up three processes, each adding a traceback that only points back:
  the worker raises the real error (``ValueError: Available memory on node 0 ...``), the engine
  core re-raises ``RuntimeError: Worker failed with error '<message>', please check the stack
  trace above for the root cause`` (or ``Exception: WorkerProc initialization failed ... See
  stack trace for root cause.``), and the API server ends with ``RuntimeError: Engine core
  initialization failed. See root cause above.`` or ``EngineDeadError: EngineCore encountered
  an issue. See stack trace (above) for the root cause.``. The root cause is the worker's own
  exception; when the log no longer holds it, the message quoted by ``Worker failed with
  error '...'``.
* Config validation fails as a pydantic ``ValidationError`` whose useful text is the indented
  ``Value error, <message> [type=value_error, ...]`` line below it.
* A killed engine core leaves no exception of its own: the API server logs ``MPClient: engine
  core exited unexpectedly`` (or ``... died unexpectedly``) and exits with code 0.
* On CPU, asking for more memory than the machine has fails by vLLM's own checks (``... is less
  than desired CPU memory utilization``, ``... is less than requested memory for kv``): that
  is an out-of-memory verdict with positive evidence, not a guess.
"""

from __future__ import annotations

import re

from autotune.engines.base import (
    LogError,
    classify_common,
    clip,
    error_lines,
    error_message_with,
    pick_root_cause,
)
from autotune.patching import FAILED_MARKER

#: ``(APIServer pid=8331) INFO 12-01 03:03:34 [core_client.py:817] `` and the like
_PREFIX = re.compile(
    r"^\([\w.-]+ pid=\d+\) "
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ?)?"
)
_WORKER_FAILED = re.compile(
    r"Worker failed with error '(?P<inner>.*)', please check the stack trace above"
)
_VALUE_ERROR = re.compile(r"^\s*Value error, (?P<message>.*?)(?: \[type=\w+[,\]].*)?$")
#: a process of the engine died without an exception of its own (SIGKILL, the OOM killer)
_DIED = re.compile(r"(?:engine core exited unexpectedly|died unexpectedly).*", re.IGNORECASE)

#: vLLM's own "not enough memory" messages (the CPU backend's checks, the KV cache sizing)
OOM_MARKERS = (
    "less than desired cpu memory utilization",
    "less than requested memory for kv",
    "no available memory for the cache blocks",
    "larger than the available kv cache memory",
)


def strip_prefixes(log_text: str) -> list[str]:
    """The log's lines without vLLM's per-line logger prefix."""
    return [_PREFIX.sub("", line, count=1) for line in log_text.splitlines()]


def classify(log_tail: str) -> str | None:
    """vLLM's reason for a failure: its memory checks are OOM, then the shared markers."""
    lowered = log_tail.lower()
    if FAILED_MARKER.lower() not in lowered and error_message_with(log_tail, OOM_MARKERS):
        return "oom"
    return classify_common(log_tail)


def root_cause(log_text: str) -> str | None:
    """The line that explains why a vLLM server failed (see the module docstring)."""
    lines = strip_prefixes(log_text)
    errors = error_lines(lines)
    if any(e.kind == "patch" for e in errors):
        return pick_root_cause(errors)
    quoted: str | None = None  # the message a "Worker failed with error '...'" quotes
    for error in reversed([e for e in errors if e.kind in ("exception", "parser")]):
        wrapped = _WORKER_FAILED.search(error.message)
        if wrapped:
            quoted = quoted or wrapped.group("inner")
            continue
        if error.is_pointer:
            continue
        if quoted is not None and not error.message.startswith(quoted[:60]):
            continue  # older than the failure the engine core reported
        return _with_value_error(error, lines)
    if quoted is not None:
        return clip(f"RuntimeError: Worker failed with error '{quoted}'")
    died = [line.strip() for line in lines if _DIED.search(line)]
    if died:
        return clip(died[-1])
    return pick_root_cause([e for e in errors if e.kind == "bare"])


def _with_value_error(error: LogError, lines: list[str]) -> str:
    """A pydantic ValidationError's own line says only how many errors; add the first one."""
    if not error.type.endswith("ValidationError"):
        return clip(error.text)
    for line in lines[error.index + 1 : error.index + 8]:
        match = _VALUE_ERROR.match(line)
        if match:
            return clip(f"{error.type.rsplit('.', 1)[-1]}: Value error, {match.group('message')}")
    return clip(error.text)
