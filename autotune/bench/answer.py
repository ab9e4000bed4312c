"""What one streamed benchmark answer delivered, event by event: the hot path of a benchmark.

:class:`StreamedAnswer` takes the SSE lines of each network read as they arrive and keeps the
arrival time of each chunk that carried part of the answer, its token ids, its text, the
server's usage count and finish reason. How its tokens are counted is decided once the stream
ended (:meth:`StreamedAnswer.count`): ids, else the model's tokenizer, else the server's word.
"""

from __future__ import annotations

import json

from autotune.bench.tokens import (
    BY_EVENTS,
    BY_IDS,
    BY_TOKENIZER,
    BY_USAGE,
    TokenCounter,
    usage_tokens,
)
from autotune.client.choice import token_ids
from autotune.client.stream import (
    CUT_SHORT,
    DONE,
    UNPARSED,
    SseReader,
    bad_shape,
    chunk_error,
    cut_short,
)
from autotune.engines.dialect import RequestDialect


class StreamedAnswer:
    """What one streamed answer delivered so far: chunk times, ids, text, the usage count."""

    __slots__ = (
        "chunk_ids",
        "chunk_times",
        "dialect",
        "finish",
        "ids",
        "reader",
        "retries",
        "text",
        "times",
        "usage",
    )

    def __init__(self, dialect: RequestDialect) -> None:
        self.dialect = dialect  # where a chunk carries its token ids (if it does)
        self.times: list[float] = []  # one per id, else one per chunk (deadline messages)
        self.chunk_times: list[float] = []  # one per chunk with content
        self.chunk_ids: list[int] = []  # ids each of those chunks carried
        self.ids: list[int] = []
        self.text: list[str] = []  # one piece per chunk with content ("" for ids only)
        self.usage: int | None = None
        self.finish: str | None = None  # the last finish reason sent
        #: the stream's events (the gate reads its answers by the same rules)
        self.reader = SseReader()
        self.retries = 0  # times the request was sent again (``RawStream.transport_retries``)

    def add(self, lines: list[bytes], now: float) -> bool:
        """Take the complete SSE lines of one network read, arrived at ``now``; True at
        ``[DONE]``.

        Raises ``json.JSONDecodeError`` for an event that is not JSON, and
        :class:`~autotune.client.stream.StreamError` for an answer the server reports as failed (an
        error event, field or object, a cut-short finish reason) or a chunk whose fields are
        not a completion's.
        """
        feed = self.reader.feed
        for line in lines:
            payload = feed(line)
            if payload is not None and self._take(payload, now):
                return True
        payload = self.reader.pause()
        return payload is not None and self._take(payload, now)

    def end(self, rest: bytes, now: float) -> None:
        """The body ended at ``now``: its last line even without a newline (``rest``), and an
        event still waiting for its blank line."""
        if rest and self.add([rest], now):
            return
        payload = self.reader.close()
        if payload is not None:
            self._take(payload, now)

    def count(self, counter: TokenCounter) -> tuple[list[float], list[int], str]:
        """The arrival time and tokens of each chunk that carried a token, and how they were
        counted: ids, else the tokenizer on the text, else (no tokenizer) one per event, the
        count then the server's usage. A chunk with no token is no arrival: one sent at once
        (text with no ids) set the TTFT, and empty or half-token chunks cut every ITL."""
        if self.ids:
            per_chunk, source = list(self.chunk_ids), BY_IDS
        elif counter.available:
            per_chunk, source = counter.per_chunk(self.text), BY_TOKENIZER
        else:
            source = BY_USAGE if self.usage is not None else BY_EVENTS
            return list(self.chunk_times), [1] * len(self.chunk_times), source
        kept = [(t, k) for t, k in zip(self.chunk_times, per_chunk, strict=True) if k > 0]
        return [t for t, _ in kept], [k for _, k in kept], source

    def _take(self, payload: bytes, now: float) -> bool:
        """Record one event's content and time; True at ``[DONE]``.

        A chunk of k token ids is k tokens at one time; a chunk with text and no ids (a
        dialect without them) is counted later, by the tokenizer (:meth:`count`).
        """
        if payload == DONE:
            return True
        chunk = self.reader.parsed
        if chunk is UNPARSED:
            chunk = json.loads(payload.decode())
        try:
            if chunk.__class__ is not dict or "error" in chunk or chunk.get("object") == "error":
                problem = chunk_error(chunk, payload)
                if problem is not None:
                    raise problem
            usage = chunk.get("usage")
            if usage:
                self.usage = usage_tokens(usage)
            for choice in chunk.get("choices") or ():
                new_ids = token_ids(self.dialect, choice)  # the dialect's field or logprobs'
                piece = choice.get("text")
                if piece and piece.__class__ is not str:
                    raise TypeError("text is not a string")
                if new_ids or piece:
                    self.text.append(piece or "")
                    self.chunk_times.append(now)
                    self.chunk_ids.append(len(new_ids))
                if new_ids:
                    self.ids += new_ids
                    self.times += [now] * len(new_ids)
                elif piece:
                    self.times.append(now)
                finish = choice.get("finish_reason")
                if finish is not None:
                    if finish in CUT_SHORT:
                        raise cut_short(finish, payload)
                    self.finish = finish
        except (AttributeError, LookupError, TypeError):
            # a list where an object belongs, a number for text: named, not a Python error
            raise bad_shape(payload) from None
        return False
