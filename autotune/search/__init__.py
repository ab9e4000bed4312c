"""The search: which config to launch next.

* :mod:`~autotune.search.strategy` -- the samplers (``auto``, ``tpe``, ``random``, ``gp``);
* :mod:`~autotune.search.model` -- the model ``auto`` fits to the measurements;
* :mod:`~autotune.search.guide` -- first proposals that avoid known-lossy choices.
"""

from __future__ import annotations

from autotune.search.strategy import DEFAULT_SAMPLER, build_sampler

__all__ = ["DEFAULT_SAMPLER", "build_sampler"]
