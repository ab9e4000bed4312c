"""What one completion choice (or a streamed chunk of one) carries per token, in either shape
servers answer ``/v1/completions``'s ``logprobs`` with: the one reader of token ids, per-token
strings, logprobs and top candidates, for the gate and the benchmark alike.

Two shapes are in use, and a server does not say which it speaks:

* the completions API's: ``logprobs: {tokens: [str], token_logprobs: [float], top_logprobs:
  [{token: logprob}]}`` (vLLM, the OpenAI legacy API; some servers give each ``top_logprobs``
  entry as a list of ``{token, logprob}`` objects instead of a dict);
* the chat API's, per token: ``logprobs: {content: [{token, logprob, id?, bytes?,
  top_logprobs: [{token, logprob, id?}]}]}``. llama.cpp's llama-server answers
  ``/v1/completions`` this way, with each token's ``id`` (and ignores the request fields that
  ask other servers for ids).

Read through one shape only, the other's answers carried "nothing": the gate compared
llama-server's answers by text and excused nothing by margin, and a K-cache that moved
logprobs by 0.027 nats passed. The generated token ids come from the engine's dialect field
(``engines/dialect.py``) where the answer has it, else from the ``content`` entries' ids.

A value of the wrong type raises ``TypeError``/``KeyError``/``ValueError``: the callers name
the chunk as evidence (``client.stream.bad_shape``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.engines.dialect import RequestDialect

#: one position's top candidates: token string -> logprob (None where JSON carried a -inf)
TopCandidates = dict[str, float | None]


def finite_logprob(value: float | None) -> float:
    """A logprob as a float; JSON's null (how a -inf is serialised) becomes -inf."""
    return float("-inf") if value is None else float(value)


def token_ids(dialect: RequestDialect, choice: dict[str, Any]) -> list[int]:
    """The generated token ids a choice carries: the dialect's field, else the ids of its
    ``logprobs.content`` entries (only when every entry has one: a partial list would put
    ids at the wrong positions). The benchmark's hot path: one lookup when neither is there."""
    ids = dialect.token_ids(choice)
    if ids:
        return ids
    logprobs = choice.get("logprobs")
    if logprobs.__class__ is not dict:
        return []
    content = logprobs.get("content")
    if not content:
        return []
    found = [entry.get("id") for entry in content]
    if any(i.__class__ is not int for i in found):
        if any(i is not None and i.__class__ is not int for i in found):
            raise TypeError("a logprobs.content id is not an integer")
        return []
    return found


@dataclass(frozen=True)
class TokenScores:
    """Per generated token of a choice: id, string, logprob and top candidates; each tuple as
    long as the answer gave (empty when it gave none)."""

    ids: tuple[int, ...] = ()
    tokens: tuple[str, ...] = ()
    logprobs: tuple[float, ...] = ()
    #: per position, the top candidates (None where the answer gave none for it)
    tops: tuple[TopCandidates | None, ...] = ()


def token_scores(dialect: RequestDialect, choice: dict[str, Any]) -> TokenScores:
    """Everything per token a choice carries, whichever shape its ``logprobs`` has."""
    ids = tuple(token_ids(dialect, choice))
    logprobs = choice.get("logprobs")
    if not logprobs:
        return TokenScores(ids=ids)
    if not isinstance(logprobs, dict):
        raise TypeError("logprobs is not an object")
    content = logprobs.get("content")
    if content is not None:
        return TokenScores(
            ids=ids,
            tokens=tuple(_string(entry["token"]) for entry in content),
            logprobs=tuple(finite_logprob(entry["logprob"]) for entry in content),
            tops=tuple(top_candidates(entry.get("top_logprobs")) for entry in content),
        )
    return TokenScores(
        ids=ids,
        tokens=tuple(_string(t) for t in logprobs.get("tokens") or ()),
        logprobs=tuple(finite_logprob(x) for x in logprobs.get("token_logprobs") or ()),
        tops=tuple(top_candidates(top) for top in logprobs.get("top_logprobs") or ()),
    )


def top_candidates(top: Any) -> TopCandidates | None:
    """One position's top candidates as ``{token: logprob}``, from the completions API's dict
    or a list of ``{token, logprob}`` objects (the chat API's shape); None when not given."""
    if top is None:
        return None
    if isinstance(top, list):
        return {_string(entry["token"]): entry.get("logprob") for entry in top}
    if not isinstance(top, dict):
        raise TypeError("top_logprobs entry is neither an object nor a list")
    return top


def _string(token: Any) -> str:
    if not isinstance(token, str):
        raise TypeError("a token is not a string")
    return token
