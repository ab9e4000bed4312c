"""FAULT: corrupt the sampled token of every sequence, but only in steps that batch several.

Batching bugs are the class of fault a quiet, one-request-at-a-time correctness check cannot
see: a kernel that indexes the wrong row, a padding mask that is off by one when the batch has
more than one sequence, a cache slot shared between two requests. The server starts, every
request sent alone is answered correctly, and the text goes wrong only under load. This patch
exists so that a test can prove autotune's check *under load* (benchmark responses compared
with the reference) rejects such a configuration after its quiet check passed.

Target: ``vllm.v1.sample.sampler.Sampler.forward`` (vLLM 0.32, v1 engine; the CPU model runner
inherits ``self.sampler = Sampler(...)`` from the GPU runner). ``forward`` receives the logits
of one scheduler step, one row per scheduled request. When there is more than one row, the
wrapper swaps the two largest logits of every row before the original sampler runs: greedy
decoding then picks each sequence's runner-up token, and the returned logprobs stay finite and
consistent with the (corrupted) logits. A step with a single row is passed through untouched,
so requests that run alone are exactly right. The sampler's own warm-up (a dummy batch during
start-up) is corrupted too, which changes nothing anyone sees.

Every step, batched or not, also sleeps ``STEP_DELAY_S`` before sampling. Without it the fault
depended on the machine's timing: on a starved 2-core machine the API server was seen handing
eight concurrent 192-token requests to the engine one at a time, each finished (0.3 s) before
the next arrived, so no step ever held two sequences and the fault never fired. With 20 ms
steps a 24-token answer takes about half a second alone, far longer than the API server needs to
pass on the requests sent with it, and the engine core sleeps instead of competing for the CPU.

The first corrupted step prints ``AUTOTUNE_BATCH_CORRUPT rows=<n> pid=<pid>`` to stderr.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import time
from typing import Any

from autotune.patching import PatchError, PatchInfo

MODULE = "vllm.v1.sample.sampler"

PATCH = PatchInfo(
    name="batch_corrupt",
    kind="fault",
    engine="vllm",
    versions=">=0.32",
    targets=(f"{MODULE}.Sampler.forward",),
    rationale="Deliberately pick the runner-up token in steps with more than one sequence.",
    choices=(False, True),
    default=False,
)

STEP_DELAY_S = 0.02

_state = {"corrupted_steps": 0, "done": False}


def _corrupting(original: Any) -> Any:
    @functools.wraps(original)
    def forward(self: Any, logits: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(STEP_DELAY_S)  # slow steps: concurrent requests overlap on any machine
        if logits.dim() == 2 and logits.shape[0] > 1 and logits.shape[1] > 1:
            top = logits.topk(2, dim=-1)
            logits = logits.clone()
            logits.scatter_(-1, top.indices, top.values.flip(-1))  # swap best and runner-up
            _state["corrupted_steps"] += 1
            if _state["corrupted_steps"] == 1:
                print(
                    f"AUTOTUNE_BATCH_CORRUPT rows={logits.shape[0]} pid={os.getpid()}",
                    file=sys.stderr,
                    flush=True,
                )
        return original(self, logits, *args, **kwargs)

    return forward


def apply(value: bool) -> None:
    """Wrap ``Sampler.forward`` (once per process)."""
    if not value or _state["done"]:
        return
    cls = importlib.import_module(MODULE).Sampler
    params = list(inspect.signature(cls.forward).parameters)
    if params[:2] != ["self", "logits"]:
        raise PatchError(
            f"{MODULE}.Sampler.forward takes {params}, expected (self, logits, ...)",
            PATCH.name,
        )
    cls.forward = _corrupting(cls.forward)
    _state["done"] = True
