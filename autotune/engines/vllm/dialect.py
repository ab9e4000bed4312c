"""vLLM's completions dialect: the fields it adds to the OpenAI API.

``return_token_ids`` gives each choice ``token_ids`` (generated) and ``prompt_token_ids``;
``ignore_eos`` generates exactly ``max_tokens`` tokens; ``prompt_logprobs: k`` scores every
prompt token, and a prompt may be a list of token ids, which is how the gate scores the
reference continuation on exactly its tokens.
"""

from __future__ import annotations

from autotune.engines.dialect import RequestDialect

VLLM_DIALECT = RequestDialect(
    name="vllm",
    token_ids_field="return_token_ids",
    fixed_length_field="ignore_eos",
    prompt_scoring_field="prompt_logprobs",
    token_ids_key="token_ids",
    prompt_token_ids_key="prompt_token_ids",
    prompt_scores_key="prompt_logprobs",
)
