"""Create or resume a study and run its trials: preflight, cleanup, baseline, loop.

The loop asks Optuna for one trial at a time (``study.optimize(n_trials=1)``) so Optuna's
heartbeats run while a server is up, and so autotune can decide after each trial: a trial that
never launched (its parameters broke a constraint) does not count towards ``--trials``, an
infrastructure fault is re-enqueued once, and too many infrastructure faults in a row stop the
run rather than burning the night.

A trial left RUNNING by a dead run is reclaimed as soon as its death is known, not only once
Optuna's heartbeat grace has passed: each trial records its worker (machine, pid, process create
time) before anything is launched, so on the same machine a gone worker is certain at once; on
another machine the heartbeat decides. Reclaiming stops the recorded server group and every
descendant recorded while it ran, marks the trial ``interrupted`` (FAIL), queues its parameters
again (a baseline stays the baseline) and says so in one line. It happens before the first trial,
before every later one, and in every wait on a trial another worker holds (the baseline, a
duplicate), so no wait trusts a holder that is gone.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune import names
from autotune.engines import build_engine
from autotune.engines.base import DroppedChoice, Engine
from autotune.errors import AutotuneError, InfrastructureError, PreflightError, SpecError
from autotune.model.roofline import roofline_from_spec
from autotune.search import strategy
from autotune.search.guide import GuidedSampler, Neighbour, early_neighbours, record_plan, risky_for
from autotune.spec.load import spec_error_for_missing_model
from autotune.spec.model import StudySpec
from autotune.spec.workload import check_workload, refuse_changed_workload
from autotune.storage import (
    artifact_dir_for,
    artifact_store,
    check_artifact_dir,
    check_reachable,
    check_study_name,
    open_storage,
    resolve_url,
    safe_url,
    sqlite_file,
    study_names,
)
from autotune.study.cleanup import (
    cleanup_stale,
    enqueue_retry,
    on_optuna_stale,
    reclaim_trial,
    trial_dead_reason,
)
from autotune.study.hardware import describe_machine
from autotune.study.record import TrialOutcome
from autotune.study.trial import TrialContext, TrialRunner
from autotune.study.warm_start import warm_start_from

#: trials whose parameters violate constraints are retried by the sampler up to this many
#: times per counted trial before the run gives up on the space
MAX_UNLAUNCHED_PER_TRIAL = 50


def quiet_optuna() -> None:
    """Optuna's per-trial INFO lines and experimental-API warnings would drown autotune's own
    output. Called where a run starts (the CLI, :func:`run_study`, re-measurements), never at
    import: importing autotune must not change a host program's logging."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass(frozen=True)
class RunOptions:
    trials: int
    storage_url: str | None = None
    study_name: str | None = None
    seed: int | None = None
    artifact_dir: str | None = None
    validate: bool = True
    #: resume a study whose workload hash changed (workload.check_workload)
    allow_workload_change: bool = False
    #: search strategy (``autotune/search/strategy.py``); None: the study's recorded one, else auto
    sampler: str | None = None
    #: another study (same storage) whose best verified configs are launched first
    warm_start: str | None = None


@dataclass
class RunSummary:
    study_name: str
    storage_url: str
    outcomes: list[TrialOutcome] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)
    stopped_because: str | None = None


def storage_url_for(spec: StudySpec, override: str | None) -> str:
    return override or spec.storage or spec.default_storage()


def study_target(
    spec: StudySpec, study: str | None, storage: str | None, *, existing: bool
) -> tuple[str, str]:
    """(storage URL, study name), both checked before anything is written: the name (one
    rule for ``--study`` and the spec's ``study:``), the URL (in-memory SQLite refused, the
    directory there), and either that the SQLite file exists (``existing``: commands that read
    a study never create an empty database) or that a database server answers (``run``: a bad
    URL is refused before the artifact directory is made)."""
    name = check_study_name(study) if study is not None else spec.name
    url = storage_url_for(spec, storage)
    where = {"key": "--storage"}
    if storage is None and spec.storage is not None:
        where = {"key": "storage", "file": str(spec.path)}
    resolve_url(url, **where)
    database = sqlite_file(url)
    if existing:
        if database is not None and not database.is_file():
            raise SpecError(
                f"no study storage at {database} (run `autotune run` first, or give --storage)",
                **where,
            )
    else:
        check_reachable(url, **where)
    return url, name


def preflight(spec: StudySpec, engine: Engine, *, validate: bool = True) -> list[DroppedChoice]:
    """Everything that can be known wrong before a trial is spent. Returns the choices this
    machine cannot run (``Engine.machine_limits``), which the sampler then never proposes."""
    missing = spec_error_for_missing_model(spec)
    if missing is not None:
        raise missing
    version = engine.version()
    if version == "not installed":
        hint = f" ({engine.install_hint})" if engine.install_hint else ""
        raise PreflightError(f"engine {spec.engine.kind!r} is not installed{hint}")
    problem = engine.model_problem()
    if problem is not None:
        raise PreflightError(problem)
    if validate:
        bad = [i for i in engine.validate_space(spec.space) if not i.ok]
        if bad:
            first = bad[0]
            raise SpecError(
                f"{first.target}: {first.error}"
                + (f" (and {len(bad) - 1} more; run autotune validate)" if len(bad) > 1 else ""),
                file=str(spec.space.path),
                key=f"parameters.{first.parameter}",
            )
    return engine.machine_limits(spec.space)


def check_warm_start_source(url: str, study_name: str, source: str) -> None:
    """``--warm-start SOURCE`` refused before anything is written (the study, its queued
    baseline, the artifact directory): a study cannot seed itself, and SOURCE must be a study
    of the same storage. The storage is only read (:func:`autotune.storage.study_names`)."""
    if source == study_name:
        raise SpecError("a study cannot warm-start from itself", key="--warm-start")
    known = study_names(url) or []
    if source not in known:
        raise SpecError(
            f"no study named {source!r} in {safe_url(url)} (studies: {', '.join(known) or 'none'})",
            key="--warm-start",
        )


def check_space_unchanged(study: optuna.Study, spec: StudySpec) -> None:
    """Refuse to resume a study whose trials took a parameter from a domain the space no
    longer has: Optuna cannot continue it (a categorical parameter's choices or a parameter's
    type or log scale changed) and raised a ValueError traceback at the first ask, after the
    study had been opened. Numeric bounds may move (Optuna allows it), and parameters may be
    added or dropped."""
    current = {p.name: p for p in spec.space.parameters}
    for trial in study.get_trials(deepcopy=False):
        for name, old in trial.distributions.items():
            parameter = current.get(name)
            if parameter is None:
                continue
            try:
                optuna.distributions.check_distribution_compatibility(old, parameter.distribution())
            except ValueError as exc:
                raise SpecError(
                    f"study {study.study_name!r} has trials with {name} from "
                    f"{optuna.distributions.distribution_to_json(old)}, which the space no "
                    f"longer has ({exc}). Restore it, or give a new --study name",
                    file=str(spec.space.path),
                    key=f"parameters.{name}",
                ) from None


def open_study(
    spec: StudySpec,
    url: str,
    *,
    study_name: str | None = None,
    seed: int | None = None,
    dropped: Sequence[DroppedChoice] = (),
    neighbours: Sequence[Neighbour] = (),
    sampler_name: str | None = None,
    risky: Mapping[str, Sequence[Any]] | None = None,
    allow_workload_change: bool | None = None,
) -> tuple[optuna.Study, bool]:
    """Load the study or create it. Exactly one worker creates it, even when several start
    together: creation is an INSERT guarded by the database's unique study name.

    ``dropped`` choices are never proposed and ``neighbours`` are the first sampled trials
    (``autotune/search/guide.py``). A resumed study is refused before anything is written to
    it when its objective's directions, its search space's domains or (unless
    ``allow_workload_change`` is None: not checked, or True) its workload changed."""
    storage = _open_storage(url)
    name = study_name or spec.name

    def make_sampler(chosen: str) -> optuna.samplers.BaseSampler:
        # trials of config faults carry a positive ``correct`` constraint: every strategy
        # learns the regions that crash or print garbage as bad
        sampler = strategy.build_sampler(
            chosen, spec.space, seed, n_objectives=len(spec.objective.directions), risky=risky
        )
        if dropped or neighbours:
            sampler = GuidedSampler(
                sampler, spec.space, dropped=dropped, neighbours=neighbours, seed=seed
            )
        return sampler

    first_choice = sampler_name or strategy.DEFAULT_SAMPLER
    sampler = make_sampler(first_choice)
    try:
        study = optuna.create_study(
            storage=storage,
            study_name=name,
            sampler=sampler,
            pruner=build_pruner(),
            directions=spec.objective.directions,
        )
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(
            storage=storage, study_name=name, sampler=sampler, pruner=build_pruner()
        )
        created = False
        if [d.name.lower() for d in study.directions] != spec.objective.directions:
            raise SpecError(
                f"study {name!r} exists with directions "
                f"{[d.name.lower() for d in study.directions]}, the spec asks for "
                f"{spec.objective.directions}",
                file=str(spec.path),
                key="objective",
            ) from None
        check_space_unchanged(study, spec)  # before anything is written to the study
        if allow_workload_change is not None:
            refuse_changed_workload(study, spec, allow_change=allow_workload_change)
    chosen = strategy.record_sampler(study, sampler_name)
    if chosen != first_choice:  # resumed without --sampler: the study's own strategy
        study.sampler = make_sampler(chosen)
    if created or names.MACHINE not in study.user_attrs:
        # the report's "hardware"; a study made before this was recorded gets the machine it
        # resumes on, rather than "not recorded" for ever
        study.set_user_attr(names.MACHINE, describe_machine())
    if created:
        study.set_user_attr(names.SPEC_PATH, str(spec.path))
        study.set_metric_names(list(spec.objective.metrics))  # `show` reads each one's interval
        # The baseline is trial 0: engine defaults, no patches. It records the reference.
        study.enqueue_trial(
            spec.space.baseline_optuna_params(), user_attrs={names.ROLE: names.BASELINE}
        )
    return study, created


def _open_storage(url: str, attempts: int = 4) -> optuna.storages.RDBStorage:
    """Workers starting together on an empty database race to create Optuna's tables; the
    losers get IntegrityError/ProgrammingError ("already exists") once, then find them made."""
    for attempt in range(attempts):
        try:
            return open_storage(url)
        except SpecError as exc:
            transient = "IntegrityError" in str(exc) or "ProgrammingError" in str(exc)
            if not transient or attempt == attempts - 1:
                raise
            time.sleep(0.5 + 0.5 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


#: the study's shared compile cache, in its artifact folder
COMPILE_CACHE_DIR = "compile-cache"


def build_pruner() -> optuna.pruners.BasePruner:
    """No Optuna pruner: a trial is stopped short by its screen (``study/screen.py``: one
    round, then on only if its interval overlaps the leader's), never by a percentile of the
    intermediate values, which knows nothing of how noisy a round is."""
    return optuna.pruners.NopPruner()


def run_study(
    spec: StudySpec,
    options: RunOptions,
    *,
    on_phase: Callable[[int, str], None] | None = None,
    on_trial: Callable[[TrialOutcome, optuna.Study], None] | None = None,
    log_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    on_notice: Callable[[str], None] | None = None,
) -> RunSummary:
    """Run ``options.trials`` launched trials (resuming the study if it exists)."""
    quiet_optuna()
    engine = build_engine(spec)
    dropped = preflight(spec, engine, validate=options.validate)
    for choice in dropped:
        (on_notice or (lambda _line: None))(choice.notice())
    roofline = roofline_record(spec)  # before anything is written: it may fail on the model
    neighbours = early_neighbours(spec.space, engine, dropped)
    url = storage_url_for(spec, options.storage_url)
    # Bad input writes nothing. A bad storage URL, an artifact directory that cannot be made
    # and a warm-start study that is not there are found before the storage is touched; a
    # storage that cannot be opened and a resume refused (objective directions, search space,
    # workload) are found by opening the study, before the artifact directory is made.
    resolve_url(url)
    check_reachable(url)
    name = options.study_name or spec.name
    artifacts_path = artifact_dir_for(url, name, options.artifact_dir)
    check_artifact_dir(artifacts_path)
    if options.warm_start:
        check_warm_start_source(url, name, options.warm_start)
    study, _created = open_study(
        spec,
        url,
        study_name=options.study_name,
        seed=options.seed,
        dropped=dropped,
        neighbours=neighbours,
        sampler_name=options.sampler,
        risky=risky_for(spec.space, engine),
        allow_workload_change=options.allow_workload_change,
    )
    changed = check_workload(study, spec, allow_change=options.allow_workload_change)
    if changed:
        (on_notice or (lambda _line: None))(changed)
    if options.warm_start:
        for line in warm_start_from(study, spec, url, options.warm_start):
            (on_notice or (lambda _line: None))(line)
    artifacts = artifact_store(artifacts_path)
    record_plan(study, dropped, neighbours)
    summary = RunSummary(study_name=study.study_name, storage_url=url)
    summary.cleaned = cleanup_stale(study)
    backend = getattr(study._storage, "_backend", study._storage)  # noqa: SLF001
    if hasattr(backend, "heartbeat_stale_trial_callback"):
        backend.heartbeat_stale_trial_callback = on_optuna_stale(summary.cleaned)
    if not _created:
        _wait_for_creator(study)
    if study.user_attrs.get(names.REFERENCE) is None and not _baseline_pending(study):
        study.enqueue_trial(
            spec.space.baseline_optuna_params(), user_attrs={names.ROLE: names.BASELINE}
        )
    ctx = TrialContext(
        spec=spec,
        engine=engine,
        log_dir=log_dir or artifacts_path / "logs",
        artifacts=artifacts,
        on_phase=on_phase or (lambda _n, _p: None),
        study=study,
        extra_env=dict(extra_env or {}),
        # one compile cache for the study's trials: a config whose graph an earlier trial
        # compiled starts warm (vLLM's torch.compile cache; engines without one ignore it)
        compile_cache=artifacts_path / COMPILE_CACHE_DIR,
    )
    study.set_user_attr(names.ENGINE_VERSION, engine.version())
    if roofline is not None and names.ROOFLINE not in study.user_attrs:
        study.set_user_attr(names.ROOFLINE, roofline)
    runner = TrialRunner(ctx)
    launched = 0
    unlaunched = 0
    infra_in_a_row = 0
    while launched < options.trials:
        summary.cleaned += cleanup_stale(study)
        _wait_for_reference(study, summary.cleaned)
        runner.last = None
        try:
            study.optimize(runner, n_trials=1, catch=(InfrastructureError,), gc_after_trial=False)
        except KeyboardInterrupt:
            # Ctrl-C: the runner stopped the server and recorded the trial `interrupted`; queue
            # its parameters again so the next run retries it (like a killed run's trial).
            last = runner.last
            if last is not None and last.verdict == "interrupted":
                enqueue_retry(study, study.trials[last.number])
            raise
        finally:
            summary.cleaned += runner.notes
            runner.notes.clear()
        outcome = runner.last
        if outcome is None:
            raise PreflightError("a trial ended without an outcome (see the study's last trial)")
        summary.outcomes.append(outcome)
        if on_trial is not None:
            on_trial(outcome, study)
        if outcome.verdict == "duplicate":
            # not launched: this worker waited for the running trial with these parameters
            # and took its outcome (see TrialRunner._settle_duplicate); ask again
            continue
        if outcome.verdict == "constraint_violated":
            unlaunched += 1
            if unlaunched > MAX_UNLAUNCHED_PER_TRIAL * max(1, options.trials):
                summary.stopped_because = (
                    "the sampler keeps proposing configurations that "
                    "violate the space's constraints"
                )
                break
            continue
        if outcome.infrastructure:
            infra_in_a_row += 1
            trial = study.trials[outcome.number]
            if trial.user_attrs.get(names.RETRY_OF) is None:
                enqueue_retry(study, trial)
            if infra_in_a_row >= spec.max_consecutive_infra_failures:
                summary.stopped_because = (
                    f"{infra_in_a_row} infrastructure failures in a row (last: {outcome.verdict})"
                )
                break
            continue
        infra_in_a_row = 0
        launched += 1
        if outcome.role == names.BASELINE and outcome.verdict != "correct":
            trial = study.trials[outcome.number]
            detail = trial.user_attrs.get(names.FAIL_DETAIL, "")
            raise PreflightError(
                f"the baseline (trial {outcome.number}) failed: "
                f"{outcome.verdict}: {detail}. Nothing else can be judged "
                f"without a reference; see `autotune show` for its log."
            )
    return summary


def roofline_record(spec: StudySpec) -> dict[str, Any] | None:
    """The spec's decode roofline (None without a ``roofline`` section), stored once so `show`
    can say how far each config is. Computed before the study and its artifact directory are
    made (``run_study``, ``run_parallel``): without ``active_params`` and ``bits`` it inspects
    the model, which can fail (no config in the folder), and failing after the study was
    created left a study with its baseline queued behind an exit code 2."""
    if not spec.roofline:
        return None
    try:
        return roofline_from_spec(spec.roofline, spec.model.path).to_dict()
    except (KeyError, ValueError, AutotuneError) as exc:
        raise SpecError(
            f"cannot compute the roofline: {exc}", file=str(spec.path), key="roofline"
        ) from None


def _baseline_pending(study: optuna.Study) -> bool:
    return any(
        t.state in (TrialState.WAITING, TrialState.RUNNING)
        and t.user_attrs.get(names.ROLE) == names.BASELINE
        for t in study.get_trials(deepcopy=False)
    )


def _wait_for_creator(study: optuna.Study, timeout_s: float = 10.0) -> None:
    """A study another worker created a moment ago gets its baseline queued right after; wait
    for it rather than queue a second baseline (the creator may have died: then give up)."""
    deadline = time.monotonic() + timeout_s
    while not study.get_trials(deepcopy=False) and time.monotonic() < deadline:
        time.sleep(0.2)


def _wait_for_reference(study: optuna.Study, notes: list[str], poll_s: float = 1.0) -> None:
    """A worker that joined a study whose baseline runs elsewhere waits for its reference.

    Every poll checks that the baseline's worker is alive; a dead one's baseline is reclaimed
    (leftover server stopped, re-enqueued as the baseline) and this worker takes it next. There
    is no blind deadline: the wait ends when the reference is stored, the baseline is queued or
    gone, or its holder is found dead.
    """
    while True:
        if study.user_attrs.get(names.REFERENCE) is not None:
            return
        trials = study.get_trials(deepcopy=False)
        waiting = any(
            t.state == TrialState.WAITING and t.user_attrs.get(names.ROLE) == names.BASELINE
            for t in trials
        )
        if waiting:
            return  # this worker will take the baseline itself
        running = [
            t
            for t in trials
            if t.state == TrialState.RUNNING and t.user_attrs.get(names.ROLE) == names.BASELINE
        ]
        if not running:
            return  # the caller's trial will fail visibly with "no reference"
        for holder in running:
            why = trial_dead_reason(study, holder)
            if why is not None:
                notes += reclaim_trial(study, holder, why)
        time.sleep(poll_s)
