"""How one kind of server is asked for more than text: its request dialect.

The OpenAI completions API gives text, ``logprobs`` (per-token strings, logprobs and the top
candidates) and ``echo``. What the correctness gate and the benchmark client want beyond that
(the generated token ids, fixed-length generation, scoring a given continuation token by token)
every engine spells its own way, or not at all. Each engine declares its dialect
(``Engine.dialect``); ``protocol.completion_body`` builds requests from it and the gate reads the
answers through it, so neither ever names an engine's fields.

A dialect says what to *ask*; what a server really *gives* is still learned from its answers at
the baseline (``gate.reference.Capabilities``): a server that ignores a field answers with less,
and the gate compares with what every answer carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: teacher-forced scoring modes, as stored in a study's reference (``Capabilities``): by token
#: ids through the dialect's prompt-scoring field (named after vLLM's field, the first dialect
#: that had one: studies already store this value), or by text with the OpenAI API's ``echo``
TEACHER_PROMPT_LOGPROBS = "prompt_logprobs"
TEACHER_ECHO = "echo"


@dataclass(frozen=True)
class RequestDialect:
    """The request fields and answer keys of one server kind beyond the plain OpenAI API.

    A field left None is not asked for: the plain OpenAI dialect (:data:`OPENAI`) asks for
    nothing beyond the standard API.
    """

    #: a short name for messages and records
    name: str
    #: request field (boolean) that asks for the generated and the prompt's token ids
    token_ids_field: str | None = None
    #: request field (boolean) that makes generation ignore end-of-sequence, so an answer has
    #: exactly ``max_tokens`` tokens (fixed lengths: comparable answers, comparable load)
    fixed_length_field: str | None = None
    #: request field (integer: top-k) that scores every prompt token, so a reference
    #: continuation sent back as prompt token ids is scored teacher-forced on exactly its tokens
    prompt_scoring_field: str | None = None
    #: keys of an answer's choice: the generated token ids, the prompt's token ids and the
    #: prompt tokens' scores (a list, one ``{token_id: logprob}`` entry per prompt position)
    token_ids_key: str | None = None
    prompt_token_ids_key: str | None = None
    prompt_scores_key: str | None = None

    @property
    def scores_prompts(self) -> bool:
        """Whether the server can be asked to score a continuation given as token ids."""
        return self.prompt_scoring_field is not None and self.prompt_scores_key is not None

    def token_ids(self, choice: dict[str, Any]) -> list[int]:
        """The generated token ids a choice (or a streamed chunk of one) carries, if any."""
        return list(choice.get(self.token_ids_key) or ()) if self.token_ids_key else []

    def prompt_token_ids(self, choice: dict[str, Any]) -> list[int]:
        """The prompt's token ids a choice carries, if any."""
        if not self.prompt_token_ids_key:
            return []
        return list(choice.get(self.prompt_token_ids_key) or ())

    def prompt_scores(self, choice: dict[str, Any]) -> list[Any] | None:
        """The per-prompt-token scores a choice carries, or None."""
        if not self.prompt_scores_key:
            return None
        return choice.get(self.prompt_scores_key)


#: the plain OpenAI completions API: text, logprobs and echo, nothing else asked for
OPENAI = RequestDialect(name="openai")
