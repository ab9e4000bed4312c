"""The benchmark client's hot path: a ``StreamingClient`` reads aiohttp's response directly
(``protocol.open_raw_stream``) and bounds the time without a token with one timer per request
(``protocol.TokenDeadline``). Against the fake server and against a raw socket server that
writes exact bytes (a stream that stops, a connection dropped mid-answer), and through httpx
for the SSE splitting the two transports share.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from autotune.bench.phase import run_phase, stream_request
from autotune.client import http as client_module
from autotune.client.http import StreamingClient, connect
from autotune.client.stream import TokenDeadline
from autotune.engines.vllm.dialect import VLLM_DIALECT
from tests.fake_proc import KEY


def event(i: int) -> bytes:
    chunk = {"choices": [{"index": 0, "text": f" t{i}", "token_ids": [i]}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


USAGE = b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n'

# --- a raw HTTP/1.1 server: exact bytes, exact moments ------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> dict:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return json.loads(await reader.readexactly(length))


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    """Serve ``handler(reader, writer, connection_number)`` on a port the OS picks."""
    count = 0
    tasks: list[asyncio.Task] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        count += 1
        tasks.append(asyncio.current_task())
        try:
            await handler(reader, writer, count)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for task in tasks:
            task.cancel()
        server.close()


def run_raw(handler: Handler, *, deadline_s: float = 5.0):
    async def go():
        async with (
            raw_server(handler) as url,
            connect(url, "k", max_connections=4, timeout_s=30.0) as client,
        ):
            return await stream_request(
                client, "m", "p", 3, dialect=VLLM_DIALECT, read_timeout_s=deadline_s
            )

    return asyncio.run(go())


def test_events_split_across_writes_and_the_done_line_are_read():
    async def handler(reader, writer, _n):
        await read_request(reader)
        writer.write(STREAM_HEAD)
        body = event(0) + event(1) + event(2) + USAGE + b"data: [DONE]\n\n"
        for start in range(0, len(body), 7):  # 7-byte pieces: events and lines split anywhere
            writer.write(chunked(body[start : start + 7]))
            await writer.drain()
            await asyncio.sleep(0)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    record = run_raw(handler)
    assert record.ok, record.error
    assert record.token_ids == (0, 1, 2) and record.text == " t0 t1 t2"
    assert record.output_tokens == 3 and len(record.token_times_s) == 3


def test_a_stream_that_stops_is_a_hang_naming_the_token_it_waited_for():
    async def handler(reader, writer, _n):
        await read_request(reader)
        writer.write(STREAM_HEAD + chunked(event(0)) + chunked(event(1)))
        await writer.drain()
        await asyncio.Event().wait()  # the connection stays open, nothing more comes

    record = run_raw(handler, deadline_s=0.5)
    assert not record.ok and record.hung
    assert record.error == "hang: no token within 0.5 s (waiting for token 3)"
    assert len(record.token_times_s) == 2
    assert record.e2e_s >= 0.5  # no token for one deadline, after the second token


def one_slot_server(tokens: int, gap_s: float, *, serve: int | None = None) -> Handler:
    """A server with one slot, as llama-server with ``--parallel 1``: requests wait their turn
    (no byte until then), each streams ``tokens`` tokens ``gap_s`` apart. ``serve``: after that
    many answers it goes silent for good (the connection stays open)."""
    slot = asyncio.Lock()
    served = 0

    async def handler(reader, writer, _n):
        nonlocal served
        await read_request(reader)
        async with slot:
            if serve is not None and served >= serve:
                await asyncio.Event().wait()
            writer.write(STREAM_HEAD)
            for i in range(tokens):
                writer.write(chunked(event(i)))
                await writer.drain()
                await asyncio.sleep(gap_s)
            writer.write(chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            served += 1

    return handler


def run_raw_phase(handler: Handler, *, requests: int, deadline_s: float):
    async def go():
        async with (
            raw_server(handler) as url,
            connect(url, "k", max_connections=8, timeout_s=30.0) as client,
        ):
            return await run_phase(
                client, "m", ["p"], requests, requests, 8, dialect=VLLM_DIALECT,
                read_timeout_s=deadline_s,
            )  # fmt: skip

    return asyncio.run(go())


def test_a_request_queued_behind_streaming_ones_is_waiting_not_hung():
    """Three requests at once to one slot, 8 tokens 0.25 s apart each: the third waits about
    4 s for its first token, four no-token deadlines of its own, while the server streams to
    the others all along. That is a queue (its TTFT says so), not a hang."""
    result = run_raw_phase(one_slot_server(8, 0.25), requests=3, deadline_s=1.0)
    assert result.hang is None, result.hang
    assert all(r.ok for r in result.records) and len(result.records) == 3
    assert max(r.ttft_s for r in result.records) > 1.0  # one of them did queue past a deadline


def test_a_server_silent_to_every_request_is_a_hang_after_one_deadline_of_silence():
    """The same server answers one request, then goes silent: the queued one is hung once
    nothing at all has streamed for the deadline."""
    result = run_raw_phase(one_slot_server(4, 0.05, serve=1), requests=2, deadline_s=1.0)
    assert result.hang is not None and "waiting for the first token" in result.hang
    hung = [r for r in result.records if r.hung]
    assert hung and hung[0].e2e_s >= 1.0


def run_raw_gate(handler: Handler, *, prompts: int, deadline_s: float):
    """The gate's verification requests, all at once, to ``handler``."""
    from autotune.gate.requests import gather_completions

    async def go():
        async with (
            raw_server(handler) as url,
            connect(url, "k", max_connections=8, timeout_s=30.0) as client,
        ):
            names = [f"p{i}" for i in range(prompts)]
            return await gather_completions(
                client, "m", names, dict.fromkeys(names, 8), dialect=VLLM_DIALECT,
                concurrent=True, deadline_s=deadline_s,
            )  # fmt: skip

    return asyncio.run(go())


def test_the_gate_s_requests_queued_at_one_slot_are_waiting_not_hung():
    """The gate's batched verification (every check prompt at once) against one slot: the
    last waits about four of its deadlines for a first token while the others stream."""
    answers = run_raw_gate(one_slot_server(8, 0.25), prompts=3, deadline_s=1.0)
    assert [a.text for a in answers] == [" t0 t1 t2 t3 t4 t5 t6 t7"] * 3


def test_the_gate_s_requests_to_a_server_silent_to_all_are_a_hang():
    from autotune.client.stream import NoTokenWithin

    with pytest.raises(NoTokenWithin, match="got no token within 1 s"):
        run_raw_gate(one_slot_server(4, 0.05, serve=1), prompts=2, deadline_s=1.0)


def test_a_connection_dropped_mid_answer_is_an_error_not_a_hang():
    async def handler(reader, writer, _n):
        await read_request(reader)
        writer.write(STREAM_HEAD + chunked(event(0)) + chunked(event(1)))
        await writer.drain()
        # closed by on_connect without the terminating chunk: the body broke off

    record = run_raw(handler)
    assert not record.ok and not record.hung
    assert "hang" not in record.error and "Payload" in record.error, record.error
    assert len(record.token_times_s) == 2


def test_an_error_status_keeps_the_body_as_detail():
    async def handler(reader, writer, _n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nboom")
        await writer.drain()

    record = run_raw(handler)
    assert not record.ok and not record.hung and record.error == "http 500: boom"


def test_a_redirect_is_not_followed():
    """aiohttp follows redirects by default, and the benchmark measured the server a 307 sent
    it to, reported as the one given (the gate's httpx client refused it): a redirect is the
    answer, a failed request, and the other server is never asked."""
    asked_elsewhere: list[int] = []

    async def elsewhere(reader, writer, _n):
        asked_elsewhere.append(1)
        await read_request(reader)
        writer.write(STREAM_HEAD + chunked(event(0) + event(1) + event(2)) + b"0\r\n\r\n")
        await writer.drain()

    async def go():
        async with raw_server(elsewhere) as target:

            async def redirect(reader, writer, _n):
                await read_request(reader)
                location = f"{target}/v1/completions".encode()
                writer.write(
                    b"HTTP/1.1 307 Temporary Redirect\r\nlocation: "
                    + location
                    + b"\r\ncontent-length: 0\r\n\r\n"
                )
                await writer.drain()

            async with (
                raw_server(redirect) as url,
                connect(url, "k", max_connections=4, timeout_s=30.0) as client,
            ):
                return await stream_request(
                    client, "m", "p", 3, dialect=VLLM_DIALECT, read_timeout_s=5.0
                )

    record = asyncio.run(go())
    assert not record.ok and (record.error or "").startswith("http 307")
    assert not asked_elsewhere


def test_an_error_field_mid_answer_fails_the_request_with_the_servers_words():
    """llama.cpp's server reports a failure mid-answer as an ``error:`` line, then ends the
    body as usual: the request was recorded as served, with the tokens before it."""

    async def handler(reader, writer, _n):
        await read_request(reader)
        failure = b'error: {"code":500,"message":"llama_decode failed"}\n\n'
        writer.write(STREAM_HEAD + chunked(event(0) + failure) + b"0\r\n\r\n")
        await writer.drain()

    record = run_raw(handler)
    assert not record.ok and not record.hung and len(record.token_times_s) == 1
    assert record.error == (
        'the stream carried an error: {"code":500,"message":"llama_decode failed"}'
    )


def test_a_whole_json_answer_names_its_content_type():
    """A server that ignores ``stream: true``: the error said only "stream ended without
    tokens", request after request."""

    async def handler(reader, writer, _n):
        await read_request(reader)
        body = json.dumps({"choices": [{"text": " t0 t1 t2"}]}).encode()
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
        writer.write(head.encode() + b"\r\n\r\n" + body)
        await writer.drain()

    record = run_raw(handler)
    assert not record.ok and record.error == (
        "stream ended without tokens: the answer was not a server-sent event stream "
        "(application/json)"
    )


def test_a_connection_closed_before_any_answer_is_tried_once_more():
    async def handler(reader, writer, n):
        await read_request(reader)
        if n == 1:
            return  # closed without a byte of answer (a keep-alive connection the server shut)
        writer.write(STREAM_HEAD + chunked(event(7) + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    record = run_raw(handler)
    assert record.ok and record.token_ids == (7,), record.error


def test_the_request_sent_carries_the_key_and_the_fixed_length_body():
    seen: dict = {}

    async def handler(reader, writer, _n):
        head = await reader.readuntil(b"\r\n\r\n")
        seen["head"] = head.decode().lower()
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        seen["body"] = json.loads(await reader.readexactly(length))
        writer.write(STREAM_HEAD + chunked(event(1) + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    record = run_raw(handler)
    assert record.ok
    assert (
        seen["head"].startswith("post /v1/completions ")
        and "authorization: bearer k" in seen["head"]
    )
    body = seen["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True and body["ignore_eos"] is True


# --- the fake server: the same record through either transport -----------------------------------


def test_the_aiohttp_path_records_what_the_httpx_path_records(fake_server, monkeypatch):
    proc = fake_server("--decode-ms", "1")

    async def through(client: httpx.AsyncClient):
        async with client:
            return await run_phase(
                client, "toy", ["1 2 3", "a b c"], 6, 3, 12, dialect=VLLM_DIALECT,
                read_timeout_s=30.0,
            )  # fmt: skip

    plain = asyncio.run(
        through(httpx.AsyncClient(base_url=proc.url, headers={"Authorization": f"Bearer {KEY}"}))
    )

    # the streaming client's requests must not go through httpx at all
    async def no_httpx(self, request):
        raise AssertionError(f"httpx carried {request.url}")

    monkeypatch.setattr(client_module._SessionTransport, "handle_async_request", no_httpx)
    fast = asyncio.run(through(connect(proc.url, KEY, max_connections=4)))
    assert all(r.ok for r in plain.records) and all(r.ok for r in fast.records)
    for a, b in zip(plain.records, fast.records, strict=True):
        assert (a.prompt, a.token_ids, a.text, a.output_tokens) == (
            b.prompt, b.token_ids, b.text, b.output_tokens,
        )  # fmt: skip
        assert len(b.token_times_s) == b.output_tokens == 12
        assert b.ttft_s == b.token_times_s[0] > 0


def test_a_server_that_never_answers_is_a_hang_after_one_deadline(fake_server):
    proc = fake_server("--fault", "hang_in_bench")

    async def go():
        async with connect(proc.url, KEY, max_connections=2) as client:
            assert isinstance(client, StreamingClient)
            return await stream_request(
                client, "toy", "1 2", 4, dialect=VLLM_DIALECT, read_timeout_s=0.5
            )

    record = asyncio.run(go())
    assert record.hung and not record.ok
    assert record.error == "hang: no token within 0.5 s (waiting for the first token)"
    assert record.e2e_s >= 0.5


def test_a_wrong_key_is_an_http_error_with_the_detail(fake_server):
    proc = fake_server()

    async def go():
        async with connect(proc.url, "wrong", max_connections=2) as client:
            return await stream_request(client, "toy", "1 2", 4, dialect=VLLM_DIALECT)

    record = asyncio.run(go())
    assert not record.ok and record.error.startswith("http 401: ")


# --- TokenDeadline: verdicts on a clock the test moves ---------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_stream_that_keeps_coming_outlives_many_deadlines():
    clock = Clock()

    async def go() -> float:
        async with TokenDeadline(0.01, 0.0, clock=clock) as deadline:
            for _ in range(40):  # 40 arrivals 0.006 apart on the clock: 24 deadlines in all
                clock.now += 0.006
                deadline.last = clock.now
                await asyncio.sleep(0.002)  # the timer fires in between, more than once
        return clock.now

    assert asyncio.run(go()) == pytest.approx(0.24)


def test_silence_for_one_deadline_raises_timeout_at_the_awaiting_reader():
    clock = Clock()
    reached = []

    async def go() -> None:
        async with TokenDeadline(0.01, 0.0, clock=clock) as deadline:
            clock.now = 0.005
            deadline.last = clock.now
            await asyncio.sleep(0.02)  # the clock stands still: idle 0 < deadline, re-armed
            reached.append("alive")
            clock.now = 0.5  # nothing arrived for far longer than the deadline
            await asyncio.Event().wait()
        reached.append("never")

    with pytest.raises(TimeoutError):
        asyncio.run(go())
    assert reached == ["alive"]


def test_the_first_token_counts_from_the_send_and_none_means_no_deadline():
    clock = Clock()

    async def first() -> None:
        async with TokenDeadline(0.01, 0.0, clock=clock):
            clock.now = 0.02  # no arrival at all since the send
            await asyncio.Event().wait()

    with pytest.raises(TimeoutError):
        asyncio.run(first())

    async def unbounded() -> str:
        async with TokenDeadline(None, 0.0, clock=clock):
            clock.now = 1e6
            await asyncio.sleep(0.02)
        return "done"

    assert asyncio.run(unbounded()) == "done"


# --- the SSE splitting, through httpx (the same loop as aiohttp's) ----------------------------


def mock_client(pieces: list[bytes]) -> httpx.AsyncClient:
    class Pieces(httpx.AsyncByteStream):
        async def __aiter__(self):
            for piece in pieces:
                yield piece

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Pieces())

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://test")


def stream_of(pieces: list[bytes]):
    async def go():
        async with mock_client(pieces) as client:
            return await stream_request(client, "m", "p", 3, dialect=VLLM_DIALECT)

    return asyncio.run(go())


def test_an_event_split_mid_json_and_a_last_event_without_newline():
    body = event(0) + event(1)
    cut = len(event(0)) + 11  # inside the second event's JSON
    record = stream_of([body[:cut], body[cut:], event(2).rstrip(b"\n")])
    assert record.ok and record.token_ids == (0, 1, 2) and record.output_tokens == 3


def test_a_chunk_of_several_token_ids_is_that_many_tokens_at_one_time():
    chunk = {"choices": [{"text": " a b", "token_ids": [5, 6]}]}
    record = stream_of([b"data: " + json.dumps(chunk).encode() + b"\n\n", b"data: [DONE]\n\n"])
    assert record.token_ids == (5, 6) and len(set(record.token_times_s)) == 1
    assert record.output_tokens == 2


@pytest.mark.parametrize("bad", [b"data: {not json\n\n", b"data: \xff\xfe\n\n"])
def test_a_chunk_that_is_not_json_is_a_failed_request(bad):
    record = stream_of([event(0), bad])
    assert not record.ok and not record.hung and record.error.startswith("bad stream chunk")
