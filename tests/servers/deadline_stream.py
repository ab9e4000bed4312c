"""A streaming completions server that misbehaves in one way, for the deadline tests.

Run as ``python tests/servers/deadline_stream.py MODE``; it binds port 0 and prints the port
on its first stdout line. Modes:

- ``keepalive``: one token, then only ``: keepalive`` SSE comments (and empty ``data:``
  events and chunks without tokens) forever: bytes arrive, tokens never do;
- ``runaway``: ignores ``max_tokens`` and streams tokens forever, never ``[DONE]``;
- ``text_after_id``: one token with its id, then text-only chunks (no ids) forever;
- ``finish_after_id``: one token with its id, then finish-reason-only chunks forever;
- ``normal``: exactly ``max_tokens`` tokens, usage, ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

MODE = sys.argv[1] if len(sys.argv) > 1 else "normal"


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _token(i: int) -> bytes:
    return _event({"choices": [{"index": 0, "text": f" t{i}", "token_ids": [i]}]})


async def _stream(max_tokens: int):
    if MODE == "keepalive":
        yield _token(0)
        while True:
            await asyncio.sleep(0.1)
            yield b": keepalive\n\n"
            yield b"data:\n\n"
            yield _event({"choices": [{"index": 0, "text": ""}]})
    elif MODE in ("text_after_id", "finish_after_id"):
        yield _token(0)
        extra = (
            {"text": " z"} if MODE == "text_after_id" else {"text": "", "finish_reason": "length"}
        )
        while True:
            await asyncio.sleep(0.002)
            yield _event({"choices": [{"index": 0, **extra}]})
    elif MODE == "runaway":
        i = 0
        while True:
            yield _token(i)
            i += 1
            await asyncio.sleep(0.002)
    else:
        for i in range(max_tokens):
            yield _token(i)
        yield _event({"choices": [], "usage": {"completion_tokens": max_tokens}})
        yield b"data: [DONE]\n\n"


async def completions(request: Request) -> StreamingResponse:
    body = await request.json()
    return StreamingResponse(
        _stream(int(body.get("max_tokens", 16))), media_type="text/event-stream"
    )


async def models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})


app = Starlette(
    routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models),
    ]
)


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections queue from here on: the port is announced only once it listens
    print(sock.getsockname()[1], flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
