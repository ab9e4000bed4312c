"""A response cache, caught by a prompt it has never seen.

The workload repeats its prompts by design: the correctness gate can only judge an answer to a
prompt whose reference it holds. A server (or a proxy in front of it) that stores answers and
replays them for a repeated prompt therefore answers the benchmark from memory: its answers are
right, token for token, and arrive as fast as it cares to send them (an audit's server measured
7648 tok/s against the engine's 362). Nothing in the answers themselves shows it.

So each round of the benchmark also sends one **control**: the round's prompt (rotating through
the workload) with a fresh nonce line after it, at the same length, alone (as the
single-request phase). No cache keyed by the whole prompt can hold its answer, while the work a
real engine does is the same: the prompt's prefix is the repeated prompt's (a prefix cache
serves both alike, so the prefill costs the same), and the answer has the same length. The
control's answer is timed, never judged (no reference holds it).

:func:`replay_check` compares the end-to-end time per output token of the single-request
answers with the controls'. End to end, because it is the one clock no shape of stream can
bend: a real engine that streams in bursts (vLLM's CPU server, starved of CPU, sends most of
an answer in one flush) leaves no meaning in the time after the first token, and measured
0.006 ms "per token" that way on the demo. Without speculation, a real engine answers a prompt
it saw before no faster than the same prompt with a line added, so repeated answers
:data:`REPLAY_RATIO` times faster than the controls were not decoded. The trial is then
refused (``replayed_answers``), its figures never scored, unless the launch decodes
speculatively (the engine reads it from the launch, ``Engine.speculates``): speculation drawn
from earlier answers (llama.cpp's n-gram cache, vLLM's suffix decoding) does make repeated
prompts faster than new ones, so there the ratio is said (a trap, in ``show``), not refused.
A cache that matches prompts by a prefix, or by meaning, rather than by the whole text is not
caught.
"""

from __future__ import annotations

import secrets
import statistics
from collections.abc import Sequence
from typing import Any

#: repeated prompts answered this many times faster per token than a fresh one were not
#: decoded; far above what a real engine without speculation shows (the two do the same work,
#: and noise on a busy machine moves one request's time by well under 2x)
REPLAY_RATIO = 4.0
#: an answer with fewer tokens is left out of the comparison (its time is mostly the prefill)
MIN_CONTROL_TOKENS = 8


def control_prompt(prompt: str) -> str:
    """``prompt`` with a nonce line after it that no earlier request carried (never the same
    twice): its prefix stays the repeated prompt's, the whole text is new."""
    return f"{prompt}\n(request {secrets.token_hex(6)})"


def _ms_per_token(record: Any) -> float | None:
    """End-to-end time per output token in ms (None: failed, or fewer than
    :data:`MIN_CONTROL_TOKENS` tokens)."""
    if not record.ok or record.tokens < MIN_CONTROL_TOKENS or not record.e2e_s:
        return None
    return record.e2e_s / record.tokens * 1000


def _controls(n: int) -> str:
    return f"{n} control" if n == 1 else f"{n} controls"


def _compare(repeated: Sequence[Any], controls: Sequence[Any]) -> dict[str, Any] | None:
    """Median end-to-end ms per token of ``repeated`` and of ``controls``, and their ratio;
    None when either has no answer that can be timed."""
    timed_controls = [t for r in controls for t in [_ms_per_token(r)] if t is not None]
    timed_repeated = [t for r in repeated for t in [_ms_per_token(r)] if t is not None]
    if not timed_controls or not timed_repeated:
        return None
    control_ms = statistics.median(timed_controls)
    repeated_ms = statistics.median(timed_repeated)
    ratio = control_ms / repeated_ms if repeated_ms > 0 else float("inf")
    return {
        "controls": len(timed_controls),
        "repeated": len(timed_repeated),
        "control_ms_per_token": round(control_ms, 4),
        "repeated_ms_per_token": round(repeated_ms, 4),
        "ratio": round(ratio, 2) if ratio != float("inf") else None,
        "flagged": ratio >= REPLAY_RATIO,
    }


def _faster(found: dict[str, Any], where: str) -> str:
    how = "inf" if found["ratio"] is None else f"{found['ratio']:.1f}"
    return (
        f"answers to repeated prompts {where} came {how}x faster per token end to end "
        f"({found['repeated_ms_per_token']:.3g} ms) than to a fresh prompt "
        f"({found['control_ms_per_token']:.3g} ms, {_controls(found['controls'])})"
    )


def replay_check(
    repeated: Sequence[Any],
    controls: Sequence[Any],
    *,
    speculates: bool = False,
    load_repeated: Sequence[Any] = (),
    load_controls: Sequence[Any] = (),
) -> dict[str, Any]:
    """The ``replay_check`` record of one benchmark (``RequestRecord``s of the single-request
    phases and of their controls; with ``load_controls``, of the load phases and the control
    sent among each): ``checked`` (False, with the reason, when no control or no repeated
    answer could be timed), ``flagged`` (at least :data:`REPLAY_RATIO`, alone or under load),
    ``refused`` and the figures it rests on (under load in ``under_load``).

    Under load too, because a cache that replays only while other requests are in flight (or
    only once an entry was asked for a few times) answered the single requests honestly and
    the load phases, the headline's, from memory. A control there waits in the same queue as
    the requests beside it, so an honest server's ratio stays near 1.

    ``speculates``: the launch decodes speculatively. Speculation drawn from earlier answers
    (llama.cpp's n-gram cache, vLLM's suffix decoding) really does make a repeated prompt
    decode faster than a new one, so there a flagged ratio is said (the speed holds for
    repeated prompts only) but not refused: the answers were decoded, and right."""
    alone = _compare(repeated, controls)
    loaded = _compare(load_repeated, load_controls) if load_controls else None
    record: dict[str, Any] = {"ratio_limit": REPLAY_RATIO}
    if alone is None and loaded is None:
        timed = [t for r in controls for t in [_ms_per_token(r)] if t is not None]
        timed_repeated = [t for r in repeated for t in [_ms_per_token(r)] if t is not None]
        missing = "fresh-prompt control" if not timed else "single-request answer"
        failed = next((r.error for r in (*controls, *load_controls) if not r.ok), None)
        why = (
            f"the control failed: {failed}"
            if failed and not timed
            else f"an answer needs {MIN_CONTROL_TOKENS} tokens or more"
        )
        record.update(
            controls=len(timed),
            repeated=len(timed_repeated),
            checked=False,
            flagged=False,
            refused=False,
            reason=f"replay check not run: no {missing} could be timed ({why})",
        )
        return record
    main = alone if alone is not None else loaded
    assert main is not None
    flagged = bool(main["flagged"] or (loaded is not None and loaded["flagged"]))
    record.update(
        checked=True,
        flagged=flagged,
        refused=flagged and not speculates,
        speculative=speculates,
        controls=main["controls"],
        repeated=main["repeated"],
        control_ms_per_token=main["control_ms_per_token"],
        repeated_ms_per_token=main["repeated_ms_per_token"],
        ratio=main["ratio"],
    )
    if load_controls:
        failed = next((r.error for r in load_controls if not r.ok), None)
        why = (
            f"the control failed: {failed}"
            if failed
            else (f"an answer needs {MIN_CONTROL_TOKENS} tokens or more")
        )
        record["under_load"] = loaded or {"checked": False, "reason": f"not run ({why})"}
    worst = [
        _faster(found, where)
        for found, where in ((alone, "alone"), (loaded, "under load"))
        if found is not None and found["flagged"]
    ]
    if flagged and speculates:
        record["reason"] = (
            f"{'; '.join(worst)} with speculative decoding on: speculation drawn from earlier "
            "answers speeds repeated prompts, so this speed holds for repeated prompts only"
        )
    elif flagged:
        record["reason"] = (
            f"{'; '.join(worst)}: replayed from a cache, not decoded; its speed is not the engine's"
        )
    else:
        parts = [
            f"{'inf' if found['ratio'] is None else format(found['ratio'], '.1f')}x {where} "
            f"({_controls(found['controls'])})"
            for found, where in ((alone, "alone"), (loaded, "under load"))
            if found is not None
        ]
        if load_controls and loaded is None:  # a part that could not run says so
            parts.append(f"under load {record['under_load']['reason']}")
        if alone is None:
            parts.insert(0, "alone not run (no single-request answer or control timed)")
        record["reason"] = "repeated prompts at a fresh prompt's speed per token: " + ", ".join(
            parts
        )
    return record
