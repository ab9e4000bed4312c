"""The correctness gate: a trial's output against the pinned reference, before any scoring.

Policy (also in docs/guide/gate.md):

* The baseline (engine defaults, no patches) records the **reference**: for every check prompt
  and every workload prompt, the greedy continuation with its token ids, each token's logprob
  and the margin between the top-1 and top-2 candidates; and, for the check prompts, the
  *teacher-forced* logprobs of that continuation (prompt + reference tokens sent back to be
  scored, in the engine's dialect), so a trial can be scored on exactly the same token sequence.
* The baseline measures its own **repeat-to-repeat variation**: the same requests again, once
  one at a time and once all at once (a different batch shape, the legitimate source of
  numeric noise). The logprob tolerance is ``max(floor, 4 x the largest drift it saw)`` unless
  the spec pins ``check.logprob_tolerance``. Both numbers are stored with the reference.
* A trial passes when, for every prompt: (1) its greedy tokens equal the reference's, except
  that a divergence at a position whose reference top-1/top-2 margin is within twice the
  tolerance, to the reference's runner-up token there, is a tie flip, accepted and comparison
  stops there (a flip to another token is not; without the runner-up, a reference recorded
  before it was kept or an answer without per-token strings, the margin alone decides);
  (2) its teacher-forced logprobs differ from the reference's by at most the tolerance at
  every position (on a server that scores no given continuation, the logprobs of its greedy
  tokens where they agree with the reference's: ``judge.greedy_logprob_drift``); (3) sanity
  holds (not empty, not whitespace-only, no runaway repetition, no non-printable characters)
  wherever the reference itself was sane; (4) known-answer prompts match their regular
  expressions.
* Anything else fails the trial as ``incorrect_output`` with the first divergent position and
  both texts. A failed trial gets no performance score.

This module is the gate's entry (:func:`record_reference` at the baseline, :func:`collect_outputs`
then :func:`compare` for a trial) and re-exports the gate's names; the parts live beside it:
``reference.py`` (the reference and verdict types), ``requests.py`` (the requests, in the
engine's dialect) and ``judge.py`` (the judgement, pure).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import httpx

from autotune.engines.dialect import RequestDialect
from autotune.errors import excerpt
from autotune.gate.judge import (
    common_prefix,
    max_abs_diff,
    units,
)
from autotune.gate.reference import (
    Capabilities,
    Completion,
    Reference,
    ReferenceEntry,
    TeacherRejected,
)
from autotune.gate.requests import (
    TeacherUnsupported,
    detect_teacher_mode,
    gather_completions,
    teacher_forced_logprobs,
)
from autotune.spec.model import CheckSpec

#: the derived tolerance is this many times the largest drift the baseline showed itself
TOLERANCE_MULTIPLIER = 4.0


async def collect_outputs(
    client: httpx.AsyncClient,
    model: str,
    reference: Reference,
    prompts: Sequence[str],
    *,
    dialect: RequestDialect,
    concurrent: bool = False,
    deadline_s: float | None = 60.0,
) -> tuple[dict[str, Completion], dict[str, tuple[float, ...]]]:
    """The trial's greedy completions and teacher-forced logprobs for ``prompts``."""
    max_tokens = {p: reference.max_tokens[p] for p in prompts}
    completions = await gather_completions(
        client,
        model,
        prompts,
        max_tokens,
        dialect=dialect,
        concurrent=concurrent,
        deadline_s=deadline_s,
    )
    teacher = {}
    mode = reference.capabilities.teacher_forced
    for prompt in prompts:
        entry = reference.entries[prompt]
        if mode and entry.teacher_logprobs:
            try:
                teacher[prompt] = await teacher_forced_logprobs(
                    client,
                    model,
                    entry.completion,
                    dialect=dialect,
                    mode=mode,
                    deadline_s=deadline_s,
                )
            except (httpx.HTTPStatusError, TeacherUnsupported) as exc:
                # The baseline could score it, this config cannot (seen: a broken model whose
                # logprobs are not finite, which JSON cannot carry): the gate fails it.
                if isinstance(exc, httpx.HTTPStatusError):
                    exc = f"{exc.response.status_code}: {excerpt(exc.response.text)}"
                teacher[prompt] = TeacherRejected(str(exc))
    return {c.prompt: c for c in completions}, teacher


async def record_reference(
    client: httpx.AsyncClient,
    model: str,
    check: CheckSpec,
    workload_prompts: Sequence[str],
    workload_max_tokens: int | Mapping[str, int],
    *,
    dialect: RequestDialect,
    engine_version: str = "",
    deadline_s: float | None = 60.0,
) -> Reference:
    """Run the baseline's greedy outputs twice (alone, then batched) and pin the reference.

    Every request asks for fixed-length generation (where the engine's dialect allows) so
    lengths are fixed and comparable. What the answers
    carry (token ids, per-token strings, logprobs, a way to teacher-force) is recorded as the
    reference's :class:`Capabilities`: every later trial is judged with exactly those checks.
    """
    max_tokens = {p: check.max_tokens for p in check.prompts}
    for prompt in workload_prompts:
        if isinstance(workload_max_tokens, int):
            max_tokens.setdefault(prompt, workload_max_tokens)
        else:  # one length per prompt (reference_prompts.reference_requests)
            max_tokens.setdefault(prompt, workload_max_tokens[prompt])
    prompts = list(max_tokens)
    alone = await gather_completions(
        client, model, prompts, max_tokens, dialect=dialect, concurrent=False, deadline_s=deadline_s
    )
    batched = await gather_completions(
        client, model, prompts, max_tokens, dialect=dialect, concurrent=True, deadline_s=deadline_s
    )
    checked = [c for c in alone if c.prompt in check.prompts]
    teacher_mode = None
    if checked and checked[0].text:
        teacher_mode = await detect_teacher_mode(
            client, model, checked[0], deadline_s, dialect=dialect
        )
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
        common = common_prefix(units(a, method), units(b, method))
        if common < max(len(units(a, method)), len(units(b, method))):
            unstable += 1
        if capabilities.token_logprobs:
            for i in range(min(common, len(a.logprobs), len(b.logprobs))):
                drift = max(drift, abs(a.logprobs[i] - b.logprobs[i]))
    teacher_alone: dict[str, tuple[float, ...]] = {}
    if teacher_mode:
        for completion in checked:
            teacher_alone[completion.prompt] = await teacher_forced_logprobs(
                client, model, completion, dialect=dialect, mode=teacher_mode, deadline_s=deadline_s
            )
        teacher_batched = await asyncio.gather(
            *(
                teacher_forced_logprobs(
                    client, model, c, dialect=dialect, mode=teacher_mode, deadline_s=deadline_s
                )
                for c in checked
            )
        )
        for first, second in zip(teacher_alone.values(), teacher_batched, strict=True):
            drift = max(drift, max_abs_diff(first, second))
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
