"""A SIMULATED landscape of two numeric values and nothing else: a smooth interior peak.

A cost model, not a measurement: the speed peaks at ``fraction`` 0.73 and ``tokens`` 300 (log
scale) and falls off smoothly around it, over a floor of 5 tok/s. Written after a trace showed
the default strategy launching the corner of such a space (1.0, 1000) again and again: its main
effects (``u``, ``u**2``) and their products extrapolate there. It is the landscape the numeric
local term of ``autotune.search.model.fit_speed`` was built and its length chosen on, so it is
a check that the fix holds, not an overfitting check (``unseen.py`` is that).

Parameters missing from ``params`` (the baseline sets none) take 0.5 and 10.
"""

from __future__ import annotations

import math
from typing import Any

#: measurement noise the harness adds by default
NOISE = 0.05


def landscape(params: dict[str, Any]) -> dict[str, Any]:
    """The harness's landscape protocol: noise-free tok/s (every config starts and is correct)."""
    fraction = params.get("fraction", 0.5)
    tokens = params.get("tokens", 10)
    bump = math.exp(
        -((fraction - 0.73) ** 2) / 0.08 - (math.log(tokens) - math.log(300)) ** 2 / 4.5
    )
    return {"tok_s": 100.0 * bump + 5.0}
