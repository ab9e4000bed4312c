"""A trial's verdict written into Optuna: attributes, constraints, state, artifacts.

The verdict policy (see ``docs/design/architecture.md``):

* correct and measured -> COMPLETE with the objective value(s), constraint ``correct`` = 0
  (and one constraint per SLO, positive when violated);
* correct, but its first round clearly worse than the leader's (``screen.py``) -> PRUNED
  ``screened`` with that round's metrics, constraint ``correct`` = 0: never best;
* a configuration fault (wrong output, crash, OOM, rejected flags, ...) -> PRUNED with
  constraint ``correct`` = 1: the sampler learns the region is bad, yet no speed is made up
  for a config that was never measured, and it can never be the best trial;
* an infrastructure fault -> FAIL (the sampler ignores it), re-enqueued once.

Every function here writes; none launches or measures anything. Each returns the
:class:`TrialOutcome` the run loop reads; raising ``TrialPruned`` is left to ``trial.py``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.artifacts import upload_artifact

from autotune import names
from autotune.errors import CandidateError, InfrastructureError, TrialFailure
from autotune.spec.model import ObjectiveSpec

if TYPE_CHECKING:
    from autotune.study.screen import ScreenResult

_LOG_TAIL_CHARS = 6000
#: how far a chain of duplicates (a duplicate whose holder itself took an outcome) is followed
_MAX_DUPLICATE_CHAIN = 16


@dataclass(frozen=True)
class TrialOutcome:
    number: int
    role: str
    verdict: str  # "correct" | a failure reason
    values: tuple[float, ...] | None = None
    infrastructure: bool = False


def record_failure(trial: optuna.Trial, role: str, exc: TrialFailure) -> TrialOutcome:
    """Why the trial failed, its evidence, and (a configuration fault only) the correctness
    constraint that keeps it from ever being best."""
    infra = isinstance(exc, InfrastructureError)
    evidence = dict(exc.evidence)
    if "log_tail" in evidence:
        evidence["log_tail"] = str(evidence["log_tail"])[-_LOG_TAIL_CHARS:]
    trial.set_user_attr(names.FAIL_REASON, exc.reason)
    trial.set_user_attr(names.FAIL_DETAIL, exc.detail[:2000])
    trial.set_user_attr(names.EVIDENCE, trim(evidence))
    if exc.reason == "incorrect_output":
        trial.set_user_attr(names.CORRECT, False)
    if not infra:
        trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 1.0)
    return TrialOutcome(trial.number, role, exc.reason, None, infrastructure=infra)


def record_screened(
    trial: optuna.Trial, role: str, metrics: dict[str, float], screen: ScreenResult
) -> TrialOutcome:
    """Verified correct, measured for one round and clearly worse than the leader
    (``screen.py``): its one round's metrics, the screen's record and the reason, and no
    correctness constraint (the config is not bad, only slower). The caller ends it PRUNED,
    so it is never best, never exported, never a confirmation candidate."""
    trial.set_user_attr(names.METRICS, {k: round(v, 4) for k, v in metrics.items()})
    trial.set_user_attr(names.CORRECT, True)
    trial.set_user_attr(names.FAIL_REASON, names.SCREENED)
    trial.set_user_attr(names.FAIL_DETAIL, screen.detail()[:2000])
    trial.set_user_attr(names.SCREEN, screen.to_dict())
    trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 0.0)
    return TrialOutcome(trial.number, role, names.SCREENED)


def record_measured(
    trial: optuna.Trial, role: str, objective: ObjectiveSpec, metrics: dict[str, float]
) -> TrialOutcome:
    """A correct, measured trial: its metrics, constraints and objective value(s). A trial
    whose benchmark measured no value of an objective metric fails ``request_errors`` (the
    outcome then has no values)."""
    trial.set_user_attr(names.METRICS, {k: round(v, 4) for k, v in metrics.items()})
    trial.set_user_attr(names.CORRECT, True)
    missing = [m for m in objective.metrics if m not in metrics]
    if missing:
        return record_failure(
            trial,
            role,
            CandidateError("request_errors", f"no measurement of {', '.join(missing)}"),
        )
    trial.set_constraint(names.CORRECTNESS_CONSTRAINT, 0.0)
    for slo in objective.slos:
        trial.set_constraint(
            names.slo_constraint(slo.metric),
            slo.violation(metrics[slo.metric]) if slo.metric in metrics else 1.0,
        )
    values = tuple(metrics[m] for m in objective.metrics)
    return TrialOutcome(trial.number, role, names.CORRECT_VERDICT, values)


# --- duplicates ------------------------------------------------------------------------------


def running_duplicate(
    trial: optuna.Trial, values: dict[str, Any]
) -> optuna.trial.FrozenTrial | None:
    """Another RUNNING trial with exactly these parameters (not one that itself waits as a
    duplicate), if any."""
    study = trial.study
    for other in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if (
            other.number != trial.number
            and other.user_attrs.get(names.PARAMS_RESOLVED) == values
            and other.user_attrs.get(names.DUPLICATE_OF) is None
        ):
            return other
    return None


def record_duplicate(
    trial: optuna.Trial, role: str, holder: optuna.trial.FrozenTrial
) -> tuple[TrialOutcome, str]:
    """Record ``holder``'s outcome as this duplicate's (the caller ends it PRUNED, not
    counted): its verdict and correctness constraint, never a made-up penalty. Returns the
    outcome and the line for ``TrialPruned``."""
    study = trial.study
    storage = study._storage  # noqa: SLF001
    source = holder
    for _ in range(_MAX_DUPLICATE_CHAIN):  # a holder that itself took an outcome points further
        further = source.user_attrs.get(names.DUPLICATE_OF)
        if source.user_attrs.get(names.FAIL_REASON) != "duplicate" or further is None:
            break
        source = storage.get_trial(
            storage.get_trial_id_from_study_id_trial_number(study._study_id, further)  # noqa: SLF001
        )
    verdict = source.user_attrs.get(names.FAIL_REASON) or (
        names.CORRECT_VERDICT
        if source.state == optuna.trial.TrialState.COMPLETE
        else source.state.name
    )
    trial.set_user_attr(names.FAIL_REASON, "duplicate")
    trial.set_user_attr(
        names.FAIL_DETAIL,
        f"the sampler proposed the parameters of trial {holder.number} while it ran; "
        f"waited for it instead of launching a second server; its outcome: {verdict}",
    )
    trial.set_user_attr(
        names.EVIDENCE,
        {"duplicate_of": source.number, "outcome": verdict, "values": source.values},
    )
    constraint = source.system_attrs.get(names.constraint_attr(names.CORRECTNESS_CONSTRAINT))
    if constraint is not None:
        trial.set_constraint(names.CORRECTNESS_CONSTRAINT, float(constraint))
    outcome = TrialOutcome(trial.number, role, "duplicate")
    return outcome, f"duplicate of trial {holder.number}: {verdict}"


# --- artifacts -------------------------------------------------------------------------------


def upload_trial_files(
    artifacts: Any, trial: optuna.Trial, log_path: Path, redact: Callable[[str], str] = str
) -> None:
    """The server log and the verified outputs as the trial's artifacts (the dashboard shows
    them); ``redact`` cuts the launch's secrets out of the outputs (a server may echo its key;
    the log is redacted where it is written). Artifacts are a convenience: a write that fails
    loses nothing of the record."""
    if artifacts is None or not log_path.exists():
        return
    try:
        upload_artifact(
            artifact_store=artifacts,
            file_path=str(log_path),
            study_or_trial=trial,
            mimetype="text/plain",
            encoding="utf-8",
        )
        outputs = {k: trial.user_attrs.get(k) for k in (names.CHECK, names.EVIDENCE)}
        with tempfile.NamedTemporaryFile(
            "w", suffix=f"-trial{trial.number}-outputs.json", delete=False
        ) as handle:
            handle.write(redact(json.dumps(outputs, indent=2, default=str)))
        upload_artifact(
            artifact_store=artifacts,
            file_path=handle.name,
            study_or_trial=trial,
            mimetype="application/json",
        )
        os.unlink(handle.name)
    except OSError:
        pass  # artifacts are a convenience; the trial's record is in the storage


def trim(data: Any, limit: int = 4000) -> Any:
    """Keep stored attributes small: long strings are cut from the front (tails matter)."""
    if isinstance(data, str):
        return data if len(data) <= limit else "..." + data[-limit:]
    if isinstance(data, dict):
        return {k: trim(v, limit) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [trim(v, limit) for v in data]
    return data
