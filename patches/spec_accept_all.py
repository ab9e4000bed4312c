"""FAULT: a lossy speculative decoder: every draft token is accepted, right or wrong.

Speculative decoding is lossless only because the model verifies each draft token: under greedy
sampling a draft is kept while it equals the model's own argmax and the first mismatch is
replaced by the model's token. A bug in that verification (an off-by-one in the accepted
length, a comparison against the wrong row) makes the server emit the *drafts*: the text stays
fluent (n-gram drafts are copied from the context), it is faster than any correct config
(every step jumps by ``num_speculative_tokens + 1``), and only a token-for-token comparison with
a greedy reference sees that it is a different text. This patch plants that bug so that a test
can prove the correctness gate rejects a lossy speculative config as ``incorrect_output``.

Target: ``vllm.v1.sample.rejection_sampler.rejection_sample`` (vLLM 0.32, V1 model runner; the
CPU build uses it because Model Runner V2 needs Triton). ``RejectionSampler.forward`` looks the
function up as a module global at each call, so replacing the module attribute is enough; the
patch checks both facts before it applies (fail closed: a vLLM whose verification moved
elsewhere refuses the patch rather than run unpatched). The wrapper runs the real verification,
then overwrites each request's row with all of its draft tokens followed by the bonus token
(the model's token after the last draft, which vLLM samples for the all-accepted case anyway).
vLLM derives its acceptance counters from these rows, so ``/metrics`` then reports every draft
as accepted: the counters of a lossy run read 100%.

The first overwritten step prints ``AUTOTUNE_SPEC_ACCEPT_ALL drafts=<n> pid=<pid>`` to stderr.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from typing import Any

from autotune.patching import PatchError, PatchInfo

MODULE = "vllm.v1.sample.rejection_sampler"

PATCH = PatchInfo(
    name="spec_accept_all",
    kind="fault",
    engine="vllm",
    versions=">=0.32",
    targets=(f"{MODULE}.rejection_sample", f"{MODULE}.RejectionSampler.forward"),
    rationale="Deliberately accept every speculative draft token (lossy speculation).",
    choices=(False, True),
    default=False,
)

#: the leading parameters the wrapper relies on, in vLLM 0.32's order
EXPECTED = (
    "draft_token_ids",
    "num_draft_tokens",
    "max_spec_len",
    "cu_num_draft_tokens",
    "draft_probs",
    "target_logits",
    "bonus_token_ids",
)

_state = {"overwritten_steps": 0, "done": False}


def _accepting_all(original: Any) -> Any:
    @functools.wraps(original)
    def rejection_sample(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        bound = inspect.signature(original).bind(*args, **kwargs)
        draft_token_ids = bound.arguments["draft_token_ids"]
        num_draft_tokens = bound.arguments["num_draft_tokens"]
        bonus_token_ids = bound.arguments["bonus_token_ids"].reshape(-1)
        start = 0
        for row, count in enumerate(num_draft_tokens):
            count = int(count)
            if count > 0:
                output[row, :count] = draft_token_ids[start : start + count].to(output.dtype)
                output[row, count] = bonus_token_ids[row].to(output.dtype)
            start += count
        if start:
            _state["overwritten_steps"] += 1
            if _state["overwritten_steps"] == 1:
                print(
                    f"AUTOTUNE_SPEC_ACCEPT_ALL drafts={start} pid={os.getpid()}",
                    file=sys.stderr,
                    flush=True,
                )
        return output

    return rejection_sample


def apply(value: bool) -> None:
    """Replace the module's ``rejection_sample`` (once per process)."""
    if not value or _state["done"]:
        return
    module = importlib.import_module(MODULE)
    original = module.rejection_sample
    params = tuple(inspect.signature(original).parameters)
    if params[: len(EXPECTED)] != EXPECTED:
        raise PatchError(
            f"{MODULE}.rejection_sample takes {params}, expected {EXPECTED} first", PATCH.name
        )
    if "rejection_sample" not in module.RejectionSampler.forward.__code__.co_names:
        raise PatchError(
            f"{MODULE}.RejectionSampler.forward no longer calls rejection_sample by its "
            "module name: replacing it would change nothing",
            PATCH.name,
        )
    module.rejection_sample = _accepting_all(original)
    _state["done"] = True
