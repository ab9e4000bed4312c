"""The study spec: what to tune, how to check it and how to measure it.

* :mod:`~autotune.spec.model` -- the frozen dataclasses a spec is (types only);
* :mod:`~autotune.spec.load` -- ``studies/*.yaml`` loaded and validated, one error per bad key;
* :mod:`~autotune.spec.checks` -- the checks at load (launch size, roofline section, URLs);
* :mod:`~autotune.spec.workload` -- the workload's prompts (inline, file, synthetic), its hash.
"""

from __future__ import annotations

from autotune.spec.load import load_spec
from autotune.spec.model import (
    CheckSpec,
    EngineSpec,
    KnownAnswer,
    ModelSpec,
    ObjectiveSpec,
    SloSpec,
    StudySpec,
    WorkloadSpec,
)

__all__ = [
    "CheckSpec",
    "EngineSpec",
    "KnownAnswer",
    "ModelSpec",
    "ObjectiveSpec",
    "SloSpec",
    "StudySpec",
    "WorkloadSpec",
    "load_spec",
]
