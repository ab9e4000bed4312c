"""The search space: its parameters, constraints, the YAML that declares them, and the typed
settings a config turns into.

* :mod:`~autotune.space.model` -- parameters and targets (flag, env var, JSON key, patch), and
  the Optuna suggestions;
* :mod:`~autotune.space.load` -- ``search_spaces/*.yaml`` read and checked;
* :mod:`~autotune.space.constraints` -- relations between parameters;
* :mod:`~autotune.space.settings` -- :class:`ServerSettings`, one config in engine-neutral terms.
"""

from __future__ import annotations

from autotune.space.load import load_space
from autotune.space.model import Parameter, SearchSpace
from autotune.space.settings import ServerSettings

__all__ = ["Parameter", "SearchSpace", "ServerSettings", "load_space"]
