"""TEST DOUBLE's HTTP layer: the subset of vLLM's OpenAI-compatible API that autotune uses.

Routes, request validation (vLLM's 400s) and response shapes for the four dialects; the
request-level faults (500s, hangs, empty text, missing metrics) and the connection fault
(``stale_keepalive``: :class:`StaleKeepAlive`) are answered here. Generation is the scheduler's
(:mod:`autotune.testing.fake_scheduler`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route

from autotune.testing.fake_options import MAX_LOGPROBS, ServerOptions, log
from autotune.testing.fake_scheduler import FakeScheduler, GenRequest, SchedulerStats, TokenEvent


class BadRequest(Exception):
    """A request vLLM would answer with 400."""


@dataclass(frozen=True)
class CompletionParams:
    """The validated fields of one ``/v1/completions`` body."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    stream: bool
    include_usage: bool
    logprobs: int | None
    prompt_logprobs: int | None
    return_token_ids: bool
    ignore_eos: bool
    seed: int | None
    echo: bool = False


def _error(status: int, message: str, kind: str) -> Any:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


class FakeServer:
    """The Starlette app plus the scheduler; one per process."""

    def __init__(
        self, opts: ServerOptions, scheduler: FakeScheduler, *, sim: dict[str, Any]
    ) -> None:
        self.opts = opts
        self.scheduler = scheduler
        self.model = scheduler.model
        self.sim = sim
        self.started = time.monotonic()
        self.child: subprocess.Popen[bytes] | None = None
        self.port = opts.port  # the real one once bound (--port 0)
        self._scheduler_task: asyncio.Task[None] | None = None
        #: the ``replay_cache`` fault's stored answers: (prompt as sent, max_tokens) -> chunks
        self._replayed: dict[tuple[str, int], list[str]] = {}

    def app(self) -> Any:
        """Build the ASGI app."""

        @contextlib.asynccontextmanager
        async def lifespan(_app: Any) -> AsyncIterator[None]:
            self._scheduler_task = asyncio.create_task(self.scheduler.run())
            log(f"ready on http://{self.opts.host}:{self.port} (pid {os.getpid()})")
            if self.opts.port_file:  # atomically: a reader never sees a half-written port
                tmp = f"{self.opts.port_file}.tmp"
                with open(tmp, "w") as fh:
                    fh.write(f"{self.port}\n")
                os.replace(tmp, self.opts.port_file)
            yield
            self._scheduler_task.cancel()

        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/sim/stats", self.sim_stats, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/sim/reset", self.sim_reset, methods=["POST"]),
        ]
        app = Starlette(routes=routes, lifespan=lifespan)
        return StaleKeepAlive(app) if self.opts.fault == "stale_keepalive" else app

    # -- helpers -----------------------------------------------------------------------------
    def _ready(self) -> bool:
        return time.monotonic() - self.started >= self.opts.ready_delay_s

    def _authorized(self, request: Any) -> bool:
        if self.opts.api_key is None:
            return True
        return request.headers.get("authorization", "") == f"Bearer {self.opts.api_key}"

    # -- routes ------------------------------------------------------------------------------
    async def health(self, request: Any) -> Any:
        return Response(status_code=200 if self._ready() else 503)

    async def version(self, request: Any) -> Any:
        return JSONResponse({"version": "0.0.0+fake"})

    async def models(self, request: Any) -> Any:
        if not self._authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        card = {
            "id": self.opts.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.opts.model,
            "parent": None,
            "max_model_len": self.opts.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def sim_stats(self, request: Any) -> Any:
        stats = self.scheduler.stats
        decode_s = stats.busy_decode_ms / 1000.0
        body = {
            **asdict(stats),
            "mode": self.opts.simulate or "toy",
            "time_scale": self.opts.time_scale,
            "fault": self.opts.fault,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "sim_decode_tok_s": stats.tokens / decode_s if decode_s > 0 else None,
            "step_ms_batch1": self.scheduler.step_cost_ms(1),
            "child_pid": self.child.pid if self.child else None,
            **self.sim,
        }
        return JSONResponse(body)

    async def metrics(self, request: Any) -> Any:
        """A few of vLLM's Prometheus metrics (see the module docstring)."""
        if self.opts.fault == "no_metrics":
            return PlainTextResponse("Not Found", status_code=404)
        scheduler, stats = self.scheduler, self.scheduler.stats
        label = f'{{model_name="{self.opts.served_model_name}"}}'
        preempted = stats.completed if self.opts.fault == "preempt" else 0
        rows = [
            ("vllm:num_requests_running", "gauge", len(scheduler.running)),
            ("vllm:num_requests_waiting", "gauge", len(scheduler.waiting)),
            ("vllm:kv_cache_usage_perc", "gauge", len(scheduler.running) / scheduler.max_num_seqs),
            ("vllm:generation_tokens", "counter", stats.tokens),
            ("vllm:num_preemptions", "counter", preempted),
        ]
        lines = []
        for name, kind, value in rows:
            sample = f"{name}_total" if kind == "counter" else name
            lines += [f"# TYPE {name} {kind}", f"{sample}{label} {float(value)}"]
        return PlainTextResponse("\n".join(lines) + "\n")

    async def sim_reset(self, request: Any) -> Any:
        """Zero the counters (test hook), e.g. between a warm-up and a measured phase."""
        completed = self.scheduler.stats.completed  # crash_mid_bench counts from start regardless
        self.scheduler.stats = SchedulerStats(completed=completed)
        return Response(status_code=204)

    async def completions(self, request: Any) -> Any:
        if not self._authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        if not self._ready():
            return _error(503, "The server is still loading the model.", "ServiceUnavailable")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "Request body is not valid JSON.", "BadRequestError")
        model = body.get("model") if isinstance(body, dict) else None
        if model is not None and model != self.opts.served_model_name:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        try:
            params = self._parse(body)
        except BadRequest as exc:
            return _error(400, str(exc), "BadRequestError")
        fault = self.opts.fault
        if fault == "http_500":
            return _error(500, "Internal Server Error (injected fault)", "InternalServerError")
        if fault == "flaky_500" and params.stream:
            # Only streamed (benchmark) requests, one in three: the server starts, verifies and
            # stays up, but part of its load fails.
            self._flaky_count = getattr(self, "_flaky_count", 0) + 1
            if self._flaky_count % 3 == 0:
                return _error(
                    500, "Internal Server Error (injected, 1 in 3)", "InternalServerError"
                )
        if fault == "one_500_in_bench" and params.include_usage:
            self._bench_count = getattr(self, "_bench_count", 0) + 1
            if self._bench_count == self.opts.fault_after:
                return _error(500, "Internal Server Error (injected, once)", "InternalServerError")
        if fault == "wrong_late" and params.include_usage:
            # right until the --fault-after-th benchmark request, whitespace from then on
            self._bench_count = getattr(self, "_bench_count", 0) + 1
            if self._bench_count > self.opts.fault_after:
                self.scheduler.wrong_from = 0
        if fault == "healthy_but_broken":
            return _error(
                500,
                "EngineCore encountered an issue: RuntimeError: Unsupported attention "
                "configuration: head_dim=16",
                "InternalServerError",
            )
        replay_key = (json.dumps(body.get("prompt")), params.max_tokens)  # the text, as sent
        replays = fault == "replay_cache" or (
            # replays only while other requests are in flight: the load phases, never the
            # single-request phase beside its control
            fault == "replay_when_busy"
            and (self.scheduler.waiting or any(not r.cancelled for r in self.scheduler.running))
        )
        if replays and params.include_usage and replay_key in self._replayed:
            stored = self._replayed[replay_key]  # sent at once: nothing is decoded
            return StreamingResponse(iter(stored), media_type="text/event-stream")
        if fault == "hang" or (fault == "hang_in_bench" and params.include_usage):
            await asyncio.Event().wait()  # never set: the request is accepted and never answered
        rng = random.Random(params.seed if params.seed is not None else random.getrandbits(64))
        gen = GenRequest(
            prompt_ids=params.prompt_ids,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            ignore_eos=params.ignore_eos,
            rng=rng,
        )
        if fault == "wrong_alone_in_bench" and params.include_usage:
            # wrong when it arrives with nothing else in flight: the single-request phase
            gen.broken = not self.scheduler.waiting and not any(
                not r.cancelled for r in self.scheduler.running
            )
        request_id = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        self.scheduler.submit(gen)
        if params.stream:
            chunks = self._stream(gen, params, request_id, created)
            if fault in ("replay_cache", "replay_when_busy") and params.include_usage:
                chunks = self._recorded(chunks, replay_key)
            return StreamingResponse(chunks, media_type="text/event-stream")
        events: list[TokenEvent] = []
        try:
            while not events or events[-1].finish_reason is None:
                events.append(await gen.events.get())
        except asyncio.CancelledError:
            gen.cancelled = True  # the client went away: free the slot
            raise
        return JSONResponse(self._full_response(gen, params, events, request_id, created))

    def _parse(self, body: Any) -> CompletionParams:
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object.")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            prompt_ids = self.model.tokenize(prompt)
        elif isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            prompt_ids = list(prompt)
            bad = [t for t in prompt_ids if not self.model.valid_id(t)]
            if bad:
                raise BadRequest(f"Token id {bad[0]} is out of vocabulary")
        else:
            raise BadRequest("prompt must be a string or a list of token ids (one prompt only)")
        if not prompt_ids:
            raise BadRequest("The prompt cannot be empty.")
        max_tokens = body.get("max_tokens")
        max_tokens = 16 if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("max_tokens must be an integer >= 1")
        if len(prompt_ids) + max_tokens > self.opts.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.opts.max_model_len} tokens. "
                f"However, you requested {len(prompt_ids) + max_tokens} tokens "
                f"({len(prompt_ids)} in the messages, {max_tokens} in the completion)."
            )
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        logprobs = _optional_count(body, "logprobs")
        prompt_logprobs = _optional_count(body, "prompt_logprobs")
        stream = bool(body.get("stream", False))
        if stream and prompt_logprobs is not None:
            raise BadRequest("prompt_logprobs is not supported with stream=true")
        stream_options = body.get("stream_options") or {}
        seed = body.get("seed")
        dialect = self.opts.dialect
        if dialect != "vllm":  # vLLM's own fields are unknown here: ignored, as proxies do
            prompt_logprobs = None
        if dialect == "text":
            logprobs = None
        echo = dialect == "openai" and bool(body.get("echo", False))
        if echo and stream:
            raise BadRequest("echo is not supported with stream=true")
        return CompletionParams(
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            include_usage=bool(stream_options.get("include_usage", False)),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            return_token_ids=dialect == "vllm" and bool(body.get("return_token_ids", False)),
            ignore_eos=bool(body.get("ignore_eos", False)),
            seed=seed if isinstance(seed, int) else (self.opts.seed if temperature > 0 else None),
            echo=echo,
        )

    def _logprobs_block(self, events: list[TokenEvent], k: int, offset: int) -> dict[str, Any]:
        tokens: list[str] = []
        token_logprobs: list[float] = []
        top_logprobs: list[dict[str, float]] = []
        text_offset: list[int] = []
        for event in events:
            token = self.model.token_str(event.chosen.token_id)
            text_offset.append(offset)
            offset += len(token)
            tokens.append(token)
            token_logprobs.append(event.chosen.logprob)
            top = {self.model.token_str(e.token_id): e.logprob for e in event.top[:k]}
            top.setdefault(token, event.chosen.logprob)
            top_logprobs.append(top)
        return {
            "text_offset": text_offset,
            "token_logprobs": token_logprobs,
            "tokens": tokens,
            "top_logprobs": top_logprobs,
        }

    def _content_logprobs(self, events: list[TokenEvent], k: int) -> dict[str, Any]:
        """llama.cpp's llama-server's ``logprobs`` on ``/v1/completions``: the chat API's
        per-token ``content`` entries, each with its token id, and ids in the top candidates."""

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            token = self.model.token_str(token_id)
            return {
                "id": token_id,
                "token": token,
                "bytes": list(token.encode()),
                "logprob": logprob,
            }

        content = []
        for event in events:
            top = [entry(e.token_id, e.logprob) for e in event.top[:k]]
            chosen = entry(event.chosen.token_id, event.chosen.logprob)
            if chosen["id"] not in {t["id"] for t in top}:
                top.append(dict(chosen))
            content.append({**chosen, "top_logprobs": top})
        return {"content": content}

    def _logprobs(self, events: list[TokenEvent], k: int, offset: int) -> dict[str, Any]:
        """The dialect's ``logprobs`` of ``events``: llama.cpp's shape or the completions API's."""
        if self.opts.dialect == "llamacpp":
            return self._content_logprobs(events, k)
        return self._logprobs_block(events, k, offset)

    def _prompt_logprobs(self, prompt_ids: list[int], k: int) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = [None]
        wrong = self.scheduler.wrong_from is not None
        for i in range(1, len(prompt_ids)):
            context = prompt_ids[:i]
            broken = wrong and i >= 2
            actual = self.model.score(
                context, prompt_ids[i], broken=broken, drift=self.scheduler.drift
            )
            entries = [actual]
            top = self.model.distribution(context, broken=broken, drift=self.scheduler.drift)
            entries += [e for e in top[:k] if e.token_id != actual.token_id]
            out.append(
                {
                    str(e.token_id): {
                        "logprob": e.logprob,
                        "rank": e.rank,
                        "decoded_token": self.model.token_str(e.token_id),
                    }
                    for e in entries
                }
            )
        return out

    def _full_response(
        self,
        gen: GenRequest,
        params: CompletionParams,
        events: list[TokenEvent],
        request_id: str,
        created: int,
    ) -> dict[str, Any]:
        token_ids = [e.chosen.token_id for e in events]
        text = self._text(token_ids)
        logprobs = None
        if params.logprobs is not None:
            logprobs = self._logprobs(events, params.logprobs, 0)
        if params.echo:
            text = self.model.decode(gen.prompt_ids) + text
            if logprobs is not None:
                logprobs = self._echo_logprobs(gen.prompt_ids, logprobs)
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": events[-1].finish_reason,
            "stop_reason": None,
            "token_ids": token_ids if params.return_token_ids else None,
            "prompt_logprobs": (
                self._prompt_logprobs(gen.prompt_ids, params.prompt_logprobs)
                if params.prompt_logprobs is not None
                else None
            ),
            "prompt_token_ids": gen.prompt_ids if params.return_token_ids else None,
        }
        return {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": self.opts.served_model_name,
            "choices": [choice],
            "usage": _usage(len(gen.prompt_ids), len(token_ids)),
        }

    async def _stream(
        self, gen: GenRequest, params: CompletionParams, request_id: str, created: int
    ) -> AsyncIterator[str]:
        head = {"id": request_id, "object": "text_completion", "created": created}
        head["model"] = self.opts.served_model_name
        offset = 0
        first = True
        try:
            while True:
                event = await gen.events.get()
                token = event.chosen.token_id
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": self._text([token]),
                    "logprobs": None,
                    "finish_reason": event.finish_reason,
                    "stop_reason": None,
                }
                if params.logprobs is not None:
                    choice["logprobs"] = self._logprobs([event], params.logprobs, offset)
                    offset += len(self.model.token_str(token))
                if params.return_token_ids:
                    choice["prompt_token_ids"] = gen.prompt_ids if first else None
                    choice["token_ids"] = [token]
                first = False
                yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
                if event.finish_reason is not None:
                    break
            if params.include_usage:
                usage = _usage(len(gen.prompt_ids), len(gen.generated))
                yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not gen.events.empty() or len(gen.generated) < gen.max_tokens:
                gen.cancelled = True  # client went away: free the slot

    async def _recorded(
        self, chunks: AsyncIterator[str], key: tuple[str, int]
    ) -> AsyncIterator[str]:
        """The ``replay_cache`` fault: pass ``chunks`` on and keep them, once complete."""
        sent = []
        async for chunk in chunks:
            sent.append(chunk)
            yield chunk
        self._replayed[key] = sent

    def _text(self, token_ids: list[int]) -> str:
        return "" if self.opts.fault == "no_text" else self.model.decode(token_ids)

    def _echo_logprobs(self, prompt_ids: list[int], generated: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI ``echo`` shape: the prompt's tokens (the first unscored) before the
        generated ones, offsets counted from the start of the prompt's text."""
        tokens, values, tops, offsets = [], [], [], []
        offset = 0
        for i, token_id in enumerate(prompt_ids):
            token = self.model.token_str(token_id)
            tokens.append(token)
            offsets.append(offset)
            offset += len(token)
            if i == 0:
                values.append(None)
                tops.append(None)
                continue
            scored = self.model.score(prompt_ids[:i], token_id, drift=self.scheduler.drift)
            values.append(scored.logprob)
            tops.append({token: scored.logprob})
        return {
            "text_offset": offsets + [offset + o for o in generated["text_offset"]],
            "token_logprobs": values + generated["token_logprobs"],
            "tokens": tokens + generated["tokens"],
            "top_logprobs": tops + generated["top_logprobs"],
        }


class StaleKeepAlive:
    """The ``stale_keepalive`` fault, llama.cpp's llama-server's habit: every answer advertises
    ``Keep-Alive: timeout=5, max=100``, yet a connection that carried a streamed answer is dead.

    The real server closes it right after the answer, and a client that pooled it loses the
    next request it sends there (about half of them, by a race). Here the close comes as that
    next request arrives, which is left unanswered: every reuse fails, so a test sees it each
    time, not by chance. The streamed answer's ``[DONE]`` goes out in one write with the end of
    the body, so that the client has read the whole answer when it stops and pools the
    connection (an answer cut off at ``[DONE]`` would not be pooled, and the fault not seen).

    The connection is reached through uvicorn's request cycle (the ``send`` it hands the app).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.spent: set[Any] = set()  # transports that carried a streamed answer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        if transport is None:
            raise RuntimeError("stale_keepalive needs uvicorn's request cycle (its transport)")
        if transport in self.spent:
            self.spent.discard(transport)
            transport.close()
            while (await receive())["type"] != "http.disconnect":
                pass  # the request's body, then the disconnect: nothing is answered
            return
        streamed = False
        held: bytes | None = None

        async def watch(message: dict[str, Any]) -> None:
            nonlocal streamed, held
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (b"keep-alive", b"timeout=5, max=100")]
                streamed = any(
                    k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                    for k, v in headers
                )
                message = {**message, "headers": headers}
            elif streamed and message["type"] == "http.response.body":
                body = message.get("body", b"")
                if message.get("more_body") and b"data: [DONE]" in body:
                    held = body  # sent with the end of the body
                    return
                if not message.get("more_body"):
                    # dead from now on: the next request may arrive before the app returns
                    self.spent.add(transport)
                    if held is not None:
                        message, held = {**message, "body": held + body}, None
            await send(message)

        await self.app(scope, receive, watch)


def _optional_count(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None or value is False:
        return None
    if value is True:
        return 1
    if not isinstance(value, int) or value < 0:
        raise BadRequest(f"{key} must be a non-negative integer")
    if value > MAX_LOGPROBS:
        raise BadRequest(f"Requested {key} of {value}, which is greater than max allowed: 20")
    return value


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
