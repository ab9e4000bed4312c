"""The correctness gate: a trial's output against the pinned reference, before any scoring.

Policy (also in the README, "The correctness gate"):

* The baseline (engine defaults, no patches) records the **reference**: for every check prompt
  and every workload prompt, the greedy continuation with its token ids, each token's logprob
  and the margin between the top-1 and top-2 candidates; and, for the check prompts, the
  *teacher-forced* logprobs of that continuation (prompt + reference tokens sent back with
  ``prompt_logprobs``), so a trial can be scored on exactly the same token sequence.
* The baseline measures its own **repeat-to-repeat variation**: the same requests again, once
  one at a time and once all at once (a different batch shape, the legitimate source of
  numeric noise). The logprob tolerance is ``max(floor, 4 x the largest drift it saw)`` unless
  the spec pins ``check.logprob_tolerance``. Both numbers are stored with the reference.
* A trial passes when, for every prompt: (1) its greedy tokens equal the reference's, except
  that a divergence at a position whose reference top-1/top-2 margin is within twice the
  tolerance is a tie flip, accepted and comparison stops there; (2) its teacher-forced logprobs
  differ from the reference's by at most the tolerance at every position; (3) sanity holds
  (not empty, not whitespace-only, no runaway repetition, no non-printable characters) wherever
  the reference itself was sane; (4) known-answer prompts match their regular expressions.
* Anything else fails the trial as ``incorrect_output`` with the first divergent position and
  both texts. A failed trial gets no performance score.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from autotune.protocol import NoTokenWithin, StreamError, open_stream, sse_payloads
from autotune.spec import CheckSpec

#: the derived tolerance is this many times the largest drift the baseline showed itself
TOLERANCE_MULTIPLIER = 4.0
#: teacher-forced scoring: token ids with vLLM's ``prompt_logprobs``, or text with ``echo``
TEACHER_PROMPT_LOGPROBS = "prompt_logprobs"
TEACHER_ECHO = "echo"
#: how outputs are compared, best first: token ids, per-token strings, the text itself
COMPARE_TOKEN_IDS = "token_ids"
COMPARE_TOKEN_STRINGS = "token_strings"
COMPARE_TEXT = "text"
_NO_READ_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=10.0, pool=None)


@dataclass(frozen=True)
class Completion:
    """One greedy completion: text, token ids and, per position, logprob and top-2 margin."""

    prompt: str
    text: str
    token_ids: tuple[int, ...]
    tokens: tuple[str, ...] = ()
    logprobs: tuple[float, ...] = ()
    margins: tuple[float | None, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What this server's answers let the gate check, learned from the baseline's answers.

    Servers differ: vLLM returns token ids, per-token logprobs and scores a given continuation
    (``prompt_logprobs``); llama.cpp, TGI, SGLang and most proxies return text, sometimes
    per-token strings and logprobs, rarely ids. The gate compares with the best thing every
    answer carries and says which: it never reports a check that could not run.
    """

    text: bool = True
    token_ids: bool = True
    token_strings: bool = True
    token_logprobs: bool = True
    top_logprobs: bool = True
    teacher_forced: str | None = TEACHER_PROMPT_LOGPROBS

    @property
    def comparison(self) -> str:
        if self.token_ids:
            return COMPARE_TOKEN_IDS
        if self.token_strings:
            return COMPARE_TOKEN_STRINGS
        return COMPARE_TEXT

    def problem(self) -> str | None:
        """Why nothing can be verified on this server, or None."""
        if not self.text:
            return (
                "the server returns no text for the check prompts, so no output can be "
                "verified; check engine.command / model.served_name and that /v1/completions "
                "answers with choices[0].text"
            )
        return None

    def notices(self) -> list[str]:
        """One line per check this server's answers do not allow (warnings, not errors)."""
        out = []
        if not self.token_ids:
            what = "per-token strings" if self.token_strings else "the text"
            out.append(f"server returns no token ids; outputs are compared by {what}")
        if not self.teacher_forced:
            out.append(
                "server scores no given continuation (neither prompt_logprobs nor echo with "
                "logprobs); the teacher-forced logprob check is skipped"
            )
        if not self.top_logprobs:
            out.append("server returns no top-2 logprobs; near-tie token flips are not excused")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Capabilities:
        return cls(**data) if data else cls()


@dataclass(frozen=True)
class ReferenceEntry:
    completion: Completion
    #: teacher-forced logprobs of the reference continuation (check prompts only)
    teacher_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class Reference:
    """The pinned reference of a study, recorded once by the baseline."""

    entries: dict[str, ReferenceEntry]
    max_tokens: dict[str, int]
    tolerance: float
    drift_observed: float
    engine_version: str = ""
    capabilities: Capabilities = field(default_factory=Capabilities)
    #: prompts whose baseline output differed between alone and batched (the baseline's own
    #: nondeterminism; a check on such a server can flag correct configs)
    unstable_prompts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "entries": {
                p: {
                    "completion": asdict(e.completion),
                    "teacher_logprobs": list(e.teacher_logprobs),
                }
                for p, e in self.entries.items()
            },
            "max_tokens": dict(self.max_tokens),
            "tolerance": self.tolerance,
            "drift_observed": self.drift_observed,
            "engine_version": self.engine_version,
            "capabilities": self.capabilities.to_dict(),
            "unstable_prompts": self.unstable_prompts,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reference:
        entries = {}
        for prompt, raw in data["entries"].items():
            c = raw["completion"]
            completion = Completion(
                prompt=c["prompt"],
                text=c["text"],
                token_ids=tuple(c["token_ids"]),
                tokens=tuple(c["tokens"]),
                logprobs=tuple(c["logprobs"]),
                margins=tuple(c["margins"]),
                prompt_token_ids=tuple(c["prompt_token_ids"]),
            )
            entries[prompt] = ReferenceEntry(completion, tuple(raw["teacher_logprobs"]))
        return cls(
            entries=entries,
            max_tokens=dict(data["max_tokens"]),
            tolerance=float(data["tolerance"]),
            drift_observed=float(data["drift_observed"]),
            engine_version=data.get("engine_version", ""),
            capabilities=Capabilities.from_dict(data.get("capabilities")),
            unstable_prompts=int(data.get("unstable_prompts", 0)),
        )


class TeacherRejected(str):
    """Stands in for teacher-forced logprobs the server refused to compute (its error text)."""


@dataclass(frozen=True)
class Divergence:
    """Where a trial's output first left the reference, with both texts as evidence."""

    prompt: str
    position: int
    kind: str  # token | logprob | sanity | known_answer | length
    expected_token: str | None = None
    got_token: str | None = None
    expected_text: str = ""
    got_text: str = ""
    detail: str = ""


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    prompts_checked: int
    max_logprob_drift: float = 0.0
    tie_flips: int = 0
    first_divergence: Divergence | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)
    #: the checks that actually ran, e.g. ``{"compared_by": "token_ids", "teacher_forced":
    #: "prompt_logprobs", "sanity": True, "known_answers": 2}``; a check absent here never ran
    checks: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["problems"] = list(self.problems)
        return out


# --- talking to the server -------------------------------------------------------------------


async def complete_greedy(
    client: httpx.AsyncClient,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    deadline_s: float | None = 60.0,
    phase: str = "verification",
) -> Completion:
    """A greedy completion, streamed, with whatever the server gives beside the text.

    Asks for token ids (vLLM's ``return_token_ids``) and top-2 logprobs. A server that refuses
    the request (HTTP 400/422: a field it does not know, or vLLM refusing a runner-up logprob of
    -inf) is asked again with top-1 logprobs, then with a plain OpenAI body; what the answer then
    lacks is what :class:`Capabilities` records at the baseline. Streamed so that the deadline is
    time without a token (``protocol.py``): a long answer from a slow config is not a hang.
    """
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "logprobs": 2,
        "return_token_ids": True,
        "ignore_eos": ignore_eos,
    }
    plain = {k: body[k] for k in ("model", "prompt", "max_tokens", "temperature", "stream")}
    rejected: httpx.HTTPStatusError | None = None
    for variant in (body, {**body, "logprobs": 1}, plain):
        try:
            return await _stream_completion(client, variant, deadline_s, phase)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code not in (400, 422):
                raise
            rejected = exc
    assert rejected is not None
    raise rejected


async def _stream_completion(
    client: httpx.AsyncClient, body: dict[str, Any], deadline_s: float | None, phase: str
) -> Completion:
    prompt = body["prompt"]
    text: list[str] = []
    ids: list[int] = []
    prompt_ids: list[int] = []
    tokens: list[str] = []
    logprobs: list[float] = []
    margins: list[float | None] = []
    try:
        async with open_stream(client, "/v1/completions", body, deadline_s=deadline_s) as response:
            if response.status_code != 200:
                await response.aread()
                response.raise_for_status()
            async for payload, _now in sse_payloads(
                response, time.perf_counter(), token_deadline_s=deadline_s
            ):
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if chunk.get("error"):
                    raise StreamError(f"the stream carried an error: {chunk['error']}")
                for choice in chunk.get("choices") or []:
                    text.append(choice.get("text") or "")
                    ids.extend(choice.get("token_ids") or ())
                    prompt_ids.extend(choice.get("prompt_token_ids") or ())
                    lp = choice.get("logprobs") or {}
                    tokens.extend(lp.get("tokens") or ())
                    logprobs.extend(_finite(x) for x in lp.get("token_logprobs") or ())
                    margins.extend(_margin(top) for top in lp.get("top_logprobs") or ())
    except TimeoutError:
        raise NoTokenWithin(phase, f"the request for prompt {prompt!r}", deadline_s or 0) from None
    except json.JSONDecodeError as exc:
        raise StreamError(f"a stream chunk was not JSON: {exc}") from None
    return Completion(
        prompt=prompt,
        text="".join(text),
        token_ids=tuple(ids),
        tokens=tuple(tokens),
        logprobs=tuple(logprobs),
        margins=tuple(margins),
        prompt_token_ids=tuple(prompt_ids),
    )


def _finite(value: float | None) -> float:
    """A logprob as a float; JSON's null (how a -inf is serialised) becomes -inf."""
    return float("-inf") if value is None else float(value)


def _margin(top: dict[str, float | None] | None) -> float | None:
    if not top or len(top) < 2:
        return None
    best = sorted((_finite(v) for v in top.values()), reverse=True)
    if best[1] == float("-inf"):
        return None  # no finite runner-up: no near-tie
    return float(best[0] - best[1])


class TeacherUnsupported(Exception):
    """The server cannot score a given continuation in this way (detected at the baseline)."""


async def teacher_forced_logprobs(
    client: httpx.AsyncClient,
    model: str,
    reference: Completion,
    *,
    mode: str = TEACHER_PROMPT_LOGPROBS,
    deadline_s: float | None = 60.0,
) -> tuple[float, ...]:
    """Logprobs the server gives the reference continuation when it is fed back as prompt.

    ``prompt_logprobs`` (vLLM): the prompt and continuation as token ids, scored exactly on the
    reference's tokens. ``echo`` (the OpenAI legacy API: ``echo`` with ``logprobs``): the prompt
    and continuation as text, scored on however the server tokenises it, which is the same for
    the baseline and every trial of one server, so the two stay comparable.
    """
    if mode == TEACHER_PROMPT_LOGPROBS:
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(reference.prompt_token_ids) + list(reference.token_ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
    else:
        body = {
            "model": model,
            "prompt": reference.prompt + reference.text,
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": True,
            "logprobs": 1,
        }
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
    choice = (response.json().get("choices") or [{}])[0]
    if mode == TEACHER_PROMPT_LOGPROBS:
        return _from_prompt_logprobs(choice, reference)
    return _from_echo(choice, reference)


def _from_prompt_logprobs(choice: dict[str, Any], reference: Completion) -> tuple[float, ...]:
    entries = choice.get("prompt_logprobs")
    if not entries:
        raise TeacherUnsupported("the answer has no prompt_logprobs")
    start = len(reference.prompt_token_ids)
    out = []
    for position, token_id in enumerate(reference.token_ids, start=start):
        entry = entries[position] if position < len(entries) else None
        value = None
        if entry:
            item = entry.get(str(token_id)) or entry.get(token_id)
            if item is not None:
                value = item["logprob"] if isinstance(item, dict) else item
        out.append(_finite(value))
    return tuple(out)


def _from_echo(choice: dict[str, Any], reference: Completion) -> tuple[float, ...]:
    lp = choice.get("logprobs") or {}
    offsets = lp.get("text_offset") or []
    values = lp.get("token_logprobs") or []
    if not offsets or len(offsets) != len(values):
        raise TeacherUnsupported("the echoed answer has no per-token offsets and logprobs")
    begin = len(reference.prompt)
    end = begin + len(reference.text)
    scored = [_finite(v) for o, v in zip(offsets, values, strict=True) if begin <= o < end]
    if not scored:
        raise TeacherUnsupported("the echoed answer does not cover the continuation")
    return tuple(scored)


async def _gather_completions(
    client, model, prompts, max_tokens, *, concurrent: bool, deadline_s: float | None
) -> list[Completion]:
    async def one(prompt: str) -> Completion:
        return await complete_greedy(
            client, model, prompt, max_tokens[prompt], ignore_eos=True, deadline_s=deadline_s
        )

    if concurrent:
        return list(await asyncio.gather(*(one(p) for p in prompts)))
    return [await one(p) for p in prompts]


async def collect_outputs(
    client: httpx.AsyncClient,
    model: str,
    reference: Reference,
    prompts: Sequence[str],
    *,
    concurrent: bool = False,
    deadline_s: float | None = 60.0,
) -> tuple[dict[str, Completion], dict[str, tuple[float, ...]]]:
    """The trial's greedy completions and teacher-forced logprobs for ``prompts``."""
    max_tokens = {p: reference.max_tokens[p] for p in prompts}
    completions = await _gather_completions(
        client, model, prompts, max_tokens, concurrent=concurrent, deadline_s=deadline_s
    )
    teacher = {}
    mode = reference.capabilities.teacher_forced
    for prompt in prompts:
        entry = reference.entries[prompt]
        if mode and entry.teacher_logprobs:
            try:
                teacher[prompt] = await teacher_forced_logprobs(
                    client, model, entry.completion, mode=mode, deadline_s=deadline_s
                )
            except (httpx.HTTPStatusError, TeacherUnsupported) as exc:
                # The baseline could score it, this config cannot (seen: a broken model whose
                # logprobs are not finite, which JSON cannot carry): the gate fails it.
                if isinstance(exc, httpx.HTTPStatusError):
                    exc = f"{exc.response.status_code}: {exc.response.text[:200]}"
                teacher[prompt] = TeacherRejected(str(exc))
    return {c.prompt: c for c in completions}, teacher


async def _detect_teacher_mode(
    client: httpx.AsyncClient, model: str, sample: Completion, deadline_s: float | None
) -> str | None:
    """Which way of teacher-forced scoring this server supports, tried on one completion."""
    modes = [TEACHER_ECHO]
    if sample.token_ids and sample.prompt_token_ids:
        modes.insert(0, TEACHER_PROMPT_LOGPROBS)
    for mode in modes:
        try:
            scored = await teacher_forced_logprobs(
                client, model, sample, mode=mode, deadline_s=deadline_s
            )
        except (httpx.HTTPStatusError, TeacherUnsupported):
            continue
        if scored and all(math.isfinite(v) for v in scored):
            return mode
    return None


async def record_reference(
    client: httpx.AsyncClient,
    model: str,
    check: CheckSpec,
    workload_prompts: Sequence[str],
    workload_max_tokens: int | Mapping[str, int],
    *,
    engine_version: str = "",
    deadline_s: float | None = 60.0,
) -> Reference:
    """Run the baseline's greedy outputs twice (alone, then batched) and pin the reference.

    ``ignore_eos`` is set on every request so lengths are fixed and comparable. What the answers
    carry (token ids, per-token strings, logprobs, a way to teacher-force) is recorded as the
    reference's :class:`Capabilities`: every later trial is judged with exactly those checks.
    """
    max_tokens = {p: check.max_tokens for p in check.prompts}
    for prompt in workload_prompts:
        if isinstance(workload_max_tokens, int):
            max_tokens.setdefault(prompt, workload_max_tokens)
        else:  # one length per prompt (workload.reference_requests)
            max_tokens.setdefault(prompt, workload_max_tokens[prompt])
    prompts = list(max_tokens)
    alone = await _gather_completions(
        client, model, prompts, max_tokens, concurrent=False, deadline_s=deadline_s
    )
    batched = await _gather_completions(
        client, model, prompts, max_tokens, concurrent=True, deadline_s=deadline_s
    )
    checked = [c for c in alone if c.prompt in check.prompts]
    teacher_mode = None
    if checked and checked[0].text:
        teacher_mode = await _detect_teacher_mode(client, model, checked[0], deadline_s)
    capabilities = Capabilities(
        text=any(c.text.strip() for c in checked),
        token_ids=all(c.token_ids for c in alone),
        token_strings=all(c.tokens for c in alone),
        token_logprobs=all(len(c.logprobs) == len(c.tokens) and c.tokens for c in alone),
        top_logprobs=any(m is not None for c in alone for m in c.margins),
        teacher_forced=teacher_mode,
    )
    method = capabilities.comparison
    drift = 0.0
    unstable = 0
    for a, b in zip(alone, batched, strict=True):
        common = _common_prefix(_units(a, method), _units(b, method))
        if common < max(len(_units(a, method)), len(_units(b, method))):
            unstable += 1
        if capabilities.token_logprobs:
            for i in range(min(common, len(a.logprobs), len(b.logprobs))):
                drift = max(drift, abs(a.logprobs[i] - b.logprobs[i]))
    teacher_alone: dict[str, tuple[float, ...]] = {}
    if teacher_mode:
        for completion in checked:
            teacher_alone[completion.prompt] = await teacher_forced_logprobs(
                client, model, completion, mode=teacher_mode, deadline_s=deadline_s
            )
        teacher_batched = await asyncio.gather(
            *(
                teacher_forced_logprobs(client, model, c, mode=teacher_mode, deadline_s=deadline_s)
                for c in checked
            )
        )
        for first, second in zip(teacher_alone.values(), teacher_batched, strict=True):
            drift = max(drift, _max_abs_diff(first, second))
    entries = {c.prompt: ReferenceEntry(c, teacher_alone.get(c.prompt, ())) for c in alone}
    tolerance = check.logprob_tolerance
    if tolerance is None:
        tolerance = max(check.tolerance_floor, TOLERANCE_MULTIPLIER * drift)
    return Reference(
        entries=entries,
        max_tokens=max_tokens,
        tolerance=float(tolerance),
        drift_observed=float(drift),
        engine_version=engine_version,
        capabilities=capabilities,
        unstable_prompts=unstable,
    )


# --- comparing -------------------------------------------------------------------------------


def sanity_problem(text: str, token_ids: Sequence[int] = ()) -> str | None:
    """Outputs that are wrong whatever the reference says."""
    if not text:
        return "empty output"
    if not text.strip():
        return "whitespace-only output"
    if any((not ch.isprintable()) and ch not in "\n\t\r" for ch in text):
        return "non-printable characters in output"
    ids = list(token_ids)
    if len(ids) >= 16:
        tail = ids[len(ids) // 4 :]
        for period in (1, 2):
            if all(tail[i] == tail[i % period] for i in range(len(tail))):
                return f"runaway repetition (a {period}-token loop)"
    return None


def compare(
    reference: Reference,
    completions: dict[str, Completion],
    teacher: dict[str, tuple[float, ...]],
    check: CheckSpec | None = None,
) -> CheckResult:
    """Judge a trial's outputs against the reference. Pure: no I/O."""
    tol = reference.tolerance
    max_drift = 0.0
    tie_flips = 0
    problems: list[str] = []
    first: Divergence | None = None

    def fail(divergence: Divergence, problem: str) -> None:
        nonlocal first
        problems.append(problem)
        if first is None:
            first = divergence

    method = reference.capabilities.comparison
    for prompt, got in completions.items():
        ref = reference.entries[prompt].completion
        divergence = _first_divergence(reference, ref, got, method)
        if divergence == "tie_flip":
            tie_flips += 1
        elif divergence is not None:
            fail(divergence, f"{prompt!r}: {divergence.kind} {divergence.position} differs")
        if isinstance(teacher.get(prompt), TeacherRejected):
            fail(
                Divergence(
                    prompt=prompt,
                    position=0,
                    kind="logprob",
                    expected_text=ref.text,
                    got_text=got.text,
                    detail=f"the server rejected teacher-forced scoring: {teacher[prompt]}",
                ),
                f"{prompt!r}: teacher-forced scoring rejected",
            )
        elif prompt in teacher:
            expected = reference.entries[prompt].teacher_logprobs
            diffs = [abs(a - b) for a, b in zip(expected, teacher[prompt], strict=False)]
            if diffs:
                worst = max(range(len(diffs)), key=diffs.__getitem__)
                max_drift = max(max_drift, diffs[worst])
                if diffs[worst] > tol:
                    fail(
                        Divergence(
                            prompt=prompt,
                            position=worst,
                            kind="logprob",
                            expected_token=_token_at(ref, worst),
                            got_token=_token_at(ref, worst),
                            expected_text=ref.text,
                            got_text=got.text,
                            detail=f"logprob drift {diffs[worst]:.4f} > tolerance {tol:.4f}",
                        ),
                        f"{prompt!r}: logprob drift {diffs[worst]:.4f} at {worst}",
                    )
        if sanity_problem(ref.text, ref.token_ids) is None:
            problem = sanity_problem(got.text, got.token_ids)
            if problem:
                fail(
                    Divergence(
                        prompt=prompt,
                        position=0,
                        kind="sanity",
                        expected_text=ref.text,
                        got_text=got.text,
                        detail=problem,
                    ),
                    f"{prompt!r}: {problem}",
                )
    known = 0
    if check is not None:
        for answer in check.known_answers:
            known += answer.prompt in completions
            got = completions.get(answer.prompt)
            if got is not None and not re.search(answer.expect, got.text):
                fail(
                    Divergence(
                        prompt=answer.prompt,
                        position=0,
                        kind="known_answer",
                        expected_text=answer.expect,
                        got_text=got.text,
                        detail=f"does not match /{answer.expect}/",
                    ),
                    f"{answer.prompt!r}: known answer /{answer.expect}/ not found",
                )
    return CheckResult(
        passed=not problems,
        prompts_checked=len(completions),
        max_logprob_drift=max_drift,
        tie_flips=tie_flips,
        first_divergence=first,
        problems=tuple(problems),
        checks={
            "compared_by": method,
            "prompts": len(completions),
            "teacher_forced": reference.capabilities.teacher_forced if teacher else None,
            "sanity": True,
            "known_answers": known,
        },
    )


def _units(completion: Completion, method: str) -> Sequence[Any]:
    """The sequence a comparison walks: token ids, per-token strings, or characters."""
    if method == COMPARE_TOKEN_IDS:
        return completion.token_ids
    if method == COMPARE_TOKEN_STRINGS:
        return completion.tokens
    return completion.text


def _first_divergence(
    reference: Reference, ref: Completion, got: Completion, method: str, kind_suffix: str = ""
) -> Divergence | str | None:
    """Where ``got`` first leaves ``ref``: None (equal), ``"tie_flip"`` (excused), or the
    :class:`Divergence`. Tie flips need the reference's top-2 margin at that token, so they
    exist only for token-wise comparisons of a server that gives top-2 logprobs."""
    a, b = _units(ref, method), _units(got, method)
    position = _common_prefix(a, b)
    if position >= max(len(a), len(b)):
        return None
    both = position < min(len(a), len(b))
    margin = None
    if method != COMPARE_TEXT and position < len(ref.margins):
        margin = ref.margins[position]
    if both and margin is not None and margin <= 2 * reference.tolerance:
        return "tie_flip"
    detail = f"reference top-2 margin {margin}" if method != COMPARE_TEXT else ""
    if method == COMPARE_TOKEN_IDS and not got.token_ids and got.text:
        detail = "the answer carries no token ids (the baseline's did)"
    if method == COMPARE_TEXT:
        kind, expected, found = "text", _word_at(ref.text, position), _word_at(got.text, position)
        detail = f"first differing character at offset {position}"
    else:
        kind = "token" if both else "length"
        expected, found = _token_at(ref, position), _token_at(got, position)
    return Divergence(
        prompt=ref.prompt,
        position=position,
        kind=kind + kind_suffix,
        expected_token=expected,
        got_token=found,
        expected_text=ref.text,
        got_text=got.text,
        detail=detail,
    )


def comparable_answers(
    reference: Reference, answers: Sequence[Any], asked: Mapping[str, int], limit: int
) -> list[Any]:
    """The benchmark answers (``.prompt``) the reference can judge, at most ``limit``.

    Only answers asked with the reference's own length compare with it: a workload prompt that
    is also a check prompt was recorded at ``check.max_tokens``, and a longer benchmark answer
    to it is not a divergence. ``asked`` is the workload's length per prompt
    (``workload.reference_requests``).
    """
    return [
        a
        for a in answers
        if a.prompt in reference.entries
        and reference.max_tokens.get(a.prompt) == asked.get(a.prompt)
    ][:limit]


def compare_under_load(
    reference: Reference, prompt: str, token_ids: Sequence[int], text: str
) -> tuple[Divergence | None, str]:
    """One benchmark response against the reference (correctness under load).

    Compared by token ids where both have them, else by the text (every server streams text).
    Returns the divergence (or None) and the method used.
    """
    ref = reference.entries[prompt].completion
    method = COMPARE_TOKEN_IDS if ref.token_ids and token_ids else COMPARE_TEXT
    got = Completion(prompt=prompt, text=text, token_ids=tuple(token_ids))
    divergence = _first_divergence(reference, ref, got, method, kind_suffix="_under_load")
    return (None if divergence in (None, "tie_flip") else divergence), method


def _word_at(text: str, offset: int) -> str:
    """The whitespace-delimited word around ``offset`` (evidence for a text divergence)."""
    if offset >= len(text):
        return "<end of text>"
    start = text.rfind(" ", 0, offset + 1)
    start = 0 if start < 0 else start
    if start == offset and text[offset] == " ":
        start = offset
    end = text.find(" ", offset + 1)
    return text[start : len(text) if end < 0 else end]


def compare_tokens(
    reference: Reference, prompt: str, token_ids: Sequence[int], text: str
) -> Divergence | None:
    """Token-id comparison of one benchmark response (see :func:`compare_under_load`)."""
    ref = reference.entries[prompt].completion
    got = Completion(prompt=prompt, text=text, token_ids=tuple(token_ids))
    divergence = _first_divergence(reference, ref, got, COMPARE_TOKEN_IDS, "_under_load")
    return None if divergence in (None, "tie_flip") else divergence


def _token_at(completion: Completion, position: int) -> str | None:
    if position < len(completion.tokens):
        return completion.tokens[position]
    if position < len(completion.token_ids):
        return f"id:{completion.token_ids[position]}"
    return None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    diffs = [
        abs(x - y) for x, y in zip(a, b, strict=False) if x != float("-inf") and y != float("-inf")
    ]
    return max(diffs, default=0.0)


def describe_checks(check: dict[str, Any] | None) -> str:
    """One line naming the checks a trial's output actually passed (from its stored ``check``).

    Shown by ``show`` and written in the export header, so a reader knows what "verified" meant
    on this server: a check that did not run is not named.
    """
    if not check or not check.get("passed"):
        return "not verified"
    ran = check.get("checks")
    if not ran:
        # Recorded before the gate said which checks ran: claim none of them.
        return "passed (which checks ran was not recorded for this trial)"
    by = {
        COMPARE_TOKEN_IDS: "token ids",
        COMPARE_TOKEN_STRINGS: "per-token strings",
        COMPARE_TEXT: "text",
    }
    compared = by.get(ran.get("compared_by"), str(ran.get("compared_by")))
    parts = [f"{compared} ({check.get('prompts_checked')} prompts)"]
    if ran.get("teacher_forced"):
        parts.append(f"teacher-forced logprobs ({ran['teacher_forced']})")
    if ran.get("sanity"):
        parts.append("sanity")
    if ran.get("known_answers"):
        parts.append(f"{ran['known_answers']} known answers")
    compared = check.get("under_load_compared_by") or {}
    if compared:
        how = ", ".join(f"{n} by {by.get(m, m)}" for m, n in sorted(compared.items()))
        parts.append(f"under load ({how})")
    return "; ".join(parts)
