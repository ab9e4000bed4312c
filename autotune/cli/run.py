"""``autotune run``: the search, then the confirmation of its best configs."""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from typing import Annotated

import optuna
import typer
from rich.live import Live

from autotune import names
from autotune.analysis.confirm import confirm_study
from autotune.cli import render
from autotune.cli.common import console, err, fail, open_spec
from autotune.cli.options import (
    DEFAULT_SPEC,
    ArtifactDirOpt,
    SeedOpt,
    SpecOpt,
    StorageOpt,
    StudyOpt,
    WorkerEnvOpt,
)
from autotune.cli.render import literal
from autotune.errors import AutotuneError, SpecError
from autotune.search.strategy import DEFAULT_SAMPLER, SAMPLER_ATTR, check_space
from autotune.search.strategy import check_name as check_sampler_name
from autotune.spec.model import StudySpec
from autotune.storage import (
    artifact_dir_for,
    check_artifact_dir,
    load_study,
    sqlite_file,
    study_names,
)
from autotune.study.budget import BudgetPlan, launches_made, plan_budget
from autotune.study.loop import RunOptions, check_warm_start_source, run_study
from autotune.study.parallel import DevicePlanSpec, check_device_options, run_parallel
from autotune.study.results import (
    NO_CONFIRMED_WINNER,
    baseline_reason,
    best_trials,
    verified_baseline,
)


def run(
    trials: Annotated[
        int,
        typer.Option(
            "--trials",
            min=1,
            help="Server launches in all: the baseline, the search and the confirmation (at "
            "most a fifth, unless --confirm-repeats asks). A resumed study counts the launches "
            "it already made.",
        ),
    ] = 50,
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    seed: SeedOpt = None,
    sampler: Annotated[
        str | None,
        typer.Option(
            "--sampler",
            help="Search strategy: auto (default: model-based, autotune/search/strategy.py), tpe, "
            "random, gp. A resumed study keeps its recorded one unless given.",
        ),
    ] = None,
    warm_start: Annotated[
        str | None,
        typer.Option(
            "--warm-start",
            help="Another study in the same storage: its best verified configs are launched "
            "first (and gated here).",
        ),
    ] = None,
    artifact_dir: ArtifactDirOpt = None,
    parallel: Annotated[
        int,
        typer.Option(
            "--parallel", min=1, help="Trials run at once on this machine (one worker each)."
        ),
    ] = 1,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="GPUs the workers share out, e.g. 0-7 or 0,1,2,3.")
    ] = None,
    gpus_per_trial: Annotated[int, typer.Option("--gpus-per-trial", min=1)] = 1,
    cpus: Annotated[
        str | None,
        typer.Option("--cpus", help="CPU cores the workers share out (CPU engines), e.g. 0-15."),
    ] = None,
    cpus_per_trial: Annotated[int | None, typer.Option("--cpus-per-trial", min=1)] = None,
    worker_env: WorkerEnvOpt = None,
    confirm_top: Annotated[
        int,
        typer.Option(
            "--confirm-top",
            min=0,
            help="Re-measure the top K configs against the baseline before declaring the best "
            "(0: skip; 1 when the budget holds no more).",
        ),
    ] = 2,
    confirm_repeats: Annotated[
        int | None,
        typer.Option(
            "--confirm-repeats",
            min=2,
            help="Confirmation rounds to plan, out of --trials (default: what fits in a fifth "
            "of it: 2 to 8 rounds, a second candidate only where each gets 4; none below about "
            "--trials 20). The race stops earlier once settled.",
        ),
    ] = None,
    allow_workload_change: Annotated[
        bool,
        typer.Option(
            "--allow-workload-change",
            help="Resume a study although its workload changed (recorded in the study).",
        ),
    ] = False,
) -> None:
    """Tune, then confirm the best: N server launches in all, the baseline, the search and the
    confirmation (resuming the study if it exists, within the same N)."""
    try:
        if sampler is not None:
            check_sampler_name(sampler)
        # Every name, URL and path is checked before anything is created.
        study_spec, url, name = open_spec(spec, study, storage, existing=False)
        study_names(url)  # a storage that cannot be read (not a database) is refused here
        # the strategy this run will use (a resumed study's own without --sampler) must be
        # able to search the space: gp refuses a domain too wide to list
        check_space(sampler or recorded_sampler(url, name) or DEFAULT_SAMPLER, study_spec.space)
        check_artifact_dir(artifact_dir_for(url, name, artifact_dir))
        if warm_start is not None:  # before anything is written, for --parallel too
            check_warm_start_source(url, name, warm_start)
        extra_env = json.loads(worker_env) if worker_env else None  # checked at parsing
        check_device_options(parallel, gpus, gpus_per_trial, cpus, cpus_per_trial)
        plan = None
        if not worker_env:  # a worker runs its share of the parent's plan
            plan = plan_run(study_spec, url, name, trials, confirm_top, confirm_repeats)
        options = RunOptions(
            trials=trials if plan is None else plan.search,
            storage_url=storage,
            study_name=study,
            seed=seed,
            artifact_dir=artifact_dir,
            allow_workload_change=allow_workload_change,
            sampler=sampler,
            warm_start=warm_start,
        )
        confirm = partial(  # the confirmation after the search (quiet: `run` ends with a line)
            confirm_phase,
            study_spec,
            top=plan.top_k if plan else 0,
            rounds=plan.rounds if plan else 0,
            artifact_dir=artifact_dir,
            quiet=True,
        )
        if plan is not None:
            console.print(literal(plan.describe()))
        if parallel > 1:
            devices = DevicePlanSpec(
                gpus=gpus, gpus_per_trial=gpus_per_trial, cpus=cpus, cpus_per_trial=cpus_per_trial
            )
            code = 0
            if options.trials:
                code = run_parallel(spec, options, workers=parallel, plan=devices, say=render.say)
            if code == 0 and plan is not None and plan.confirms:
                confirm(url, name)
            render.print_report(url, name)
            if code == 0:
                say_verdict(load_study(url, name), plan)
            raise typer.Exit(code=code)
        view = render.LiveView(options.trials)
        with Live(view.render(), console=console, refresh_per_second=4, transient=False) as live:
            view.live = live
            summary = run_study(
                study_spec,
                options,
                on_phase=view.on_phase,
                on_trial=view.on_trial,
                extra_env=extra_env,
                on_notice=lambda line: console.print(f"[yellow]machine:[/] {literal(line)}"),
            )
        if plan is not None and plan.confirms and not summary.stopped_because:
            confirm(summary.storage_url, summary.study_name)
    except AutotuneError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        err.print(
            "[yellow]interrupted:[/] the current trial was stopped and recorded; "
            "run the same command again to resume."
        )
        raise typer.Exit(code=130) from None
    render.print_run_summary(summary)
    render.print_report(summary.storage_url, summary.study_name)
    if summary.stopped_because:
        raise typer.Exit(code=1)
    say_verdict(load_study(summary.storage_url, summary.study_name), plan)


def plan_run(
    spec: StudySpec,
    url: str,
    name: str,
    trials: int,
    confirm_top: int,
    confirm_repeats: int | None,
) -> BudgetPlan:
    """How ``--trials`` is spent (``study/budget.py``), counting the launches the study already
    made when it exists. Raises SpecError (``--confirm-repeats``) before anything is written."""
    done = launches_so_far(url, name)
    if len(spec.objective.metrics) != 1:
        plan = plan_budget(trials, done, 0, None)
        return dataclasses.replace(
            plan, no_confirm="no confirmation (a multi-objective study reports its Pareto front)"
        )
    return plan_budget(trials, done, confirm_top, confirm_repeats)


def launches_so_far(url: str, name: str) -> int:
    """Launches study ``name`` already made; 0 when it does not exist yet."""
    study = existing_study(url, name)
    return 0 if study is None else launches_made(study.get_trials(deepcopy=False))


def recorded_sampler(url: str, name: str) -> str | None:
    """The strategy study ``name`` was created with; None when it does not exist yet."""
    study = existing_study(url, name)
    return None if study is None else study.user_attrs.get(SAMPLER_ATTR)


def existing_study(url: str, name: str) -> optuna.Study | None:
    """Study ``name`` when it exists, else None (an SQLite file that is not there is not
    created by asking)."""
    database = sqlite_file(url)
    if database is not None and not database.is_file():
        return None
    try:
        return load_study(url, name)
    except SpecError:  # no such study yet
        return None


def say_verdict(study, plan: BudgetPlan | None) -> None:
    """The run's last line: the baseline's when nothing beat it; when the search found a better
    config but the budget held no confirmation, that no winner is confirmed, naming the best
    unconfirmed trial. That verdict is recorded on the study (``confirmation_skipped``), so that
    ``export`` writes the baseline, as the verdict says, and ``--allow-unconfirmed`` the best
    unconfirmed trial."""
    if baseline_reason(study) is not None or plan is None or plan.confirms:
        render.say_if_baseline_is_best(study)
        return
    if len(study.directions) != 1 or study.user_attrs.get(names.CONFIRMATION) is not None:
        return
    study.set_user_attr(names.CONFIRMATION_SKIPPED, plan.no_confirm or "no confirmation ran")
    best = best_trials(study)
    base = verified_baseline(study)
    if not best or base is None or best[0].number == base.number:
        return
    gain = ""
    if base.values and best[0].values and base.values[0]:
        ratio = best[0].values[0] / base.values[0] - 1
        gain = f", {names.sign(study.metric_names[0]) * ratio:+.1%} in its single measurement"
    console.print(
        f"[yellow]{literal(NO_CONFIRMED_WINNER)}[/] ({literal(plan.no_confirm or '')}); the best "
        f"unconfirmed config is trial {best[0].number}{gain}: `autotune confirm` measures it "
        "again, `autotune export --allow-unconfirmed` writes it"
    )


def confirm_phase(
    spec, url: str, name: str, *, top: int, rounds: int, artifact_dir=None, quiet=False
) -> None:
    """The confirmation phase (``analysis/confirm.py``); ``run`` is ``quiet`` (it says it at
    its end). An earlier run's "no confirmation fitted" no longer holds once one is planned."""
    earlier = load_study(url, name)
    if earlier.user_attrs.get(names.CONFIRMATION_SKIPPED):
        earlier.set_user_attr(names.CONFIRMATION_SKIPPED, None)
    done = confirm_study(
        spec,
        url,
        name,
        top_k=top,
        rounds=rounds,
        on_start=lambda: console.print(
            f"confirming the top {top} configs against the baseline (at most "
            f"{rounds * (top + 1)} launches in interleaved rounds, fewer once the ranking is "
            "settled)..."
        ),
        on_phase=lambda n, p: render.print_trial_phase(n, p) if p == "launching" else None,
        artifact_dir=artifact_dir,
    )
    if done is None and not quiet and len(spec.objective.metrics) == 1:
        console.print("[yellow]no verified correct config beyond the baseline to confirm[/]")
