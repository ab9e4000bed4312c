"""The correctness gate: a config's output is compared with the pinned reference before any
speed is measured (the policy: docs/guide/gate.md).

* :mod:`~autotune.gate.run` -- record the reference, collect a config's outputs, judge them;
* :mod:`~autotune.gate.reference` -- what the reference holds and what the engine can give;
* :mod:`~autotune.gate.requests` -- the greedy and teacher-forced requests;
* :mod:`~autotune.gate.judge` -- the comparison itself (pure: tokens, logprobs, ties).
"""

from __future__ import annotations

from autotune.engines.dialect import (
    TEACHER_ECHO,
    TEACHER_PROMPT_LOGPROBS,
)
from autotune.gate.judge import (
    comparable_answers,
    compare,
    compare_tokens,
    compare_under_load,
    judge_under_load,
    sanity_problem,
    under_load_tie_flips_by,
    weakest_tie_rule,
)
from autotune.gate.reference import (
    COMPARE_TEXT,
    COMPARE_TOKEN_IDS,
    COMPARE_TOKEN_STRINGS,
    Capabilities,
    CheckResult,
    Completion,
    Divergence,
    Reference,
    ReferenceEntry,
    TeacherRejected,
    describe_checks,
)
from autotune.gate.requests import (
    TeacherUnsupported,
    complete_greedy,
    detect_teacher_mode,
    gather_completions,
    teacher_forced_logprobs,
)
from autotune.gate.run import (
    TOLERANCE_MULTIPLIER,
    collect_outputs,
    record_reference,
)

__all__ = [
    "COMPARE_TEXT",
    "COMPARE_TOKEN_IDS",
    "COMPARE_TOKEN_STRINGS",
    "TEACHER_ECHO",
    "TEACHER_PROMPT_LOGPROBS",
    "TOLERANCE_MULTIPLIER",
    "Capabilities",
    "CheckResult",
    "Completion",
    "Divergence",
    "Reference",
    "ReferenceEntry",
    "TeacherRejected",
    "TeacherUnsupported",
    "collect_outputs",
    "comparable_answers",
    "compare",
    "compare_tokens",
    "compare_under_load",
    "judge_under_load",
    "under_load_tie_flips_by",
    "weakest_tie_rule",
    "complete_greedy",
    "describe_checks",
    "detect_teacher_mode",
    "gather_completions",
    "record_reference",
    "sanity_problem",
    "teacher_forced_logprobs",
]
