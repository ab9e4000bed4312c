"""A small OpenAI-compatible completions server whose streams lie in chosen ways.

The mode is the request's ``model`` (one process serves them all):

* ``honest``: one token per event with its id, ``step`` seconds apart, true usage;
* ``usage4x``: as honest, but ``usage.completion_tokens`` is 4x the tokens streamed;
* ``usage4x-text``: the same without token ids (text only);
* ``burst``: the first token at once, then the answer held for ``n * step`` and flushed with
  0.4 ms between tokens;
* ``held``: the whole answer held for ``n * step``, then flushed 0.4 ms apart;
* ``text4``: text only, four tokens per event, an event every ``4 * step``;
* ``split``: text only, every token's text split over two events ``step / 2`` apart;
* ``text``: text only, one token per event (the steady text-only reference);
* ``ids2x``: two token ids per event for one token of text (ids that count double).

The text is the demo model's (``models/demo``) tokenization of spelled-out numbers, so its
tokenizer counts exactly ``max_tokens`` tokens in any answer. ``GET /metrics`` carries
``vllm:generation_tokens_total`` (the tokens truly streamed, or 4x in ``usage4x`` modes when
started with ``--metrics-lie``).

Run: ``python tests/servers/lying_stream.py [--step S]``; it binds port 0 and prints
``port N`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route
from tokenizers import Tokenizer

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo" / "tokenizer.json"
WORDS = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
]
FLUSH_GAP_S = 0.0004
TEXT_ONLY = {"usage4x-text", "text4", "split", "text"}

_tok = Tokenizer.from_file(str(DEMO))
_text = "".join(f" {w}" for w in WORDS * 40)
_enc = _tok.encode(_text, add_special_tokens=False)
PIECES = [_text[a:b] for a, b in _enc.offsets]
IDS = list(_enc.ids)
STATE = {"generated": 0, "lie": False}


def _event(obj: dict) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _chunk(pieces: list[str], ids: list[int], with_ids: bool) -> bytes:
    choice: dict = {"index": 0, "text": "".join(pieces), "finish_reason": None}
    if with_ids:
        choice["token_ids"] = ids
    return _event({"object": "text_completion", "choices": [choice]})


async def _stream(mode: str, n: int, step: float):
    pieces, ids = PIECES[:n], IDS[:n]
    with_ids = mode not in TEXT_ONLY
    usage = 4 * n if mode.startswith("usage4x") else n
    STATE["generated"] += 4 * n if STATE["lie"] and mode.startswith("usage4x") else n
    if mode in ("honest", "usage4x", "usage4x-text", "text"):
        for i in range(n):
            yield _chunk(pieces[i : i + 1], ids[i : i + 1], with_ids)
            await asyncio.sleep(step)
    elif mode in ("burst", "held"):
        start = 0
        if mode == "burst":
            yield _chunk(pieces[:1], ids[:1], with_ids)
            start = 1
        await asyncio.sleep(n * step)
        for i in range(start, n):
            yield _chunk(pieces[i : i + 1], ids[i : i + 1], with_ids)
            time.sleep(FLUSH_GAP_S)  # blocking on purpose: asyncio's timer is coarser than this
    elif mode == "ids2x":
        for i in range(n // 2):
            yield _chunk(pieces[i : i + 1], ids[2 * i : 2 * i + 2], True)
            await asyncio.sleep(2 * step)
    elif mode == "text4":
        for i in range(0, n, 4):
            yield _chunk(pieces[i : i + 4], ids[i : i + 4], with_ids)
            await asyncio.sleep(4 * step)
    elif mode == "split":
        for i in range(n):
            piece = pieces[i]
            cut = max(1, len(piece) // 2) if len(piece) > 1 else len(piece)
            yield _chunk([piece[:cut]], [], False)
            await asyncio.sleep(step / 2)
            if piece[cut:]:
                yield _chunk([piece[cut:]], [], False)
            await asyncio.sleep(step / 2)
    else:
        yield _event({"error": {"message": f"unknown mode {mode}"}})
    finish = {"index": 0, "text": "", "finish_reason": "length"}
    yield _event({"object": "text_completion", "choices": [finish]})
    yield _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": usage}})
    yield b"data: [DONE]\n\n"


def make_app(step: float) -> Starlette:
    async def completions(request: Request):
        body = await request.json()
        n = min(int(body.get("max_tokens") or 16), len(PIECES))
        mode = str(body.get("model") or "honest")
        return StreamingResponse(_stream(mode, n, step), media_type="text/event-stream")

    async def metrics(request: Request):
        text = (
            "# TYPE vllm:generation_tokens counter\n"
            f"vllm:generation_tokens_total {STATE['generated']}\n"
        )
        return PlainTextResponse(text)

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )


@contextlib.contextmanager
def running(*args: str) -> Iterator[str]:
    """This server in a child process; yields its base URL, stops it afterwards."""
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("port "):
            raise RuntimeError(f"lying_stream did not start: {line!r} {proc.stderr.read()[:2000]}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--step", type=float, default=0.01)
    parser.add_argument("--metrics-lie", action="store_true")
    args = parser.parse_args()
    STATE["lie"] = args.metrics_lie
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    print(f"port {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(make_app(args.step), log_level="warning", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
