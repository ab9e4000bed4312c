"""Answers from OpenAI-compatible servers autotune has not met (llama.cpp, SGLang, TGI, a proxy):
the legitimate variants of the protocol are read as the answer they are, and an answer that
reports a failure or is not a completion fails the request with the server's words as evidence,
never as a Python error nor as a (shorter) answer.

Both readers are driven through ``httpx.MockTransport`` with exact bytes: the benchmark client
(``bench.stream_request``, which records a failed request) and the gate (``complete_greedy``,
which raises ``StreamError``; the trial records it as ``request_errors``). The aiohttp
transport, which the benchmark uses on a real server, is in ``test_client_stream.py``. Whole
(not streamed) answers: the gate's teacher-forced scoring and the server's first completion.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from autotune.analysis.profile import _decode
from autotune.bench.phase import RequestRecord, stream_request
from autotune.client.stream import StreamError
from autotune.engines.base import LaunchConfig
from autotune.engines.dialect import OPENAI, TEACHER_ECHO, TEACHER_PROMPT_LOGPROBS
from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.errors import CandidateError
from autotune.gate.requests import (
    Completion,
    TeacherUnsupported,
    complete_greedy,
    teacher_forced_logprobs,
)
from autotune.server.process import ServerProcess

SSE = "text/event-stream"


def data(obj: object, **dumps: object) -> bytes:
    return b"data: " + json.dumps(obj, **dumps).encode() + b"\n\n"


def token(i: int, **extra: object) -> bytes:
    return data({"choices": [{"index": 0, "text": f" t{i}", "token_ids": [i], **extra}]})


DONE = b"data: [DONE]\n\n"


def answer_with(
    pieces: list[bytes], content_type: str | None = SSE, status: int = 200
) -> httpx.AsyncClient:
    """A client whose every request is answered with ``pieces``, one network read each."""

    class Pieces(httpx.AsyncByteStream):
        async def __aiter__(self):
            for piece in pieces:
                yield piece

    def handler(_request: httpx.Request) -> httpx.Response:
        headers = {"content-type": content_type} if content_type else {}
        return httpx.Response(status, headers=headers, stream=Pieces())

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://t")


def bench(pieces: list[bytes], content_type: str | None = SSE) -> RequestRecord:
    async def go() -> RequestRecord:
        async with answer_with(pieces, content_type) as client:
            # two tokens asked: the variants below answer two (a "length" finish short of the
            # tokens asked is an answer shorter than the workload's, refused)
            return await stream_request(
                client, "m", "p", 2, dialect=VLLM_DIALECT, read_timeout_s=10.0
            )

    return asyncio.run(go())


def gate(pieces: list[bytes], content_type: str | None = SSE) -> Completion:
    async def go() -> Completion:
        async with answer_with(pieces, content_type) as client:
            return await complete_greedy(client, "m", "p", 3, dialect=VLLM_DIALECT, deadline_s=10.0)

    return asyncio.run(go())


# --- legitimate variants: read as the answer they carry -----------------------------------------

TWO_TOKENS = token(1) + token(2)
VARIANTS = {
    "no space after data:": TWO_TOKENS.replace(b"data: ", b"data:") + DONE,
    "CRLF line endings": (TWO_TOKENS + DONE).replace(b"\n", b"\r\n"),
    # the SSE standard's third line ending: read as one long line, "bad stream chunk"
    "CR-only line endings": (TWO_TOKENS + DONE).replace(b"\n", b"\r"),
    "comments and event names": b": keep-alive\n\n"
    + b"event: completion\n"
    + token(1)
    + b": ping\n\n"
    + token(2)
    + DONE,
    "a last chunk of usage only": TWO_TOKENS
    + data({"choices": [], "usage": {"completion_tokens": 2}})
    + DONE,
    "text null, finish reason alone": token(1)
    + data({"choices": [{"text": None}]})
    + token(2)
    + data({"choices": [{"text": "", "finish_reason": "length"}]})
    + DONE,
    "no [DONE]: the body just ends": TWO_TOKENS,
    "blanks around [DONE]": TWO_TOKENS + b"data:   [DONE]  \n\n",
    # the SSE standard lets a stream begin with a UTF-8 byte-order mark, which it strips; kept,
    # the first line read as a field named "\ufeffdata" and its token was lost
    "a byte-order mark first": b"\xef\xbb\xbf" + TWO_TOKENS + DONE,
    # every event one data line and no blank line between them (the readers dispatched each
    # data line at once, and still must)
    "no blank lines at all": TWO_TOKENS.replace(b"\n\n", b"\n") + b"data: [DONE]\n",
    # the SSE standard's data field over several lines, joined with a line break: each line
    # was read as a chunk of its own ("bad stream chunk" / "a stream chunk was not JSON")
    "a data field over several lines": token(1)
    + b'data: {"choices": [{"index": 0, "text": " t2",\n'
    + b'data:  "token_ids": [2]}]}\n\n'
    + DONE,
    "the same with CRLF and an empty data line inside": (
        token(1)
        + b'data: {"choices": [{"index": 0,\ndata:\n'
        + b'data: "text": " t2", "token_ids": [2]}]}\n\n'
        + DONE
    ).replace(b"\n", b"\r\n"),
}


#: variants whose line endings are also read one byte at a time
SPLIT_BYTEWISE = (
    "CRLF line endings",
    "CR-only line endings",
    "the same with CRLF and an empty data line inside",
)


@pytest.mark.parametrize("body", VARIANTS.values(), ids=VARIANTS.keys())
def test_legitimate_stream_variants_are_read_as_their_answer(body: bytes) -> None:
    record = bench([body])
    assert record.ok, record.error
    assert (record.token_ids, record.text, record.output_tokens) == ((1, 2), " t1 t2", 2)
    completion = gate([body])
    assert (completion.token_ids, completion.text) == ((1, 2), " t1 t2")


@pytest.mark.parametrize(
    "body",
    [VARIANTS[k] for k in SPLIT_BYTEWISE],
    ids=[f"{k}, a byte a read" for k in SPLIT_BYTEWISE],
)
def test_line_endings_split_between_reads_are_read_as_their_answer(body: bytes) -> None:
    """Every byte its own network read: a CRLF whose CR ends one read and LF starts the next
    is one line ending, not two (a second would end a data field over several lines early)."""
    pieces = [body[i : i + 1] for i in range(len(body))]
    record = bench(pieces)
    assert record.ok, record.error
    assert (record.token_ids, record.text) == ((1, 2), " t1 t2")
    assert gate(pieces).token_ids == (1, 2)


def test_an_empty_data_field_is_no_event() -> None:
    """An empty data field carries no chunk (the SSE standard dispatches an event with empty
    data; there is nothing to read from it); it was parsed as JSON and failed the request
    ("bad stream chunk: Expecting value")."""
    body = token(1) + b"data:\n\n" + b"data: \r\n\r\n" + token(2) + DONE
    record = bench([body])
    assert record.ok and record.token_ids == (1, 2), record.error
    assert gate([body]).token_ids == (1, 2)


def test_a_character_split_across_network_reads_is_whole() -> None:
    body = data({"choices": [{"text": " naïve €", "token_ids": [1]}]}, ensure_ascii=False) + DONE
    cut = body.index("€".encode()) + 1  # inside the euro sign's three bytes
    record = bench([body[:cut], body[cut:]])
    assert record.ok and record.text == " naïve €", record.error
    assert gate([body[:cut], body[cut:]]).text == " naïve €"


def test_a_data_field_over_several_network_reads_is_one_event() -> None:
    """The event's lines come in separate reads: the first is no JSON value yet, so the reader
    waits for the rest (the blank line, or a line that completes it)."""
    first = token(1) + b'data: {"choices": [{"index": 0, "text": " t2",\n'
    rest = b'data: "token_ids": [2]}]}\n\n' + DONE
    record = bench([first, rest])
    assert record.ok and record.token_ids == (1, 2), record.error
    assert gate([first, rest]).token_ids == (1, 2)


def paced(pieces: list[bytes], pause_s: float) -> RequestRecord:
    """``bench`` with ``pause_s`` of silence before each piece after the first."""

    class Paced(httpx.AsyncByteStream):
        async def __aiter__(self):
            for index, piece in enumerate(pieces):
                if index:
                    await asyncio.sleep(pause_s)
                yield piece

    def handler(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": SSE}, stream=Paced())

    async def go() -> RequestRecord:
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            # two tokens asked: the variants below answer two (a "length" finish short of the
            # tokens asked is an answer shorter than the workload's, refused)
            return await stream_request(
                client, "m", "p", 2, dialect=VLLM_DIALECT, read_timeout_s=10.0
            )

    return asyncio.run(go())


def test_a_token_is_timed_by_its_data_line_not_by_a_late_blank_line() -> None:
    """A data line that is a whole JSON value is an event at once: the blank line that ends it
    by the standard may come in a later read (or never), and the token is not timed by it."""
    record = paced([token(1)[:-1], b"\n" + token(2)[:-1], b"\n" + DONE], pause_s=0.3)
    assert record.ok and record.token_ids == (1, 2), record.error
    first, second = record.token_times_s
    assert first < 0.25 and 0.25 < second < 0.55, record.token_times_s


# --- a failure the server reports mid-answer: the request failed, with its words ---------------

ERRORS = {
    # OpenAI, vLLM, SGLang, recent llama.cpp: a data event with an error object
    "error object": (
        data({"error": {"message": "CUDA error: an illegal memory access", "code": 500}}),
        "the stream carried an error: ",
    ),
    # TGI: the error is a string
    "error string": (
        data({"error": "CUDA error: an illegal memory access", "error_type": "generation"}),
        "the stream carried an error: ",
    ),
    # llama.cpp's server_sent_event(sink, "error", ...): an `error:` field, not data
    "error: field": (
        b'error: {"code":500,"message":"CUDA error: an illegal memory access"}\n\n',
        "the stream carried an error: ",
    ),
    "event: error": (
        b'event: error\ndata: {"message": "CUDA error: an illegal memory access"}\n\n',
        "the stream carried an error event: ",
    ),
    # the event's text over two data lines (the SSE standard joins them): the first line alone
    # was the evidence
    "event: error, its data over two lines": (
        b"event: error\ndata: CUDA error:\ndata: an illegal memory access\n\n",
        "the stream carried an error event: ",
    ),
    # vLLM's ErrorResponse without an "error" wrapper (its older shape): counted as a chunk
    # without tokens, the request was served and the gate's answer one token short
    "a bare error object": (
        data({"object": "error", "message": "CUDA error: an illegal memory access", "code": 500}),
        "the stream carried an error: ",
    ),
}


@pytest.mark.parametrize(("event", "said"), ERRORS.values(), ids=ERRORS.keys())
def test_an_error_reported_mid_stream_fails_the_request_with_the_servers_words(
    event: bytes, said: str
) -> None:
    """After the error the stream ends as usual ([DONE], or just ends): read as an answer, the
    tokens before it were a benchmark request served and a gate answer that looked wrong
    (``incorrect_output`` for a config that crashed)."""
    for tail in (DONE, b""):
        record = bench([token(1) + event + tail])
        assert not record.ok and not record.hung
        assert record.error.startswith(said), record.error
        assert "CUDA error: an illegal memory access" in record.error
        assert len(record.token_times_s) == 1  # the token before the error is kept
        with pytest.raises(StreamError) as caught:
            gate([token(1) + event + tail])
        assert str(caught.value) == record.error


def test_an_error_event_without_data_at_the_end_still_fails() -> None:
    record = bench([token(1) + b"event: error\n\n"])
    assert not record.ok and record.error == "the stream carried an error event: (no data)"
    with pytest.raises(StreamError, match=r"error event: \(no data\)"):
        gate([token(1) + b"event: error\n"])


@pytest.mark.parametrize("reason", ["abort", "error"])
def test_an_answer_the_server_cut_short_is_no_answer(reason: str) -> None:
    """SGLang and vLLM end a dropped request with finish_reason "abort": its tokens so far
    are not an answer of the asked length."""
    body = token(1) + data({"choices": [{"text": "", "finish_reason": reason}]}) + DONE
    record = bench([body])
    assert not record.ok
    assert record.error.startswith(f"the server cut the answer short (finish_reason {reason!r})")
    with pytest.raises(StreamError, match=rf"cut the answer short \(finish_reason '{reason}'\)"):
        gate([body])


# --- chunks that are not completions: named, never a Python error ------------------------------

MALFORMED = {
    "a JSON list": (b"data: [1, 2]\n\n", "a stream chunk is not a JSON object: [1, 2]"),
    "JSON null": (b"data: null\n\n", "a stream chunk is not a JSON object: null"),
    "choices an object": (
        data({"choices": {"text": " a"}}),
        'a stream chunk is not a completions chunk (choices[].text): {"choices": {"text": " a"}}',
    ),
    "a choice a string": (
        data({"choices": ["a"]}),
        'a stream chunk is not a completions chunk (choices[].text): {"choices": ["a"]}',
    ),
    "text a number": (
        data({"choices": [{"text": 5, "token_ids": [1]}]}),
        "a stream chunk is not a completions chunk (choices[].text): ",
    ),
    "token ids a number": (
        data({"choices": [{"text": " a", "token_ids": 5}]}),
        "a stream chunk is not a completions chunk (choices[].text): ",
    ),
}


@pytest.mark.parametrize(("event", "said"), MALFORMED.values(), ids=MALFORMED.keys())
def test_a_chunk_that_is_not_a_completion_chunk_is_named(event: bytes, said: str) -> None:
    """Each was an AttributeError or TypeError out of the benchmark client and the gate."""
    record = bench([token(1) + event + DONE])
    assert not record.ok and record.error.startswith(said), record.error
    with pytest.raises(StreamError) as caught:
        gate([token(1) + event + DONE])
    assert str(caught.value).startswith(said)


@pytest.mark.parametrize(
    "usage", [{"completion_tokens": "3"}, [3]], ids=["count a string", "usage a list"]
)
def test_a_usage_that_is_not_a_count_is_named(usage: object) -> None:
    record = bench([token(1) + data({"choices": [], "usage": usage}) + DONE])
    assert not record.ok
    assert record.error.startswith("a stream chunk is not a completions chunk"), record.error


def test_bytes_in_no_utf_encoding_are_a_stream_error_in_the_gate() -> None:
    """The gate's reader let UnicodeDecodeError out (the benchmark's already named it)."""
    with pytest.raises(StreamError, match="a stream chunk was not JSON: "):
        gate([token(1) + b'data: "\xff\xfe"\n\n' + DONE])


def test_top_logprobs_as_a_list_of_token_objects_are_read() -> None:
    """The chat API's shape of ``top_logprobs`` (a list of {token, logprob}), which some servers
    give on /v1/completions too: read as a dict it was an AttributeError in the gate."""
    top = [{"token": " a", "logprob": -0.1}, {"token": " b", "logprob": -2.1}]
    lp = {"tokens": [" a"], "token_logprobs": [-0.1], "top_logprobs": [top]}
    body = data({"choices": [{"text": " a", "token_ids": [1], "logprobs": lp}]}) + DONE
    completion = gate([body])
    assert completion.runner_ups == (" b",) and completion.margins == (pytest.approx(2.0),)


def test_an_event_stream_without_a_single_event_is_named() -> None:
    """Not even [DONE]: the gate read an empty answer, and a trial's verdict was
    ``incorrect_output: empty output`` for a server that sent nothing."""
    with pytest.raises(StreamError, match=r"event stream \(text/event-stream\) ended without"):
        gate([b": keep-alive\n\n"])


def test_a_whole_json_answer_to_a_streamed_request_names_the_content_type() -> None:
    """``autotune bench --url`` without ``--check`` runs no gate: each request of a server that
    ignores ``stream: true`` said only "stream ended without tokens"."""
    body = json.dumps({"choices": [{"text": " t1 t2"}]}).encode()
    record = bench([body], content_type="application/json")
    assert record.error == (
        "stream ended without tokens: the answer was not a server-sent event stream "
        "(application/json)"
    )


# --- whole answers: teacher-forced scoring and the first completion -----------------------------

REFERENCE = Completion(prompt="p", text=" four", token_ids=(7,), prompt_token_ids=(1, 2))


def score(body: bytes, mode: str) -> tuple[float, ...]:
    dialect = VLLM_DIALECT if mode == TEACHER_PROMPT_LOGPROBS else OPENAI

    async def go() -> tuple[float, ...]:
        async with answer_with([body], "application/json") as client:
            return await teacher_forced_logprobs(
                client, "m", REFERENCE, dialect=dialect, mode=mode, deadline_s=10.0
            )

    return asyncio.run(go())


SCORING = {
    "choices an object": ({"choices": {"0": {}}}, TEACHER_ECHO),
    "a choice a string": ({"choices": ["x"]}, TEACHER_PROMPT_LOGPROBS),
    "logprobs a list": ({"choices": [{"logprobs": [1]}]}, TEACHER_ECHO),
    "an offset null": (
        {"choices": [{"logprobs": {"text_offset": [0, None], "token_logprobs": [None, -1.0]}}]},
        TEACHER_ECHO,
    ),
    "a logprob a string": (
        {"choices": [{"logprobs": {"text_offset": [0, 1], "token_logprobs": [None, "x"]}}]},
        TEACHER_ECHO,
    ),
    "a prompt score without logprob": (
        {"choices": [{"prompt_logprobs": [None, {"2": {}}, {"7": {"rank": 1}}]}]},
        TEACHER_PROMPT_LOGPROBS,
    ),
}


@pytest.mark.parametrize(("answer", "mode"), SCORING.values(), ids=SCORING.keys())
def test_a_scoring_answer_of_another_shape_is_unsupported_with_evidence(
    answer: dict, mode: str
) -> None:
    """Each was a KeyError, AttributeError, TypeError or ValueError out of the gate (at the
    baseline, out of detecting the scoring mode); unsupported, the baseline records no
    teacher-forced check and a trial's check fails with this reason."""
    body = json.dumps(answer).encode()
    with pytest.raises(TeacherUnsupported) as caught:
        score(body, mode)
    expected = f"the scoring answer is not a completions answer: {body.decode()}"
    assert str(caught.value) == expected


def test_a_scoring_answer_that_is_an_error_or_empty_says_so() -> None:
    error = b'{"error": {"message": "logprobs are not supported"}}'
    with pytest.raises(TeacherUnsupported, match="an error: .*logprobs are not supported"):
        score(error, TEACHER_ECHO)
    with pytest.raises(TeacherUnsupported) as caught:
        score(b"", TEACHER_ECHO)
    assert str(caught.value) == "the scoring answer is not JSON: (an empty body)"


def test_a_first_completion_without_choices_shows_the_body(tmp_path: Path) -> None:
    """A 200 whose body is an error (a proxy whose upstream failed): the reason was "returned
    no choices", without what the server said."""
    launch = LaunchConfig(
        argv=("unused",), env={}, host="127.0.0.1", port=0, api_key="", served_model="m"
    )
    proc = ServerProcess(launch, tmp_path / "server.log", startup_timeout_s=1)

    async def go() -> None:
        body = b'{"error": {"message": "upstream model is loading"}}'
        async with answer_with([body], "application/json") as client:
            await proc._first_completion(client)  # the readiness check's last step

    with pytest.raises(CandidateError) as caught:
        asyncio.run(go())
    assert caught.value.reason == "startup_failed"
    assert "returned no choices: " in str(caught.value)
    assert "upstream model is loading" in str(caught.value)


def test_the_profiling_request_names_an_error_the_server_reports() -> None:
    """``autotune profile``'s decode request read chunks with a bare ``json.loads``: an error
    chunk had no usage and was blamed as "produced 0 tokens"."""
    body = token(1) + data({"error": {"message": "CUDA error: an illegal memory access"}}) + DONE

    async def go() -> tuple[float, int]:
        async with answer_with([body]) as client:
            return await _decode(client, {}, 10.0)

    with pytest.raises(StreamError, match="the stream carried an error: .*illegal memory"):
        asyncio.run(go())


# --- answers of another length than asked -------------------------------------------------------


def test_tokens_beyond_max_tokens_within_the_slack_are_not_counted() -> None:
    """A last chunk carrying nine ids more than asked (inside the runaway slack, at no time
    cost) made a red team's server 50 % faster: the figures count the tokens asked for only,
    and the record says how many more came."""
    extra = data({"choices": [{"index": 0, "text": " x" * 9, "token_ids": list(range(3, 12))}]})
    record = bench([TWO_TOKENS + extra + DONE])
    assert record.ok, record.error
    assert record.output_tokens == 2 and len(record.token_times_s) == 2
    assert (record.asked_tokens, record.uncounted_tokens) == (2, 9)


def test_a_length_finish_short_of_the_tokens_asked_fails_the_request() -> None:
    """finish_reason "length" after one of the two tokens asked: the server claims the length
    limit it never reached (or its context cut the answer); its end-to-end times would be a
    shorter workload's."""
    record = bench([token(1, finish_reason="length") + DONE])
    assert not record.ok
    assert 'finish_reason "length") after 1 of the 2 tokens asked' in (record.error or "")


def test_an_answer_that_stops_early_is_counted_as_shorter_than_asked() -> None:
    """A server that ends at its end-of-sequence token although told to ignore it: the answer
    is read (it is what it streamed), and the benchmark's counts say it was short."""
    from autotune.bench.tokens import off_length

    record = bench([token(1, finish_reason="stop") + DONE])
    assert record.ok and record.output_tokens == 1
    assert off_length([record]) == {"shorter_than_asked": 1}
    assert off_length([bench([TWO_TOKENS + DONE])]) == {}
