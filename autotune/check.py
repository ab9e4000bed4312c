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
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from autotune.spec import CheckSpec

#: the derived tolerance is this many times the largest drift the baseline showed itself
TOLERANCE_MULTIPLIER = 4.0


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
    timeout_s: float = 60.0,
) -> Completion:
    """A greedy, non-streaming completion with token ids and top-2 logprobs."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": 2,
        "return_token_ids": True,
        "ignore_eos": ignore_eos,
    }
    response = await client.post("/v1/completions", json=body, timeout=timeout_s)
    if response.status_code == 400 and "Out of range float" in response.text:
        # A runner-up with probability 0 (logprob -inf, which JSON cannot carry) makes vLLM
        # refuse the whole answer. Ask for the chosen tokens' logprobs only: without a finite
        # runner-up there is no near-tie, which is what a missing margin means in compare().
        body["logprobs"] = 1
        response = await client.post("/v1/completions", json=body, timeout=timeout_s)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    lp = choice.get("logprobs") or {}
    tokens = tuple(lp.get("tokens") or ())
    logprobs = tuple(float(x) if x is not None else 0.0 for x in lp.get("token_logprobs") or ())
    margins = tuple(_margin(top) for top in lp.get("top_logprobs") or ())
    return Completion(
        prompt=prompt,
        text=choice.get("text") or "",
        token_ids=tuple(choice.get("token_ids") or ()),
        tokens=tokens,
        logprobs=logprobs,
        margins=margins,
        prompt_token_ids=tuple(choice.get("prompt_token_ids") or ()),
    )


def _margin(top: dict[str, float] | None) -> float | None:
    if not top or len(top) < 2:
        return None
    best = sorted(top.values(), reverse=True)
    return float(best[0] - best[1])


async def teacher_forced_logprobs(
    client: httpx.AsyncClient, model: str, reference: Completion, *, timeout_s: float = 60.0
) -> tuple[float, ...]:
    """Logprobs the server gives the reference continuation when it is fed back as prompt."""
    ids = list(reference.prompt_token_ids) + list(reference.token_ids)
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }
    response = await client.post("/v1/completions", json=body, timeout=timeout_s)
    response.raise_for_status()
    entries = response.json()["choices"][0].get("prompt_logprobs") or []
    start = len(reference.prompt_token_ids)
    out = []
    for position, token_id in enumerate(reference.token_ids, start=start):
        entry = entries[position] if position < len(entries) else None
        value = None
        if entry:
            item = entry.get(str(token_id)) or entry.get(token_id)
            if item is not None:
                value = item["logprob"] if isinstance(item, dict) else float(item)
        out.append(float(value) if value is not None else float("-inf"))
    return tuple(out)


async def _gather_completions(
    client, model, prompts, max_tokens, *, concurrent: bool, ignore_eos: dict[str, bool]
) -> list[Completion]:
    async def one(prompt: str) -> Completion:
        return await complete_greedy(
            client, model, prompt, max_tokens[prompt], ignore_eos=ignore_eos[prompt]
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
) -> tuple[dict[str, Completion], dict[str, tuple[float, ...]]]:
    """The trial's greedy completions and teacher-forced logprobs for ``prompts``."""
    max_tokens = {p: reference.max_tokens[p] for p in prompts}
    ignore = {p: True for p in prompts}
    completions = await _gather_completions(
        client, model, prompts, max_tokens, concurrent=concurrent, ignore_eos=ignore
    )
    teacher = {}
    for prompt in prompts:
        entry = reference.entries[prompt]
        if entry.teacher_logprobs:
            try:
                teacher[prompt] = await teacher_forced_logprobs(client, model, entry.completion)
            except httpx.HTTPStatusError as exc:
                # A live server that cannot score the reference continuation (seen: a broken
                # model whose logprobs are not finite, which JSON cannot carry) fails the gate.
                teacher[prompt] = TeacherRejected(
                    f"{exc.response.status_code}: {exc.response.text[:200]}"
                )
    return {c.prompt: c for c in completions}, teacher


async def record_reference(
    client: httpx.AsyncClient,
    model: str,
    check: CheckSpec,
    workload_prompts: Sequence[str],
    workload_max_tokens: int,
    *,
    engine_version: str = "",
) -> Reference:
    """Run the baseline's greedy outputs twice (alone, then batched) and pin the reference.

    ``ignore_eos`` is set on every request so lengths are fixed and comparable.
    """
    max_tokens = {p: check.max_tokens for p in check.prompts}
    for prompt in workload_prompts:
        max_tokens.setdefault(prompt, workload_max_tokens)
    prompts = list(max_tokens)
    ignore = {p: True for p in prompts}
    alone = await _gather_completions(
        client, model, prompts, max_tokens, concurrent=False, ignore_eos=ignore
    )
    batched = await _gather_completions(
        client, model, prompts, max_tokens, concurrent=True, ignore_eos=ignore
    )
    drift = 0.0
    for a, b in zip(alone, batched, strict=True):
        common = _common_prefix(a.token_ids, b.token_ids)
        for i in range(common):
            drift = max(drift, abs(a.logprobs[i] - b.logprobs[i]))
    entries: dict[str, ReferenceEntry] = {}
    teacher_alone = {}
    for completion in alone:
        if completion.prompt in check.prompts:
            teacher_alone[completion.prompt] = await teacher_forced_logprobs(
                client, model, completion
            )
    teacher_batched = await asyncio.gather(
        *(teacher_forced_logprobs(client, model, c) for c in alone if c.prompt in teacher_alone)
    )
    for first, second in zip(teacher_alone.values(), teacher_batched, strict=True):
        drift = max(drift, _max_abs_diff(first, second))
    for completion in alone:
        entries[completion.prompt] = ReferenceEntry(
            completion, teacher_alone.get(completion.prompt, ())
        )
    tolerance = check.logprob_tolerance
    if tolerance is None:
        tolerance = max(check.tolerance_floor, TOLERANCE_MULTIPLIER * drift)
    return Reference(
        entries=entries,
        max_tokens=max_tokens,
        tolerance=float(tolerance),
        drift_observed=float(drift),
        engine_version=engine_version,
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

    for prompt, got in completions.items():
        ref = reference.entries[prompt].completion
        position = _common_prefix(ref.token_ids, got.token_ids)
        if position < max(len(ref.token_ids), len(got.token_ids)):
            margin = ref.margins[position] if position < len(ref.margins) else None
            if (
                position < len(ref.token_ids)
                and position < len(got.token_ids)
                and margin is not None
                and margin <= 2 * tol
            ):
                tie_flips += 1
            else:
                kind = (
                    "token" if position < min(len(ref.token_ids), len(got.token_ids)) else "length"
                )
                fail(
                    Divergence(
                        prompt=prompt,
                        position=position,
                        kind=kind,
                        expected_token=_token_at(ref, position),
                        got_token=_token_at(got, position),
                        expected_text=ref.text,
                        got_text=got.text,
                        detail=f"reference top-2 margin {margin}",
                    ),
                    f"{prompt!r}: token {position} differs",
                )
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
    if check is not None:
        for answer in check.known_answers:
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
    )


def compare_tokens(
    reference: Reference, prompt: str, token_ids: Sequence[int], text: str
) -> Divergence | None:
    """Token-only comparison for benchmark responses (correctness under load)."""
    ref = reference.entries[prompt].completion
    position = _common_prefix(ref.token_ids, tuple(token_ids))
    if position >= max(len(ref.token_ids), len(token_ids)):
        return None
    margin = ref.margins[position] if position < len(ref.margins) else None
    if (
        position < min(len(ref.token_ids), len(token_ids))
        and margin is not None
        and margin <= 2 * reference.tolerance
    ):
        return None
    got_id = token_ids[position] if position < len(token_ids) else None
    return Divergence(
        prompt=prompt,
        position=position,
        kind="token_under_load",
        expected_token=_token_at(ref, position),
        got_token=f"id:{got_id}",
        expected_text=ref.text,
        got_text=text,
    )


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
