"""What the CLI prints: rich tables and one-line summaries of library results.

Nothing here decides or measures; each function takes a result (or a study to read) and
renders it, so each command module stays a thin layer of options -> one library call -> render.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from autotune import names
from autotune.analysis.profile import COVERAGE_BAND, sort_profiles, table_rows
from autotune.bench.tokens import suspect_line
from autotune.errors import PreflightError, one_line
from autotune.gate.reference import Capabilities, describe_checks
from autotune.report.format import model_of, time_lines
from autotune.server.metrics import preemption_notes
from autotune.storage import load_study, safe_url
from autotune.study.results import (
    NO_CONFIRMED_WINNER,
    NOT_MEASURED_ON,
    baseline_headline,
    baseline_reason,
    best_trials,
    report_of,
    request_troubles,
    snapshot,
)

#: verdicts that are no failure (a screened trial is correct, only clearly slower)
NOT_FAILED = ("correct", "running", "waiting", *NOT_MEASURED_ON)

# Wide tables when the output is a file or a pipe (CI logs, `| less`), not 80 columns. No
# emoji codes: a ":x:" in a log line or a parameter value is text, as its brackets are.
console = Console(width=None if sys.stdout.isatty() else 180, emoji=False)
err = Console(stderr=True, emoji=False)


def literal(value: object) -> str:
    """``value`` as rich markup that prints as it is, for a table cell or a line that styles
    its fixed parts: brackets escaped (a ``x[/]`` in a server's log raised a MarkupError, a
    ``[link=...]`` parameter value became a hyperlink, ``[rank0]:`` vanished) and control
    characters written as escapes (``errors.visible``: an ESC from the log reached the
    terminal raw, a bidi control reversed the text beside it)."""
    return escape(one_line(str(value)))


_SAY_STYLES = {"info": "", "notice": "yellow", "warning": "bold yellow", "error": "red"}


def say(level: str, text: str) -> None:
    """A library's ``say(level, text)`` callback (``study.parallel.Say``): a worker's own line
    as is, anything else in its level's colour."""
    if level == "line":
        console.print(one_line(text), markup=False, highlight=False)
        return
    style = _SAY_STYLES.get(level, "")
    console.print(f"[{style}]{literal(text)}[/]" if style else literal(text))


def print_confirmation(data: dict) -> None:
    table = Table(
        title=f"confirmation: {literal(data['metric'])}, {data['repeats']} interleaved rounds"
    )
    for col in ("config", "samples", "median", "failures"):
        table.add_column(col)
    for c in data["candidates"]:
        style = (
            "bold green"
            if c["trial_number"] is not None and c["trial_number"] == data["winner"]
            else ""
        )
        table.add_row(
            literal(c["label"]),
            ", ".join(f"{x:.1f}" for x in c["samples"]),
            "" if c["median"] is None else f"{c['median']:.1f}",
            literal(", ".join(c["failures"])),
            style=style,
        )
    console.print(table)
    if data["winner"] is None:
        console.print("[red]no candidate passed every confirmation round[/]")
    elif data["gain"] is not None:
        low, high = data["gain_ci"]
        # "winner" only when the interval excludes no change: a +33% whose interval spans
        # -57% .. +314% (the 12-trial demo on a loaded 2-core machine) is not a confirmed gain
        if low > 0:
            label = "winner (confirmed gain)"
        elif data["gain"] > 0:
            label = "no confirmed gain (the interval includes none); best median"
        else:
            label = "no real gain; best candidate"
        console.print(
            f"{label}: trial {data['winner']}, {data['gain']:+.1%} over the baseline "
            f"(95% CI {low:+.1%} .. {high:+.1%})"
        )
    if data.get("stopped_by"):
        dropped = data.get("eliminated") or ()
        console.print(
            f"the race stopped after {data['repeats']} rounds ({literal(data['stopped_by'])}): "
            f"{data.get('launches', 0)} of {data.get('planned_launches', 0)} planned launches"
            + (f"; dropped as clearly slower: {literal(', '.join(dropped))}" if dropped else "")
        )
    if data.get("host_noise"):
        console.print(f"[yellow]{literal(data['host_noise'])}[/]")


class LiveView:
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
            literal(self.phase),
            "[bold]elapsed[/]",
            f"{time.monotonic() - self.trial_started:5.1f} s",
            "[bold]done[/]",
            f"{self.done}/{self.total}",
        )
        table.add_row(
            "[bold]best[/]", self.best, "[bold]last[/]", literal(self.last), "", "", "", ""
        )
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
        role, verdict = literal(outcome.role), literal(outcome.verdict)
        console.print(f"trial {outcome.number} \\[{role}]: {verdict} {values}")
        if outcome.role == names.BASELINE and outcome.verdict == "correct":
            reference = study.user_attrs.get(names.REFERENCE) or {}
            for notice in gate_notices(reference.get("capabilities")):
                console.print(f"[yellow]gate:[/] {literal(notice)}")


def short(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def gate_notices(capabilities: dict | None) -> list[str]:
    return Capabilities.from_dict(capabilities).notices() if capabilities else []


def reference_line(reference: dict) -> str:
    """What the gate's reference compares. A tolerance and a baseline drift are shown only where
    logprobs were compared: for a reference of text or token strings alone no drift was
    measured, and a "drift 0.0000" would be a figure nobody measured."""
    capabilities = Capabilities.from_dict(reference.get("capabilities"))
    head = (
        f"reference: {reference['prompts']} prompts, compared by "
        f"{capabilities.comparison.replace('_', ' ')}"
    )
    if capabilities.compares_logprobs:
        return (
            f"{head}, logprob tolerance {reference['tolerance']:.4f} "
            f"(baseline drift {reference['drift_observed']:.4f})"
        )
    return f"{head}; no logprobs compared (the server gives none): no tolerance, no drift measured"


def print_report(
    storage_url: str, study_name: str, *, limit: int | None = None
) -> tuple[Any, list]:
    """Print a study's trials; returns the study and the one snapshot of its trials that was
    printed, so a caller adds to the same read instead of taking a second one."""
    study = load_study(storage_url, study_name)
    trials = snapshot(study)  # one read: a live study's new trial cannot make two disagree
    report = report_of(study, trials=trials)
    console.print(f"model: {literal(model_of(report.attrs.get(names.SPEC_PATH)))}")
    rows = report.rows if limit is None else report.rows[-limit:]
    console.print(trials_table(report, rows, trials))
    if report.failures_by_reason:
        console.print(
            "failures by reason: "
            + literal(", ".join(f"{k}: {v}" for k, v in report.failures_by_reason.items()))
        )
        print_failure_details(rows)
    # failed requests of trials that completed all the same, and requests sent again
    for trouble in request_troubles(trials):
        for line in trouble.lines():
            console.print(f"[yellow]requests:[/] {literal(line)}", soft_wrap=True)
    for line in noisy_host_lines(trials):
        console.print(f"[yellow]noisy host:[/] {literal(line)}", soft_wrap=True)
    for line in speculation_lines(trials):  # speculative trials: acceptance
        console.print(f"speculative decoding: {literal(line)}", soft_wrap=True)
    for line in measurement_lines(trials, report.best):
        console.print(f"[yellow]measurement:[/] {literal(line)}", soft_wrap=True)
    for note in preemption_notes(rows):
        console.print(f"[yellow]preemptions:[/] {literal(note)}")
    screened = [r for r in report.rows if r.verdict == names.SCREENED]
    if screened:
        console.print(
            f"screened after one round (clearly slower than the leader, not measured on): "
            f"trial {', '.join(str(r.number) for r in screened)}"
        )
    spent = time_lines(trials)
    if spent:
        console.print("where the time went:")
        for line in spent:
            console.print(f"  {literal(line)}", soft_wrap=True)
    if report.reference:
        console.print(literal(reference_line(report.reference)))
        for notice in gate_notices(report.reference.get("capabilities")):
            console.print(f"[yellow]gate:[/] {literal(notice)}")
    roofline = report.attrs.get(names.ROOFLINE)
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
        print_confirmation(report.attrs[names.CONFIRMATION])
    if report.attrs.get(names.ABLATION_REPORT):
        print_ablation(report.attrs[names.ABLATION_REPORT])
    if report.attrs.get(names.PROFILES):
        print_profiles(sort_profiles(report.attrs[names.PROFILES]))
    if report.best:
        console.print(f"best (verified correct): trial {', '.join(map(str, report.best))}")
        for number in report.best:
            checks = next(r.checks for r in report.rows if r.number == number)
            console.print(f"  trial {number} passed: {literal(describe_checks(checks))}")
    else:
        console.print("no verified correct trial yet")
    return study, trials


#: the metrics ``show``'s table has a column for, and the column's heading
METRIC_COLUMNS = {
    "single_tokens_per_s": "tok/s (1 req)",
    "decode_tokens_per_s": "decode tok/s",
    "output_tokens_per_s": "out tok/s",
    "ttft_p95_ms": "TTFT p95 ms",
    "itl_p95_ms": "ITL p95 ms",
}


def trials_table(report, rows, trials: list) -> Table:
    """``show``'s table of ``rows``: a failed trial in red, the best in bold green. Each cell
    from the study (role, verdict, parameter values, the reason from a server's log) is
    :func:`literal`: its brackets and escapes are text, the row's style the only markup."""
    shapes = {t.number: t.user_attrs.get(names.STREAM_SHAPE) or {} for t in trials}
    table = Table(title=f"study {literal(report.name)} ({', '.join(report.directions)})")
    objective = report.metric_names[0] if report.metric_names else ""
    cols = ("#", "role", "verdict", "params", *METRIC_COLUMNS.values(), "±95% (n)", "start s")
    for col in (*cols, "reason"):
        table.add_column(col, overflow="fold", ratio=4 if col in ("params", "reason") else None)
    for row in rows:
        params = " ".join(f"{k}={short(v)}" for k, v in row.params.items())
        style = "bold green" if row.is_best else ("red" if row.verdict not in NOT_FAILED else "")
        table.add_row(
            f"{row.number}{' *' if row.is_best else ''}",
            literal(row.role),
            literal(row.verdict),
            literal(params),
            *[metric_cell(row.metrics, c, shapes.get(row.number) or {}) for c in METRIC_COLUMNS],
            interval_cell(row.ci.get(objective), row.metrics.get(objective)),
            f"{row.startup_s:.1f}" if row.startup_s else "",
            literal(row.detail[:80]),
            style=style,
        )
    return table


def metric_cell(metrics: Mapping[str, float], name: str, shape: Mapping[str, Any]) -> str:
    """A metric's cell: its value, "bursty" for an ITL figure bursts made meaningless (never
    0.0), empty when never measured."""
    if name in metrics:
        return f"{metrics[name]:.1f}"
    if name.startswith("itl_") and shape.get("itl") == "bursty":
        return "bursty"
    return ""


def measurement_lines(trials: Iterable[Any], best: Iterable[int] = ()) -> list[str]:
    """What ``show`` says about how trials were measured: a count the server's figures
    disagree with (``measurement_suspect``), answers that arrived in bursts, and the best
    trial's single-request headline (tokens / end-to-end time, TTFT and TPOT beside it)."""
    lines = []
    best = set(best)
    for trial in trials:
        suspect = trial.user_attrs.get(names.MEASUREMENT_SUSPECT)
        if suspect:
            lines.append(f"trial {trial.number}: {suspect_line(suspect)}")
        for trap in (trial.user_attrs.get(names.TRAPS) or {}).get("flagged") or ():
            lines.append(f"trial {trial.number}: {trap}")  # bench/traps.py: warm cache, ...
        shape = trial.user_attrs.get(names.STREAM_SHAPE) or {}
        if shape.get("bursty"):
            lines.append(
                f"trial {trial.number}: {shape['bursty']} of {shape.get('responses')} answers "
                "arrived in bursts: ITL percentiles not measurable (bursty); decode tok/s is "
                "tokens / end-to-end time for those answers"
            )
        single = shape.get("single") or {}
        if trial.number in best and single.get("tokens_per_s") is not None:
            beside = [
                f"{label} {single[key]:.1f} ms"
                for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"))
                if single.get(key) is not None
            ]
            per_chunk = shape.get("tokens_per_chunk")
            if per_chunk is not None:
                beside.append(f"{per_chunk:.2g} tokens per chunk")
            lines.append(
                f"trial {trial.number}: single request {single['tokens_per_s']:.1f} tok/s "
                f"end to end ({', '.join(beside) or 'no TTFT/TPOT measured'})"
            )
    return lines


def interval_cell(ci: list[float] | None, value: float | None) -> str:
    """The objective's 95% half-width relative to its value, and the rounds measured."""
    if not ci or not value:
        return ""
    low, high, n = ci
    return f"±{(high - low) / 2 / abs(value):.1%} ({int(n)})"


def print_failure_details(rows) -> None:
    """Each failed trial's whole detail, root cause included (the table cuts it at 80), its
    control characters escaped: the root cause is a line of the server's log, ESCs kept."""
    failed = [r for r in rows if r.detail and r.verdict not in NOT_FAILED]
    if not failed:
        return
    console.print("failure details:")
    for row in failed:
        detail = row.detail if len(row.detail) <= 600 else row.detail[:597] + "..."
        console.print(
            one_line(f"  trial {row.number} {row.verdict}: {detail}"),
            soft_wrap=True,
            markup=False,
            highlight=False,
        )


def print_ablation(report: dict) -> None:
    table = Table(
        title=f"ablation of trial {report['trial_number']}: {literal(report['metric'])} "
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
            literal(c["parameter"]),
            literal(c["best_value"]),
            literal(c["reverted_to"]),
            delta,
            literal(span),
            literal(c["verdict"] + (f" ({c['detail']})" if c["detail"] else "")),
            style=style,
        )
    console.print(table)
    minimal = ", ".join(f"{k}={v}" for k, v in report["minimal_values"].items()) or "(baseline)"
    console.print(f"minimal config: {literal(minimal)}")
    if report["minimal_keeps_gain"] is not None:
        console.print(
            f"minimal config measured {report['minimal_median']:.1f}: "
            + (
                "keeps the gain"
                if report["minimal_keeps_gain"]
                else "does NOT keep the gain (interactions between changes)"
            )
        )


def print_error(exc: Exception) -> None:
    """One line, never wrapped (grep-able, copy-pastable), and the message is text, not markup:
    a key such as ``constraints[0]`` must not be read as a rich tag."""
    label = "preflight failed" if isinstance(exc, PreflightError) else "error"
    err.print(f"[bold red]{label}:[/] {literal(str(exc))}", soft_wrap=True)


def say_if_baseline_is_best(study, *, trials: list | None = None) -> None:
    """One line when no configuration beat the baseline (what `export` will then write)."""
    reason = baseline_reason(study, trials=trials)
    if reason is not None:
        console.print(
            f"[yellow]{literal(baseline_headline(reason))}[/]; "
            "`autotune export` writes the baseline's config"
        )


def print_run_summary(summary) -> None:
    """After ``run``: what cleanup did, why the run stopped (if it did), where the study is."""
    for line in summary.cleaned:
        console.print(f"[dim]cleanup:[/] {literal(line)}")
    if summary.stopped_because:
        err.print(f"[bold red]stopped:[/] {literal(summary.stopped_because)}")
    url = summary.storage_url  # a server's URL may hold a password, a file's never does
    where = literal(url if url.startswith("sqlite") else safe_url(url))
    console.print(f"Study [bold]{literal(summary.study_name)}[/] in {where}")


def print_exports(results) -> None:
    for result in results:
        what = f"trial {result.trial_number}"
        if result.baseline_reason is not None:
            why = result.baseline_reason
            if not why.startswith(NO_CONFIRMED_WINNER):
                why = f"no configuration beat it: {why}"
            what = f"the baseline (trial {result.trial_number}; {literal(why)})"
        elif getattr(result, "not_confirmed", None) is not None:
            what += f" [yellow](NOT a confirmed gain: {literal(result.not_confirmed)})[/]"
        env = f" (+ {literal(result.env_path)})" if result.env_path else ""
        console.print(f"{what} -> {literal(result.path)}{env}")
        console.print("  launch: " + literal(" ".join(result.command)))


def print_recheck(best, result) -> None:
    engines = f"engine {result.engine_version}"
    if result.recorded_engine_version and result.recorded_engine_version != result.engine_version:
        engines += f" (exported on {result.recorded_engine_version})"
    console.print(
        f"recheck of {literal(best)} on {literal(engines)}: study {literal(result.study_name)}"
    )
    style = "green" if result.ok else "red"
    console.print(f"[{style}]{literal(result.verdict.status)}[/]: {literal(result.verdict.reason)}")
    if not result.ok:
        if result.guilty:
            console.print(f"guilty parameter: {literal(', '.join(result.guilty))}")
        elif result.changes and result.verdict.status != "baseline_broken":
            console.print(
                "no single change is to blame (reverting any one alone does not fix it): "
                + literal(", ".join(result.changes))
            )


def print_validation(issues) -> int:
    """One line per parameter (an unchecked one says why); returns how many are invalid. The
    texts are the engine's own (``[on|off|auto]``, a path in brackets): printed, never read as
    markup."""
    bad = 0
    for issue in issues:
        where = f"{literal(issue.parameter)}  ({literal(issue.target)})"
        if not issue.ok:
            bad += 1
            console.print(f"[red]ERROR[/] {where}: {literal(issue.error)}")
        elif issue.unchecked:
            console.print(f"[yellow]NOT CHECKED[/] {where}: {literal(issue.unchecked)}")
        else:
            console.print(f"[green]OK[/]    {where}")
    return bad


def print_key_values(rows) -> None:
    """Two columns, no header (``autotune inspect``); a model's own names are text."""
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(literal(key), literal(value))
    console.print(table)


def print_trial_phase(number: int, phase: str) -> None:
    console.print(f"[dim]trial {number}: {literal(phase)}[/]")


def print_profile_run(results, *, chosen_by_default: bool) -> None:
    """``autotune profile``'s output: the table, then where each trace was written."""
    print_profiles([r.to_dict() for r in results])
    if chosen_by_default and len(results) == 1:
        console.print("the best correct trial is the baseline itself: one profile")
    for r in results:
        console.print(f"[dim]trial {r.trial} traces: {literal(', '.join(r.trace_files))}[/]")


def print_profiles(profiles: list[dict]) -> None:
    header, rows = table_rows(profiles)
    table = Table(title="Where the step time goes (ms per output token, decode)")
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*map(literal, row))
    console.print(table)
    low, high = COVERAGE_BAND
    for p in profiles:
        if not p["consistent"]:
            console.print(
                f"[yellow]trial {p['trial']}: the trace accounts for {p['coverage']:.0%} of the "
                f"time the client measured per token (outside {low:.0%}-{high:.0%}): read its "
                "categories with care[/]"
            )
        ratio = p["profiled_ms_per_token"] / max(p["unprofiled_ms_per_token"], 1e-9)
        if ratio > 1.2:
            console.print(
                f"[yellow]trial {p['trial']}: profiling slowed decode {ratio:.1f}x; shares are "
                "of the profiled step[/]"
            )


def describe_speculation(stats: Mapping[str, Any] | None) -> str:
    """One line for ``autotune show``: ``acceptance 62.0% (310/500 draft tokens), mean
    accepted length 2.24``."""
    if not stats:
        return ""
    if stats.get("error"):
        return f"acceptance unknown: {stats['error']}"
    rate, length = stats.get("acceptance_rate"), stats.get("mean_accepted_length")
    if rate is None:
        return "no drafts proposed"
    return (
        f"acceptance {rate:.1%} ({stats['accepted_tokens']:.0f}/{stats['draft_tokens']:.0f} "
        f"draft tokens, {stats['drafts']:.0f} drafts), mean accepted length {length:.2f}"
    )


def speculation_lines(trials: Iterable[Any]) -> list[str]:
    """``trial N (verdict): <describe>`` for every trial that speculated."""
    lines = []
    for trial in trials:
        stats = trial.user_attrs.get(names.SPECULATIVE)
        if not stats:
            continue
        config = stats.get("config") or {}
        shown = ",".join(f"{k}={v}" for k, v in config.items())
        verdict = trial.user_attrs.get(names.FAIL_REASON) or (
            "correct" if trial.user_attrs.get(names.CORRECT) else trial.state.name.lower()
        )
        lines.append(f"trial {trial.number} ({verdict}; {shown}): {describe_speculation(stats)}")
    return lines


def study_speculation_lines(storage_url: str, study_name: str) -> list[str]:
    """:func:`speculation_lines` for a stored study (``autotune show``)."""
    study = load_study(storage_url, study_name)
    return speculation_lines(study.get_trials(deepcopy=False))


def noisy_host_lines(trials: Iterable[Any]) -> list[str]:
    """``trial N: <reasons>`` for every trial measured while other work took the machine
    (user attr ``host``, bench/host.py): its figures say as much about the host as the config."""
    lines = []
    for trial in trials:
        host = trial.user_attrs.get(names.HOST) or {}
        if host.get("noisy"):
            reasons = "; ".join(host.get("reasons") or ()) or "no reason recorded"
            lines.append(f"trial {trial.number}: {reasons}")
    return lines
