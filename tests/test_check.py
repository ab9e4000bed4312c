"""The correctness gate on outputs recorded from the real vLLM CPU server (tests/fixtures).

The fixture holds the baseline's reference and three candidates' outputs: the baseline again,
the qkv_shard_swap fault patch, and an fp8 KV cache (re-record them with
tests/fixtures/record_gate_fixtures.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.gate import (
    Capabilities,
    Completion,
    Reference,
    compare,
    compare_tokens,
    sanity_problem,
)
from autotune.spec.model import CheckSpec, KnownAnswer

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "gate_demo.json").read_text())
REFERENCE = Reference.from_dict(FIXTURE["reference"])
CHECK = CheckSpec(
    prompts=tuple(p for p in REFERENCE.entries if " " in p)[:5],
    known_answers=(KnownAnswer("one two three", "^ four five six"),),
)


def candidate(name: str):
    raw = FIXTURE["candidates"][name]
    completions = {}
    for prompt, c in raw["completions"].items():
        completions[prompt] = Completion(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in c.items()}
        )
    return completions, {p: tuple(v) for p, v in raw["teacher"].items()}


def test_a_known_answer_pattern_that_never_finishes_fails_the_check_instead_of_hanging():
    """``(a|aa)+c`` against 60 a's backtracks about 1.5e12 times: the gate used ``re`` without
    a limit and never answered. Now a pattern has a time limit, and an undecided match is a
    failed check that names the pattern (never a pass)."""
    completions, teacher = candidate("baseline_again")
    completions = dict(completions)
    completions["one two three"] = dataclasses.replace(completions["one two three"], text="a" * 60)
    entry = REFERENCE.entries["one two three"]  # the same text, so only the pattern is judged
    entries = dict(REFERENCE.entries)
    entries["one two three"] = dataclasses.replace(
        entry, completion=dataclasses.replace(entry.completion, text="a" * 60)
    )
    reference = dataclasses.replace(REFERENCE, entries=entries)
    check = dataclasses.replace(
        CHECK,
        known_answers=(
            KnownAnswer("one two three", "^a{60}$"),  # decided: matches
            KnownAnswer("one two three", "(a|aa)+c"),  # backtracks without end
        ),
    )
    result = compare(reference, completions, teacher, check)
    assert not result.passed
    assert result.problems == (
        "'one two three': known answer /(a|aa)+c/ could not be checked (timed out)",
    )
    assert "rewrite it in check.known_answers" in result.first_divergence.detail


def test_reference_round_trips_and_carries_its_tolerance():
    again = Reference.from_dict(REFERENCE.to_dict())
    assert again == REFERENCE
    assert REFERENCE.tolerance >= REFERENCE.drift_observed
    first = REFERENCE.entries["one two three"].completion
    assert first.text.startswith(" four five six")
    assert len(first.token_ids) == len(first.logprobs) == len(first.margins) > 0


def test_baseline_again_passes():
    completions, teacher = candidate("baseline_again")
    result = compare(REFERENCE, completions, teacher, CHECK)
    assert result.passed, result.problems
    assert result.first_divergence is None
    assert result.max_logprob_drift <= REFERENCE.tolerance


def test_fault_patch_fails_with_first_divergent_token():
    completions, teacher = candidate("qkv_shard_swap")
    result = compare(REFERENCE, completions, teacher, CHECK)
    assert not result.passed
    div = result.first_divergence
    assert div.kind == "token" and div.position == 0
    assert div.expected_text.startswith(" four") and not div.got_text.startswith(" four")
    assert any("known answer" in p for p in result.problems)


def test_fp8_kv_cache_keeps_tokens_but_moves_logprobs_beyond_tolerance():
    completions, teacher = candidate("fp8_kv_cache")
    for prompt, got in completions.items():
        assert got.token_ids == REFERENCE.entries[prompt].completion.token_ids
    result = compare(REFERENCE, completions, teacher, CHECK)
    assert result.max_logprob_drift > 0  # the lossy cache really changes the distribution
    assert not result.passed
    assert result.first_divergence.kind == "logprob"


def test_a_wider_tolerance_accepts_fp8():
    completions, teacher = candidate("fp8_kv_cache")
    loose = dataclasses.replace(REFERENCE, tolerance=0.5)
    assert compare(loose, completions, teacher, CHECK).passed


def _ref(ids, margins, tolerance=0.01):
    completion = Completion(
        prompt="p",
        text="x",
        token_ids=tuple(ids),
        tokens=tuple(f"t{i}" for i in ids),
        logprobs=tuple(-0.1 for _ in ids),
        margins=tuple(margins),
    )
    return Reference(
        entries={"p": type(REFERENCE.entries["one two three"])(completion)},
        max_tokens={"p": len(ids)},
        tolerance=tolerance,
        drift_observed=0.0,
    )


def test_divergence_at_a_near_tie_is_a_tie_flip_not_an_error():
    reference = _ref([1, 2, 3, 4], [5.0, 0.001, 5.0, 5.0])
    got = Completion(prompt="p", text="x", token_ids=(1, 9, 9, 9))
    result = compare(reference, {"p": got}, {})
    assert result.passed and result.tie_flips == 1


def test_a_near_tie_excuses_a_flip_to_the_runner_up_only():
    """A broken config whose output leaves the reference at a close position, to a token
    that was not the other side of the tie, is wrong: excusing any token there let garbage
    pass on the workload prompts, which have no teacher-forced check behind them."""
    base = _ref([1, 2, 3, 4], [5.0, 0.001, 5.0, 5.0])
    ref = dataclasses.replace(base.entries["p"].completion, runner_ups=("t8", "t9", "t8", "t8"))
    reference = dataclasses.replace(base, entries={"p": type(base.entries["p"])(ref)})
    to_runner_up = Completion(
        prompt="p", text="x", token_ids=(1, 9, 5, 5), tokens=("t1", "t9", "t5", "t5")
    )
    result = compare(reference, {"p": to_runner_up}, {})
    assert result.passed and result.tie_flips == 1
    elsewhere = Completion(
        prompt="p", text="x", token_ids=(1, 7, 7, 7), tokens=("t1", "t7", "t7", "t7")
    )
    result = compare(reference, {"p": elsewhere}, {})
    assert not result.passed and result.tie_flips == 0
    div = result.first_divergence
    assert div.position == 1 and div.got_token == "t7" and "runner-up 't9'" in div.detail
    # a reference recorded before runner-ups were kept: the margin alone decides, as then
    assert compare(base, {"p": elsewhere}, {}).passed


def test_the_check_records_which_tie_flip_rule_applied():
    """The runner-up rule needs the reference's runner-ups and the answer's per-token strings;
    without either the margin alone excuses a flip, and the record says so (it was silent)."""
    base = _ref([1, 2, 3, 4], [5.0, 0.001, 5.0, 5.0])
    ref = dataclasses.replace(base.entries["p"].completion, runner_ups=("t8", "t9", "t8", "t8"))
    with_runner_ups = dataclasses.replace(base, entries={"p": type(base.entries["p"])(ref)})
    strings = Completion(
        prompt="p", text="x", token_ids=(1, 9, 5, 5), tokens=("t1", "t9", "t5", "t5")
    )
    ids_only = Completion(prompt="p", text="x", token_ids=(1, 9, 5, 5))

    def rule(reference: Reference, got: Completion) -> str | None:
        return compare(reference, {"p": got}, {}).checks["tie_flips_by"]

    assert rule(with_runner_ups, strings) == "runner_up"
    assert rule(base, strings) == "margin_only"  # recorded before runner-ups were kept
    assert rule(with_runner_ups, ids_only) == "margin_only"  # no per-token strings
    # text comparison, or no top-2 margins: no flip is excused by any rule
    text_only = dataclasses.replace(
        with_runner_ups, capabilities=Capabilities(token_ids=False, token_strings=False)
    )
    assert rule(text_only, strings) is None
    assert rule(_ref([1, 2, 3, 4], [None] * 4), strings) is None


def test_describe_checks_names_the_tie_flip_rule():
    from autotune.gate import describe_checks

    def line(rule: str | None) -> str:
        checks = {"compared_by": "token_ids", "tie_flips_by": rule, "sanity": True}
        return describe_checks({"passed": True, "prompts_checked": 4, "checks": checks})

    assert "near-tie flips excused to the runner-up only" in line("runner_up")
    assert "near-tie flips excused by the margin alone" in line("margin_only")
    assert "near-tie" not in line(None)


def test_the_under_load_check_records_its_tie_flip_rule():
    """A streamed benchmark answer has token ids but no per-token strings: a near-tie flip under
    load is excused by the margin alone, whatever runner-ups the reference keeps, and the
    trial's record says so (``under_load_tie_flips_by``); a text comparison excuses none."""
    from autotune.gate import describe_checks, under_load_tie_flips_by, weakest_tie_rule

    base = _ref([1, 2, 3, 4], [5.0, 0.001, 5.0, 5.0])
    ref = dataclasses.replace(base.entries["p"].completion, runner_ups=("t8", "t9", "t8", "t8"))
    with_runner_ups = dataclasses.replace(base, entries={"p": type(base.entries["p"])(ref)})
    assert under_load_tie_flips_by(with_runner_ups, "p", "token_ids") == "margin_only"
    assert under_load_tie_flips_by(with_runner_ups, "p", "text") is None
    assert weakest_tie_rule({"runner_up", "margin_only"}) == "margin_only"
    assert weakest_tie_rule({"runner_up", None}) == "runner_up"
    assert weakest_tie_rule({None}) is None and weakest_tie_rule(set()) is None
    record = {
        "passed": True,
        "prompts_checked": 3,
        "checks": {"compared_by": "token_ids", "sanity": True},
        "under_load_compared_by": {"token_ids": 8},
        "under_load_tie_flips_by": "margin_only",
    }
    assert describe_checks(record).endswith(
        "under load (8 by token ids; near-tie flips excused by the margin alone)"
    )


def test_runner_ups_come_from_top_logprobs_and_round_trip():
    from autotune.gate.requests import _runner_up

    assert _runner_up({" a": -0.1, " b": -0.2, " c": -3.0}) == " b"
    assert _runner_up({" a": -0.1}) is None and _runner_up({" a": -0.1, " b": None}) is None
    entry = REFERENCE.entries["one two three"]
    completion = dataclasses.replace(entry.completion, runner_ups=(" x", None))
    reference = dataclasses.replace(
        REFERENCE, entries={"one two three": dataclasses.replace(entry, completion=completion)}
    )
    assert Reference.from_dict(reference.to_dict()) == reference


def test_teacher_forced_scores_cut_short_fail():
    """Only the overlap was compared: a trial whose scoring covered no token passed."""
    completions, teacher = candidate("baseline_again")
    prompt = next(p for p in teacher if teacher[p])
    for short in ((), teacher[prompt][:-1]):
        result = compare(REFERENCE, completions, {**teacher, prompt: short}, CHECK)
        assert not result.passed
        assert "teacher-forced scoring covered" in result.first_divergence.detail


def test_divergence_at_a_confident_position_fails():
    reference = _ref([1, 2, 3, 4], [5.0, 5.0, 5.0, 5.0])
    got = Completion(prompt="p", text="x", token_ids=(1, 2, 7, 4))
    result = compare(reference, {"p": got}, {})
    assert not result.passed and result.first_divergence.position == 2


def test_length_mismatch_fails():
    reference = _ref([1, 2, 3, 4], [5.0] * 4)
    result = compare(reference, {"p": Completion(prompt="p", text="x", token_ids=(1, 2))}, {})
    assert not result.passed and result.first_divergence.kind == "length"


def test_compare_tokens_under_load():
    reference = _ref([1, 2, 3, 4], [5.0] * 4)
    assert compare_tokens(reference, "p", [1, 2, 3, 4], "x") is None
    div = compare_tokens(reference, "p", [1, 2, 3, 5], "y")
    assert div.position == 3 and div.kind == "token_under_load"


@pytest.mark.parametrize(
    ("text", "ids", "problem"),
    [
        ("", (), "empty"),
        ("   \n ", (1, 1), "whitespace-only"),
        ("ab\x00c", (1, 2), "non-printable"),
        ("7 7 7 7", tuple([5] * 20), "runaway repetition"),
        ("a b a b", tuple([5, 6] * 10), "runaway repetition"),
    ],
)
def test_sanity_problems(text, ids, problem):
    assert problem in sanity_problem(text, ids)


def test_sane_patterns_are_not_repetition():
    # "red green blue" repeats with a period of several tokens: legitimate for the demo.
    assert sanity_problem(" red green blue red green blue", tuple([5, 6, 7] * 8)) is None


def test_teacher_forced_scoring_the_server_rejects_fails_the_gate():
    from autotune.gate import TeacherRejected

    completions, teacher = candidate("baseline_again")
    prompt = next(iter(teacher))
    teacher[prompt] = TeacherRejected("400: Out of range float values are not JSON compliant")
    result = compare(REFERENCE, completions, teacher, CHECK)
    assert not result.passed
    assert "rejected teacher-forced scoring" in result.first_divergence.detail


def _sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


def test_greedy_request_survives_a_runner_up_with_zero_probability():
    import asyncio

    import httpx

    from autotune.gate import complete_greedy

    asked = []

    def handler(request):
        body = json.loads(request.content)
        asked.append(body.get("logprobs"))
        assert body["stream"] is True and body["temperature"] == 0.0
        if body["logprobs"] == 2:  # what vLLM answers when a top-2 logprob is -inf
            return httpx.Response(
                400, json={"error": {"message": "Out of range float values are not JSON compliant"}}
            )
        choice = {
            "text": " four",
            "token_ids": [7],
            "prompt_token_ids": [1, 2],
            "logprobs": {
                "tokens": [" four"],
                "token_logprobs": [-0.01],
                "top_logprobs": [{" four": -0.01}],
            },
        }
        return httpx.Response(200, content=_sse({"choices": [choice]}))

    async def go():
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await complete_greedy(client, "m", "one two three", 1, dialect=VLLM_DIALECT)

    completion = asyncio.run(go())
    assert asked == [2, 1]
    assert completion.token_ids == (7,) and completion.margins == (None,)
    assert completion.prompt_token_ids == (1, 2) and completion.text == " four"


def test_describe_checks_names_only_checks_that_ran():
    from autotune.gate import describe_checks

    text_only = {
        "passed": True,
        "prompts_checked": 3,
        "checks": {"compared_by": "text", "teacher_forced": None, "sanity": True},
        "under_load_compared_by": {"text": 8},
    }
    line = describe_checks(text_only)
    assert line == "text (3 prompts); sanity; under load (8 by text)"
    assert "token ids" not in line and "teacher-forced" not in line
    # an older record that never said which checks ran claims none of them
    assert "token ids" not in describe_checks({"passed": True, "prompts_checked": 5})
    assert describe_checks({"passed": False}) == "not verified"


def test_a_scoring_answer_that_is_not_json_is_unsupported_scoring():
    """A server whose completions work but whose scoring request answers an HTML page: the
    gate's "cannot score" path (the trial fails as unverifiable), not a JSONDecodeError."""
    import asyncio

    import httpx

    from autotune.gate import TeacherUnsupported, teacher_forced_logprobs

    def page(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>\n<body>busy</body>\n</html>")

    async def score() -> None:
        transport = httpx.MockTransport(page)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            await teacher_forced_logprobs(
                client,
                "m",
                REFERENCE.entries["one two three"].completion,
                dialect=VLLM_DIALECT,
            )

    with pytest.raises(TeacherUnsupported, match="not JSON: busy$"):
        asyncio.run(score())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"busy", "bad answer: busy"),  # not JSON
        ('["choices"]', 'bad answer: ["choices"]'),  # JSON, not an object
        ('"ok"', 'bad answer: "ok"'),
        (b"\x80 caf\xe9", "bad answer: \ufffd caf\ufffd"),  # bytes in no UTF encoding
        ("<html>\n<body>\n<h1>Bad Gateway</h1>\n</body>\n</html>", "bad answer: Bad Gateway"),
        ("x" * 500, "bad answer: " + "x" * 200),  # the evidence is an excerpt
    ],
)
def test_parse_json_object_names_what_answered_instead(body: str | bytes, message: str):
    """The server's first completion and the gate's scoring request read whole answers through
    this one helper: the error is the caller's words and one line of the body, a ValueError
    (never a JSONDecodeError traceback or an AttributeError on a list's ``.get``)."""
    from autotune.client.stream import NotJsonObject, parse_json_object

    with pytest.raises(NotJsonObject) as caught:
        parse_json_object(body, "bad answer")
    assert str(caught.value) == message and isinstance(caught.value, ValueError)
    assert parse_json_object(b'{"choices": []}', "bad answer") == {"choices": []}
    # as httpx's response.json(): a UTF-8 byte-order mark is allowed
    assert parse_json_object(b'\xef\xbb\xbf{"a": 1}', "bad answer") == {"a": 1}


def test_a_server_that_does_not_stream_is_named_as_such():
    """A server that ignores ``stream: true`` answers one JSON body: the gate read no event
    and reported "returns no text", true of what it read but not why."""
    import asyncio

    import httpx

    from autotune.client.stream import StreamError
    from autotune.gate import complete_greedy

    def whole(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"text": " four five six"}]})

    async def ask() -> None:
        transport = httpx.MockTransport(whole)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            await complete_greedy(client, "m", "one two three", 4, dialect=VLLM_DIALECT)

    with pytest.raises(StreamError, match=r"not a server-sent event stream \(application/json\)"):
        asyncio.run(ask())


@pytest.mark.parametrize("where", [0, -1])
def test_a_nan_teacher_forced_logprob_fails_and_does_not_hide_the_drift_after_it(where):
    """A server answered NaN at one scored position and 3 nats off everywhere else: NaN made
    ``abs(a - b)`` NaN, which compared False with the tolerance and (leading) won ``max``, so
    the trial passed with a drift the same answer without the NaN fails by."""
    completions, teacher = candidate("baseline_again")
    prompt = next(iter(teacher))
    scores = [value - 3.0 for value in teacher[prompt]]
    drifted = dict(teacher, **{prompt: tuple(scores)})
    assert not compare(REFERENCE, completions, drifted, CHECK).passed  # the control
    scores[where] = float("nan")
    result = compare(REFERENCE, completions, dict(teacher, **{prompt: tuple(scores)}), CHECK)
    assert not result.passed
    assert result.first_divergence.kind == "logprob"
    only_nan = list(teacher[prompt])
    only_nan[where] = float("nan")
    result = compare(REFERENCE, completions, dict(teacher, **{prompt: tuple(only_nan)}), CHECK)
    assert not result.passed, "a NaN logprob is no match for the reference's"
    assert "nan where the reference has" in result.first_divergence.detail


def test_a_nan_greedy_logprob_fails_wherever_it_is():
    """Servers without teacher-forced scoring are judged by their greedy tokens' logprobs:
    a NaN after the first position used to lose ``max`` to a small drift and pass."""
    reference = dataclasses.replace(
        _ref([1, 2, 3, 4], [5.0, 5.0, 5.0, 5.0]),
        capabilities=Capabilities(teacher_forced=None),
    )
    for logprobs in [(-0.1, -0.1, float("nan"), -0.1), (float("nan"),) * 4]:
        got = Completion(prompt="p", text="x", token_ids=(1, 2, 3, 4), logprobs=logprobs)
        result = compare(reference, {"p": got}, {})
        assert not result.passed, logprobs
        assert result.first_divergence.kind == "logprob"
    same = Completion(prompt="p", text="x", token_ids=(1, 2, 3, 4), logprobs=(-0.1,) * 4)
    assert compare(reference, {"p": same}, {}).passed  # the control


def test_the_under_load_sample_takes_an_answer_from_every_phase():
    """A sample of 2 from 1 single-request answer and 20 load answers per round: at least one
    of each phase of each round is judged, so a server wrong in one phase only is seen."""
    from autotune.bench.phase import RequestRecord
    from autotune.gate.judge import comparable_answers

    reference = _ref([1, 2, 3, 4], [5.0] * 4)
    answers = [
        RequestRecord(prompt="p", ok=True, token_ids=(1, 2, 3, 4), phase=f"{name} (round {r})")
        for r in (1, 2)
        for name, count in (("single-request", 1), ("load at 8", 20))
        for _ in range(count)
    ]
    picked = comparable_answers(reference, answers, {"p": 4}, 2, rounds=2)
    assert {a.phase for a in picked} == {a.phase for a in answers}
    assert [answers.index(a) for a in picked] == sorted(answers.index(a) for a in picked)


def test_the_same_token_ids_with_another_text_fail_the_check():
    """A config (or a server) that keeps every token id and changes the text they read as:
    compared by ids alone it passed, though the user reads the text."""
    completions, teacher = candidate("baseline_again")
    prompt = "one two three"
    got = completions[prompt]
    assert got.token_ids == REFERENCE.entries[prompt].completion.token_ids
    swapped = dict(completions)
    swapped[prompt] = dataclasses.replace(got, text=got.text.upper())
    result = compare(REFERENCE, swapped, teacher, CHECK)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.kind == "text" and divergence.prompt == prompt
    assert divergence.got_text == got.text.upper() and divergence.expected_text == got.text
    assert compare(REFERENCE, completions, teacher, CHECK).passed  # the control


def test_under_load_the_same_ids_with_another_text_diverge():
    """A streamed benchmark answer with every id right and the text rewritten passed the
    under-load check, which compared ids only (second hostile-server audit)."""
    from autotune.gate.judge import compare_under_load

    prompt = "one two three"
    ref = REFERENCE.entries[prompt].completion
    same, method = compare_under_load(REFERENCE, prompt, ref.token_ids, ref.text)
    assert same is None and method == "token_ids"  # the control
    divergence, _ = compare_under_load(REFERENCE, prompt, ref.token_ids, ref.text.upper())
    assert divergence is not None and divergence.kind == "text_under_load"


def test_answers_to_prompts_outside_the_reference_are_counted_as_unchecked():
    from autotune.bench.phase import RequestRecord
    from autotune.gate.judge import judge_under_load

    reference = _ref([1, 2, 3, 4], [5.0] * 4)
    answers = [RequestRecord(prompt="p", ok=True, token_ids=(1, 2, 3, 4), text="x")] * 3
    answers += [RequestRecord(prompt="other", ok=True, token_ids=(9,), text="y")] * 5
    judged = judge_under_load(reference, answers, {"p": 4, "other": 4}, 8)
    assert judged.checked == 3 and not judged.divergences
    assert (judged.answers, judged.unreferenced) == (8, 5)
