"""What the correctness gate keeps and says: the pinned reference and the verdict.

Data only, no I/O: the reference a baseline records (:class:`Reference`, with the
:class:`Capabilities` its answers showed), one answer (:class:`Completion`), where a trial left the
reference (:class:`Divergence`) and the gate's verdict (:class:`CheckResult`). Stored in a study
as JSON (``to_dict``/``from_dict``), so their field names are part of the stored format.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.engines.dialect import TEACHER_ECHO, TEACHER_PROMPT_LOGPROBS

#: how outputs are compared, best first: token ids, per-token strings, the text itself
COMPARE_TOKEN_IDS = "token_ids"
COMPARE_TOKEN_STRINGS = "token_strings"
COMPARE_TEXT = "text"

#: how a near-tie token flip was excused (``CheckResult.checks["tie_flips_by"]``): only a flip to
#: the reference's runner-up token, or (the fallback without runner-ups or per-token strings)
#: any flip at a position whose top-2 margin is close
TIE_FLIPS_BY_RUNNER_UP = "runner_up"
TIE_FLIPS_BY_MARGIN = "margin_only"


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
    #: per position, the second most likely token (its string, as ``top_logprobs`` names it):
    #: a near-tie flip is excused only to this token, not to any token at a close position
    runner_ups: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class Capabilities:
    """What this server's answers let the gate check, learned from the baseline's answers.

    Servers differ: vLLM returns token ids, per-token logprobs and scores a given continuation
    (its dialect's prompt scoring); llama.cpp, TGI, SGLang and most proxies return text, sometimes
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

    @property
    def compares_logprobs(self) -> bool:
        """Whether the gate compares logprobs on this server (per-token or teacher-forced):
        only then do a logprob tolerance and a baseline drift mean anything."""
        return self.token_logprobs or bool(self.teacher_forced)

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
            instead = (
                "the greedy tokens' own logprobs are compared instead, where the tokens agree"
                if self.token_logprobs and self.token_strings
                else "the teacher-forced logprob check is skipped"
            )
            out.append(
                f"server scores no given continuation (neither {TEACHER_PROMPT_LOGPROBS} nor "
                f"{TEACHER_ECHO} with logprobs); {instead}"
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
                # absent from references recorded before runner-ups were kept
                runner_ups=tuple(c.get("runner_ups", ())),
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
    #: the benchmark phase of an answer judged under load (``single-request (round 1)``,
    #: ``load at 4 (round 2)``); empty for the quiet check
    phase: str = ""


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    prompts_checked: int
    max_logprob_drift: float = 0.0
    tie_flips: int = 0
    first_divergence: Divergence | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)
    #: the checks that actually ran, e.g. ``{"compared_by": "token_ids", "tie_flips_by":
    #: "runner_up", "teacher_forced": "prompt_logprobs", "sanity": True, "known_answers": 2}``;
    #: a check absent here never ran (``tie_flips_by`` None: no near-tie flip could be excused)
    checks: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["problems"] = list(self.problems)
        return out


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
    tie_flips = {
        TIE_FLIPS_BY_RUNNER_UP: "near-tie flips excused to the runner-up only",
        TIE_FLIPS_BY_MARGIN: "near-tie flips excused by the margin alone",
    }
    if ran.get("tie_flips_by"):
        parts.append(tie_flips.get(ran["tie_flips_by"], f"near-tie flips by {ran['tie_flips_by']}"))
    if ran.get("teacher_forced"):
        parts.append(f"teacher-forced logprobs ({ran['teacher_forced']})")
    if ran.get("greedy_logprobs"):
        parts.append("the greedy tokens' logprobs")
    if ran.get("sanity"):
        parts.append("sanity")
    if ran.get("known_answers"):
        parts.append(f"{ran['known_answers']} known answers")
    compared = check.get("under_load_compared_by") or {}
    if compared:
        how = ", ".join(f"{n} by {by.get(m, m)}" for m, n in sorted(compared.items()))
        rule = check.get("under_load_tie_flips_by")
        if rule:
            how += "; " + tie_flips.get(rule, f"near-tie flips by {rule}")
        unreferenced = check.get("under_load_unreferenced")
        if unreferenced:
            how += (
                f"; {unreferenced} of {check.get('under_load_answers')} answers were to prompts "
                "outside the reference, unchecked"
            )
        parts.append(f"under load ({how})")
    replay = check.get("replay")  # the fresh-prompt control (bench/replay.py)
    if replay:  # a flagged ratio (a speculating launch's) or a check not run says its reason
        ok = replay.get("checked") and not replay.get("flagged")
        # the controls' answers are timed, never judged (no reference holds them): a server
        # that knows them for new prompts and answers them at once with anything is not seen
        seen = f"no cache replay seen, controls timed not judged ({replay['reason']})"
        parts.append(seen if ok else replay["reason"])
    return "; ".join(parts)
