"""The gate's judgement: a trial's answers against the reference, pure (no I/O).

Token ids, per-token strings or the text itself (``Capabilities.comparison``), near-tie flips
excused by the reference's top-2 margin, teacher-forced logprobs within the tolerance, sanity
and known answers (:func:`compare`); and one benchmark answer against the reference, for the
correctness-under-load check (:func:`comparable_answers`, :func:`compare_under_load`).
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import regex

from autotune.gate.reference import (
    COMPARE_TEXT,
    COMPARE_TOKEN_IDS,
    COMPARE_TOKEN_STRINGS,
    TIE_FLIPS_BY_MARGIN,
    TIE_FLIPS_BY_RUNNER_UP,
    CheckResult,
    Completion,
    Divergence,
    Reference,
    TeacherRejected,
)
from autotune.spec.model import CheckSpec


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
    rules: set[str] = set()
    # no teacher-forced scoring on this server: the greedy tokens' own logprobs instead
    greedy_logprobs = (
        reference.capabilities.teacher_forced is None
        and reference.capabilities.token_logprobs
        and method != COMPARE_TEXT
    )
    for prompt, got in completions.items():
        ref = reference.entries[prompt].completion
        rule = tie_flip_rule(ref, got, method)
        if rule is not None:
            rules.add(rule)
        divergence = _first_divergence(reference, ref, got, method)
        if divergence is None and method != COMPARE_TEXT:
            divergence = text_divergence(ref, got)  # the same tokens must read the same
        if divergence == "tie_flip":
            tie_flips += 1
        elif divergence is not None:
            fail(divergence, f"{prompt!r}: {divergence.kind} {divergence.position} differs")
        if greedy_logprobs:
            drift, divergence = greedy_logprob_drift(ref, got, method, tol)
            max_drift = max(max_drift, drift)
            if divergence is not None:
                fail(divergence, f"{prompt!r}: {divergence.detail} at {divergence.position}")
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
            if len(teacher[prompt]) != len(expected):
                # scored on the same server the same way, the counts match unless the answer
                # is cut short; comparing the overlap would let a short answer pass unseen
                fail(
                    Divergence(
                        prompt=prompt,
                        position=min(len(teacher[prompt]), len(expected)),
                        kind="logprob",
                        expected_text=ref.text,
                        got_text=got.text,
                        detail=(
                            f"teacher-forced scoring covered {len(teacher[prompt])} tokens, "
                            f"the reference's {len(expected)}"
                        ),
                    ),
                    f"{prompt!r}: teacher-forced scoring covered a different number of tokens",
                )
            diffs = [logprob_gap(a, b) for a, b in zip(expected, teacher[prompt], strict=False)]
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
                            detail=drift_detail(
                                expected[worst], teacher[prompt][worst], "logprob", tol
                            ),
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
            if got is None:
                continue
            matched = _search(answer.expect, got.text)
            if matched is not True:
                detail = (
                    f"does not match /{answer.expect}/"
                    if matched is False
                    else f"/{answer.expect}/ could not be matched within "
                    f"{KNOWN_ANSWER_TIMEOUT_S:g} s (a pattern that backtracks without end): "
                    "rewrite it in check.known_answers"
                )
                fail(
                    Divergence(
                        prompt=answer.prompt,
                        position=0,
                        kind="known_answer",
                        expected_text=answer.expect,
                        got_text=got.text,
                        detail=detail,
                    ),
                    f"{answer.prompt!r}: known answer /{answer.expect}/ "
                    + ("not found" if matched is False else "could not be checked (timed out)"),
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
            # the weaker rule if any prompt fell back to it: the record must not overstate
            "tie_flips_by": weakest_tie_rule(rules),
            "teacher_forced": reference.capabilities.teacher_forced if teacher else None,
            "greedy_logprobs": len(completions) if greedy_logprobs else None,
            "sanity": True,
            "known_answers": known,
        },
    )


def greedy_logprob_drift(
    ref: Completion, got: Completion, method: str, tolerance: float
) -> tuple[float, Divergence | None]:
    """The largest difference between the logprobs ``ref`` and ``got`` gave their greedy
    tokens where those tokens agree, and the divergence when it exceeds ``tolerance``.

    For a server that scores no given continuation (llama.cpp's ignores ``echo`` and prompt
    scoring): up to the first differing token both answers are conditioned on the same
    prefix, so each token's logprob there is exactly what teacher-forced scoring would give.
    Without it, a config that keeps every greedy token but moves the distribution (a
    quantised KV cache) passed unseen. An answer without the logprobs the reference has fails:
    the check cannot run on it.
    """
    compared = min(common_prefix(units(ref, method), units(got, method)), len(ref.logprobs))
    if len(got.logprobs) < compared:
        position, detail = len(got.logprobs), "no logprob for this token (the baseline had one)"
        return 0.0, _logprob_divergence(ref, got, position, detail)
    diffs = [
        logprob_gap(a, b)
        for a, b in zip(ref.logprobs[:compared], got.logprobs[:compared], strict=True)
    ]
    if not diffs:
        return 0.0, None
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    if diffs[worst] <= tolerance:
        return diffs[worst], None
    detail = drift_detail(
        ref.logprobs[worst], got.logprobs[worst], "greedy-token logprob", tolerance
    )
    return diffs[worst], _logprob_divergence(ref, got, worst, detail)


def logprob_gap(expected: float, got: float) -> float:
    """How far ``got`` is from ``expected``: 0 when equal (two ``-inf`` too), infinite when
    either is NaN or only one is infinite. ``abs(a - b)`` alone gives NaN there, and a NaN
    compares False with everything, so it passed every tolerance and hid every other drift
    of its answer (``max`` keeps a leading NaN as the worst)."""
    if expected == got:
        return 0.0
    gap = abs(expected - got)
    return gap if math.isfinite(gap) else math.inf


def drift_detail(expected: float, got: float, what: str, tolerance: float) -> str:
    """The divergence's detail: the drift against the tolerance, or both values where the
    drift is not a number (a NaN or an infinity the reference does not have)."""
    gap = logprob_gap(expected, got)
    if math.isfinite(gap):
        return f"{what} drift {gap:.4f} > tolerance {tolerance:.4f}"
    return f"{what} {got!r} where the reference has {expected!r} (not a finite drift)"


def _logprob_divergence(ref: Completion, got: Completion, position: int, detail: str) -> Divergence:
    return Divergence(
        prompt=ref.prompt,
        position=position,
        kind="logprob",
        expected_token=_token_at(ref, position),
        got_token=_token_at(got, position),
        expected_text=ref.text,
        got_text=got.text,
        detail=detail,
    )


def units(completion: Completion, method: str) -> Sequence[Any]:
    """The sequence a comparison walks: token ids, per-token strings, or characters."""
    if method == COMPARE_TOKEN_IDS:
        return completion.token_ids
    if method == COMPARE_TOKEN_STRINGS:
        return completion.tokens
    return completion.text


def tie_flip_rule(ref: Completion, got: Completion, method: str) -> str | None:
    """Which rule excuses a near-tie flip of ``got`` from ``ref``, or None where none can be.

    ``TIE_FLIPS_BY_RUNNER_UP`` (only a flip to the reference's runner-up token) needs the
    reference's runner-ups and the answer's per-token strings. Without either, a reference
    recorded before runner-ups were kept or an answer compared by ids alone (under load), the
    older ``TIE_FLIPS_BY_MARGIN`` applies: any token at a close position is excused. None for a
    text comparison or a reference without top-2 margins, where no flip is excused at all.
    This is the rule :func:`_first_divergence` applies; :func:`compare` records it
    (``checks["tie_flips_by"]``) so a verdict says which rule excused its flips.
    """
    if method == COMPARE_TEXT or all(m is None for m in ref.margins):
        return None
    if ref.runner_ups and got.tokens:
        return TIE_FLIPS_BY_RUNNER_UP
    return TIE_FLIPS_BY_MARGIN


def _first_divergence(
    reference: Reference, ref: Completion, got: Completion, method: str, kind_suffix: str = ""
) -> Divergence | str | None:
    """Where ``got`` first leaves ``ref``: None (equal), ``"tie_flip"`` (excused), or the
    :class:`Divergence`. Tie flips need the reference's top-2 margin at that token, so they
    exist only for token-wise comparisons of a server that gives top-2 logprobs."""
    a, b = units(ref, method), units(got, method)
    position = common_prefix(a, b)
    if position >= max(len(a), len(b)):
        return None
    both = position < min(len(a), len(b))
    margin = None
    if method != COMPARE_TEXT and position < len(ref.margins):
        margin = ref.margins[position]
    near_tie = both and margin is not None and margin <= 2 * reference.tolerance
    if near_tie:
        # a near tie excuses a flip to the other side of the tie, not to any token: a broken
        # config whose output leaves the reference at a close position is still wrong (on a
        # workload prompt nothing else, no teacher-forced check, would say so)
        runner_up = ref.runner_ups[position] if position < len(ref.runner_ups) else None
        chosen = got.tokens[position] if position < len(got.tokens) else None
        if runner_up is None or chosen is None or chosen == runner_up:
            return "tie_flip"
    detail = f"reference top-2 margin {margin}" if method != COMPARE_TEXT else ""
    if near_tie:
        detail += f": a near tie, but not to the reference's runner-up {runner_up!r}"
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


def text_divergence(ref: Completion, got: Completion) -> Divergence | None:
    """Where the text of an answer whose tokens all match the reference's first differs from
    the reference's text, or None. Users read the text: a config that keeps the token ids
    and changes what they detokenize to (a tokenizer mode, a special-token setting, a server
    that rewrites its text) changes the output. Both texts come from the same streamed
    request on the same engine, so a correct config's text is the reference's exactly."""
    if got.text == ref.text:
        return None
    offset = common_prefix(ref.text, got.text)
    return Divergence(
        prompt=ref.prompt,
        position=offset,
        kind="text",
        expected_token=_word_at(ref.text, offset),
        got_token=_word_at(got.text, offset),
        expected_text=ref.text,
        got_text=got.text,
        detail=f"the same tokens, a different text from character {offset}",
    )


#: up to this many benchmark answers, every one is judged (about a second of comparisons)
JUDGE_EVERY_UP_TO = 4096


def comparable_answers(
    reference: Reference,
    answers: Sequence[Any],
    asked: Mapping[str, int],
    limit: int,
    *,
    rounds: int = 1,
) -> list[Any]:
    """The benchmark answers (``.prompt``) the reference can judge: **every one** up to
    :data:`JUDGE_EVERY_UP_TO` (judging is pure computation), else a sample of at most
    ``limit`` (``check.under_load_sample``, raised to that ceiling) but never fewer than one
    a round (``rounds``), one a phase (``.phase``: the single-request phase, each load level
    and goodput probe of each round) and one a prompt: a server that goes wrong in a late
    round, only when it serves one request at a time, or only on some prompts, is sampled
    there.

    A sample of 9 of 34 answers, drawn the same way on every launch, let a red team's server
    wrong on every 17th answer pass its trial and two confirmation launches as a confirmed
    gain: hence every answer. Where a sample is drawn, which answer stands for a window, a
    phase or a prompt is drawn at random, afresh on every call, never the first or any fixed
    position, which a server (or a periodic fault) would pass by being wrong elsewhere.

    Only answers asked with the reference's own length compare with it: a workload prompt that
    is also a check prompt was recorded at ``check.max_tokens``, and a longer benchmark answer
    to it is not a divergence. ``asked`` is the workload's length per prompt
    (``reference_prompts.single_length_prompts``).
    """
    eligible = [
        a
        for a in answers
        if a.prompt in reference.entries
        and reference.max_tokens.get(a.prompt) == asked.get(a.prompt)
    ]
    limit = max(limit, rounds, JUDGE_EVERY_UP_TO)
    if len(eligible) <= limit:
        return eligible
    rng = random.Random(secrets.randbits(64))
    picked = stratified(eligible, limit, rng)
    for attribute in ("phase", "prompt"):
        covered = {getattr(a, attribute, "") for a in picked}
        groups: dict[str, list[Any]] = {}
        for answer in eligible:
            groups.setdefault(getattr(answer, attribute, ""), []).append(answer)
        picked += [rng.choice(group) for key, group in groups.items() if key not in covered]
    order = {id(a): i for i, a in enumerate(eligible)}
    return sorted({id(a): a for a in picked}.values(), key=lambda a: order[id(a)])


def stratified(answers: Sequence[Any], limit: int, rng: random.Random) -> list[Any]:
    """``limit`` of ``answers`` (in benchmark order, round after round): the answers cut into
    ``limit`` consecutive windows of equal length (so every round has its share), and from
    each window an answer, at random, to a prompt picked least so far (so the prompts share
    the sample). In benchmark order."""
    picked: list[Any] = []
    used: dict[str, int] = {}
    n = len(answers)
    for i in range(limit):
        window = answers[(i * n) // limit : ((i + 1) * n) // limit]
        fewest = min(used.get(a.prompt, 0) for a in window)
        choice = rng.choice([a for a in window if used.get(a.prompt, 0) == fewest])
        used[choice.prompt] = used.get(choice.prompt, 0) + 1
        picked.append(choice)
    return picked


def compare_under_load(
    reference: Reference, prompt: str, token_ids: Sequence[int], text: str
) -> tuple[Divergence | None, str]:
    """One benchmark response against the reference (correctness under load).

    Compared by token ids where both have them, else by the text (every server streams text);
    an answer whose ids all match must also read as the reference's text.
    Returns the divergence (or None) and the method used.
    """
    ref = reference.entries[prompt].completion
    method = COMPARE_TOKEN_IDS if ref.token_ids and token_ids else COMPARE_TEXT
    got = Completion(prompt=prompt, text=text, token_ids=tuple(token_ids))
    divergence = _first_divergence(reference, ref, got, method, kind_suffix="_under_load")
    if divergence is None and method == COMPARE_TOKEN_IDS:
        # streamed like the reference's answer, by the same engine: the same ids read the same
        found = text_divergence(ref, got)
        if found is not None:
            divergence = replace(found, kind="text_under_load")
    return (None if divergence in (None, "tie_flip") else divergence), method


#: how long one known-answer pattern may take on one answer: a pattern like ``(a+)+$`` takes
#: longer than the age of the universe on 40 characters, and the gate must still answer
KNOWN_ANSWER_TIMEOUT_S = 2.0


def _search(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` occurs in ``text`` (``re`` syntax, checked at load), or None when it
    could not be decided within :data:`KNOWN_ANSWER_TIMEOUT_S`: not a pass, never silently."""
    try:
        return regex.search(pattern, text, timeout=KNOWN_ANSWER_TIMEOUT_S) is not None
    except TimeoutError:
        return None


def weakest_tie_rule(rules: Collection[str | None]) -> str | None:
    """The rule a record of several answers states: the margin alone if any answer was judged
    by it (the record must not overstate the check), else the runner-up rule, else None."""
    if TIE_FLIPS_BY_MARGIN in rules:
        return TIE_FLIPS_BY_MARGIN
    return TIE_FLIPS_BY_RUNNER_UP if TIE_FLIPS_BY_RUNNER_UP in rules else None


def under_load_tie_flips_by(reference: Reference, prompt: str, method: str) -> str | None:
    """The near-tie rule :func:`compare_under_load` applied to an answer to ``prompt``
    compared by ``method`` (:func:`tie_flip_rule`): a streamed benchmark answer carries token
    ids but no per-token strings, so a flip at a close position is excused by the margin alone
    there. Recorded beside the under-load counts so that a verdict says so."""
    ref = reference.entries[prompt].completion
    return tie_flip_rule(ref, Completion(prompt=prompt, text="", token_ids=()), method)


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


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    diffs = [
        abs(x - y) for x, y in zip(a, b, strict=False) if x != float("-inf") and y != float("-inf")
    ]
    return max(diffs, default=0.0)


@dataclass(frozen=True)
class UnderLoadResult:
    """The correctness-under-load check of one benchmark: what was compared, and how."""

    #: the answers compared (never the answers seen): one a round at least
    checked: int
    divergences: tuple[Divergence, ...]
    #: how many were compared by each method (token ids, text)
    compared_by: dict[str, int] = field(default_factory=dict)
    #: the weakest rule that excused a near-tie flip in any of them (None: none needed)
    tie_flips_by: str | None = None
    #: answers seen, and of them those no reference covers (a prompt outside the recorded
    #: ones, or asked with another length): never compared, so said, never counted as checked
    answers: int = 0
    unreferenced: int = 0


def judge_under_load(
    reference: Reference,
    answers: Sequence[Any],
    asked: Mapping[str, int],
    limit: int,
    *,
    rounds: int = 1,
) -> UnderLoadResult:
    """Benchmark answers (``.prompt``, ``.token_ids``, ``.text``), at the batch shapes where
    batching bugs live, against the reference: a sample of :func:`comparable_answers`, each
    compared by token ids where it and the reference have them, else by its text."""
    sample = comparable_answers(reference, answers, asked, limit, rounds=rounds)
    unreferenced = sum(
        1
        for a in answers
        if a.prompt not in reference.entries
        or reference.max_tokens.get(a.prompt) != asked.get(a.prompt)
    )
    divergences = []
    methods: dict[str, int] = {}
    rules: set[str | None] = set()
    for record in sample:
        divergence, method = compare_under_load(
            reference, record.prompt, record.token_ids, record.text
        )
        methods[method] = methods.get(method, 0) + 1
        rules.add(under_load_tie_flips_by(reference, record.prompt, method))
        if divergence is not None:
            divergences.append(replace(divergence, phase=getattr(record, "phase", "")))
    # the weaker rule wins the record: one answer excused by the margin alone is enough
    return UnderLoadResult(
        len(sample),
        tuple(divergences),
        methods,
        weakest_tie_rule(rules),
        answers=len(answers),
        unreferenced=unreferenced,
    )
