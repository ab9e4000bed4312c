"""Which workload prompts the baseline records a reference for, and at which length.

The under-load check compares benchmark answers with these references: answers to a prompt the
reference does not cover cannot be judged and are counted as unchecked.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

#: at most this many distinct workload prompts get a reference (correctness under load);
#: a 10,000-line file must not make the baseline answer 10,000 prompts twice
REFERENCE_PROMPTS_MAX = 32


def single_length_prompts(workload: Any) -> dict[str, int]:
    """Every distinct workload prompt sent with one output length, with that length, in
    workload order: the answers a reference of that prompt can judge (a prompt asked with two
    lengths cannot match one reference). The under-load check reads lengths from here, not from
    :func:`reference_requests`, so a stored reference of other prompts (a study recorded before
    the reference's prompts were drawn) still judges every answer it covers."""
    lengths = list(workload.output_tokens) or [workload.max_tokens] * len(workload.prompts)
    seen: dict[str, set[int]] = {}
    for prompt, n in zip(workload.prompts, lengths, strict=True):
        seen.setdefault(prompt, set()).add(n)
    return {p: next(iter(ns)) for p, ns in seen.items() if len(ns) == 1}


def reference_requests(workload: Any) -> dict[str, int]:
    """The workload prompts the baseline records a reference for, with their output lengths:
    only prompts sent with one length (a prompt asked twice with two lengths cannot match one
    reference), at most :data:`REFERENCE_PROMPTS_MAX` distinct ones, in workload order.

    Where there are more, the 32 are drawn at random, seeded by the workload itself (the same
    workload always gets the same ones, so a resumed study keeps its reference): the first 32
    let a server answer every later prompt wrongly and pass, since nothing compared those
    answers. Answers to prompts left out are counted as unchecked (``under_load_unreferenced``)."""
    chosen = single_length_prompts(workload)
    if len(chosen) <= REFERENCE_PROMPTS_MAX:
        return chosen
    digest = hashlib.sha256("\0".join(chosen).encode()).digest()
    picked = set(random.Random(digest).sample(list(chosen), REFERENCE_PROMPTS_MAX))
    return {p: n for p, n in chosen.items() if p in picked}
