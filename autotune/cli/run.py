"""``autotune run``: the search, then the confirmation of its best configs."""

from __future__ import annotations

import json
from functools import partial
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape

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
)
from autotune.errors import AutotuneError, SpecError
from autotune.search.strategy import check_name as check_sampler_name
from autotune.storage import artifact_dir_for, load_study
from autotune.study.loop import RunOptions, run_study
from autotune.study.parallel import DevicePlanSpec, check_device_options, run_parallel


def run(
    trials: Annotated[int, typer.Option("--trials", min=1, help="Trials to launch.")] = 50,
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
    worker_env: Annotated[
        str | None,
        typer.Option(
            "--worker-env", hidden=True, help="JSON env of one worker's device set (internal)."
        ),
    ] = None,
    confirm_top: Annotated[
        int,
        typer.Option(
            "--confirm-top",
            min=0,
            help="Re-measure the top K configs against the baseline before declaring the best "
            "(0: skip).",
        ),
    ] = 2,
    confirm_repeats: Annotated[int, typer.Option("--confirm-repeats", min=2)] = 2,
    allow_workload_change: Annotated[
        bool,
        typer.Option(
            "--allow-workload-change",
            help="Resume a study although its workload changed (recorded in the study).",
        ),
    ] = False,
) -> None:
    """Tune: run N trials of the study (resuming it if it exists), then confirm the best."""
    try:
        if sampler is not None:
            check_sampler_name(sampler)
        # Every name, URL and path is checked before anything is created.
        study_spec, url, name = open_spec(spec, study, storage, existing=False)
        artifact_dir_for(url, name, artifact_dir)
        try:
            extra_env = json.loads(worker_env) if worker_env else None
        except json.JSONDecodeError as exc:
            raise SpecError(f"not JSON: {exc}", key="--worker-env") from None
        check_device_options(parallel, gpus, gpus_per_trial, cpus, cpus_per_trial)
        options = RunOptions(
            trials=trials,
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
            top=confirm_top,
            repeats=confirm_repeats,
            artifact_dir=artifact_dir,
            quiet=True,
        )
        if parallel > 1:
            plan = DevicePlanSpec(
                gpus=gpus, gpus_per_trial=gpus_per_trial, cpus=cpus, cpus_per_trial=cpus_per_trial
            )
            code = run_parallel(spec, options, workers=parallel, plan=plan, say=render.say)
            if code == 0 and confirm_top:
                confirm(url, name)
            render.print_report(url, name)
            if code == 0:
                render.say_if_baseline_is_best(load_study(url, name))
            raise typer.Exit(code=code)
        view = render.LiveView(trials)
        with Live(view.render(), console=console, refresh_per_second=4, transient=False) as live:
            view.live = live
            summary = run_study(
                study_spec,
                options,
                on_phase=view.on_phase,
                on_trial=view.on_trial,
                extra_env=extra_env,
                on_notice=lambda line: console.print(f"[yellow]machine:[/] {escape(line)}"),
            )
        if confirm_top and not worker_env and not summary.stopped_because:
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
    render.say_if_baseline_is_best(load_study(summary.storage_url, summary.study_name))


def confirm_phase(
    spec, url: str, name: str, *, top: int, repeats: int, artifact_dir=None, quiet=False
) -> None:
    """The confirmation phase (``analysis/confirm.py``); ``run`` is ``quiet`` (it says it at
    its end)."""
    done = confirm_study(
        spec,
        url,
        name,
        top_k=top,
        repeats=repeats,
        on_start=lambda: console.print(
            f"confirming the top {top} configs against the baseline ({repeats} interleaved "
            "rounds)..."
        ),
        on_phase=lambda n, p: render.print_trial_phase(n, p) if p == "launching" else None,
        artifact_dir=artifact_dir,
    )
    if done is None and not quiet and len(spec.objective.metrics) == 1:
        console.print("[yellow]no verified correct config beyond the baseline to confirm[/]")
