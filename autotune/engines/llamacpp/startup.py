"""A llama-server's startup broken into its parts, from the timestamps of its own log.

llama-server states no durations while it starts, but with ``--log-prefix`` (autotune's launch
sets it) every logged line begins with the time since the logger started, ``M.SS.mmm.uuu``
(``0.05.825.901`` is 5.826 s, ``5.09.925.994`` five minutes and 9.926 s), and its start passes
milestones it always logs at its default verbosity (verbatim from real logs in
``tests/test_startup_parts.py``):

* ``srv  llama_server: loading model`` and ``srv    load_model: loading model '<gguf>'`` (the
  weights are read from here; ``common_init_result: fitting params to device memory ...``
  follows within a millisecond);
* ``llama_context: ...`` or ``llama_init_from_model: ...``, when one is logged (a warning about
  the context size, an allocation failure): the context and its KV cache are being made;
* ``common_init_from_params: warming up the model with an empty run`` (absent with
  ``--no-warmup``);
* ``srv    load_model: initializing slots, n_slots = 4``;
* ``srv  llama_server: server is listening on http://...`` (older builds: ``main: server is
  listening``).

The parts are the spans between them: ``weights`` (load start to the context line) and
``kv_cache`` (context line to the warm-up) when a context line was logged, else ``model_load``
(the two together: llama.cpp did not say where one ended); ``warmup`` (warm-up to the slots) and
``slots`` (slots to listening: slots, prompt cache, a speculative draft's context). A span whose
ends were not both logged is absent, never 0.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_STAMP = re.compile(r"^(?P<m>\d+)\.(?P<s>\d\d)\.(?P<ms>\d{3})\.(?P<us>\d{3}) [IWED] (?P<text>.*)$")
#: the load's start: ``llama_server: loading model``, ``load_model: loading model '<gguf>'`` or
#: (logged within a millisecond of them) ``common_init_result: fitting params to device memory``
_LOAD = re.compile(r"(?:\w+: loading model\b|common_init_result: fitting params)")
_CONTEXT = re.compile(r"^(?:llama_context|llama_init_from_model|llama_kv_cache\w*):")
_WARMUP = re.compile(r"warming up the model")
_SLOTS = re.compile(r"load_model: initializing slots")
_LISTENING = re.compile(r"server is listening on")


def _stamped(log_lines: Sequence[str]) -> list[tuple[float, str]]:
    out = []
    for line in log_lines:
        match = _STAMP.match(line.strip())
        if match:
            seconds = (
                int(match["m"]) * 60
                + int(match["s"])
                + int(match["ms"]) / 1e3
                + int(match["us"]) / 1e6
            )
            out.append((seconds, match["text"].strip()))
    return out


def _first(
    lines: list[tuple[float, str]], pattern: re.Pattern[str], after: float | None
) -> float | None:
    if after is None:
        return None
    return next((t for t, text in lines if t >= after and pattern.search(text)), None)


def startup_parts(log_lines: Sequence[str]) -> dict[str, float]:
    """``weights`` and ``kv_cache`` (or ``model_load``), ``warmup`` and ``slots`` seconds, each
    only when both its milestones were logged (see the module docstring)."""
    lines = _stamped(log_lines)
    load = _first(lines, _LOAD, 0.0)
    warmup = _first(lines, _WARMUP, load)
    slots = _first(lines, _SLOTS, load)
    listening = _first(lines, _LISTENING, slots)
    loaded = warmup if warmup is not None else slots  # where the model and context are made
    context = _first(lines, _CONTEXT, load)
    if context is not None and loaded is not None and context > loaded:
        context = None  # a draft model's context, after the main model's warm-up
    spans: dict[str, tuple[float | None, float | None]] = {
        "warmup": (warmup, slots),
        "slots": (slots, listening),
    }
    if context is not None:
        spans = {"weights": (load, context), "kv_cache": (context, loaded), **spans}
    else:
        spans = {"model_load": (load, loaded), **spans}
    return {
        name: round(end - start, 3)
        for name, (start, end) in spans.items()
        if start is not None and end is not None and end >= start
    }
