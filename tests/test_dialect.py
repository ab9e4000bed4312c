"""Request dialects: the one request builder asks each engine's server in its own fields, and
the gate reads answers through the dialect (no server: pure functions and a mock transport)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from autotune.client.stream import completion_body
from autotune.engines.command import CommandEngine
from autotune.engines.dialect import OPENAI, TEACHER_ECHO, TEACHER_PROMPT_LOGPROBS
from autotune.engines.registry import BUILTIN
from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.engines.vllm.engine import VllmEngine
from autotune.gate import Completion, complete_greedy, detect_teacher_mode


def test_plain_openai_body_asks_for_nothing_beyond_the_api() -> None:
    body = completion_body(
        OPENAI, "m", "p", 8, stream=True, token_ids=True, fixed_length=True, logprobs=2
    )
    assert body == {
        "model": "m",
        "prompt": "p",
        "max_tokens": 8,
        "temperature": 0.0,
        "stream": True,
        "logprobs": 2,
    }


def test_vllm_body_spells_the_extras_in_vllm_fields() -> None:
    body = completion_body(
        VLLM_DIALECT,
        "m",
        "p",
        8,
        stream=True,
        include_usage=True,
        token_ids=True,
        fixed_length=True,
    )
    assert body["return_token_ids"] is True and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}
    # fixed_length False is sent as asked (the gate's greedy answers may stop at EOS)
    assert (
        completion_body(VLLM_DIALECT, "m", "p", 8, stream=True, fixed_length=False)["ignore_eos"]
        is False
    )
    # not streamed: no "stream" key at all (the OpenAI default)
    scored = completion_body(VLLM_DIALECT, "m", [1, 2, 3], 1, stream=False, prompt_scores=0)
    assert scored == {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": 0,
    }


def test_asking_a_dialect_without_prompt_scoring_to_score_is_a_bug() -> None:
    assert not OPENAI.scores_prompts and VLLM_DIALECT.scores_prompts
    with pytest.raises(ValueError, match="openai"):
        completion_body(OPENAI, "m", [1], 1, stream=False, prompt_scores=0)


def test_answers_are_read_through_the_dialect() -> None:
    choice = {"text": "x", "token_ids": [5, 6], "prompt_token_ids": [1], "prompt_logprobs": [None]}
    assert VLLM_DIALECT.token_ids(choice) == [5, 6]
    assert VLLM_DIALECT.prompt_token_ids(choice) == [1]
    assert VLLM_DIALECT.prompt_scores(choice) == [None]
    assert OPENAI.token_ids(choice) == [] and OPENAI.prompt_token_ids(choice) == []
    assert OPENAI.prompt_scores(choice) is None
    assert VLLM_DIALECT.token_ids({"text": "x", "token_ids": None}) == []


def test_every_builtin_engine_declares_a_dialect() -> None:
    assert VllmEngine.dialect is VLLM_DIALECT
    # the command engine's servers are mostly vLLM-compatible: it asks with vLLM's extensions
    # and the gate learns from the answers what each server really gives (see command.py)
    assert CommandEngine.dialect is VLLM_DIALECT
    assert all(cls.dialect.name for cls in BUILTIN.values())


def _sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


def _gate_against(handler, coro):
    async def go():
        transport = httpx.MockTransport(handler)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await coro(client)

    return asyncio.run(go())


def test_the_gate_asks_a_plain_openai_server_only_standard_fields() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if body.get("stream"):
            choice = {"text": " four", "logprobs": {"tokens": [" four"], "token_logprobs": [-0.1]}}
            return httpx.Response(200, content=_sse({"choices": [choice]}))
        # echo scoring: offsets and logprobs over prompt + continuation
        lp = {"text_offset": [0, 13], "token_logprobs": [None, -0.1], "tokens": ["a", " four"]}
        return httpx.Response(200, json={"choices": [{"text": "", "logprobs": lp}]})

    completion = _gate_against(
        handler, lambda c: complete_greedy(c, "m", "one two three", 1, dialect=OPENAI)
    )
    assert completion.text == " four" and completion.token_ids == ()
    mode = _gate_against(
        handler,
        lambda c: detect_teacher_mode(c, "m", completion, 5.0, dialect=OPENAI),
    )
    assert mode == TEACHER_ECHO
    vllm_words = {"return_token_ids", "ignore_eos", "prompt_logprobs"}
    assert all(not (vllm_words & set(body)) for body in seen), seen


def test_the_gate_scores_token_ids_where_the_dialect_can() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body.get("prompt_logprobs") == 0 and body["prompt"] == [1, 2, 7]
        entries = [None, {"2": -0.5}, {"7": -0.25}]
        return httpx.Response(200, json={"choices": [{"text": "", "prompt_logprobs": entries}]})

    sample = Completion(prompt="p", text=" four", token_ids=(7,), prompt_token_ids=(1, 2))
    mode = _gate_against(
        handler, lambda c: detect_teacher_mode(c, "m", sample, 5.0, dialect=VLLM_DIALECT)
    )
    assert mode == TEACHER_PROMPT_LOGPROBS
