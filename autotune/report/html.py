"""`autotune report`: one self-contained HTML page a person reads after a night's run.

Why a file and not a dashboard: optuna-dashboard is a live explorer of Optuna trials and knows
nothing of verdicts, references, confirmation or ablation; the morning-after questions are
autotune's own (what won, by how much and how sure, what failed and why, how far from the
hardware, what to deploy). The page answers them from the study alone, with everything inlined
(styles, plotly's JS once, the data), so it opens from disk, mails as an attachment, and makes
no network request when viewed.

What "best" means is ``report.best_trials`` / ``report.baseline_reason`` (never a bare
``study.best_trial``); the rows are ``report.report_of``'s; the checks a trial passed are
``check.describe_checks``'s words. This module only lays them out. Every section copes with a
study still running and with a study in which no trial was verified correct (it says so).

The page is split by job: this module assembles it and writes the tables and text sections;
:mod:`autotune.report.plots` draws the figures; :mod:`autotune.report.format` holds the shared
formatting (colours, escaping, the study's model/engine/objective names).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shlex
from collections import Counter
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from autotune import names
from autotune._files import write_text_atomically
from autotune.gate.reference import describe_checks
from autotune.names import split_level
from autotune.report.format import (
    OK_VERDICTS,
    colour,
    confirmation_ran,
    diff_table,
    doubts_html,
    engine_of,
    esc,
    machine_text,
    metric_html,
    model_of,
    row_of,
    timestamp,
    traps_html,
)
from autotune.report.plots import (
    Figures,
    ablation_section,
    importance_section,
    load_curves_section,
    pareto_section,
    progress_section,
    roofline_section,
)
from autotune.report.profile import section as step_time_section
from autotune.storage import load_study, safe_url
from autotune.study.results import (
    ReportSource,
    StudyReport,
    TrialRow,
    baseline_headline,
    baseline_reason,
    objective_names,
    report_of,
    request_troubles,
    snapshot,
    time_spent,
    verified_baseline,
)

__all__ = ["ReportSource", "build_report", "write_report"]


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;
background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:1.6em;margin:0 0 4px}h2{margin-top:0;font-size:1.25em}
section{background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:18px 20px;margin:16px 0}
table{border-collapse:collapse;font-size:.9em;margin:8px 0}
th,td{border-bottom:1px solid #e6e9ee;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f0f2f5}
tr.changed td{background:#fff6da}
.muted{color:#667085}.note{background:#f0f4ff;border-left:4px solid #5b7bd5;padding:8px 12px;
margin:8px 0}
.warn{background:#fff1f0;border-left:4px solid #d62728;padding:8px 12px;margin:8px 0}
.good{background:#eefaf1;border-left:4px solid #2e9d5b;padding:8px 12px;margin:8px 0}
.chip{display:inline-block;border-radius:10px;padding:1px 9px;margin:2px;color:#fff;
font-size:.85em}
pre{background:#14181f;color:#e6e6e6;padding:10px;border-radius:6px;overflow-x:auto;
max-height:380px;font-size:.82em;white-space:pre-wrap;word-break:break-word}
code{background:#eef0f3;padding:1px 4px;border-radius:4px}
details{border:1px solid #e0e3e8;border-radius:6px;margin:6px 0;padding:6px 10px}
details summary{cursor:pointer}
.evidence{margin-top:8px}
.sidebyside{display:grid;grid-template-columns:1fr 1fr;gap:10px}
.plot{min-height:360px}
"""


def write_report(
    storage_url: str, study_name: str, out: Path, *, spec_path: str | None = None
) -> Path:
    """Load the study, build the page and write it atomically to ``out``."""
    study = load_study(storage_url, study_name)  # a SpecError for an unknown study
    page = build_report(study, ReportSource(storage_url, spec_path))
    return write_text_atomically(out, page, option="--output")


def build_report(study: optuna.Study, source: ReportSource) -> str:
    """The whole page as one string."""
    trials = snapshot(study)  # one read for the whole page: a live study may add trials meanwhile
    report = report_of(study, trials=trials)
    report = dataclasses.replace(report, metric_names=objective_names(study, report, source))
    figures = Figures()
    sections = [
        _header(study, report, trials, source),
        _winner(study, report, trials, source),
        progress_section(study, report, trials, figures),
        importance_section(study, report, trials, figures),
        _failures(report, trials),
        _time_html(trials),
        load_curves_section(report, figures),
        pareto_section(study, report, trials, figures),
        ablation_section(report, figures),
        step_time_section(report.attrs, figures.html),
        roofline_section(report, figures),
        _all_trials(report, trials),
    ]
    body = "\n".join(s for s in sections if s)
    title = f"autotune report: {esc(report.name)}"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width,initial-scale=1'><title>{title}"
        f"</title><style>{_CSS}</style></head><body><main>\n{body}\n</main></body></html>\n"
    )


def _header(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], source: ReportSource
) -> str:
    counts = Counter(r.verdict for r in report.rows)
    chips = " ".join(
        f"<span class='chip' style='background:{colour(v)}'>{esc(v)}: {n}</span>"
        for v, n in counts.most_common()
    )
    servers = [t.user_attrs.get(names.SERVER) or {} for t in trials]
    hosts = sorted({s.get("hostname") for s in servers if s.get("hostname")})
    devices = sorted(
        {
            ", ".join(f"{k}={v}" for k, v in s["devices"].items())
            for s in servers
            if s.get("devices")
        }
    )
    roofline = report.attrs.get(names.ROOFLINE) or {}
    machine = report.attrs.get(names.MACHINE)
    if isinstance(machine, dict) and machine:
        hardware = machine_text(machine)
    else:  # a study from before the machine was recorded: what its trials say
        hardware = (
            f"host {', '.join(hosts)}" if hosts else "host unknown"
        ) + " (the machine's CPU, memory and GPUs were not recorded in this study)"
    if devices:
        hardware += f"; devices {'; '.join(devices)}"
    if roofline.get("device"):
        hardware += f"; roofline device {roofline['device']}"
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    running = counts.get("running", 0) + counts.get("waiting", 0)
    when = (
        f"{timestamp(min(starts))} to {timestamp(max(ends or starts))}"
        if starts
        else "no trial started"
    )
    state = (
        f"<div class='note'>This study is still running ({running} trial(s) running or "
        f"waiting): the page is a snapshot taken {timestamp(dt.datetime.now())}.</div>"
        if running
        else ""
    )
    objective = ", ".join(
        f"{m} ({d})" for m, d in zip(report.metric_names, report.directions, strict=False)
    )
    rows = [
        ("model", model_of(source.spec_path or report.attrs.get(names.SPEC_PATH))),
        ("engine", engine_of(trials, report, source)),
        ("objective", objective or ", ".join(report.directions)),
        ("hardware", hardware),
        ("dates", when),
        ("trials", f"{len(report.rows)} {chips}"),
        ("storage", esc(safe_url(source.storage_url))),
    ]
    table = "".join(
        f"<tr><th>{esc(k)}</th><td>{v if k == 'trials' else esc(v)}</td></tr>"
        if k != "storage"
        else f"<tr><th>{k}</th><td><code>{v}</code></td></tr>"
        for k, v in rows
    )
    return (
        f"<section id='header'><h1>autotune report: study {esc(report.name)}</h1>"
        f"<div class='muted'>generated {timestamp(dt.datetime.now())}</div>{state}"
        f"<table>{table}</table></section>"
    )


def _winner(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], source: ReportSource
) -> str:
    head = "<section id='winner'><h2>What won</h2>"
    if not report.best:
        finished = [r for r in report.rows if r.verdict not in ("running", "waiting")]
        return (
            f"{head}<div class='warn'><b>No trial was verified correct</b> (0 correct of "
            f"{len(finished)} finished): there is nothing to deploy. The failures below say "
            "why each one was rejected.</div></section>"
        )
    baseline = verified_baseline(study, trials=trials)
    base_params = dict((baseline.user_attrs.get(names.PARAMS_RESOLVED) or {}) if baseline else {})
    reason = baseline_reason(study, trials=trials)
    parts = [head]
    by_number = {t.number: t for t in trials}
    if reason is not None:
        headline = baseline_headline(reason)
        parts.append(
            f"<div class='note' id='baseline-stands'><b>{esc(headline[:1].upper() + headline[1:])}"
            "</b>. The baseline is the verified reference, and `export` writes it.</div>"
        )
    if len(report.best) > 1:
        parts.append(
            f"<p>{len(report.best)} configurations form the Pareto front (trials "
            f"{', '.join(map(str, report.best))}); see the Pareto section.</p>"
        )
    for number in report.best[:5]:
        row = row_of(report, number)
        parts.append(f"<h3>trial {number} ({esc(row.role)})</h3>")
        parts.append(diff_table(base_params, row.params, ("baseline", f"trial {number}")))
        shape = (
            by_number[number].user_attrs.get(names.STREAM_SHAPE) if number in by_number else None
        )
        parts.append(_metrics_line(report, row, baseline, shape))
        parts.append(traps_html(by_number.get(number)))
        parts.append(doubts_html(by_number.get(number)))
        parts.append(f"<p><b>checks passed</b>: {esc(describe_checks(row.checks))}</p>")
    parts.append(_confirmation_html(report.attrs.get(names.CONFIRMATION)))
    parts.append(_export_html(study, report, trials, source))
    parts.append("</section>")
    return "".join(parts)


def _metrics_line(
    report: StudyReport, row: TrialRow, baseline: FrozenTrial | None, shape: dict | None = None
) -> str:
    """The trial's measured figures; one never measured is left out, an ITL percentile that
    bursts made meaningless says so, and none is written as 0.0."""
    base_metrics = (baseline.user_attrs.get(names.METRICS) or {}) if baseline else {}
    shown = list(report.metric_names) or sorted(row.metrics)
    shown += [m for m in sorted(row.metrics) if m not in shown]
    if (shape or {}).get("itl") == "bursty":
        shown += [m for m in ("itl_p50_ms", "itl_p95_ms", "itl_p99_ms") if m not in shown]
    cells = []
    for name in shown:
        text = metric_html(row.metrics, name, shape)
        if not text:
            continue
        value, base = row.metrics.get(name), base_metrics.get(name)
        change = (
            f" ({value / base - 1:+.1%} vs baseline)"
            if isinstance(value, int | float) and base and row.role != "baseline"
            else ""
        )
        cells.append(f"<tr><td>{esc(name)}</td><td>{esc(text)}{change}</td></tr>")
    return f"<table><tr><th>metric</th><th>measured</th></tr>{''.join(cells)}</table>"


def _confirmation_html(data: dict | None) -> str:
    if not data:
        return (
            "<div class='note'>Not confirmed: the best single measurement may be the luckiest "
            "one. Run <code>autotune confirm</code> to re-measure the top configs against the "
            "baseline, interleaved.</div>"
        )
    rows = []
    for c in data["candidates"]:
        won = c["trial_number"] is not None and c["trial_number"] == data["winner"]
        median = "" if c["median"] is None else f"{c['median']:,.1f}"
        rows.append(
            f"<tr{' class=changed' if won else ''}><td>{esc(c['label'])}</td>"
            f"<td>{', '.join(f'{x:,.1f}' for x in c['samples'])}</td><td>{median}</td>"
            f"<td>{esc(', '.join(c['failures']))}</td></tr>"
        )
    table = (
        f"<table><tr><th>config</th><th>samples ({esc(data['metric'])})</th><th>median</th>"
        f"<th>failures</th></tr>{''.join(rows)}</table>"
    )
    if data.get("winner") is None:
        verdict = "<div class='warn'>No candidate passed every confirmation round.</div>"
    elif data.get("gain") is not None:
        low, high = data["gain_ci"]
        real = low > 0
        cls = "good" if real else "note"
        what = "a real gain" if real else "not distinguishable from the noise"
        verdict = (
            f"<div class='{cls}' id='confirmed-gain'><b>Confirmation of trial "
            f"{data['winner']}: {data['gain']:+.1%}</b> over the baseline (95% CI "
            f"{low:+.1%} .. {high:+.1%}, {data['repeats']} interleaved rounds): {what}.</div>"
        )
    else:
        verdict = ""
    if data.get("host_noise"):  # other work on the machine, not the configs, set the interval
        verdict += f"<div class='warn' id='host-noise'>{esc(data['host_noise'])}</div>"
    return f"<h3>Confirmation</h3>{verdict}{table}"


def _export_html(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], source: ReportSource
) -> str:
    spec = source.spec_path or report.attrs.get(names.SPEC_PATH) or "SPEC.yaml"
    words = ["autotune", "export", "--spec", spec]
    if source.spec_path is None:
        words += ["--study", report.name, "--storage", safe_url(source.storage_url)]
    words += ["-o", "best.yaml"]
    if len(report.best) > 1:
        words.append("--pareto")
    elif (
        report.attrs.get(names.CONFIRMATION) is None
        and baseline_reason(study, trials=trials) is None
    ):
        words.append("--allow-unconfirmed")
    return (
        "<h3>Deploy it</h3><pre id='export-command'>"
        f"{esc(' '.join(shlex.quote(w) for w in words))}</pre>"
        "<p class='muted'>writes the engine's own config file with the environment and the "
        "launch command in its header.</p>"
    )


def _failures(report: StudyReport, trials: list[FrozenTrial]) -> str:
    failed = [r for r in report.rows if r.verdict not in OK_VERDICTS]
    out = ["<section id='failures'><h2>What failed, and why</h2>"]
    requests = _request_troubles_html(trials)
    if not failed:
        if not any(t.failed for t in request_troubles(trials)):
            out.append("<p>No trial failed.</p>")
        out.append(f"{requests}</section>")
        return "".join(out)
    out.append(requests)
    by_number = {t.number: t for t in trials}
    for reason, count in report.failures_by_reason.items():
        out.append(
            f"<h3><span class='chip' style='background:{colour(reason)}'>{esc(reason)}</span> "
            f"{count} trial(s)</h3>"
        )
        for row in (r for r in failed if r.verdict == reason):
            trial = by_number[row.number]
            first_line = (row.detail.splitlines() or [""])[0][:160]
            out.append(
                f"<details class='failure' data-trial='{row.number}'><summary>trial "
                f"{row.number} ({esc(row.role)}): {esc(first_line) or '(no detail)'}</summary>"
                f"<div class='evidence'>{_evidence_html(row, trial)}</div></details>"
            )
    out.append("</section>")
    return "".join(out)


def _time_html(trials: list[FrozenTrial]) -> str:
    """Where the study's time went: each phase of the search's trials (startup with the parts
    its engine's log stated), and the confirmation's trials apart when one ran (no row of
    0.0 s when none did). Nothing for a study whose trials recorded no phases (made before
    they did)."""
    spent = time_spent(trials)
    if not spent.trials:
        return ""
    total = spent.total or 1.0
    rows = []
    confirmation = [("confirmation", spent.confirmation)] if confirmation_ran(trials) else []
    for phase, seconds in [*spent.phases.items(), *confirmation]:
        rows.append(
            f"<tr><td>{esc(phase)}</td><td>{seconds:.1f}</td><td>{seconds / total:.0%}</td></tr>"
        )
        if phase == "startup":
            rows += [
                f"<tr class='muted'><td>&nbsp;&nbsp;of it {esc(part)}</td>"
                f"<td>{value:.1f}</td><td>{value / total:.0%}</td></tr>"
                for part, value in spent.startup_parts.items()
            ]
    notes = [f"{spent.trials} trial(s) recorded their phases"]
    if spent.screened:
        notes.append(f"{spent.screened} screened after one round")
    if spent.unrecorded:
        notes.append(f"{spent.unrecorded} without a record")
    return (
        "<section id='time'><h2>Where the time went</h2><table><tr><th>phase</th>"
        "<th>seconds</th><th>share</th></tr>" + "".join(rows) + "</table>"
        f"<p class='muted'>{esc('; '.join(notes))}. Startup parts are what the engine's log "
        "states; a part it does not state is not shown.</p>"
        + (f"<p>{esc(spent.cache_line())}.</p>" if spent.cache_starts else "")
        + "</section>"
    )


def _request_troubles_html(trials: list[FrozenTrial]) -> str:
    """Requests that failed in trials that completed all the same (their benchmark stopped
    there: the page must not say "No trial failed" alone), and requests sent again on a new
    connection (not failures)."""
    troubles = request_troubles(trials)
    failed = [line for t in troubles if (line := t.failure_line())]
    retried = [line for t in troubles if (line := t.retry_line())]
    out = ""
    if failed:
        items = "".join(f"<li>{esc(line)}</li>" for line in failed)
        out += f"<h3>Failed requests</h3><ul id='failed-requests'>{items}</ul>"
    if retried:
        items = "".join(f"<li>{esc(line)}</li>" for line in retried)
        out += f"<h3>Requests sent again</h3><ul class='muted' id='resent-requests'>{items}</ul>"
    return out


def _evidence_html(row: TrialRow, trial: FrozenTrial) -> str:
    evidence = trial.user_attrs.get(names.EVIDENCE) or {}
    parts = [f"<p><b>detail</b>: {esc(row.detail) or '(none recorded)'}</p>"]
    params = ", ".join(f"{k}={v}" for k, v in row.params.items())
    parts.append(f"<p><b>config</b>: <code>{esc(params) or '(baseline)'}</code></p>")
    facts = [
        (k, evidence[k])
        for k in ("exit_code", "signal_name", "root_cause")
        if evidence.get(k) not in (None, "")
    ]
    if facts:
        parts.append(
            "<table>"
            + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
            + "</table>"
        )
    divergence = evidence.get("first_divergence")
    if divergence:
        token = ""
        if divergence.get("expected_token") is not None or divergence.get("got_token") is not None:
            token = (
                f"; expected token <code>{esc(repr(divergence.get('expected_token')))}</code>, got "
                f"<code>{esc(repr(divergence.get('got_token')))}</code>"
            )
        parts.append(
            f"<p class='divergence'><b>first divergence</b>: {esc(divergence.get('kind'))} "
            f"{esc(divergence.get('position'))} of prompt <code>{esc(divergence.get('prompt'))}"
            f"</code>{token} {esc(divergence.get('detail', ''))}</p>"
            "<div class='sidebyside'><div><b>expected (reference)</b>"
            f"<pre class='expected'>{esc(divergence.get('expected_text', ''))}</pre></div>"
            f"<div><b>got</b><pre class='got'>{esc(divergence.get('got_text', ''))}</pre></div>"
            "</div>"
        )
    if evidence.get("log_tail"):
        parts.append(
            f"<b>server log (tail)</b><pre class='log-tail'>{esc(evidence['log_tail'])}</pre>"
        )
    if len(parts) == 2:
        parts.append("<p class='muted'>No further evidence was recorded for this trial.</p>")
    return "".join(parts)


def _at_a_level(metric: str) -> bool:
    return split_level(metric)[1] is not None


def _all_trials(report: StudyReport, trials: list[FrozenTrial] | None = None) -> str:
    shown = list(report.metric_names)
    for row in report.rows:
        shown += [m for m in row.metrics if m not in shown and not _at_a_level(m)]
    shown = shown[:5]
    shapes = {t.number: t.user_attrs.get(names.STREAM_SHAPE) for t in trials or ()}
    head = "".join(f"<th>{esc(n)}</th>" for n in shown)
    rows = []
    for row in report.rows:
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        metrics = "".join(
            f"<td>{esc(metric_html(row.metrics, n, shapes.get(row.number)))}</td>" for n in shown
        )
        star = " *" if row.is_best else ""
        rows.append(
            f"<tr><td>{row.number}{star}</td><td>{esc(row.role)}</td><td><span class='chip' "
            f"style='background:{colour(row.verdict)}'>{esc(row.verdict)}</span></td>"
            f"<td><code>{esc(params)}</code></td>{metrics}</tr>"
        )
    return (
        "<section id='trials'><h2>Every trial</h2><table><tr><th>#</th><th>role</th>"
        f"<th>verdict</th><th>params</th>{head}</tr>{''.join(rows)}</table></section>"
    )
