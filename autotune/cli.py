"""The ``autotune`` command line: parse options, call one library function, render with rich.

Exit codes: 0 success, 1 a run ended without success, 2 bad input (spec, search space, CLI value,
storage URL), 3 preflight failed (engine missing, baseline broken), 130 interrupted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape

from autotune import names, render
from autotune.ablation import run_ablation
from autotune.cleanup import cleanup_stale
from autotune.cli_options import (
    DEFAULT_SPEC,
    ArtifactDirOpt,
    SeedOpt,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.compare import run_compare_command, study_ref
from autotune.confirm import confirm_study
from autotune.engines import build_engine
from autotune.errors import AutotuneError, PreflightError, SpecError
from autotune.export import export_best, export_values
from autotune.model.reader import facts_as_rows, inspect_model
from autotune.model.roofline import roofline_rows_for
from autotune.parallel import DevicePlanSpec, check_device_options, run_parallel
from autotune.profile import run_profiles
from autotune.recheck import run_recheck
from autotune.remote import check_url, run_command, study_reference
from autotune.report import load_report
from autotune.report_html import write_report
from autotune.spec import StudySpec, load_spec
from autotune.storage import artifact_dir_for, dashboard_command, load_study
from autotune.strategy import check_name as check_sampler_name
from autotune.study import RunOptions, open_study, quiet_optuna, run_study, study_target
from autotune.termination import stop_on_termination

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Autonomous, correctness-gated tuner for LLM inference servers.",
)
console, err = render.console, render.err


@app.callback()
def _quiet() -> None:
    # Optuna's per-trial INFO lines would drown the tables; set here, not at import.
    quiet_optuna()


def _fail(exc: AutotuneError) -> typer.Exit:
    """Bad input exits 2, a failed preflight 3, anything else 1 (see the module docstring)."""
    render.print_error(exc)
    return typer.Exit(
        code=2 if isinstance(exc, SpecError) else 3 if isinstance(exc, PreflightError) else 1
    )


def _open(
    spec_path: Path, study: str | None, storage: str | None, *, existing: bool = True
) -> tuple[StudySpec, str, str]:
    """The spec, the storage URL and the study name from the options (the spec's defaults
    otherwise), every one checked before anything is written (``study.study_target``)."""
    study_spec = load_spec(spec_path)
    return (study_spec, *study_target(study_spec, study, storage, existing=existing))


@app.command()
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
            help="Search strategy: auto (default: model-based, autotune/strategy.py), tpe, "
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
        study_spec, url, name = _open(spec, study, storage, existing=False)
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
            _confirm,
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
            code = run_parallel(spec, options, workers=parallel, plan=plan, console=console)
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
        raise _fail(exc) from None
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


def _confirm(
    spec, url: str, name: str, *, top: int, repeats: int, artifact_dir=None, quiet=False
) -> None:
    """The confirmation phase (confirm.py); ``run`` is ``quiet`` (it says it at its end)."""
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


@app.command()
def bench(
    url: Annotated[str, typer.Option("--url", help="A running OpenAI-compatible server.")],
    spec: SpecOpt = DEFAULT_SPEC,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="AUTOTUNE_API_KEY", help="Bearer key.")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Served model name.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the metrics.")] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Gate first, against the study's reference.")
    ] = False,
    study: StudyOpt = None,
    storage: StorageOpt = None,
) -> None:
    """Benchmark a server autotune did not start with the spec's client and workload."""
    try:
        study_spec = load_spec(spec)
        check_url(url)
        reference = (
            study_reference(*study_target(study_spec, study, storage, existing=True))
            if check
            else None
        )
        code = run_command(
            study_spec,
            url,
            api_key=api_key,
            model=model,
            json_path=json_path,
            reference=reference,
            metrics_map=build_engine(study_spec).server_metrics_map(),
            console=console,
        )
    except AutotuneError as exc:
        raise _fail(exc) from None
    raise typer.Exit(code=code)


@app.command()
def show(spec: SpecOpt = DEFAULT_SPEC, study: StudyOpt = None, storage: StorageOpt = None) -> None:
    """A table of trials: state, verdict, key params, metrics, reason; best marked with *."""
    try:
        _, url, name = _open(spec, study, storage)
        render.print_report(url, name)
    except AutotuneError as exc:
        raise _fail(exc) from None


@app.command()
def export(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="YAML file to write.")] = Path(
        "best.yaml"
    ),
    pareto: Annotated[
        bool, typer.Option("--pareto", help="Export the whole Pareto front.")
    ] = False,
    allow_unconfirmed: Annotated[
        bool,
        typer.Option(
            "--allow-unconfirmed",
            help="Export the best verified trial even if the confirmation phase has not run.",
        ),
    ] = False,
) -> None:
    """Write the best verified config as YAML for `vllm serve --config FILE`."""
    try:
        study_spec, url, name = _open(spec, study, storage)
        loaded = load_study(url, name)
        results = export_best(
            study_spec, loaded, output, pareto=pareto, require_confirmed=not allow_unconfirmed
        )
    except AutotuneError as exc:
        raise _fail(exc) from None
    render.print_exports(results)


@app.command()
def recheck(
    best: Annotated[Path, typer.Argument(help="A YAML written by `autotune export`.")],
    spec: Annotated[
        Path | None,
        typer.Option("--spec", help="Study spec (default: the one recorded at export)."),
    ] = None,
    storage: StorageOpt = None,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help="Interleaved rounds (2 launches each).")
    ] = 1,
    min_effect: Annotated[
        float,
        typer.Option("--min-effect", min=0.0, max=1.0, help="Noise band floor (default 10%)."),
    ] = 0.10,
) -> None:
    """After an upgrade: is the exported config still correct and not slower? Exit 0 if so,
    1 with the reason (and the guilty parameter) if not."""
    try:
        result = run_recheck(
            best,
            spec_path=spec,
            storage=storage,
            rounds=rounds,
            min_effect=min_effect,
            on_phase=render.print_trial_phase,
        )
    except AutotuneError as exc:
        raise _fail(exc) from None
    render.print_recheck(best, result)
    if not result.ok:
        raise typer.Exit(code=1)


@app.command()
def dashboard(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8080,
    artifact_dir: ArtifactDirOpt = None,
) -> None:
    """Open optuna-dashboard on the study's storage (with its artifacts)."""
    try:
        _, url, name = _open(spec, study, storage)
        artifacts = artifact_dir_for(url, name, artifact_dir)
    except AutotuneError as exc:
        raise _fail(exc) from None
    argv = dashboard_command(url, artifacts, port)
    console.print(f"optuna-dashboard on http://127.0.0.1:{port} (study {name})")
    raise typer.Exit(code=subprocess.call(argv))


@app.command()
def validate(spec: Annotated[Path, typer.Argument(help="Study spec YAML.")]) -> None:
    """Check every parameter against the installed engine; exit 2 on any error."""
    try:
        study_spec = load_spec(spec)
        issues = build_engine(study_spec).validate_space(study_spec.space)
    except AutotuneError as exc:
        raise _fail(exc) from None
    bad = render.print_validation(issues)
    if bad:
        err.print(f"{bad} of {len(issues)} parameters invalid in {study_spec.space.path}")
        raise typer.Exit(code=2)
    console.print(
        f"all {len(issues)} parameters valid against {study_spec.engine.kind} "
        f"{build_engine(study_spec).version()}"
    )


@app.command()
def confirm(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Candidates to re-measure.")] = 2,
    repeats: Annotated[int, typer.Option("--repeats", min=2)] = 3,
    artifact_dir: ArtifactDirOpt = None,
) -> None:
    """Re-measure the top configs interleaved with the baseline; declare the winner with its
    gain and a 95% confidence interval."""
    try:
        study_spec, url, name = _open(spec, study, storage)
        artifact_dir_for(url, name, artifact_dir)
        load_study(url, name)  # a mistyped --study is an error, never a new study
        _confirm(study_spec, url, name, top=top, repeats=repeats, artifact_dir=artifact_dir)
        data = load_report(url, name).attrs.get(names.CONFIRMATION)
        if data:
            render.print_confirmation(data)
    except AutotuneError as exc:
        raise _fail(exc) from None


@app.command()
def ablate(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    repeats: Annotated[int, typer.Option("--repeats", min=2, help="Rounds per variant.")] = 3,
    trial: Annotated[
        int | None, typer.Option("--trial", help="Trial to ablate (default: best).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Write the minimal config as YAML (like export)."),
    ] = None,
    min_effect: Annotated[
        float,
        typer.Option(
            "--min-effect",
            min=0.0,
            max=1.0,
            help="Smallest relative change counted as an effect (default 5%).",
        ),
    ] = 0.05,
    artifact_dir: ArtifactDirOpt = None,
) -> None:
    """Revert each change of the best config one at a time: what really helped?"""
    try:
        study_spec, url, name = _open(spec, study, storage)
        artifact_dir_for(url, name, artifact_dir)
        loaded = load_study(url, name, heartbeat=True)
        report = run_ablation(
            study_spec,
            loaded,
            url,
            repeats=repeats,
            trial_number=trial,
            min_effect=min_effect,
            artifact_dir=artifact_dir,
            on_phase=render.print_trial_phase,
        )
        render.print_ablation(report.to_dict())
        if output is not None:
            result = export_values(
                study_spec,
                report.minimal_values,
                output,
                title=f"minimal config from ablation of trial {report.trial_number}",
            )
            console.print(f"minimal config -> {result.path}")
    except AutotuneError as exc:
        raise _fail(exc) from None


@app.command()
def profile(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    trial: Annotated[
        list[int] | None,
        typer.Option("--trial", help="Trial to profile (repeatable; default: baseline and best)."),
    ] = None,
    tokens: Annotated[
        int, typer.Option("--tokens", min=8, help="Output tokens in the profiled decode window.")
    ] = 128,
    artifact_dir: ArtifactDirOpt = None,
) -> None:
    """Where the step time goes: launch configs with the engine's profiler, ms per token by
    category (baseline and best side by side), stored in the study."""
    try:
        study_spec, url, name = _open(spec, study, storage)
        directory = artifact_dir_for(url, name, artifact_dir)
        loaded = load_study(url, name, heartbeat=True)
        results = run_profiles(
            study_spec,
            loaded,
            directory,
            trials=trial or (),
            tokens=tokens,
            on_phase=render.print_trial_phase,
        )
    except AutotuneError as exc:
        raise _fail(exc) from None
    render.print_profile_run(results, chosen_by_default=not trial)


@app.command()
def report(
    spec: Annotated[Path | None, typer.Option("--spec", help="Study spec YAML.")] = None,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="HTML file to write.")] = Path(
        "report.html"
    ),
) -> None:
    """Write one self-contained HTML report of a study (opens from disk, no network)."""
    try:
        if spec is None and study is not None and storage is not None:
            ref = study_ref(f"{study}@{storage}")
            url, name = ref.url, ref.name
        else:
            _, url, name = _open(spec or DEFAULT_SPEC, study, storage)
        path = write_report(url, name, output, spec_path=str(spec) if spec else None)
    except AutotuneError as exc:
        raise _fail(exc) from None
    console.print(f"report of study {name} -> {path}")


@app.command()
def compare(
    a: Annotated[str, typer.Argument(help="A study (spec file or NAME@URL) or exported config.")],
    b: Annotated[str, typer.Argument(help="The other, of the same kind.")],
    spec: SpecOpt = DEFAULT_SPEC,
    storage: StorageOpt = None,
    repeats: Annotated[int, typer.Option("--repeats", min=2, help="Rounds per config.")] = 2,
) -> None:
    """Two studies or two exported configs side by side; configs are launched, interleaved,
    through the gate, and the answer says whether the difference is real."""
    try:
        code = run_compare_command(console, a, b, spec_path=spec, storage=storage, repeats=repeats)
    except AutotuneError as exc:
        raise _fail(exc) from None
    raise typer.Exit(code=code)


@app.command("inspect")
def inspect_cmd(
    model: Annotated[
        Path,
        typer.Argument(
            help="A GGUF file (any part of a split model) or a Hugging Face model folder."
        ),
    ],
    device: Annotated[
        str | None, typer.Option("--device", help="Device for the decode roofline, e.g. h200.")
    ] = None,
    bandwidth_gbs: Annotated[
        float | None,
        typer.Option("--bandwidth-gbs", help="Per-device memory bandwidth (overrides --device)."),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel degree.")] = 1,
    context: Annotated[int, typer.Option("--context", min=0, help="Tokens in the KV cache.")] = 0,
    measured: Annotated[
        list[float] | None,
        typer.Option("--measured", help="Measured decode tok/s to compare (repeatable)."),
    ] = None,
) -> None:
    """Model facts (architecture, attention, experts, quantization, fused projections) and,
    with --device or --bandwidth-gbs, the single-request decode roofline."""
    try:
        facts = inspect_model(model)
        rows = facts_as_rows(facts)
        if device or bandwidth_gbs:
            rows += [("", "")] + roofline_rows_for(
                facts,
                device=device,
                bandwidth_gbs=bandwidth_gbs,
                tp=tp,
                context_tokens=context,
                measured=measured or [],
            )
    except AutotuneError as exc:
        raise _fail(exc) from None
    render.print_key_values(rows)


@app.command()
def cleanup(
    spec: SpecOpt = DEFAULT_SPEC, study: StudyOpt = None, storage: StorageOpt = None
) -> None:
    """Stop servers left by killed runs and mark their trials interrupted (re-enqueued)."""
    try:
        study_spec, url, name = _open(spec, study, storage)
        load_study(url, name)  # a mistyped --study is an error, never a new study
        loaded, _ = open_study(study_spec, url, study_name=name)
        messages = cleanup_stale(loaded)
    except AutotuneError as exc:
        raise _fail(exc) from None
    for line in messages or ["nothing to clean up"]:
        console.print(line)


def main() -> None:
    stop_on_termination()
    try:
        app()
    except AutotuneError as exc:  # pragma: no cover - commands map their own errors
        err.print(f"[bold red]error:[/] {exc}")
        sys.exit(2 if isinstance(exc, SpecError) else 1)


if __name__ == "__main__":
    main()
