"""A response cache, caught by a prompt it has never seen.

The workload repeats its prompts by design: the correctness gate can only judge an answer to a
prompt whose reference it holds. A server (or a proxy in front of it) that stores answers and
replays them for a repeated prompt therefore answers the benchmark from memory: its answers are
right, token for token, and arrive as fast as it cares to send them (an audit's server measured
7648 tok/s against the engine's 362). Nothing in the answers themselves shows it.

So each round of the benchmark also sends one **control**: the round's prompt (rotating through
the workload) behind a fresh nonce line, at the same length, alone (as the single-request
phase). No cache keyed by the prompt or by its prefix can hold its answer, while what a real
engine does to repeated text is mostly kept: the same content follows (the answer, and
speculation drawn from the prompt, stay much the same), and the prefix cache only ever saves
a prefill, which the comparison leaves out. The control's answer is timed, never judged (no
reference holds it).

:func:`replay_check` compares the time per output token after the first (TPOT) of the
single-request answers with that of the controls: without speculation a real engine decodes a
prompt it saw before no faster than a fresh one, so repeated answers :data:`REPLAY_RATIO` times
faster than the controls were not decoded. The trial is then refused (``replayed_answers``),
its figures never scored, unless the launch decodes speculatively (the engine reads it from
the argv, ``Engine.speculates``): speculation drawn from earlier answers (llama.cpp's n-gram
cache, vLLM's suffix decoding) does make repeated prompts faster than fresh ones, so there the
ratio is said (a trap, in ``show``), not refused. An answer that came in one chunk has no TPOT;
its end-to-end time per token stands in (for a repeated answer an upper bound of its decode
time, so that fallback can only make the check more lenient). A cache that matches prompts by
meaning rather than by text is not caught.
"""

from __future__ import annotations

import secrets
import statistics
from collections.abc import Sequence
from typing import Any

#: repeated prompts decoding this many times faster than a fresh prompt were not decoded; far
#: above what a real engine without speculation shows (noise on a busy machine moves one
#: request's TPOT by well under 2x)
REPLAY_RATIO = 4.0
#: a control answer with fewer tokens has no TPOT worth comparing
MIN_CONTROL_TOKENS = 8


def control_prompt(prompt: str) -> str:
    """``prompt`` behind a nonce line no earlier request carried (never the same twice)."""
    return f"Request {secrets.token_hex(6)}.\n{prompt}"


def _ms_per_token(record: Any) -> float | None:
    """TPOT in ms, or end-to-end time per token when the answer has no TPOT (one chunk)."""
    if not record.ok or not record.tokens:
        return None
    tpot = record.tpot_s
    if tpot is None:
        return record.e2e_s / record.tokens * 1000 if record.e2e_s else None
    return tpot * 1000


def _median_ttft_ms(records: Sequence[Any]) -> float | None:
    ttfts = [r.ttft_s * 1000 for r in records if r.ok and r.ttft_s is not None]
    return round(statistics.median(ttfts), 3) if ttfts else None


def _controls(n: int) -> str:
    return f"{n} control" if n == 1 else f"{n} controls"


def replay_check(
    repeated: Sequence[Any], controls: Sequence[Any], *, speculates: bool = False
) -> dict[str, Any]:
    """The ``replay_check`` record of one benchmark (``RequestRecord``s of the single-request
    phases and of the controls): ``checked`` (False, with the reason, when no control or no
    repeated answer could be timed), ``flagged`` (at least :data:`REPLAY_RATIO`), ``refused``
    and the figures it rests on.

    ``speculates``: the launch decodes speculatively. Speculation drawn from earlier answers
    (llama.cpp's n-gram cache, vLLM's suffix decoding) really does make a repeated prompt
    decode faster than a fresh one, so there a flagged ratio is said (the speed holds for
    repeated prompts only) but not refused: the answers were decoded, and right."""
    timed_controls = [
        t
        for r in controls
        if r.tokens >= MIN_CONTROL_TOKENS
        for t in [_ms_per_token(r)]
        if t is not None
    ]
    timed_repeated = [t for r in repeated for t in [_ms_per_token(r)] if t is not None]
    record: dict[str, Any] = {
        "controls": len(timed_controls),
        "repeated": len(timed_repeated),
        "ratio_limit": REPLAY_RATIO,
    }
    if not timed_controls or not timed_repeated:
        missing = "fresh-prompt control" if not timed_controls else "single-request answer"
        record.update(
            checked=False,
            flagged=False,
            refused=False,
            reason=f"replay check not run: no {missing} could be timed "
            f"(a control needs {MIN_CONTROL_TOKENS} tokens or more)",
        )
        return record
    control_ms = statistics.median(timed_controls)
    repeated_ms = statistics.median(timed_repeated)
    ratio = control_ms / repeated_ms if repeated_ms > 0 else float("inf")
    flagged = ratio >= REPLAY_RATIO
    record.update(
        checked=True,
        flagged=flagged,
        refused=flagged and not speculates,
        speculative=speculates,
        control_ms_per_token=round(control_ms, 4),
        repeated_ms_per_token=round(repeated_ms, 4),
        ratio=round(ratio, 2) if ratio != float("inf") else None,
        # beside it, what a fresh prompt waits for its first token (no prefix cache helps it):
        # a note for the reader, never a verdict (a prefix cache legitimately shortens TTFT)
        control_ttft_ms=_median_ttft_ms(controls),
        repeated_ttft_ms=_median_ttft_ms(repeated),
    )
    how = "inf" if ratio == float("inf") else f"{ratio:.1f}"
    if flagged and speculates:
        record["reason"] = (
            f"answers to repeated prompts came {how}x faster per token ({repeated_ms:.3g} ms) "
            f"than to a fresh prompt ({control_ms:.3g} ms, {_controls(len(timed_controls))}) "
            "with speculative decoding on: speculation drawn from earlier answers speeds "
            "repeated prompts, so this speed holds for repeated prompts only"
        )
    elif flagged:
        record["reason"] = (
            f"answers to repeated prompts came {how}x faster per token ({repeated_ms:.3g} ms) "
            f"than to a fresh prompt ({control_ms:.3g} ms, {_controls(len(timed_controls))}): "
            "replayed from a cache, not decoded; its speed is not the engine's"
        )
    else:
        record["reason"] = (
            f"repeated prompts {how}x a fresh prompt's speed per token "
            f"({_controls(len(timed_controls))})"
        )
    return record
