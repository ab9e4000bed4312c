"""A third SIMULATED landscape, written AFTER the default strategy was chosen: an overfitting check.

A cost model of nothing in particular (the flags of ``search_spaces/unseen-sim.yaml`` are made
up), shaped unlike the other two landscapes:

* a numeric dimension with a sharp interior optimum (``workers`` near 12 on a log scale 1-64:
  3x off costs about a third of the speed, 1 worker next to nothing);
* an interaction between choices (the best ``batch`` depends on ``cache``);
* a failure region that is an interaction of a choice and a numeric threshold (``cache: huge``
  with more than 16 workers runs out of memory);
* a wrong region (``compress`` with the ``quick`` codec: 10 % faster, wrong output), while each
  of the two is a gain on its own;
* a lossy-looking choice that is correct and worth 6 % (fp8 KV), and four distractors.

8 % noise. Parameters missing from ``params`` take the defaults below.
"""

from __future__ import annotations

import math
from typing import Any

#: measurement noise the harness adds by default
NOISE = 0.08
#: accepted, no effect (distractors)
NOT_MODELLED = ("d1", "d2", "d3", "d4")


def landscape(p: dict[str, Any]) -> dict[str, Any]:
    """The harness's landscape protocol: tok/s, ``correct: False`` or ``failure``."""
    workers = p.get("workers", 4)
    batch = p.get("batch", 4)
    cache = p.get("cache", "small")
    codec = p.get("codec", "std")
    compress = p.get("compress", False)
    pre = p.get("prefetch", 0.0)
    if cache == "huge" and workers > 16:
        return {"failure": "oom"}
    v = 1000.0 * (1 - 0.08 * math.log2(workers / 12.0) ** 2)
    best_batch = 16 if cache != "small" else 4
    v *= 1 - 0.12 * abs(math.log2(batch / best_batch)) / 2
    v *= {"small": 1.0, "big": 1.15, "huge": 1.2}[cache]
    v *= {"std": 1.0, "quick": 1.10, "zstd": 0.95}[codec]
    v *= 1.08 if compress else 1.0
    v *= 1 - 0.25 * (pre - 0.7) ** 2
    v *= 1.06 if p.get("kv_cache_dtype") == "fp8" else 1.0
    v *= 1.03 if p.get("pin") else 1.0
    out = {"tok_s": max(v, 1.0)}
    if compress and codec == "quick":
        out["correct"] = False
        out["tok_s"] *= 1.1
    return out
