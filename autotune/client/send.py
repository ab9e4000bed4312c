"""Sending a streamed request: the answer once its headers arrived, on a connection that is
tried once more, on a new connection, when it failed before any answer.

Two doors, one rule. :func:`open_stream` hands back httpx's response (the gate, the profiler);
:func:`open_raw_stream` reads aiohttp's response directly where the client offers its session
(``client.http.StreamingClient``): the benchmark's hot path, where httpx's response and
byte-stream layers cost about 10 us of client CPU per streamed token. Reading the stream, and
bounding the time without a token, is ``client/stream.py``'s.

A request whose connection failed before any byte of an answer (a keep-alive connection the
server had closed: aiohttp's ``ServerDisconnectedError``, "Can not write request body") is
sent once more, on a connection opened for it (``StreamingClient.fresh``): a second pooled
connection may be just as stale (llama-server closes every one after a streamed answer). Each
such retry is counted, on the client and in :attr:`RawStream.transport_retries`: the server's
connection handling, never a failed request. A server that is really gone fails the retry too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx

from autotune.client.http import StreamingClient
from autotune.client.stream import ServerProgress, await_while_served

#: connect/write bounds of a streamed request; reading is bounded per token by the caller
_STREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=10.0, pool=None)


#: the most bytes autotune reads of an answer it takes whole (``/metrics``, ``/health``)
WHOLE_ANSWER_BYTES = 16 * 1024 * 1024


async def get_whole(
    client: httpx.AsyncClient, path: str, *, total_s: float, max_bytes: int = WHOLE_ANSWER_BYTES
) -> httpx.Response:
    """GET ``path`` and its whole answer within ``total_s`` seconds and ``max_bytes``, or
    ``TimeoutError`` / ``ValueError``. A per-read timeout (httpx's) never fires on a body that
    trickles a byte a second: a ``/metrics`` page sent that way held a trial, and the cleanup
    after Ctrl-C, for ever."""
    async with asyncio.timeout(total_s):
        async with client.stream("GET", path, timeout=total_s) as response:
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ValueError(f"GET {path}: an answer of over {max_bytes} bytes")
    # the body is decoded already: no header may have it decoded twice
    kept = {
        k: v
        for k, v in response.headers.items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    }
    return httpx.Response(
        response.status_code, headers=kept, content=bytes(body), request=response.request
    )


@contextlib.asynccontextmanager
async def open_stream(
    client: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    *,
    deadline_s: float | None,
    progress: ServerProgress | None = None,
) -> AsyncIterator[httpx.Response]:
    """POST ``body`` and hand back the streaming response once its headers arrived.

    The wait for the headers counts as waiting for the first token (a server that accepted the
    request and never answers sends none): it raises ``TimeoutError`` after ``deadline_s``, or
    with ``progress`` once the server has streamed nothing to any of its requests for that long
    (a server that holds a queued request's headers until a slot is free is not hung).
    """
    if progress is not None and deadline_s is not None:
        sent = _send_streaming(client, path, body)
        since = time.perf_counter()
        response, _retries = await await_while_served(
            sent, since=since, deadline_s=deadline_s, progress=progress
        )
    else:
        async with asyncio.timeout(deadline_s):
            response, _retries = await _send_streaming(client, path, body)  # counted on client
    try:
        yield response
    finally:
        await response.aclose()


async def _send_streaming(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> tuple[httpx.Response, int]:
    """The response once its headers arrived, and how many times it was sent again (0 or 1)."""
    try:
        request = client.build_request("POST", path, json=body, timeout=_STREAM_TIMEOUT)
        return await client.send(request, stream=True), 0
    except httpx.TransportError:
        # Nothing was received. Seen: a keep-alive connection the server had closed (aiohttp's
        # ServerDisconnectedError, which httpx-aiohttp reports as ConnectTimeout; llama-server
        # closes one after every streamed answer). One attempt more, on a new connection (a
        # pooled one may be as stale), counted; a server that is really gone fails it too.
        retry = _fresh(client)
        request = retry.build_request("POST", path, json=body, timeout=_STREAM_TIMEOUT)
        return await retry.send(request, stream=True), 1


def _fresh(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """Where a failed request is sent again: a new connection, counted on ``client``; a client
    without connections of its own (a test's ``MockTransport``) is itself."""
    if not isinstance(client, StreamingClient):
        return client
    client.transport_retries += 1
    return client.fresh()


#: what a request's transport raises when the connection fails or the answer breaks off
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, aiohttp.ClientError)

#: connect bound of a raw streamed request; no total or read bound: reading is bounded per
#: token by the caller (aiohttp's session default is a 300 s total, which must not apply)
_RAW_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=None)


@dataclass(frozen=True)
class RawStream:
    """A streamed answer whose headers arrived: status, body chunks as they come, whole body."""

    status: int
    #: the body in the pieces the network delivered them (an SSE event may span two)
    chunks: AsyncIterator[bytes]
    #: the rest of the body at once (for an error answer's detail)
    read: Callable[[], Awaitable[bytes]]
    #: the Content-Type header ("" without one): evidence when no token came
    content_type: str = ""
    #: times the request was sent again on a new connection before this answer came (0, 1)
    transport_retries: int = 0


@contextlib.asynccontextmanager
async def open_raw_stream(
    client: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> AsyncIterator[RawStream]:
    """POST ``body`` and hand back the answer once its headers arrived, with no deadline of its
    own: the caller bounds the whole request with a ``client.stream.TokenDeadline``.

    On a :class:`~autotune.client.http.StreamingClient` the request goes through its aiohttp session
    directly (no httpx request, response or byte-stream objects per request and per chunk);
    any other client (tests' ``httpx.MockTransport``) is read through httpx. Transport errors
    are those in :data:`TRANSPORT_ERRORS`. A redirect is not followed (aiohttp follows them by
    default, httpx does not): a server that sends the benchmark elsewhere would have another
    server's speed reported as its own, so its 3xx is the answer, a failed request.
    """
    if not isinstance(client, StreamingClient):
        response, retries = await _send_streaming(client, path, body)
        try:
            yield RawStream(
                response.status_code,
                response.aiter_bytes(),
                response.aread,
                response.headers.get("content-type", ""),
                retries,
            )
        finally:
            await response.aclose()
        return
    url = client.root_url + path
    retries = 0
    try:
        answer = await client.aiohttp_session().post(
            url,
            json=body,
            headers=client.raw_headers,
            timeout=_RAW_TIMEOUT,
            allow_redirects=False,
        )
    except aiohttp.ClientConnectionError:
        # Nothing was received (seen: a keep-alive connection the server had closed,
        # ServerDisconnectedError): once more on a new connection, as :func:`_send_streaming`.
        retries = 1
        answer = (
            await _fresh(client)
            .aiohttp_session()
            .post(
                url,
                json=body,
                headers=client.raw_headers,
                timeout=_RAW_TIMEOUT,
                allow_redirects=False,
            )
        )
    try:
        yield RawStream(
            answer.status,
            answer.content.iter_any(),
            answer.read,
            answer.headers.get("Content-Type", ""),
            retries,
        )
    finally:
        # back to the pool if the body was read to its end, closed otherwise (aiohttp decides)
        answer.release()
