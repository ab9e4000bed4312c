"""The gate's requests: greedy answers and teacher-forced scores, in the engine's dialect.

Every request is built by ``protocol.completion_body`` from the engine's
:class:`~autotune.engines.dialect.RequestDialect` and every answer read through it, so the gate
never names an engine's fields. What an answer lacks is not an error here: the baseline records
what the answers carry (``gate.reference.Capabilities``) and the gate judges with that.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from autotune.client.bounds import PROTOCOL_VIOLATION, runaway_cap, runs_away
from autotune.client.choice import TopCandidates, finite_logprob, token_scores
from autotune.client.send import open_stream
from autotune.client.stream import (
    CUT_SHORT,
    NotJsonObject,
    NoTokenWithin,
    ServerProgress,
    StreamError,
    bad_shape,
    completion_body,
    cut_short,
    parse_json_object,
    read_chunk,
    sse_payloads,
)
from autotune.engines.dialect import TEACHER_ECHO, TEACHER_PROMPT_LOGPROBS, RequestDialect
from autotune.errors import excerpt
from autotune.gate.reference import Completion

_NO_READ_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=10.0, pool=None)


async def complete_greedy(
    client: httpx.AsyncClient,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    dialect: RequestDialect,
    fixed_length: bool = False,
    deadline_s: float | None = 60.0,
    phase: str = "verification",
    progress: ServerProgress | None = None,
) -> Completion:
    """A greedy completion, streamed, with whatever the server gives beside the text.

    Asks for token ids (in the engine's ``dialect``) and top-2 logprobs. A server that refuses
    the request (HTTP 400/422: a field it does not know, or a server refusing a runner-up
    logprob of -inf) is asked again with top-1 logprobs, then with a plain OpenAI body; what the
    answer then lacks is what :class:`Capabilities` records at the baseline. Streamed so that the
    deadline is time without a token (``client/stream.py``): a long answer from a slow config is not
    a hang.
    """

    def body(**extras: Any) -> dict[str, Any]:
        return completion_body(dialect, model, prompt, max_tokens, stream=True, **extras)

    variants = (
        body(logprobs=2, token_ids=True, fixed_length=fixed_length),
        body(logprobs=1, token_ids=True, fixed_length=fixed_length),
        body(),
    )
    rejected: httpx.HTTPStatusError | None = None
    for variant in variants:
        try:
            return await _stream_completion(client, dialect, variant, deadline_s, phase, progress)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code not in (400, 422):
                raise
            rejected = exc
    assert rejected is not None
    raise rejected


async def _stream_completion(
    client: httpx.AsyncClient,
    dialect: RequestDialect,
    body: dict[str, Any],
    deadline_s: float | None,
    phase: str,
    progress: ServerProgress | None = None,
) -> Completion:
    prompt = body["prompt"]
    text: list[str] = []
    ids: list[int] = []
    prompt_ids: list[int] = []
    tokens: list[str] = []
    logprobs: list[float] = []
    margins: list[float | None] = []
    runner_ups: list[str | None] = []
    events = 0
    # ended past this many tokens (ids where the stream has them), or past a few events a token
    # (a token's text may be split over events, so only a stream far past the limit is cut)
    cap = runaway_cap(int(body["max_tokens"]))
    try:
        async with open_stream(
            client, "/v1/completions", body, deadline_s=deadline_s, progress=progress
        ) as response:
            if response.status_code != 200:
                await response.aread()
                response.raise_for_status()
            async for payload, _now in sse_payloads(
                response, time.perf_counter(), token_deadline_s=deadline_s, progress=progress
            ):
                events += 1
                if payload == b"[DONE]":
                    break
                chunk = read_chunk(payload)
                try:
                    for choice in chunk.get("choices") or ():
                        text.append(_text(choice))
                        prompt_ids.extend(dialect.prompt_token_ids(choice))
                        # either logprobs shape, ids from the dialect's field or the entries
                        scores = token_scores(dialect, choice)
                        ids.extend(scores.ids)
                        tokens.extend(scores.tokens)
                        logprobs.extend(scores.logprobs)
                        margins.extend(_margin(top) for top in scores.tops)
                        runner_ups.extend(_runner_up(top) for top in scores.tops)
                        if choice.get("finish_reason") in CUT_SHORT:
                            raise cut_short(choice["finish_reason"], payload)
                except (AttributeError, LookupError, TypeError, ValueError):
                    raise bad_shape(payload) from None
                if runs_away(len(ids), events, cap):
                    raise StreamError(
                        f"{PROTOCOL_VIOLATION}: the answer to {prompt!r} streamed on past "
                        f"{cap} tokens for max_tokens={body['max_tokens']} ({len(ids)} token "
                        f"id(s) in {events} events)"
                    )
    except TimeoutError:
        raise NoTokenWithin(phase, f"the request for prompt {prompt!r}", deadline_s or 0) from None
    kind = response.headers.get("content-type", "no content type")
    if not events and "text/event-stream" not in kind:
        # a server that ignores "stream": true answers one JSON body, and the gate would
        # report "returns no text" (true of what it read, but not why)
        raise StreamError(
            f"the answer was not a server-sent event stream ({kind}): autotune streams every "
            "request (stream: true) to time each token"
        )
    if not events:
        # not even [DONE]: read as an answer, the gate would call the config's output empty
        raise StreamError(f"the event stream ({kind}) ended without a single data event")
    return Completion(
        prompt=prompt,
        text="".join(text),
        token_ids=tuple(ids),
        tokens=tuple(tokens),
        logprobs=tuple(logprobs),
        margins=tuple(margins),
        prompt_token_ids=tuple(prompt_ids),
        runner_ups=tuple(runner_ups),
    )


def _text(choice: dict[str, Any]) -> str:
    """A chunk's text; None (a chunk carrying only a finish reason) is none."""
    text = choice.get("text")
    if text is None:
        return ""
    if not isinstance(text, str):
        raise TypeError("text is not a string")
    return text


def _margin(top: TopCandidates | None) -> float | None:
    if not top or len(top) < 2:
        return None
    best = sorted((finite_logprob(v) for v in top.values()), reverse=True)
    if best[1] == float("-inf"):
        return None  # no finite runner-up: no near-tie
    return float(best[0] - best[1])


def _runner_up(top: TopCandidates | None) -> str | None:
    """The second most likely token of a ``top_logprobs`` entry (None without a finite one)."""
    if not top or len(top) < 2:
        return None
    ranked = sorted(top.items(), key=lambda item: finite_logprob(item[1]), reverse=True)
    token, logprob = ranked[1]
    return None if finite_logprob(logprob) == float("-inf") else token


class TeacherUnsupported(Exception):
    """The server cannot score a given continuation in this way (detected at the baseline)."""


async def teacher_forced_logprobs(
    client: httpx.AsyncClient,
    model: str,
    reference: Completion,
    *,
    dialect: RequestDialect,
    mode: str = TEACHER_PROMPT_LOGPROBS,
    deadline_s: float | None = 60.0,
) -> tuple[float, ...]:
    """Logprobs the server gives the reference continuation when it is fed back as prompt.

    ``TEACHER_PROMPT_LOGPROBS``: the prompt and continuation as token ids, scored exactly on the
    reference's tokens with the dialect's prompt scoring. ``TEACHER_ECHO`` (the OpenAI legacy
    API: ``echo`` with ``logprobs``): the prompt and continuation as text, scored on however the
    server tokenises it, which is the same for the baseline and every trial of one server, so
    the two stay comparable.
    """
    if mode == TEACHER_PROMPT_LOGPROBS:
        ids = list(reference.prompt_token_ids) + list(reference.token_ids)
        body = completion_body(dialect, model, ids, 1, stream=False, prompt_scores=0)
    else:
        text = reference.prompt + reference.text
        body = completion_body(dialect, model, text, 1, stream=False, echo=True, logprobs=1)
    try:
        async with asyncio.timeout(deadline_s):
            response = await client.post("/v1/completions", json=body, timeout=_NO_READ_TIMEOUT)
    except TimeoutError:
        raise NoTokenWithin(
            "verification",
            f"teacher-forced scoring of prompt {reference.prompt!r}",
            deadline_s or 0,
        ) from None
    response.raise_for_status()
    try:
        answer = parse_json_object(response.content, "the scoring answer is not JSON")
    except NotJsonObject as exc:
        raise TeacherUnsupported(str(exc)) from None
    if answer.get("error"):  # a 200 whose body reports a failure
        raise TeacherUnsupported(f"the scoring answer is an error: {excerpt(response.text)}")
    try:
        choice = (answer.get("choices") or [{}])[0]
        if mode == TEACHER_PROMPT_LOGPROBS:
            return _from_prompt_scores(dialect, choice, reference)
        return _from_echo(choice, reference)
    except (AttributeError, LookupError, TypeError, ValueError):
        # a list where an object belongs, an offset of null, a logprob that is no number:
        # unsupported with the answer as evidence, not a Python error out of the gate
        raise TeacherUnsupported(
            f"the scoring answer is not a completions answer: {excerpt(response.text)}"
        ) from None


def _from_prompt_scores(
    dialect: RequestDialect, choice: dict[str, Any], reference: Completion
) -> tuple[float, ...]:
    entries = dialect.prompt_scores(choice)
    if not entries:
        raise TeacherUnsupported(f"the answer has no {dialect.prompt_scores_key}")
    start = len(reference.prompt_token_ids)
    out = []
    for position, token_id in enumerate(reference.token_ids, start=start):
        entry = entries[position] if position < len(entries) else None
        value = None
        if entry:
            item = entry.get(str(token_id)) or entry.get(token_id)
            if item is not None:
                value = item["logprob"] if isinstance(item, dict) else item
        out.append(finite_logprob(value))
    return tuple(out)


def _from_echo(choice: dict[str, Any], reference: Completion) -> tuple[float, ...]:
    lp = choice.get("logprobs") or {}
    offsets = lp.get("text_offset") or []
    values = lp.get("token_logprobs") or []
    if not offsets or len(offsets) != len(values):
        raise TeacherUnsupported("the echoed answer has no per-token offsets and logprobs")
    begin = len(reference.prompt)
    end = begin + len(reference.text)
    scored = [finite_logprob(v) for o, v in zip(offsets, values, strict=True) if begin <= o < end]
    if not scored:
        raise TeacherUnsupported("the echoed answer does not cover the continuation")
    return tuple(scored)


async def gather_completions(
    client: httpx.AsyncClient,
    model: str,
    prompts: Sequence[str],
    max_tokens: Mapping[str, int],
    *,
    dialect: RequestDialect,
    concurrent: bool,
    deadline_s: float | None,
) -> list[Completion]:
    """Fixed-length greedy completions of ``prompts``, one after another or all at once.

    All at once, a server with fewer slots than prompts queues some of them: their no-token
    deadline counts the server's silence to all of them (:class:`ServerProgress`), not their
    own wait in the queue."""
    progress = ServerProgress() if concurrent else None

    async def one(prompt: str) -> Completion:
        return await complete_greedy(
            client,
            model,
            prompt,
            max_tokens[prompt],
            dialect=dialect,
            fixed_length=True,
            deadline_s=deadline_s,
            progress=progress,
        )

    if concurrent:
        return list(await asyncio.gather(*(one(p) for p in prompts)))
    return [await one(p) for p in prompts]


async def detect_teacher_mode(
    client: httpx.AsyncClient,
    model: str,
    sample: Completion,
    deadline_s: float | None,
    *,
    dialect: RequestDialect,
) -> str | None:
    """Which way of teacher-forced scoring this server supports, tried on one completion."""
    modes = [TEACHER_ECHO]
    if dialect.scores_prompts and sample.token_ids and sample.prompt_token_ids:
        modes.insert(0, TEACHER_PROMPT_LOGPROBS)
    for mode in modes:
        try:
            scored = await teacher_forced_logprobs(
                client, model, sample, dialect=dialect, mode=mode, deadline_s=deadline_s
            )
        except (httpx.HTTPStatusError, TeacherUnsupported):
            continue
        if scored and all(math.isfinite(v) for v in scored):
            return mode
    return None
