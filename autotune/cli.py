"""The ``autotune`` command line: parse options, call one library function, render with rich.

Exit codes: 0 success, 1 a run ended without success, 2 bad input (spec, search space, CLI value,
storage URL), 3 preflight failed (engine missing, baseline broken), 130 interrupted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from autotune import names
from autotune.errors import AutotuneError, PreflightError, SpecError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Autonomous, correctness-gated tuner for LLM inference servers.",
)
# Wide tables when the output is a file or a pipe (CI logs, `| less`), not 80 columns.
console = Console(width=None if sys.stdout.isatty() else 180)
err = Console(stderr=True)

DEFAULT_SPEC = Path("studies/demo.yaml")
SpecOpt = Annotated[Path, typer.Option("--spec", help="Study spec YAML.")]
StudyOpt = Annotated[str | None, typer.Option("--study", help="Study name (default: the spec's).")]
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage", help="SQLAlchemy URL (default: SQLite studies/<study>.db beside the spec)."
    ),
]
ArtifactDirOpt = Annotated[
    str | None,
    typer.Option(
        "--artifact-dir",
        help="Where server logs and outputs are stored (default: <study>-artifacts beside the "
        "SQLite file).",
    ),
]


def _fail(exc: AutotuneError) -> typer.Exit:
    # One line, never wrapped (grep-able, copy-pastable), and the message is text, not markup:
    # a key such as ``constraints[0]`` must not be read as a rich tag.
    text = escape(str(exc))
    if isinstance(exc, SpecError):
        err.print(f"[bold red]error:[/] {text}", soft_wrap=True)
        return typer.Exit(code=2)
    if isinstance(exc, PreflightError):
        err.print(f"[bold red]preflight failed:[/] {text}", soft_wrap=True)
        return typer.Exit(code=3)
    err.print(f"[bold red]error:[/] {text}", soft_wrap=True)
    return typer.Exit(code=1)


def _load_spec(path: Path):
    from autotune.spec import load_spec

    return load_spec(path)


def _study_target(
    spec_path: Path, study: str | None, storage: str | None, *, existing: bool = True
) -> tuple[str, str]:
    """(storage URL, study name) from the options, falling back to the spec's defaults."""
    return _target(_load_spec(spec_path), study, storage, existing=existing)


def _target(spec, study: str | None, storage: str | None, *, existing: bool) -> tuple[str, str]:
    """(storage URL, study name), both checked before anything is written: the name (one
    rule for ``--study`` and the spec's ``study:``), the URL (in-memory SQLite refused, the
    directory there), and either that the SQLite file exists (``existing``: commands that read
    a study never create an empty database) or that a database server answers (``run``: a bad
    URL is refused before the artifact directory is made)."""
    from autotune.storage import check_reachable, check_study_name, resolve_url, sqlite_file
    from autotune.study import storage_url_for

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


def _require_study(url: str, name: str) -> None:
    """A command that works on an existing study must not create one under a mistyped name."""
    from autotune.storage import load_study

    load_study(url, name)


@app.command()
def run(
    trials: Annotated[int, typer.Option("--trials", min=1, help="Trials to launch.")] = 50,
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Sampler seed.")] = None,
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
    import json

    from autotune.study import RunOptions, run_study

    try:
        study_spec = _load_spec(spec)
        # Every name, URL and path is checked before anything is created.
        url, name = _target(study_spec, study, storage, existing=False)
        from autotune.storage import artifact_dir_for

        artifact_dir_for(url, name, artifact_dir)
        try:
            extra_env = json.loads(worker_env) if worker_env else None
        except json.JSONDecodeError as exc:
            raise SpecError(f"not JSON: {exc}", key="--worker-env") from None
        options = RunOptions(
            trials=trials,
            storage_url=storage,
            study_name=study,
            seed=seed,
            artifact_dir=artifact_dir,
            allow_workload_change=allow_workload_change,
        )
        if parallel > 1:
            from autotune.parallel import DevicePlanSpec, run_parallel

            plan = DevicePlanSpec(
                gpus=gpus, gpus_per_trial=gpus_per_trial, cpus=cpus, cpus_per_trial=cpus_per_trial
            )
            code = run_parallel(spec, options, workers=parallel, plan=plan, console=console)
            if code == 0 and confirm_top:
                _confirm(
                    study_spec,
                    url,
                    name,
                    confirm_top,
                    confirm_repeats,
                    artifact_dir=artifact_dir,
                    quiet=True,
                )
            _print_report(url, name)
            if code == 0:
                _say_if_baseline_is_best(url, name)
            raise typer.Exit(code=code)
        view = _LiveView(trials)
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
            _confirm(
                study_spec,
                summary.storage_url,
                summary.study_name,
                confirm_top,
                confirm_repeats,
                artifact_dir=artifact_dir,
                quiet=True,
            )
    except AutotuneError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        err.print(
            "[yellow]interrupted:[/] the current trial was stopped and recorded; "
            "run the same command again to resume."
        )
        raise typer.Exit(code=130) from None
    for line in summary.cleaned:
        console.print(f"[dim]cleanup:[/] {line}")
    if summary.stopped_because:
        err.print(f"[bold red]stopped:[/] {summary.stopped_because}")
    console.print(f"Study [bold]{summary.study_name}[/] in {summary.storage_url}")
    _print_report(summary.storage_url, summary.study_name)
    if summary.stopped_because:
        raise typer.Exit(code=1)
    _say_if_baseline_is_best(summary.storage_url, summary.study_name)


def _say_if_baseline_is_best(url: str, name: str) -> None:
    """One line when no configuration beat the baseline (what `export` will then write)."""
    from autotune.report import baseline_reason
    from autotune.storage import load_study

    loaded = load_study(url, name)
    reason = baseline_reason(loaded)
    if reason is not None:
        console.print(
            f"[yellow]no configuration beat the baseline[/] ({escape(reason)}); "
            "`autotune export` writes the baseline's config"
        )


def _confirm(
    study_spec,
    url: str,
    name: str,
    top: int,
    repeats: int,
    *,
    artifact_dir: str | None = None,
    quiet: bool = False,
) -> None:
    """The confirmation phase (see confirm.py); skipped for multi-objective studies."""
    from autotune.confirm import run_confirmation, top_candidates
    from autotune.storage import load_study

    if len(study_spec.objective.metrics) != 1:
        return
    loaded = load_study(url, name, heartbeat=True)
    if not top_candidates(study_spec, loaded, top):
        if not quiet:  # `run` says it once, at its end, with what export then writes
            console.print("[yellow]no verified correct config beyond the baseline to confirm[/]")
        return
    console.print(
        f"confirming the top {top} configs against the baseline ({repeats} interleaved rounds)..."
    )
    run_confirmation(
        study_spec,
        loaded,
        url,
        top_k=top,
        repeats=repeats,
        artifact_dir=artifact_dir,
        on_phase=lambda n, p: (
            console.print(f"[dim]trial {n}: {p}[/]") if p == "launching" else None
        ),
    )


def _print_confirmation(data: dict) -> None:
    table = Table(title=f"confirmation: {data['metric']}, {data['repeats']} interleaved rounds")
    for col in ("config", "samples", "median", "failures"):
        table.add_column(col)
    for c in data["candidates"]:
        style = (
            "bold green"
            if c["trial_number"] is not None and c["trial_number"] == data["winner"]
            else ""
        )
        table.add_row(
            c["label"],
            ", ".join(f"{x:.1f}" for x in c["samples"]),
            "" if c["median"] is None else f"{c['median']:.1f}",
            ", ".join(c["failures"]),
            style=style,
        )
    console.print(table)
    if data["winner"] is None:
        console.print("[red]no candidate passed every confirmation round[/]")
    elif data["gain"] is not None:
        low, high = data["gain_ci"]
        label = "winner" if data["gain"] > 0 else "no real gain; best candidate"
        console.print(
            f"{label}: trial {data['winner']}, {data['gain']:+.1%} over the baseline "
            f"(95% CI {low:+.1%} .. {high:+.1%})"
        )


class _LiveView:
    """Trial number, phase, elapsed time and best so far, refreshed while a run goes on."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.number: int | None = None
        self.phase = "starting"
        self.started = time.monotonic()
        self.trial_started = time.monotonic()
        self.done = 0
        self.best: str = "-"
        self.last: str = ""
        self.live: Live | None = None

    def render(self) -> Table:
        table = Table.grid(padding=(0, 2))
        trial = "-" if self.number is None else str(self.number)
        table.add_row(
            "[bold]trial[/]",
            trial,
            "[bold]phase[/]",
            self.phase,
            "[bold]elapsed[/]",
            f"{time.monotonic() - self.trial_started:5.1f} s",
            "[bold]done[/]",
            f"{self.done}/{self.total}",
        )
        table.add_row("[bold]best[/]", self.best, "[bold]last[/]", self.last, "", "", "", "")
        return table

    def refresh(self) -> None:
        if self.live is not None:
            self.live.update(self.render())

    def on_phase(self, number: int, phase: str) -> None:
        if number != self.number:
            self.trial_started = time.monotonic()
        self.number, self.phase = number, phase
        self.refresh()

    def on_trial(self, outcome, study) -> None:
        from autotune.report import best_trials

        if (
            outcome.verdict not in ("constraint_violated", "duplicate")
            and not outcome.infrastructure
        ):
            self.done += 1
        values = ", ".join(f"{v:.1f}" for v in outcome.values) if outcome.values else ""
        self.last = f"#{outcome.number} {outcome.verdict} {values}".strip()
        best = best_trials(study)
        if best:
            self.best = ", ".join(
                f"#{t.number} " + "/".join(f"{v:.1f}" for v in t.values) for t in best[:3]
            )
        self.phase = "done"
        self.refresh()
        console.print(f"trial {outcome.number} \\[{outcome.role}]: {outcome.verdict} {values}")
        if outcome.role == names.BASELINE and outcome.verdict == "correct":
            reference = study.user_attrs.get(names.REFERENCE) or {}
            for notice in _gate_notices(reference.get("capabilities")):
                console.print(f"[yellow]gate:[/] {notice}")


def _short(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _gate_notices(capabilities: dict | None) -> list[str]:
    from autotune.check import Capabilities

    return Capabilities.from_dict(capabilities).notices() if capabilities else []


def _print_report(storage_url: str, study_name: str, *, limit: int | None = None) -> None:
    from autotune.check import describe_checks
    from autotune.report import load_report

    report = load_report(storage_url, study_name)
    metric_cols = {
        "decode_tokens_per_s": "decode tok/s",
        "output_tokens_per_s": "out tok/s",
        "ttft_p95_ms": "TTFT p95 ms",
        "itl_p95_ms": "ITL p95 ms",
    }
    table = Table(title=f"study {report.name} ({', '.join(report.directions)})")
    objective = report.metric_names[0] if report.metric_names else None
    cols = ("#", "role", "verdict", "params", *metric_cols.values(), "±95% (n)", "start s")
    cols = (*cols, "reason")
    for col in cols:
        table.add_column(col, overflow="fold", ratio=4 if col in ("params", "reason") else None)
    rows = report.rows if limit is None else report.rows[-limit:]
    for row in rows:
        params = " ".join(f"{k}={_short(v)}" for k, v in row.params.items())
        style = (
            "bold green"
            if row.is_best
            else ("red" if row.verdict not in ("correct", "running", "waiting") else "")
        )
        table.add_row(
            f"{row.number}{' *' if row.is_best else ''}",
            row.role,
            row.verdict,
            params,
            *[f"{row.metrics[c]:.1f}" if c in row.metrics else "" for c in metric_cols],
            _interval_cell(row.ci.get(objective or ""), row.metrics.get(objective or "")),
            f"{row.startup_s:.1f}" if row.startup_s else "",
            row.detail[:80],
            style=style,
        )
    console.print(table)
    if report.failures_by_reason:
        console.print(
            "failures by reason: "
            + ", ".join(f"{k}: {v}" for k, v in report.failures_by_reason.items())
        )
        _print_failure_details(rows)
    from autotune.speculative import study_lines

    for line in study_lines(storage_url, study_name):  # speculative trials: acceptance
        console.print(f"speculative decoding: {escape(line)}", soft_wrap=True)
    from autotune.server_metrics import preemption_notes

    for note in preemption_notes(rows):
        console.print(f"[yellow]preemptions:[/] {escape(note)}")
    if report.reference:
        console.print(
            f"reference: {report.reference['prompts']} prompts, logprob tolerance "
            f"{report.reference['tolerance']:.4f} (baseline drift "
            f"{report.reference['drift_observed']:.4f})"
        )
        for notice in _gate_notices(report.reference.get("capabilities")):
            console.print(f"[yellow]gate:[/] {notice}")
    roofline = report.attrs.get("roofline")
    if roofline and report.best:
        best_row = next(r for r in report.rows if r.number == report.best[0])
        measured = best_row.metrics.get("decode_tokens_per_s")
        bound = roofline.get("tokens_per_s")
        if measured and bound:
            console.print(
                f"decode roofline: {bound:.1f} tok/s; best measured {measured:.1f} "
                f"tok/s = {measured / bound:.1%} of it"
            )
    if report.attrs.get(names.CONFIRMATION):
        _print_confirmation(report.attrs[names.CONFIRMATION])
    if report.attrs.get(names.ABLATION_REPORT):
        _print_ablation(report.attrs[names.ABLATION_REPORT])
    if report.best:
        console.print(f"best (verified correct): trial {', '.join(map(str, report.best))}")
        for number in report.best:
            checks = next(r.checks for r in report.rows if r.number == number)
            console.print(f"  trial {number} passed: {describe_checks(checks)}")
    else:
        console.print("no verified correct trial yet")


def _interval_cell(ci: list[float] | None, value: float | None) -> str:
    """The objective's 95% half-width relative to its value, and the rounds measured."""
    if not ci or not value:
        return ""
    low, high, n = ci
    return f"±{(high - low) / 2 / abs(value):.1%} ({int(n)})"


def _print_failure_details(rows) -> None:
    """Each failed trial's whole detail, root cause included (the table cuts it at 80)."""
    failed = [r for r in rows if r.detail and r.verdict not in ("correct", "running", "waiting")]
    if not failed:
        return
    console.print("failure details:")
    for row in failed:
        detail = row.detail if len(row.detail) <= 600 else row.detail[:597] + "..."
        console.print(
            f"  trial {row.number} {row.verdict}: {detail}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )


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
    from autotune.engines import build_engine
    from autotune.remote import check_url, run_command, study_reference

    try:
        study_spec = _load_spec(spec)
        check_url(url)
        reference = (
            study_reference(*_target(study_spec, study, storage, existing=True)) if check else None
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
        url, name = _study_target(spec, study, storage)
        _print_report(url, name)
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
    from autotune.export import export_best
    from autotune.storage import load_study

    try:
        study_spec = _load_spec(spec)
        url, name = _study_target(spec, study, storage)
        loaded = load_study(url, name)
        results = export_best(
            study_spec, loaded, output, pareto=pareto, require_confirmed=not allow_unconfirmed
        )
    except AutotuneError as exc:
        raise _fail(exc) from None
    for result in results:
        what = f"trial {result.trial_number}"
        if result.baseline_reason is not None:
            what = (
                f"the baseline (trial {result.trial_number}; no configuration beat it: "
                f"{escape(result.baseline_reason)})"
            )
        console.print(
            f"{what} -> {result.path}" + (f" (+ {result.env_path})" if result.env_path else "")
        )
        console.print("  launch: " + " ".join(result.command))


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
    from autotune.recheck import run_recheck

    try:
        result = run_recheck(
            best,
            spec_path=spec,
            storage=storage,
            rounds=rounds,
            min_effect=min_effect,
            on_phase=lambda n, p: console.print(f"[dim]trial {n}: {p}[/]"),
        )
    except AutotuneError as exc:
        raise _fail(exc) from None
    engines = f"engine {result.engine_version}"
    if result.recorded_engine_version and result.recorded_engine_version != result.engine_version:
        engines += f" (exported on {result.recorded_engine_version})"
    console.print(f"recheck of {best} on {engines}: study {result.study_name}")
    style = "green" if result.ok else "red"
    console.print(f"[{style}]{result.verdict.status}[/]: {escape(result.verdict.reason)}")
    if not result.ok:
        if result.guilty:
            console.print(f"guilty parameter: {', '.join(result.guilty)}")
        elif result.changes and result.verdict.status != "baseline_broken":
            console.print(
                "no single change is to blame (reverting any one alone does not fix it): "
                + ", ".join(result.changes)
            )
        raise typer.Exit(code=1)


@app.command()
def dashboard(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    port: Annotated[int, typer.Option("--port")] = 8080,
    artifact_dir: ArtifactDirOpt = None,
) -> None:
    """Open optuna-dashboard on the study's storage (with its artifacts)."""
    from autotune.storage import artifact_dir_for

    try:
        url, name = _study_target(spec, study, storage)
        artifacts = artifact_dir_for(url, name, artifact_dir)
    except AutotuneError as exc:
        raise _fail(exc) from None
    exe = shutil.which("optuna-dashboard") or str(Path(sys.executable).parent / "optuna-dashboard")
    argv = [
        exe,
        url,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--artifact-dir",
        str(artifacts),
    ]
    console.print(f"optuna-dashboard on http://127.0.0.1:{port} (study {name})")
    raise typer.Exit(code=subprocess.call(argv))


@app.command()
def validate(spec: Annotated[Path, typer.Argument(help="Study spec YAML.")]) -> None:
    """Check every parameter against the installed engine; exit 2 on any error."""
    from autotune.engines import build_engine

    try:
        study_spec = _load_spec(spec)
        issues = build_engine(study_spec).validate_space(study_spec.space)
    except AutotuneError as exc:
        raise _fail(exc) from None
    bad = 0
    for issue in issues:
        if issue.ok:
            console.print(f"[green]OK[/]    {issue.parameter}  ({issue.target})")
        else:
            bad += 1
            console.print(f"[red]ERROR[/] {issue.parameter}  ({issue.target}): {issue.error}")
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
        study_spec = _load_spec(spec)
        url, name = _study_target(spec, study, storage)
        from autotune.storage import artifact_dir_for

        artifact_dir_for(url, name, artifact_dir)
        _require_study(url, name)
        _confirm(study_spec, url, name, top, repeats, artifact_dir=artifact_dir)
        from autotune.report import load_report

        data = load_report(url, name).attrs.get(names.CONFIRMATION)
        if data:
            _print_confirmation(data)
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
    from autotune.ablation import run_ablation
    from autotune.storage import artifact_dir_for, load_study

    try:
        study_spec = _load_spec(spec)
        url, name = _study_target(spec, study, storage)
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
            on_phase=lambda n, p: console.print(f"[dim]trial {n}: {p}[/]"),
        )
        _print_ablation(report.to_dict())
        if output is not None:
            from autotune.export import export_values

            result = export_values(
                study_spec,
                report.minimal_values,
                output,
                title=f"minimal config from ablation of trial {report.trial_number}",
            )
            console.print(f"minimal config -> {result.path}")
    except AutotuneError as exc:
        raise _fail(exc) from None


def _print_ablation(report: dict) -> None:
    table = Table(
        title=f"ablation of trial {report['trial_number']}: {report['metric']} "
        f"(best median {report['best_median']:.1f}, noise band "
        f"±{report['noise_band']:.1f}, {report['repeats']} rounds)"
    )
    for col in ("change", "best", "reverted to", "delta", "range", "verdict"):
        table.add_column(col)
    for c in report["contributions"]:
        delta = "" if c["delta"] is None else f"{c['delta']:+.1f}"
        span = "" if c["delta_low"] is None else f"[{c['delta_low']:+.1f}, {c['delta_high']:+.1f}]"
        style = {"helps": "green", "needed for correctness": "yellow"}.get(c["verdict"], "dim")
        table.add_row(
            c["parameter"],
            str(c["best_value"]),
            str(c["reverted_to"]),
            delta,
            span,
            c["verdict"] + (f" ({c['detail']})" if c["detail"] else ""),
            style=style,
        )
    console.print(table)
    minimal = ", ".join(f"{k}={v}" for k, v in report["minimal_values"].items()) or "(baseline)"
    console.print(f"minimal config: {minimal}")
    if report["minimal_keeps_gain"] is not None:
        console.print(
            f"minimal config measured {report['minimal_median']:.1f}: "
            + (
                "keeps the gain"
                if report["minimal_keeps_gain"]
                else "does NOT keep the gain (interactions between changes)"
            )
        )


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
    from autotune.compare import study_ref
    from autotune.report_html import write_report

    try:
        if spec is None and study is not None and storage is not None:
            ref = study_ref(f"{study}@{storage}")
            url, name = ref.url, ref.name
        else:
            url, name = _study_target(spec or DEFAULT_SPEC, study, storage)
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
    from autotune.compare import run_compare_command

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
    from autotune.inspect import facts_as_rows, inspect_model
    from autotune.roofline import DecodeBytes, decode_roofline, roofline_rows

    try:
        facts = inspect_model(model)
        rows = facts_as_rows(facts)
        if device or bandwidth_gbs:
            try:
                roofline = decode_roofline(
                    DecodeBytes.from_facts(facts),
                    device=device,
                    bandwidth_gbs=bandwidth_gbs,
                    tp=tp,
                    context_tokens=context,
                )
            except (KeyError, ValueError) as exc:
                raise SpecError(str(exc).strip("'\""), key="--device") from None
            rows += [("", "")] + roofline_rows(roofline, measured or [])
    except AutotuneError as exc:
        raise _fail(exc) from None
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


@app.command()
def cleanup(
    spec: SpecOpt = DEFAULT_SPEC, study: StudyOpt = None, storage: StorageOpt = None
) -> None:
    """Stop servers left by killed runs and mark their trials interrupted (re-enqueued)."""
    from autotune.study import cleanup_stale, open_study

    try:
        study_spec = _load_spec(spec)
        url, name = _study_target(spec, study, storage)
        _require_study(url, name)
        loaded, _ = open_study(study_spec, url, study_name=name)
        messages = cleanup_stale(loaded)
    except AutotuneError as exc:
        raise _fail(exc) from None
    for line in messages or ["nothing to clean up"]:
        console.print(line)


def main() -> None:
    from autotune.study import quiet_optuna

    quiet_optuna()
    try:
        app()
    except AutotuneError as exc:  # pragma: no cover - commands map their own errors
        err.print(f"[bold red]error:[/] {exc}")
        sys.exit(2 if isinstance(exc, SpecError) else 1)


if __name__ == "__main__":
    main()
