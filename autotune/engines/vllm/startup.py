"""A vLLM server's startup broken into its parts, from the lines its own log writes.

vLLM states each expensive step of its start once it is over (the lines in
``tests/test_startup_parts.py`` are verbatim from real logs: the CPU server's in
``tests/fixtures/vllm_logs``, GPU servers' from published logs):

* ``Loading weights took 0.00 seconds`` (the weights read into the model; older and newer
  releases also say ``Model loading took 14.46 GiB memory and 20.3s``, model construction
  included, used only when the first line is missing): part ``weights``;
* ``torch.compile takes 12.34 s in total`` (Dynamo and Inductor, or the compile cache read
  back; newer releases put it in the init line as ``(compilation: 42.18 s)``): ``compile``;
* ``Graph capturing finished in 8 secs, took 0.31 GiB``: ``graph_capture``;
* ``init engine (profile, create kv cache, warmup model) took 216.57 seconds``: the engine's
  initialisation after the weights. torch.compile runs inside it (in the memory profiling's
  first forward pass) and so does graph capture (in the warm-up), so what is left after both
  is the memory profiling, the KV cache's allocation and the warm-up: part ``kv_cache``.

With several workers (tensor parallel) each writes its own line; the slowest one is the one
the start waited for, so the largest value of a part is kept. A part whose line is missing (an
eager start compiles nothing, captures nothing) is absent, never 0.

Whether the start found its graphs in the compile cache (:func:`compile_cache`) is said by
vLLM's compilation code. With AOT compilation (vLLM 0.32's CPU server, verbatim in
``tests/test_startup_parts.py``): ``[backbone] saved AOT compiled function to PATH`` after a
compile, ``Directly load AOT compilation from path PATH`` on a hit, and ``Compiling model again
due to a load failure from PATH, reason: ...`` when an entry was there and could not be read
(seen on every warm start of vLLM 0.32 CPU with torch 2.13: ``'function' object has no
attribute 'finalize_loading'``). Per compiled range: ``Directly load the compiled graph(s) for
compile range (1, 2048) from the cache, took 0.51 s`` (older releases: ``for dynamic shape``)
on a hit, ``Compiling a graph for compile range (1, 2048) takes 10.23 s`` on a miss.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SECONDS = r"(?P<s>\d+(?:\.\d+)?) ?s(?:ecs?|econds?)?\b"
_WEIGHTS = re.compile(r"Loading weights took " + _SECONDS)
_MODEL_LOADING = re.compile(r"Model loading took .*? and " + _SECONDS)
_COMPILE = re.compile(r"torch\.compile takes " + _SECONDS + " in total")
_COMPILATION_IN_INIT = re.compile(r"\(compilation: " + _SECONDS + r"\)")
_GRAPH_CAPTURE = re.compile(r"Graph capturing finished in " + _SECONDS)
_INIT_ENGINE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took " + _SECONDS
)
#: newer releases shorten the init line: ``init engine took 70.62 s (compilation: 42.18 s)``
_INIT_ENGINE_SHORT = re.compile(r"init engine took " + _SECONDS)
_CACHE_HIT = re.compile(
    r"Directly load the compiled graph\(s\) for .* from the cache|Directly load AOT compilation"
)
_CACHE_MISS = re.compile(r"Compiling a graph for .* takes |saved AOT compiled function to ")
_CACHE_LOAD_FAILED = re.compile(
    r"Compiling model again due to a load failure from .*reason: (?P<r>.*)"
)

#: what :func:`compile_cache` says of a start
WARM, COLD, PARTLY_WARM, LOAD_FAILED = "warm", "cold", "partly warm", "load failed"


def _largest(pattern: re.Pattern[str], lines: Sequence[str]) -> float | None:
    found = [float(m.group("s")) for line in lines for m in [pattern.search(line)] if m]
    return max(found) if found else None


def startup_parts(log_lines: Sequence[str]) -> dict[str, float]:
    """``weights``, ``compile``, ``graph_capture`` and ``kv_cache`` seconds, each only when the
    log states it (see the module docstring)."""
    weights = _largest(_WEIGHTS, log_lines)
    if weights is None:
        weights = _largest(_MODEL_LOADING, log_lines)
    compiled = _largest(_COMPILE, log_lines)
    if compiled is None:
        compiled = _largest(_COMPILATION_IN_INIT, log_lines)
    captured = _largest(_GRAPH_CAPTURE, log_lines)
    init = _largest(_INIT_ENGINE, log_lines)
    if init is None:
        init = _largest(_INIT_ENGINE_SHORT, log_lines)
    parts: dict[str, float] = {}
    for name, value in (("weights", weights), ("compile", compiled), ("graph_capture", captured)):
        if value is not None:
            parts[name] = round(value, 3)
    if init is not None:
        # both happen inside the engine's initialisation: what is left is profiling, the KV
        # cache and the warm-up (never below 0 when the lines' roundings disagree)
        parts["kv_cache"] = round(max(0.0, init - (compiled or 0.0) - (captured or 0.0)), 3)
    return parts


def compile_cache(log_lines: Sequence[str]) -> str | None:
    """``warm`` when every graph the start needed was read back from the compile cache,
    ``cold`` when it compiled them with no cache entry to read, ``partly warm`` when some were
    read and some compiled, ``load failed`` when an entry was there and vLLM could not read it
    and compiled again (the cache is broken for this vLLM and torch: it may still save the
    start other work, which is why it is not called cold); None when the log says none of
    these (an eager start compiles nothing; a log cut short says nothing), never a guess."""
    hit = any(_CACHE_HIT.search(line) for line in log_lines)
    failed = any(_CACHE_LOAD_FAILED.search(line) for line in log_lines)
    miss = failed or any(_CACHE_MISS.search(line) for line in log_lines)
    if hit:
        return PARTLY_WARM if miss else WARM
    if failed:
        return LOAD_FAILED
    return COLD if miss else None


def compile_cache_failure(log_lines: Sequence[str]) -> str | None:
    """vLLM's reason for not reading a compile-cache entry back (the first one), or None."""
    for line in log_lines:
        found = _CACHE_LOAD_FAILED.search(line)
        if found:
            return found.group("r").strip()
    return None
