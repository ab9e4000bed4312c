"""Talking to an OpenAI-compatible server: the request body, and streamed answers read under a
deadline measured per token.

One builder, :func:`completion_body`, writes every request the gate and the benchmark client
send, in the engine's dialect (``engines/dialect.py``): neither names an engine's fields.

Both the gate (``gate/``) and the benchmark client (``bench/phase.py``) stream their requests,
so one rule bounds every request autotune sends: a request is hung when **no token** arrived for
``request_timeout_s`` (comments, pings and empty events are no token). A slow server that keeps
producing tokens is never called hung, however long its answer; a server that accepted the
request and went silent is found after exactly one deadline, whatever transport carries the
bytes (the rule is enforced with ``asyncio.timeout``'s machinery, not by the HTTP library's read
timeout).

The benchmark client's requests are the hot path (``bench.stream_request``: one per token, on
a machine whose cores the server under test needs): ``client.send.open_raw_stream`` reads
aiohttp's response directly, and :class:`TokenDeadline` bounds the time without a token with
one timer per request. Sending a request (connections, the one retry) is ``client/send.py``'s;
what a chunk carries per token, ``client/choice.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx

from autotune.engines.dialect import RequestDialect
from autotune.errors import excerpt

T = TypeVar("T")


def completion_body(
    dialect: RequestDialect,
    model: str,
    prompt: str | list[int],
    max_tokens: int,
    *,
    stream: bool,
    include_usage: bool = False,
    logprobs: int | None = None,
    echo: bool = False,
    token_ids: bool = False,
    fixed_length: bool | None = None,
    prompt_scores: int | None = None,
) -> dict[str, Any]:
    """A greedy ``/v1/completions`` body; the extras are asked for in ``dialect``'s fields.

    ``token_ids``, ``fixed_length`` (True/False sent as given, None: not sent) and
    ``prompt_scores`` (top-k of every prompt token) are left out where the dialect has no field
    for them, except ``prompt_scores``, which a caller asks only of a dialect that scores
    prompts (:attr:`RequestDialect.scores_prompts`): asking another is a bug.
    """
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    if stream:
        body["stream"] = True
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if logprobs is not None:
        body["logprobs"] = logprobs
    if echo:
        body["echo"] = True
    if token_ids and dialect.token_ids_field:
        body[dialect.token_ids_field] = True
    if fixed_length is not None and dialect.fixed_length_field:
        body[dialect.fixed_length_field] = fixed_length
    if prompt_scores is not None:
        if not dialect.prompt_scoring_field:
            raise ValueError(f"the {dialect.name} dialect cannot score prompt tokens")
        body[dialect.prompt_scoring_field] = prompt_scores
    return body


class NoTokenWithin(Exception):
    """A request got no token for ``deadline_s``: names the phase, the request and the deadline."""

    def __init__(self, phase: str, request: str, deadline_s: float) -> None:
        self.phase = phase
        self.request = request
        self.deadline_s = deadline_s
        super().__init__(
            f"{phase}: {request} got no token within {deadline_s:g} s (workload.request_timeout_s)"
        )


async def sse_payloads(
    response: httpx.Response,
    start: float,
    *,
    token_deadline_s: float | None = None,
    progress: ServerProgress | None = None,
) -> AsyncIterator[tuple[bytes, float]]:
    """Yield (data payload, arrival time since ``start``) of each server-sent event, read by an
    :class:`SseReader` (which raises :class:`StreamError` for an error the stream reports
    outside its data's JSON).

    With ``token_deadline_s``, raises ``TimeoutError`` when no data payload arrives for that
    long (the caller turns it into :class:`NoTokenWithin` with its own names). Only a payload
    that carries part of the answer restarts that clock (:func:`carries_answer`): SSE comments
    (``: keepalive``), empty events and chunks without text keep a stream open but prove
    nothing, and a server sending only those is hung. With ``progress`` (shared by requests
    sent at once to one server) the wait is the server's silence to all of them: a request
    queued behind others that stream is waiting, not hung (:class:`ServerProgress`).
    """
    reader = SseReader()
    quiet = _Quiet()
    async for lines, now in _sse_lines(response, start, token_deadline_s, quiet, progress):
        for line in lines:
            payload = reader.feed(line)
            if payload is not None:
                if carries_answer(payload):
                    quiet.last = now
                    if progress is not None:
                        progress.last = start + now
                yield payload, now
        payload = reader.pause()
        if payload is not None:
            if carries_answer(payload):
                quiet.last = now
                if progress is not None:
                    progress.last = start + now
            yield payload, now
    payload = reader.close()
    if payload is not None:
        yield payload, time.perf_counter() - start


def carries_answer(payload: bytes) -> bool:
    """Whether a data payload moves the answer on: a chunk with text, token ids or a chat delta's
    content, an error, or the end (``[DONE]``). An empty chunk, a ping or a usage-only chunk
    does not."""
    if payload.strip() == b"[DONE]":
        return True
    try:
        chunk = json.loads(payload)
    except ValueError:
        return bool(payload.strip())  # not JSON: the reader's caller reports it
    if not isinstance(chunk, dict):
        return False
    if "error" in chunk or chunk.get("object") == "error":
        return True
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        if choice.get("text") or choice.get("token_ids") or delta.get("content"):
            return True
        if choice.get("finish_reason"):
            return True
    return False


class _Quiet:
    """When the last data payload arrived (seconds since the request's start)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = 0.0


class LineSplitter:
    """A byte stream's lines, read by read, split at any of the SSE standard's three line
    endings: LF, CRLF and a bare CR (a stream of CR-only lines was read as one long line, and
    failed as "bad stream chunk"). A CRLF split between two reads is one line ending. Lines
    come without their ending; ``rest`` holds the line not yet ended."""

    __slots__ = ("cr", "rest")

    def __init__(self) -> None:
        self.rest = b""
        self.cr = False  # the last read ended with a CR: an LF starting the next belongs to it

    def split(self, data: bytes) -> list[bytes]:
        if self.cr or b"\r" in data:  # the common case (LF only) stays one C-level split
            data = self._lf_only(data)
        *lines, self.rest = (self.rest + data if self.rest else data).split(b"\n")
        return lines

    def _lf_only(self, data: bytes) -> bytes:
        if not data:
            return data
        if self.cr and data.startswith(b"\n"):
            data = data[1:]
        self.cr = data.endswith(b"\r")
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


async def _sse_lines(
    response: httpx.Response,
    start: float,
    token_deadline_s: float | None,
    quiet: _Quiet | None = None,
    progress: ServerProgress | None = None,
) -> AsyncIterator[tuple[list[bytes], float]]:
    """The body's lines as they complete, with their arrival time; at the end, the last line
    even without its newline.

    Raw bytes split by hand: ``aiter_lines`` decodes and re-splits text per chunk, and on a
    machine where the server and the client share two cores that client CPU time was taken from
    the server being measured. Any of the three line endings ends a line (:class:`LineSplitter`).
    """
    lines_of = LineSplitter()
    chunks = response.aiter_bytes()
    while True:
        try:
            if progress is not None and token_deadline_s is not None:
                data = await await_while_served(
                    anext(chunks),
                    since=start + (quiet.last if quiet is not None else 0.0),
                    deadline_s=token_deadline_s,
                    progress=progress,
                )
            else:
                # One deadline per chunk, never spanning a ``yield``: a timeout that fired while
                # the consumer held the event would cancel the consumer instead of raising here.
                # the time left counts from the last data payload, not from the last byte
                left = token_deadline_s
                if token_deadline_s is not None and quiet is not None:
                    left = token_deadline_s - (time.perf_counter() - start - quiet.last)
                    if left <= 0:
                        raise TimeoutError
                async with asyncio.timeout(left):
                    data = await anext(chunks)
        except StopAsyncIteration:
            break
        lines = lines_of.split(data)
        yield lines, time.perf_counter() - start
    if lines_of.rest:
        yield [lines_of.rest], time.perf_counter() - start


async def await_while_served(
    awaitable: Awaitable[T],
    *,
    since: float,
    deadline_s: float,
    progress: ServerProgress,
) -> T:
    """``awaitable``'s result, waited for while the server streams to this request or to another
    of ``progress``'s; ``TimeoutError`` once it has been silent to all of them for ``deadline_s``
    (this request's own wait counts from ``since``, a ``time.perf_counter`` instant).

    The wait runs as a task that a deadline check does not cancel (a cancelled ``anext`` would
    close the body's iterator): it is re-armed while others are served, and the task is
    cancelled only when the request is given up.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            now = time.perf_counter()
            left = deadline_s - min(now - since, now - progress.last)
            if left <= 0:
                raise TimeoutError
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


class StreamError(Exception):
    """A streamed answer that broke the protocol or reported its own failure: an error event,
    a chunk that is not a JSON object, an answer the server says it cut short. The message
    ends in an excerpt of what the server sent (:func:`autotune.errors.excerpt`)."""


#: the SSE fields, beside ``data:``, that can report a failure (see :func:`error_field`)
ERROR_FIELDS = (b"error:", b"event:")

#: finish reasons with which a server says it gave up on an answer, not that the answer ended
#: (SGLang's and vLLM's ``abort``: a request the engine dropped; ``error``)
CUT_SHORT = ("abort", "error")


def error_field(line: bytes) -> bool:
    """Read an SSE line that is not ``data:``: True when it opens an error event
    (``event: error``, whose data is the detail), :class:`StreamError` for an ``error:`` field.

    Servers report a failure mid-answer in more ways than a data event with an ``error`` object
    (:func:`chunk_error`): llama.cpp's server writes an ``error: {...}`` line, a field the SSE
    standard tells a client to ignore, and others name the event. Ignored, the answer so far
    read as a whole one: the gate compared a truncated answer and called the config incorrect,
    the benchmark counted a broken request as served.
    """
    name, _, value = line.partition(b":")
    if name.strip() == b"error":
        raise StreamError(f"the stream carried an error: {_evidence(value)}")
    return name.strip() == b"event" and value.strip() == b"error"


def error_event(payload: bytes) -> StreamError:
    """The failure an ``event: error`` reported, its data (``payload``) as the evidence."""
    return StreamError(f"the stream carried an error event: {_evidence(payload) or '(no data)'}")


def chunk_error(chunk: Any, payload: bytes) -> StreamError | None:
    """Why a data event's parsed JSON (``chunk``) is no completion chunk, or None.

    An error report (``{"error": {...}}``: OpenAI, vLLM, SGLang, llama.cpp; TGI's error is a
    string; ``{"object": "error", "message": ...}``: vLLM's ErrorResponse in its older shape,
    with no wrapper, which read as a chunk without tokens and let a failed request count as
    served) or JSON that is not an object, which no reader can take choices from.
    """
    if not isinstance(chunk, dict):
        return StreamError(f"a stream chunk is not a JSON object: {_evidence(payload)}")
    if chunk.get("error") or chunk.get("object") == "error":
        return StreamError(f"the stream carried an error: {_evidence(payload)}")
    return None


def cut_short(reason: str, payload: bytes) -> StreamError:
    """An answer the server ended with a ``finish_reason`` in :data:`CUT_SHORT`."""
    return StreamError(
        f"the server cut the answer short (finish_reason {reason!r}): {_evidence(payload)}"
    )


def bad_shape(payload: bytes) -> StreamError:
    """A chunk whose fields are not what a completions chunk holds (``choices`` not a list of
    objects, ``text`` not a string, ``token_ids`` not a list): read further, a Python error."""
    return StreamError(
        f"a stream chunk is not a completions chunk (choices[].text): {_evidence(payload)}"
    )


def read_chunk(payload: bytes) -> dict[str, Any]:
    """A data event's payload as a completion chunk, else :class:`StreamError` naming it."""
    try:
        chunk = json.loads(payload)
    except ValueError:  # JSONDecodeError, or UnicodeDecodeError for bytes in no UTF encoding
        raise StreamError(f"a stream chunk was not JSON: {_evidence(payload)}") from None
    problem = chunk_error(chunk, payload)
    if problem is not None:
        raise problem
    return chunk


def _evidence(raw: bytes) -> str:
    return excerpt(raw.decode("utf-8", "replace"), 300)


#: the OpenAI streams' last event; no JSON, and never more than one line
DONE = b"[DONE]"

#: the UTF-8 byte-order mark a stream may begin with (the SSE standard strips one)
BOM = b"\xef\xbb\xbf"

#: :attr:`SseReader.parsed` when the reader did not parse the payload it handed out
UNPARSED: Any = object()


class SseReader:
    """The events of one server-sent event stream, read from its lines one at a time.

    One reader for the gate (:func:`sse_payloads`) and the benchmark client
    (``bench.answer.StreamedAnswer``), which each had a copy of these rules: a rule mended in
    one copy was still broken in the other. Feed each complete line (without its newline) to
    :meth:`feed`, call :meth:`pause` when a network read's lines are done and :meth:`close`
    when the body ended; each returns
    the payload of an event it completes (stripped bytes, ``b"[DONE]"`` included) or None, and
    raises :class:`StreamError` for a failure the stream reports outside its data's JSON.

    The SSE standard's interpretation
    (html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation), with
    choices of our own where servers need them:

    * A leading byte-order mark is stripped; comments (``:``) and ``id``, ``retry`` and other
      fields are ignored (``event`` and ``error``: :func:`error_field`). CRLF endings are read
      as LF.
    * The ``data:`` lines of one event are joined with a line break and the event dispatched at
      the blank line that ends it. An empty data line adds nothing (its line break is whitespace
      to JSON), and an event without data, or only blanks, is no event (the standard dispatches
      an empty one; there is no chunk to read from it).
    * Data that is already a whole JSON value (or ``[DONE]``) is an event as soon as another
      ``data:`` line follows it or the network read ends (:meth:`pause`), without waiting for
      its blank line. Safe: JSON allows nothing but whitespace after a whole value, so no
      later line could make the joined data a chunk; it only turns what would be one unreadable
      event into two readable ones. Needed: servers that write no blank lines at all (each
      data line was an event to the readers before this one), and a blank line that comes in a
      later read must not time the token. vLLM writes an event and its blank line in one
      piece: the blank line then ends the event in the same read, and nothing is parsed here.
    * An ``event: error`` marks the stream failed for good: the next event's data is the
      detail, and a stream that ends (or sends ``[DONE]``) without one still failed. Its data
      is dispatched at the read's end, whole JSON or not: waiting for more of a failed answer
      would turn the error into a hang.
    * At the end of the body, pending data is an event even without its blank line (the
      standard drops it; a server that closes right after its last event lost nothing).

    :attr:`parsed` holds the JSON value of the payload just returned when the reader had to
    parse it to decide (:data:`UNPARSED` otherwise): the benchmark's hot path parses each
    event once.
    """

    __slots__ = ("_data", "_failed", "_first", "parsed")

    def __init__(self) -> None:
        self._data = b""  # the pending event's data lines, joined
        self._failed = False  # an ``event: error`` came
        self._first = True  # no line yet (a byte-order mark may lead)
        self.parsed: Any = UNPARSED

    def feed(self, line: bytes) -> bytes | None:
        """Read one line: the payload of the event it completes, or None."""
        if self._first:
            self._first = False
            if line.startswith(BOM):
                line = line[3:]
        if line.startswith(b"data:"):
            value = line[5:].strip()
            pending = self._data
            if not pending:
                self._data = value
            elif value:
                if self._whole(pending):
                    self._data = value
                    return self._dispatch(pending)
                self._data = pending + b"\n" + value
            return None
        if not line or line == b"\r":  # the blank line that ends an event
            pending = self._data
            if pending:
                self._data = b""
                self.parsed = UNPARSED
                return self._dispatch(pending)
        elif line.startswith(ERROR_FIELDS):
            self._failed |= error_field(line)
        return None

    def pause(self) -> bytes | None:
        """The network read's lines are done: the pending data if it is whole already."""
        pending = self._data
        if pending and (self._failed or self._whole(pending)):
            self._data = b""
            return self._dispatch(pending)
        return None

    def close(self) -> bytes | None:
        """The body ended: the pending data as an event; :class:`StreamError` for an error
        event that came without data."""
        pending = self._data
        self._data = b""
        self.parsed = UNPARSED
        if pending:
            return self._dispatch(pending)
        if self._failed:
            raise error_event(b"")
        return None

    def _whole(self, data: bytes) -> bool:
        """Whether ``data`` is a whole event's: ``[DONE]`` or a JSON value (kept in
        :attr:`parsed`)."""
        if data == DONE:
            self.parsed = UNPARSED
            return True
        try:
            self.parsed = json.loads(data.decode())
        except (ValueError, RecursionError):  # not (yet) JSON, or no UTF-8
            return False
        return True

    def _dispatch(self, payload: bytes) -> bytes:
        if self._failed:
            raise error_event(b"" if payload == DONE else payload)
        return payload


class NotJsonObject(ValueError):
    """A whole (not streamed) answer that is not a JSON object; the message ends in an excerpt
    of the body (:func:`autotune.errors.excerpt`), the evidence of what answered instead."""


def parse_json_object(body: str | bytes, what: str) -> dict[str, Any]:
    """``body`` parsed as a JSON object, else :class:`NotJsonObject` ``"<what>: <excerpt>"``.

    A server that is not what the spec says (a proxy's error page, a web UI on the port) answers
    with HTML or a bare string; a caller reports that in its own words (``what``) with the body
    as evidence, not as a JSONDecodeError or an AttributeError on ``.get``. Pass an httpx
    response's ``content``: bytes parse exactly as ``response.json()`` does (UTF-8/16/32, a BOM
    allowed); the excerpt reads them as UTF-8.
    """
    try:
        answer = json.loads(body)
    except ValueError:  # JSONDecodeError, or UnicodeDecodeError for bytes in no UTF encoding
        answer = None
    if isinstance(answer, dict):
        return answer
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    raise NotJsonObject(f"{what}: {excerpt(text) or '(an empty body)'}")


class ServerProgress:
    """When any request of one phase last received a token (``time.perf_counter`` seconds).

    Shared by the requests sent at once to one server, so that a request's no-token deadline
    counts the *server's* silence, not its own: a server with one slot and eight requests at
    its door streams to one while the others wait for their first token, politely queued, for
    as long as the queue ahead of them takes. That wait is a queue, and it is measured (in TTFT);
    it becomes a hang only when nothing at all has streamed for the deadline. A server that
    starves one request while serving others is still bounded: once the others finish, the
    silence counts.
    """

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = float("-inf")


class TokenDeadline:
    """The no-token deadline of one request, with one timer for the whole request.

    ``asyncio.timeout`` re-armed for every chunk makes and cancels a timer handle per token
    (3-4 us of client CPU each on the 2-core demo machine). Here the reader only stores each
    arrival in :attr:`last` (seconds since ``origin`` on ``time.perf_counter``, a number it
    computes anyway for the token's time); the one timer, when it fires, re-arms itself for
    ``last + deadline_s`` if anything arrived since, and otherwise expires the scope: the code
    inside is cancelled at its current ``await`` and ``TimeoutError`` leaves the ``async with``,
    by ``asyncio.timeout``'s own machinery. The wait counts from ``origin`` (the send): the
    headers are no token. ``deadline_s`` None: no deadline.

    The scope must not span a ``yield`` of an async generator (the cancellation would land in
    the consumer): use it around the reading loop itself. With ``progress`` the wait is the
    server's silence (:class:`ServerProgress`): the reader stores each arrival there too.
    """

    def __init__(
        self,
        deadline_s: float | None,
        origin: float,
        *,
        clock: Callable[[], float] = time.perf_counter,
        total_s: float | None = None,
        progress: ServerProgress | None = None,
    ) -> None:
        self.deadline_s = deadline_s
        #: tokens of the other requests to the same server (None: this request alone counts)
        self.progress = progress
        #: the request's whole time, tokens or not (None: no such bound)
        self.total_s = total_s
        #: whether it was ``total_s``, not the no-token deadline, that ended the request
        self.total_expired = False
        self.origin = origin
        self._clock = clock  # the reader's clock (``last`` is on it); tests pass their own
        #: the last arrival, seconds after ``origin`` (0: the send)
        self.last = 0.0
        self._scope = asyncio.timeout(None)
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> TokenDeadline:
        await self._scope.__aenter__()
        if self.deadline_s is not None or self.total_s is not None:
            self._arm()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return await self._scope.__aexit__(*exc_info)

    def _arm(self) -> None:
        now = self._clock()
        elapsed = now - self.origin
        idle = elapsed - self.last
        if self.progress is not None:  # queued behind requests that stream: not idle
            idle = min(idle, now - self.progress.last)
        loop = asyncio.get_running_loop()
        waits = []
        if self.deadline_s is not None:
            waits.append(self.deadline_s - idle)
        if self.total_s is not None:
            waits.append(self.total_s - elapsed)
            self.total_expired = elapsed >= self.total_s
        if min(waits) <= 0:
            self._timer = None
            self._scope.reschedule(loop.time())  # expire now: cancels the reader's await
        else:
            self._timer = loop.call_later(min(waits), self._arm)
