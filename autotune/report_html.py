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
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
import math
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune import names
from autotune.check import describe_checks
from autotune.report import (
    StudyReport,
    TrialRow,
    baseline_reason,
    best_trials,
    is_verified_feasible,
    report_of,
    verified_baseline,
)
from autotune.report_profile import section as step_time_section
from autotune.storage import load_study

#: one colour per verdict, shared by every plot and the tables (failure reasons not listed
#: here get the fallback)
VERDICT_COLOURS = {
    "correct": "#2e9d5b",
    "incorrect": "#d62728",
    "oom": "#9467bd",
    "server_crashed": "#8c564b",
    "startup_failed": "#e377c2",
    "startup_timeout": "#bcbd22",
    "hang": "#ff7f0e",
    "request_errors": "#17becf",
    "invalid_config": "#7f7f7f",
    "constraint_violated": "#c7c7c7",
    "running": "#1f77b4",
    "waiting": "#aec7e8",
}
_OTHER_COLOUR = "#555555"
_OK = ("correct", "running", "waiting")

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


@dataclass(frozen=True)
class ReportSource:
    """Where the study lives, to write the commands a reader can paste (password hidden)."""

    storage_url: str
    spec_path: str | None = None


def write_report(
    storage_url: str, study_name: str, out: Path, *, spec_path: str | None = None
) -> Path:
    """Load the study, build the page and write it atomically to ``out``."""
    study = load_study(storage_url, study_name)  # a SpecError for an unknown study
    page = build_report(study, ReportSource(storage_url, spec_path))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out


def build_report(study: optuna.Study, source: ReportSource) -> str:
    """The whole page as one string."""
    report = report_of(study)
    report = dataclasses.replace(report, metric_names=_objective_names(study, report, source))
    trials = study.get_trials(deepcopy=False)
    figures = _Figures()
    sections = [
        _header(study, report, trials, source),
        _winner(study, report, trials, source),
        _progress(study, report, trials, figures),
        _importance(study, report, trials, figures),
        _failures(report, trials),
        _load_curves(report, figures),
        _pareto(study, report, trials, figures),
        _ablation(report, figures),
        step_time_section(report.attrs, figures.html),
        _roofline(report, figures),
        _all_trials(report),
    ]
    body = "\n".join(s for s in sections if s)
    title = f"autotune report: {_e(report.name)}"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width,initial-scale=1'><title>{title}"
        f"</title><style>{_CSS}</style></head><body><main>\n{body}\n</main></body></html>\n"
    )


# --- figures ------------------------------------------------------------------------------


class _Figures:
    """Plotly figures as HTML fragments; plotly.js is inlined in the first one only."""

    def __init__(self) -> None:
        self.count = 0

    def html(self, fig: Any, name: str, *, height: int = 380) -> str:
        fig.update_layout(
            template="plotly_white", height=height, margin={"l": 60, "r": 20, "t": 70, "b": 50}
        )
        fragment = fig.to_html(
            full_html=False,
            include_plotlyjs=self.count == 0,  # True inlines the bundle: no CDN, no network
            include_mathjax=False,
            div_id=f"plot-{name}",
            config={"displaylogo": False, "responsive": True},
        )
        self.count += 1
        return f"<div class='plot' data-plot='{_e(name)}'>{fragment}</div>"


def _go():
    import plotly.graph_objects as go

    return go


# --- sections -----------------------------------------------------------------------------


def _header(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], source: ReportSource
) -> str:
    counts = Counter(r.verdict for r in report.rows)
    chips = " ".join(
        f"<span class='chip' style='background:{_colour(v)}'>{_e(v)}: {n}</span>"
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
    hardware = ", ".join(hosts) or "unknown"
    if devices:
        hardware += f"; devices {'; '.join(devices)}"
    if roofline.get("device"):
        hardware += f"; roofline device {roofline['device']}"
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    running = counts.get("running", 0) + counts.get("waiting", 0)
    when = f"{_when(min(starts))} to {_when(max(ends or starts))}" if starts else "no trial started"
    state = (
        f"<div class='note'>This study is still running ({running} trial(s) running or "
        f"waiting): the page is a snapshot taken {_when(dt.datetime.now())}.</div>"
        if running
        else ""
    )
    objective = ", ".join(
        f"{m} ({d})" for m, d in zip(report.metric_names, report.directions, strict=False)
    )
    rows = [
        ("model", _model_of(trials, source)),
        ("engine", _engine_of(trials, report, source)),
        ("objective", objective or ", ".join(report.directions)),
        ("hardware", hardware),
        ("dates", when),
        ("trials", f"{len(report.rows)} {chips}"),
        ("storage", _e(_safe_url(source.storage_url))),
    ]
    table = "".join(
        f"<tr><th>{_e(k)}</th><td>{v if k == 'trials' else _e(v)}</td></tr>"
        if k != "storage"
        else f"<tr><th>{k}</th><td><code>{v}</code></td></tr>"
        for k, v in rows
    )
    return (
        f"<section id='header'><h1>autotune report: study {_e(report.name)}</h1>"
        f"<div class='muted'>generated {_when(dt.datetime.now())}</div>{state}"
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
    baseline = verified_baseline(study)
    base_params = dict((baseline.user_attrs.get(names.PARAMS_RESOLVED) or {}) if baseline else {})
    reason = baseline_reason(study)
    parts = [head]
    if reason is not None:
        parts.append(
            f"<div class='note'><b>No configuration beat the baseline</b>: {_e(reason)}. "
            "The baseline is the verified reference, and `export` writes it.</div>"
        )
    if len(report.best) > 1:
        parts.append(
            f"<p>{len(report.best)} configurations form the Pareto front (trials "
            f"{', '.join(map(str, report.best))}); see the Pareto section.</p>"
        )
    for number in report.best[:5]:
        row = _row(report, number)
        parts.append(f"<h3>trial {number} ({_e(row.role)})</h3>")
        parts.append(_diff_table(base_params, row.params, ("baseline", f"trial {number}")))
        parts.append(_metrics_line(report, row, baseline))
        parts.append(f"<p><b>checks passed</b>: {_e(describe_checks(row.checks))}</p>")
    parts.append(_confirmation_html(report.attrs.get(names.CONFIRMATION)))
    parts.append(_export_html(study, report, source))
    parts.append("</section>")
    return "".join(parts)


def _metrics_line(report: StudyReport, row: TrialRow, baseline: FrozenTrial | None) -> str:
    base_metrics = (baseline.user_attrs.get(names.METRICS) or {}) if baseline else {}
    shown = list(report.metric_names) or sorted(row.metrics)
    shown += [m for m in sorted(row.metrics) if m not in shown]
    cells = []
    for name in shown:
        if name not in row.metrics:
            continue
        value = row.metrics[name]
        base = base_metrics.get(name)
        change = (
            f" ({value / base - 1:+.1%} vs baseline)" if base and row.role != "baseline" else ""
        )
        cells.append(f"<tr><td>{_e(name)}</td><td>{value:,.1f}{change}</td></tr>")
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
            f"<tr{' class=changed' if won else ''}><td>{_e(c['label'])}</td>"
            f"<td>{', '.join(f'{x:,.1f}' for x in c['samples'])}</td><td>{median}</td>"
            f"<td>{_e(', '.join(c['failures']))}</td></tr>"
        )
    table = (
        f"<table><tr><th>config</th><th>samples ({_e(data['metric'])})</th><th>median</th>"
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
    return f"<h3>Confirmation</h3>{verdict}{table}"


def _export_html(study: optuna.Study, report: StudyReport, source: ReportSource) -> str:
    spec = source.spec_path or report.attrs.get(names.SPEC_PATH) or "SPEC.yaml"
    words = ["autotune", "export", "--spec", spec]
    if source.spec_path is None:
        words += ["--study", report.name, "--storage", _safe_url(source.storage_url)]
    words += ["-o", "best.yaml"]
    if len(report.best) > 1:
        words.append("--pareto")
    elif report.attrs.get(names.CONFIRMATION) is None and baseline_reason(study) is None:
        words.append("--allow-unconfirmed")
    import shlex

    return (
        "<h3>Deploy it</h3><pre id='export-command'>"
        f"{_e(' '.join(shlex.quote(w) for w in words))}</pre>"
        "<p class='muted'>writes the engine's own config file with the environment and the "
        "launch command in its header.</p>"
    )


def _progress(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], figures: _Figures
) -> str:
    go = _go()
    from plotly.subplots import make_subplots

    if not trials:
        return "<section id='progress'><h2>Progress</h2><p>No trial yet.</p></section>"
    sign = 1.0 if report.directions and report.directions[0] == "maximize" else -1.0
    metric = (report.metric_names or ("objective",))[0]
    out = ["<section id='progress'><h2>Best so far</h2>"]
    verdicts = [_row(report, t.number).verdict for t in trials]
    for axis in ("launch", "wall clock"):
        xs = [t.number if axis == "launch" else _iso(_end(t)) for t in trials]
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.75, 0.25])
        best, line_x, line_y = None, [], []
        order = sorted(range(len(trials)), key=lambda i: _end(trials[i]) or dt.datetime.max)
        if axis == "launch":
            order = list(range(len(trials)))
        for i in order:
            t = trials[i]
            if is_verified_feasible(t) and t.values:
                value = t.values[0]
                if best is None or sign * value > sign * best:
                    best = value
                line_x.append(xs[i])
                line_y.append(best)
        for verdict in dict.fromkeys(verdicts):
            idx = [i for i, v in enumerate(verdicts) if v == verdict]
            measured = [i for i in idx if trials[i].values and verdict == "correct"]
            if measured:
                fig.add_trace(
                    go.Scatter(
                        x=[xs[i] for i in measured],
                        y=[trials[i].values[0] for i in measured],
                        mode="markers",
                        marker={"color": _colour(verdict), "size": 9},
                        name=verdict,
                        legendgroup=verdict,
                        text=[f"trial {trials[i].number}" for i in measured],
                    ),
                    row=1,
                    col=1,
                )
            fig.add_trace(
                go.Scatter(
                    x=[xs[i] for i in idx],
                    y=[verdict] * len(idx),
                    mode="markers",
                    marker={"color": _colour(verdict), "size": 10, "symbol": "square"},
                    name=verdict,
                    legendgroup=verdict,
                    showlegend=not measured,
                    text=[f"trial {trials[i].number}" for i in idx],
                ),
                row=2,
                col=1,
            )
        if line_x:
            fig.add_trace(
                go.Scatter(
                    x=line_x,
                    y=line_y,
                    mode="lines",
                    line={"shape": "hv", "color": "#1d2330"},
                    name="best so far",
                ),
                row=1,
                col=1,
            )
        fig.update_yaxes(title_text=metric, row=1, col=1)
        fig.update_xaxes(
            title_text="trial (launch order)" if axis == "launch" else "finished at", row=2, col=1
        )
        fig.update_layout(title=f"{metric}: every trial by verdict, over {axis}")
        out.append(figures.html(fig, f"best-so-far-{axis.replace(' ', '-')}", height=420))
    if not any(v == "correct" for v in verdicts):
        out.append("<p class='muted'>No trial was verified correct: nothing to track yet.</p>")
    out.append("</section>")
    return "".join(out)


def _importance(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], figures: _Figures
) -> str:
    go = _go()
    out = ["<section id='importance'><h2>What mattered</h2>"]
    correct = [t for t in trials if is_verified_feasible(t) and t.values and t.params]
    metric = (report.metric_names or ("objective",))[0]
    importances, why = _importances(study, correct)
    if importances:
        names = list(importances)[::-1]
        fig = go.Figure(
            go.Bar(
                x=[importances[n] for n in names],
                y=names,
                orientation="h",
                marker={"color": "#5b7bd5"},
            )
        )
        fig.update_layout(
            title=f"parameter importance for {metric} (PED-ANOVA over correct trials)",
            xaxis_title="importance",
        )
        out.append(figures.html(fig, "importance", height=max(260, 40 * len(names) + 120)))
    else:
        out.append(f"<p class='note'>Parameter importances not computable: {_e(why)}.</p>")
    if len(correct) >= 2:
        out.append(figures.html(_parallel(correct, metric), "parallel-coordinates", height=420))
    else:
        out.append(
            f"<p class='note'>Parallel coordinates need at least 2 correct trials "
            f"({len(correct)} so far).</p>"
        )
    out.append("</section>")
    return "".join(out)


def _importances(study: optuna.Study, correct: list[FrozenTrial]) -> tuple[dict[str, float], str]:
    if len(correct) < 2:
        return {}, f"they need at least 2 correct trials ({len(correct)} so far)"
    sign = 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0
    try:
        with _quiet_optuna():
            shadow = optuna.create_study(directions=study.directions)
            for t in correct:
                shadow.add_trial(t)
            # PED-ANOVA (Optuna's default; no scikit-learn needed) ranks what separates the
            # best trials from the rest, and reads "best" as low values: orient the target.
            found = optuna.importance.get_param_importances(
                shadow,
                evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                target=lambda t: -sign * t.values[0],
                normalize=True,
            )
    except (ValueError, RuntimeError, ZeroDivisionError, ImportError) as exc:
        return {}, str(exc).strip() or type(exc).__name__
    found = {k: v for k, v in found.items() if not math.isnan(v)}
    if not found:
        return {}, "no parameter varied among the correct trials"
    return found, ""


class _quiet_optuna:
    """The shadow study's creation log and experimental-feature warnings are noise here."""

    def __enter__(self) -> None:
        self.level = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: object) -> None:
        self.warnings.__exit__(*exc)
        optuna.logging.set_verbosity(self.level)


def _parallel(correct: list[FrozenTrial], metric: str) -> Any:
    """Parallel coordinates drawn as SVG lines (plotly's Parcoords needs WebGL, which a
    headless or GPU-less browser may not have): one axis per parameter, values scaled to
    0..1, categorical values spread evenly, each trial a line coloured by the objective."""
    go = _go()
    names = sorted({n for t in correct for n in t.params})
    axes: list[tuple[str, dict[Any, float], list[str]]] = []  # name, value -> 0..1, labels
    for name in names:
        values = [t.params.get(name) for t in correct]
        distinct = sorted({repr(v) for v in values})
        numeric = all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values if v is not None
        )
        if numeric and len({v for v in values if v is not None}) > 1:
            nums = [v for v in values if v is not None]
            lo, hi = min(nums), max(nums)
            scale = {repr(v): (v - lo) / (hi - lo) for v in nums}
            labels = [f"{lo:g}", f"{hi:g}"]
        else:
            step = 1.0 / max(1, len(distinct) - 1)
            scale = {d: i * step if len(distinct) > 1 else 0.5 for i, d in enumerate(distinct)}
            labels = distinct
        axes.append((name, scale, labels))
    objective = [t.values[0] for t in correct]
    lo, hi = min(objective), max(objective)
    fig = go.Figure()
    x = [*range(len(axes)), len(axes)]
    for t, value in zip(correct, objective, strict=True):
        ys = []
        for name, scale, _labels in axes:
            ys.append(scale.get(repr(t.params.get(name))) if name in t.params else None)
        ys.append(0.5 if hi == lo else (value - lo) / (hi - lo))
        shade = 0.0 if hi == lo else (value - lo) / (hi - lo)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=ys,
                mode="lines+markers",
                line={"color": _ramp(shade), "width": 2},
                name=f"trial {t.number}: {value:,.1f}",
                hovertext=[f"{n} = {t.params.get(n)!r}" for n, _, _ in axes] + [f"{value:,.1f}"],
                hoverinfo="text+name",
            )
        )
    for i, (name, _scale, labels) in enumerate(axes):
        fig.add_annotation(
            x=i,
            y=1.08,
            text=f"{name}<br>{' / '.join(labels)[:60]}",
            showarrow=False,
            font={"size": 10},
        )
    fig.add_annotation(
        x=len(axes),
        y=1.08,
        text=f"{metric}<br>{lo:,.1f} .. {hi:,.1f}",
        showarrow=False,
        font={"size": 10},
    )
    fig.update_xaxes(showticklabels=False, showgrid=True, gridcolor="#888", dtick=1)
    fig.update_yaxes(showticklabels=False, range=[-0.05, 1.18], showgrid=False)
    fig.update_layout(
        title="parallel coordinates over correct trials (darker = better objective value)",
        showlegend=False,
    )
    return fig


def _failures(report: StudyReport, trials: list[FrozenTrial]) -> str:
    failed = [r for r in report.rows if r.verdict not in _OK]
    out = ["<section id='failures'><h2>What failed, and why</h2>"]
    if not failed:
        out.append("<p>No trial failed.</p></section>")
        return "".join(out)
    by_number = {t.number: t for t in trials}
    for reason, count in report.failures_by_reason.items():
        out.append(
            f"<h3><span class='chip' style='background:{_colour(reason)}'>{_e(reason)}</span> "
            f"{count} trial(s)</h3>"
        )
        for row in (r for r in failed if r.verdict == reason):
            trial = by_number[row.number]
            first_line = (row.detail.splitlines() or [""])[0][:160]
            out.append(
                f"<details class='failure' data-trial='{row.number}'><summary>trial "
                f"{row.number} ({_e(row.role)}): {_e(first_line) or '(no detail)'}</summary>"
                f"<div class='evidence'>{_evidence_html(row, trial)}</div></details>"
            )
    out.append("</section>")
    return "".join(out)


def _evidence_html(row: TrialRow, trial: FrozenTrial) -> str:
    evidence = trial.user_attrs.get(names.EVIDENCE) or {}
    parts = [f"<p><b>detail</b>: {_e(row.detail) or '(none recorded)'}</p>"]
    params = ", ".join(f"{k}={v}" for k, v in row.params.items())
    parts.append(f"<p><b>config</b>: <code>{_e(params) or '(baseline)'}</code></p>")
    facts = [
        (k, evidence[k])
        for k in ("exit_code", "signal_name", "root_cause")
        if evidence.get(k) not in (None, "")
    ]
    if facts:
        parts.append(
            "<table>"
            + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
            + "</table>"
        )
    divergence = evidence.get("first_divergence")
    if divergence:
        token = ""
        if divergence.get("expected_token") is not None or divergence.get("got_token") is not None:
            token = (
                f"; expected token <code>{_e(repr(divergence.get('expected_token')))}</code>, got "
                f"<code>{_e(repr(divergence.get('got_token')))}</code>"
            )
        parts.append(
            f"<p class='divergence'><b>first divergence</b>: {_e(divergence.get('kind'))} "
            f"{_e(divergence.get('position'))} of prompt <code>{_e(divergence.get('prompt'))}"
            f"</code>{token} {_e(divergence.get('detail', ''))}</p>"
            "<div class='sidebyside'><div><b>expected (reference)</b>"
            f"<pre class='expected'>{_e(divergence.get('expected_text', ''))}</pre></div>"
            f"<div><b>got</b><pre class='got'>{_e(divergence.get('got_text', ''))}</pre></div>"
            "</div>"
        )
    if evidence.get("log_tail"):
        parts.append(
            f"<b>server log (tail)</b><pre class='log-tail'>{_e(evidence['log_tail'])}</pre>"
        )
    if len(parts) == 2:
        parts.append("<p class='muted'>No further evidence was recorded for this trial.</p>")
    return "".join(parts)


def _load_curves(report: StudyReport, figures: _Figures) -> str:
    """Metrics measured at several load levels are stored as ``metric@level`` (issue #12);
    goodput as ``goodput`` (the highest level whose SLOs hold)."""
    go = _go()
    out = ["<section id='load'><h2>Load curves and goodput</h2>"]
    correct = [r for r in report.rows if r.verdict == "correct"]
    curves: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for row in correct:
        for key, value in row.metrics.items():
            name, sep, level = key.partition("@")
            if not sep:
                continue
            try:
                x = float(level)
            except ValueError:
                continue
            curves.setdefault(name, {}).setdefault(row.number, []).append((x, value))
    # one level per launch is a point, not a curve (every trial stores ``metric@level``)
    curves = {
        name: kept
        for name, by_trial in curves.items()
        if (kept := {n: points for n, points in by_trial.items() if len(points) > 1})
    }
    goodput = {r.number: r.metrics["goodput"] for r in correct if "goodput" in r.metrics}
    if not curves and not goodput:
        out.append(
            "<p class='note'>Not measured: this study's trials measured one load level each "
            "(a workload with several concurrency levels stores a curve per launch).</p>"
        )
    for name, by_trial in sorted(curves.items()):
        fig = go.Figure()
        for number, points in sorted(by_trial.items()):
            points.sort()
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in points],
                    y=[p[1] for p in points],
                    mode="lines+markers",
                    name=f"trial {number}" + (" (best)" if number in report.best else ""),
                    line={"width": 4 if number in report.best else 1.5},
                )
            )
        fig.update_layout(title=f"{name} by load level", xaxis_title="load level", yaxis_title=name)
        out.append(figures.html(fig, f"load-{_slug(name)}"))
    if goodput:
        numbers = sorted(goodput)
        fig = go.Figure(
            go.Bar(
                x=[f"trial {n}" for n in numbers],
                y=[goodput[n] for n in numbers],
                marker={"color": ["#2e9d5b" if n in report.best else "#8fa8d8" for n in numbers]},
            )
        )
        fig.update_layout(title="goodput: highest load whose SLOs hold", yaxis_title="goodput")
        out.append(figures.html(fig, "goodput"))
    out.append("</section>")
    return "".join(out)


def _pareto(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], figures: _Figures
) -> str:
    if len(report.directions) < 2:
        return ""
    go = _go()
    names = report.metric_names or ("objective 1", "objective 2")
    correct = [t for t in trials if is_verified_feasible(t) and t.values]
    front = {t.number for t in best_trials(study)}
    fig = go.Figure()
    for on_front in (False, True):
        chosen = [t for t in correct if (t.number in front) == on_front]
        fig.add_trace(
            go.Scatter(
                x=[t.values[0] for t in chosen],
                y=[t.values[1] for t in chosen],
                mode="markers",
                name="Pareto front" if on_front else "dominated",
                marker={
                    "size": 11 if on_front else 8,
                    "color": "#d62728" if on_front else "#8fa8d8",
                },
                text=[f"trial {t.number}" for t in chosen],
            )
        )
    fig.update_layout(
        title="Pareto front over correct trials",
        xaxis_title=f"{names[0]} ({report.directions[0]})",
        yaxis_title=f"{names[1]} ({report.directions[1]})",
    )
    return f"<section id='pareto'><h2>Pareto front</h2>{figures.html(fig, 'pareto')}</section>"


def _ablation(report: StudyReport, figures: _Figures) -> str:
    data = report.attrs.get(names.ABLATION_REPORT)
    head = "<section id='ablation'><h2>Which change bought what (ablation)</h2>"
    if not data:
        return (
            f"{head}<p class='note'>No ablation stored. <code>autotune ablate</code> reverts "
            "each change of the best config one at a time and measures what it bought.</p>"
            "</section>"
        )
    go = _go()
    measured = [c for c in data["contributions"] if c["delta"] is not None]
    rest = data["best_median"] - sum(c["delta"] for c in measured)
    sign = 1.0 if data["direction"] == "maximize" else -1.0
    labels = ["without these changes", *[c["parameter"] for c in measured], "best config"]
    values = [rest, *[sign * c["delta"] for c in measured], data["best_median"]]
    fig = go.Figure(
        go.Waterfall(
            x=labels,
            y=values,
            measure=["absolute", *["relative"] * len(measured), "total"],
            text=[
                f"{v:+,.1f}" if 0 < i < len(values) - 1 else f"{v:,.1f}"
                for i, v in enumerate(values)
            ],
            textposition="outside",
        )
    )
    band = data["noise_band"]
    fig.add_hrect(
        y0=data["best_median"] - band,
        y1=data["best_median"] + band,
        fillcolor="#5b7bd5",
        opacity=0.15,
        line_width=0,
        annotation_text=f"noise band ±{band:,.1f}",
        annotation_position="top left",
    )
    fig.update_layout(
        title=f"ablation of trial {data['trial_number']}: {data['metric']} "
        f"({data['repeats']} rounds per variant)",
        yaxis_title=data["metric"],
        showlegend=False,
    )
    rows = "".join(
        f"<tr><td>{_e(c['parameter'])}</td><td>{_e(c['best_value'])}</td>"
        f"<td>{_e(c['reverted_to'])}</td><td>"
        f"{'' if c['delta'] is None else format(c['delta'], '+,.1f')}</td>"
        f"<td>{_e(c['verdict'])}{(' (' + _e(c['detail']) + ')') if c['detail'] else ''}</td></tr>"
        for c in data["contributions"]
    )
    minimal = ", ".join(f"{k}={v}" for k, v in data["minimal_values"].items()) or "(baseline)"
    keeps = data.get("minimal_keeps_gain")
    kept = (
        ""
        if keeps is None
        else f" It measured {data['minimal_median']:,.1f}: "
        + ("it keeps the gain." if keeps else "it does NOT keep the gain (interactions).")
        if data.get("minimal_median") is not None
        else " It failed when measured."
    )
    return (
        f"{head}{figures.html(fig, 'ablation', height=420)}<table><tr><th>change</th>"
        f"<th>best</th><th>reverted to</th><th>delta</th><th>verdict</th></tr>{rows}</table>"
        f"<p>Minimal config: <code>{_e(minimal)}</code>.{_e(kept)}</p></section>"
    )


def _roofline(report: StudyReport, figures: _Figures) -> str:
    data = report.attrs.get(names.ROOFLINE)
    head = "<section id='roofline'><h2>How far from the hardware</h2>"
    if not data or not data.get("tokens_per_s"):
        return (
            f"{head}<p class='note'>No roofline stored: give the spec a <code>roofline:</code> "
            "section to see measured decode speed as a fraction of the memory-bandwidth limit."
            "</p></section>"
        )
    bound = float(data["tokens_per_s"])
    measured = None
    if report.best:
        measured = _row(report, report.best[0]).metrics.get("decode_tokens_per_s")
    if measured is None:
        return (
            f"{head}<p>Decode roofline: {bound:,.1f} tok/s ({_e(data.get('label', ''))}); no "
            "verified trial measured decode tok/s yet.</p></section>"
        )
    go = _go()
    fig = go.Figure(
        go.Indicator(
            mode="gauge+number",
            value=measured,
            number={"suffix": " tok/s", "valueformat": ",.0f"},
            gauge={
                "axis": {"range": [0, max(bound, measured)]},
                "bar": {"color": "#2e9d5b"},
                "threshold": {"line": {"color": "#d62728", "width": 4}, "value": bound},
            },
            title={
                "text": f"best decode speed: {measured / bound:.1%} of the roofline "
                f"({bound:,.0f} tok/s)"
            },
        )
    )
    assumptions = "".join(f"<li>{_e(a)}</li>" for a in data.get("assumptions") or [])
    return (
        f"{head}{figures.html(fig, 'roofline', height=320)}<p class='muted'>"
        f"{_e(data.get('label', ''))}; bandwidth {_e(data.get('bandwidth_gbs'))} GB/s per "
        f"device, tp {_e(data.get('tp'))}</p><ul class='muted'>{assumptions}</ul></section>"
    )


def _all_trials(report: StudyReport) -> str:
    names = list(report.metric_names)
    for row in report.rows:
        names += [m for m in row.metrics if m not in names and "@" not in m]
    names = names[:5]
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    rows = []
    for row in report.rows:
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        metrics = "".join(
            f"<td>{row.metrics[n]:,.1f}</td>" if n in row.metrics else "<td></td>" for n in names
        )
        star = " *" if row.is_best else ""
        rows.append(
            f"<tr><td>{row.number}{star}</td><td>{_e(row.role)}</td><td><span class='chip' "
            f"style='background:{_colour(row.verdict)}'>{_e(row.verdict)}</span></td>"
            f"<td><code>{_e(params)}</code></td>{metrics}</tr>"
        )
    return (
        "<section id='trials'><h2>Every trial</h2><table><tr><th>#</th><th>role</th>"
        f"<th>verdict</th><th>params</th>{head}</tr>{''.join(rows)}</table></section>"
    )


# --- helpers ------------------------------------------------------------------------------


def _diff_table(base: dict[str, Any], other: dict[str, Any], labels: Sequence[str]) -> str:
    names = list(dict.fromkeys([*base, *other]))
    if not names:
        return "<p class='muted'>No tuned parameters.</p>"
    rows = []
    for name in names:
        a = _shown(base.get(name, "(engine default)"))
        b = _shown(other.get(name, "(engine default)"))
        changed = a != b
        rows.append(
            f"<tr{' class=changed' if changed else ''}><td>{_e(name)}</td><td>{_e(a)}</td>"
            f"<td>{_e(b)}{' &larr; changed' if changed else ''}</td></tr>"
        )
    return (
        f"<table class='diff'><tr><th>parameter</th><th>{_e(labels[0])}</th>"
        f"<th>{_e(labels[1])}</th></tr>{''.join(rows)}</table>"
    )


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def _row(report: StudyReport, number: int) -> TrialRow:
    return next(r for r in report.rows if r.number == number)


def _model_of(trials: list[FrozenTrial], source: ReportSource) -> str:
    for trial in trials:
        argv = (trial.user_attrs.get(names.SERVER) or {}).get("argv") or []
        for flag in ("--model", "--served-model-name"):
            if flag in argv and argv.index(flag) + 1 < len(argv):
                return str(argv[argv.index(flag) + 1])
        for i, word in enumerate(argv[:-1]):
            if word in ("serve",) and not argv[i + 1].startswith("-"):
                return str(argv[i + 1])
    return "unknown (no trial started a server)"


def _engine_of(trials: list[FrozenTrial], report: StudyReport, source: ReportSource) -> str:
    versions = {
        (t.user_attrs.get(names.SERVER) or {}).get("engine_version")
        for t in trials
        if (t.user_attrs.get(names.SERVER) or {}).get("engine_version")
    }
    if report.engine_version:
        versions.add(report.engine_version)
    kind = _spec_kind(source.spec_path or report.attrs.get(names.SPEC_PATH))
    text = ", ".join(sorted(map(str, versions))) or "version unknown"
    return f"{kind} {text}" if kind else text


def _spec_kind(path: str | None) -> str | None:
    """The engine kind (vllm, command, ...) from the study's spec, if it still loads."""
    if not path:
        return None
    from autotune.errors import AutotuneError
    from autotune.spec import load_spec

    try:
        return load_spec(Path(path)).engine.kind
    except (AutotuneError, OSError):
        return None


def _objective_names(
    study: optuna.Study, report: StudyReport, source: ReportSource
) -> tuple[str, ...]:
    """The objective's metric names: Optuna's own if set, else the spec's (a study records
    its spec's path), else what the confirmation or ablation measured."""
    if study.metric_names:
        return tuple(study.metric_names)
    path = source.spec_path or report.attrs.get(names.SPEC_PATH)
    if path:
        from autotune.errors import AutotuneError
        from autotune.spec import load_spec

        try:
            metrics = tuple(load_spec(Path(path)).objective.metrics)
        except (AutotuneError, OSError):
            metrics = ()
        if len(metrics) == len(report.directions):
            return metrics
    for key in (names.CONFIRMATION, names.ABLATION_REPORT):
        data = report.attrs.get(key)
        if data and len(report.directions) == 1:
            return (data["metric"],)
    return ()


def _end(trial: FrozenTrial) -> dt.datetime | None:
    return trial.datetime_complete or trial.datetime_start


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat(sep=" ", timespec="seconds") if value else None


def _when(value: dt.datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL was refused long before; never print a secret
        return "(storage URL)"


def _colour(verdict: str) -> str:
    return VERDICT_COLOURS.get(verdict, _OTHER_COLOUR)


def _ramp(x: float) -> str:
    """Light blue (worst) to dark blue (best)."""
    lo, hi = (190, 205, 235), (20, 50, 140)
    r, g, b = (round(a + (c - a) * x) for a, c in zip(lo, hi, strict=True))
    return f"rgb({r},{g},{b})"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)
