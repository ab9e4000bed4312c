"""Issue #31 item 3: the correctness-under-load check samples every benchmark round.

``bench.samples`` holds the main level's answers round after round; the check takes
``check.under_load_sample`` of them through :func:`autotune.gate.judge.comparable_answers`.
The sample is stratified over rounds and prompts, and never smaller than one answer a round,
so a server that turns wrong after its first benchmark requests is caught.
"""

from __future__ import annotations

import pytest

from autotune.bench.phase import RequestRecord
from autotune.gate import judge
from autotune.gate.judge import comparable_answers, compare_under_load
from autotune.gate.reference import Completion, Reference, ReferenceEntry

PROMPTS = ("p0", "p1", "p2", "p3")
ROUNDS = 3
PER_ROUND = 8  # workload.num_requests at the main level: 2 answers per prompt per round
SAMPLE = 8  # check.under_load_sample's default
RIGHT = (11, 12, 13, 14)
WRONG = (11, 99, 98, 97)


def _reference() -> Reference:
    entries = {
        p: ReferenceEntry(Completion(prompt=p, text=" a b c d", token_ids=RIGHT)) for p in PROMPTS
    }
    return Reference(
        entries=entries, max_tokens=dict.fromkeys(PROMPTS, 4), tolerance=0.0, drift_observed=0.0
    )


def _answers(right_for: int) -> list[tuple[int, RequestRecord]]:
    """(round, answer) in benchmark order; the first ``right_for`` answers are right."""
    out = []
    for n in range(ROUNDS * PER_ROUND):
        ids = RIGHT if n < right_for else WRONG
        record = RequestRecord(
            prompt=PROMPTS[n % len(PROMPTS)], ok=True, token_ids=ids, text=" a b c d"
        )
        out.append((n // PER_ROUND, record))
    return out


def _sample(answers: list[tuple[int, RequestRecord]]) -> list[RequestRecord]:
    asked = dict.fromkeys(PROMPTS, 4)
    return comparable_answers(_reference(), [r for _, r in answers], asked, SAMPLE)


@pytest.fixture(autouse=True)
def sampled(monkeypatch):
    """These tests are about the sample drawn past :data:`judge.JUDGE_EVERY_UP_TO` answers:
    it is set to 0 here, so that few answers are sampled too."""
    monkeypatch.setattr(judge, "JUDGE_EVERY_UP_TO", 0)


def test_every_answer_is_judged_by_default(monkeypatch) -> None:
    """A red team's server wrong on every 17th answer passed: 9 of 34 answers were judged,
    the same 9 on every launch. Judging is pure computation: every answer is judged."""
    monkeypatch.setattr(judge, "JUDGE_EVERY_UP_TO", 4096)
    answers = [
        RequestRecord(
            prompt=PROMPTS[i % len(PROMPTS)],
            ok=True,
            token_ids=WRONG if i % 17 == 16 else RIGHT,
            text=" a b c d",
        )
        for i in range(34)
    ]
    asked = dict.fromkeys(PROMPTS, 4)
    judged = comparable_answers(_reference(), answers, asked, SAMPLE)
    assert len(judged) == 34
    wrong = [
        r for r in judged if compare_under_load(_reference(), r.prompt, r.token_ids, r.text)[0]
    ]
    assert len(wrong) == 2


def test_a_server_right_throughout_passes_and_the_count_is_the_limit() -> None:
    sample = _sample(_answers(right_for=ROUNDS * PER_ROUND))
    assert len(sample) == SAMPLE
    assert all(
        compare_under_load(_reference(), r.prompt, r.token_ids, r.text)[0] is None for r in sample
    )


def test_a_server_wrong_after_its_first_12_benchmark_answers_is_caught() -> None:
    sample = _sample(_answers(right_for=12))
    divergent = [
        r for r in sample if compare_under_load(_reference(), r.prompt, r.token_ids, r.text)[0]
    ]
    assert divergent, "every sampled answer came from before the server turned wrong"


def test_the_sample_is_stratified_over_rounds_and_prompts() -> None:
    answers = _answers(right_for=0)
    sample = _sample(answers)
    round_of = {id(r): k for k, r in answers}
    assert {round_of[id(r)] for r in sample} == set(range(ROUNDS))
    assert {r.prompt for r in sample} == set(PROMPTS)


def test_more_rounds_than_the_sample_still_samples_every_round() -> None:
    """With 12 rounds and a sample of 8, a server wrong in its last round only is caught: the
    sample grows to one answer a round (``rounds``), and the count is what was compared."""
    rounds = 12
    answers = [
        RequestRecord(prompt=PROMPTS[i % len(PROMPTS)], ok=True, token_ids=RIGHT, text=" a b c d")
        for i in range((rounds - 1) * PER_ROUND)
    ] + [
        RequestRecord(prompt=PROMPTS[i % len(PROMPTS)], ok=True, token_ids=WRONG)
        for i in range(PER_ROUND)
    ]
    asked = dict.fromkeys(PROMPTS, 4)
    sample = comparable_answers(_reference(), answers, asked, SAMPLE, rounds=rounds)
    assert len(sample) == rounds
    verdicts = [compare_under_load(_reference(), r.prompt, r.token_ids, r.text)[0] for r in sample]
    # (without the round count, 8 windows of 12 answers pick round 10's right answers last)
    assert any(v is not None for v in verdicts)


def test_a_server_wrong_on_one_prompt_only_is_caught_whatever_its_position() -> None:
    """Ten prompts round-robin, a sample of 8: the windows' first answers skipped some prompts
    at every position, so a server wrong on one of those passed (second hostile-server audit:
    wrong on every prompt past the 32nd). Now every referenced prompt has an answer judged."""
    prompts = tuple(f"q{i}" for i in range(10))
    entries = {
        p: ReferenceEntry(Completion(prompt=p, text=" a b c d", token_ids=RIGHT)) for p in prompts
    }
    reference = Reference(
        entries=entries, max_tokens=dict.fromkeys(prompts, 4), tolerance=0.0, drift_observed=0.0
    )
    for wrong in prompts:
        answers = [
            RequestRecord(
                prompt=p, ok=True, token_ids=WRONG if p == wrong else RIGHT, text=" a b c d"
            )
            for _ in range(ROUNDS * 4)
            for p in prompts
        ]
        sample = comparable_answers(reference, answers, dict.fromkeys(prompts, 4), SAMPLE)
        assert {r.prompt for r in sample} == set(prompts)
        assert any(
            compare_under_load(reference, r.prompt, r.token_ids, r.text)[0] for r in sample
        ), wrong
