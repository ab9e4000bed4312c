"""llama-server's completions dialect: what it does with autotune's requests.

Measured on the real server (``/work/shared/REAL_ENGINES.md``; ``tests/test_llamacpp_engine.py``
holds the dialect): ``ignore_eos`` is honoured, so answers have exactly ``max_tokens`` tokens
(fixed lengths); ``return_token_ids`` is ignored, so no token-ids field is asked for (the
generated ids come with the logprobs, in each streamed chunk's ``logprobs.content[].id``,
which the gate and the benchmark read engine-neutrally); ``prompt_logprobs`` is ignored, so it
cannot score a continuation given as token ids; and ``echo: true`` is silently ignored, so
there is no teacher forcing through echo either. The baseline learns this from the answers
(``gate.reference.Capabilities``); the dialect only keeps autotune from asking for fields the
server drops.
"""

from __future__ import annotations

from autotune.engines.dialect import RequestDialect

LLAMACPP_DIALECT = RequestDialect(name="llamacpp", fixed_length_field="ignore_eos")
