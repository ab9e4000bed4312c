"""The study spec as frozen dataclasses: what a loaded ``studies/*.yaml`` holds.

Kept apart from the loader (:mod:`autotune.spec.load`) so that the modules that only read a
spec (the gate, the engines, the report) depend on these types and not on the YAML parsing,
the workload builder and the model readers behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.names import DEFAULT_OBJECTIVE, direction
from autotune.space.model import SearchSpace


@dataclass(frozen=True)
class EngineSpec:
    """How to start the engine. ``command`` is the launcher prefix (vLLM) or full template."""

    kind: str
    command: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    patch_dirs: tuple[Path, ...] = ()
    health_path: str = "/health"
    #: command engine: a command whose first output line is the engine's version
    version_command: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    path: str
    served_name: str
    tokenizer: str | None = None


@dataclass(frozen=True)
class KnownAnswer:
    prompt: str
    expect: str  # a regular expression the greedy completion must match


@dataclass(frozen=True)
class CheckSpec:
    """The correctness gate's inputs. See ``gate/run.py`` for the tolerance policy."""

    prompts: tuple[str, ...]
    max_tokens: int = 32
    known_answers: tuple[KnownAnswer, ...] = ()
    #: None = derived from the baseline's own variation (``auto``)
    logprob_tolerance: float | None = None
    #: floor of the derived tolerance, in nats
    tolerance_floor: float = 0.01
    #: benchmark responses compared with the reference per trial past 4096 answers (up to
    #: that, every one: gate/judge.py JUDGE_EVERY_UP_TO)
    under_load_sample: int = 8


@dataclass(frozen=True)
class WorkloadSpec:
    prompts: tuple[str, ...]
    max_tokens: int = 64
    concurrency: int = 8
    num_requests: int = 32
    single_requests: int = 3
    warmup_requests: int = 2
    repeats: int = 2
    request_timeout_s: float = 60.0
    #: per-prompt output lengths (a file's max_tokens, a synthetic distribution); empty: all
    #: ``max_tokens``. Where the prompts came from and in what unit lengths are: workload.py
    output_tokens: tuple[int, ...] = ()
    source: str = "inline"
    length_unit: str | None = None
    chat_format: str | None = None
    #: every concurrency measured on one launch (the load curve); ``concurrency`` is the largest
    levels: tuple[int, ...] = ()
    #: repeat until the objective's 95% CI half-width / mean is within this (0: fixed repeats)
    target_precision: float = 0.03
    #: ... or until this much measuring (seconds), or this many rounds
    max_measure_s: float = 60.0
    max_repeats: int = 30
    #: SLOs for goodput (the highest concurrency meeting them), searched on every launch
    slos: tuple[SloSpec, ...] = ()
    goodput_max_concurrency: int = 64

    @property
    def concurrency_levels(self) -> tuple[int, ...]:
        return self.levels or (self.concurrency,)


@dataclass(frozen=True)
class SloSpec:
    """A constraint on a measured metric, e.g. ``ttft_p95_ms <= 500``."""

    metric: str
    op: str
    bound: float

    def holds(self, value: float) -> bool:
        return value <= self.bound if self.op == "<=" else value >= self.bound

    def violation(self, value: float) -> float:
        """Optuna's convention: <= 0 is feasible."""
        return value - self.bound if self.op == "<=" else self.bound - value


@dataclass(frozen=True)
class ObjectiveSpec:
    metrics: tuple[str, ...] = (DEFAULT_OBJECTIVE,)
    slos: tuple[SloSpec, ...] = ()

    @property
    def directions(self) -> list[str]:
        return [direction(m) for m in self.metrics]


@dataclass(frozen=True)
class StudySpec:
    path: Path
    name: str
    engine: EngineSpec
    model: ModelSpec
    space: SearchSpace
    check: CheckSpec
    workload: WorkloadSpec
    objective: ObjectiveSpec
    startup_timeout_s: float = 300.0
    max_consecutive_infra_failures: int = 3
    storage: str | None = None
    #: decode roofline inputs, optional (see model/roofline.py)
    roofline: dict[str, Any] = field(default_factory=dict)

    @property
    def directory(self) -> Path:
        return self.path.parent

    def default_storage(self) -> str:
        return f"sqlite:///{(self.directory / (self.name + '.db')).resolve()}"
