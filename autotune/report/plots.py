"""`autotune report`'s figures: plotly figures as HTML fragments, one function per section.

plotly.js is inlined once per page (:class:`Figures`), so the page needs no network when viewed.
Each section copes with a study still running and with one in which no trial was verified
correct. The page around them is :mod:`autotune.report.html`'s.
"""

from __future__ import annotations

import datetime as dt
import html
import math
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune import names
from autotune.errors import visible
from autotune.names import split_level
from autotune.report.format import colour, end_of, esc, iso, ramp, row_of, slug
from autotune.study.results import StudyReport, best_trials, is_verified_feasible


class Figures:
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
        return f"<div class='plot' data-plot='{esc(name)}'>{fragment}</div>"


def _go():
    import plotly.graph_objects as go

    return go


#: what a re-measurement round is called on the progress figure (not progress: the same configs)
_ROUND_LABELS = {
    names.CONFIRM: "confirmation round (re-measured, not progress)",
    names.ABLATION: "ablation round (not progress)",
    names.COMPARE: "comparison round (not progress)",
}


def is_search_launch(trial: FrozenTrial) -> bool:
    """A trial the search launched (baseline, search, retry; a trial from before roles were
    recorded counts as one): the only trials "best so far" counts. Confirmation, ablation and
    comparison rounds re-measure configs already seen: plotted as progress, their noise climbs."""
    role = trial.user_attrs.get(names.ROLE)
    return not role or role in names.SEARCH_ROLES


def best_so_far(
    trials: list[FrozenTrial], order: list[int], sign: float
) -> list[tuple[int, float]]:
    """(index into ``trials``, best so far) at each verified search launch, in ``order``."""
    best, points = None, []
    for i in order:
        t = trials[i]
        if is_search_launch(t) and is_verified_feasible(t) and t.values:
            value = t.values[0]
            if best is None or sign * value > sign * best:
                best = value
            points.append((i, best))
    return points


def _series(trial: FrozenTrial, verdict: str) -> str:
    """The legend entry of one trial's marker: its verdict, or what its round is."""
    role = trial.user_attrs.get(names.ROLE)
    if verdict == "correct" and not is_search_launch(trial):
        return _ROUND_LABELS.get(role, f"{role} round (not progress)")
    return verdict


def progress_section(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], figures: Figures
) -> str:
    go = _go()
    from plotly.subplots import make_subplots

    if not trials:
        return "<section id='progress'><h2>Progress</h2><p>No trial yet.</p></section>"
    sign = 1.0 if report.directions and report.directions[0] == "maximize" else -1.0
    metric = (report.metric_names or ("objective",))[0]
    out = ["<section id='progress'><h2>Best so far</h2>"]
    verdicts = [row_of(report, t.number).verdict for t in trials]
    series = [_series(t, v) for t, v in zip(trials, verdicts, strict=True)]
    for axis in ("launch", "wall clock"):
        xs = [t.number if axis == "launch" else iso(end_of(t)) for t in trials]
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.75, 0.25])
        order = sorted(range(len(trials)), key=lambda i: end_of(trials[i]) or dt.datetime.max)
        if axis == "launch":
            order = list(range(len(trials)))
        points = best_so_far(trials, order, sign)
        line_x, line_y = [xs[i] for i, _ in points], [b for _, b in points]
        for name in dict.fromkeys(series):
            idx = [i for i, v in enumerate(series) if v == name]
            measured = [i for i in idx if trials[i].values and verdicts[i] == "correct"]
            if measured:
                fig.add_trace(
                    go.Scatter(
                        x=[xs[i] for i in measured],
                        y=[trials[i].values[0] for i in measured],
                        mode="markers",
                        marker={
                            "color": colour(verdicts[measured[0]]),
                            "size": 9,
                            "symbol": "circle" if name == "correct" else "circle-open",
                        },
                        name=plotly_text(name),
                        legendgroup=plotly_text(name),
                        text=[f"trial {trials[i].number}" for i in measured],
                    ),
                    row=1,
                    col=1,
                )
            fig.add_trace(
                go.Scatter(
                    x=[xs[i] for i in idx],
                    y=[plotly_text(verdicts[i]) for i in idx],
                    mode="markers",
                    marker={"color": colour(verdicts[idx[0]]), "size": 10, "symbol": "square"},
                    name=plotly_text(name),
                    legendgroup=plotly_text(name),
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
                    name="best so far (search launches)",
                ),
                row=1,
                col=1,
            )
        fig.update_yaxes(title_text=plotly_text(metric), row=1, col=1)
        fig.update_xaxes(
            title_text="trial (launch order)" if axis == "launch" else "finished at", row=2, col=1
        )
        fig.update_layout(title=f"{plotly_text(metric)}: every trial by verdict, over {axis}")
        out.append(figures.html(fig, f"best-so-far-{axis.replace(' ', '-')}", height=420))
    if not any(v == "correct" for v in verdicts):
        out.append("<p class='muted'>No trial was verified correct: nothing to track yet.</p>")
    elif any(not is_search_launch(t) for t in trials):
        out.append(
            "<p class='muted'>The line counts search launches only; confirmation, ablation and "
            "comparison rounds re-measure configs already seen and are drawn as open markers, "
            "not as progress.</p>"
        )
    out.append("</section>")
    return "".join(out)


def importance_section(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], figures: Figures
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
                y=[plotly_text(n) for n in names],
                orientation="h",
                marker={"color": "#5b7bd5"},
            )
        )
        fig.update_layout(
            title=f"parameter importance for {plotly_text(metric)} (PED-ANOVA over correct trials)",
            xaxis_title="importance",
        )
        out.append(figures.html(fig, "importance", height=max(260, 40 * len(names) + 120)))
    else:
        out.append(f"<p class='note'>Parameter importances not computable: {esc(why)}.</p>")
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
    0..1, categorical values spread evenly, each trial a line coloured by the objective. Its
    texts are plotly's HTML subset: a value goes through :func:`plotly_text`."""
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
                line={"color": ramp(shade), "width": 2},
                name=f"trial {t.number}: {value:,.1f}",
                hovertext=[plotly_text(f"{n} = {t.params.get(n)!r}") for n, _, _ in axes]
                + [f"{value:,.1f}"],
                hoverinfo="text+name",
            )
        )
    for i, (name, _scale, labels) in enumerate(axes):
        fig.add_annotation(
            x=i,
            y=1.08,
            text=f"{plotly_text(name)}<br>{plotly_text(' / '.join(labels)[:60])}",
            showarrow=False,
            font={"size": 10},
        )
    fig.add_annotation(
        x=len(axes),
        y=1.08,
        text=f"{plotly_text(metric)}<br>{lo:,.1f} .. {hi:,.1f}",
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


def plotly_text(value: object) -> str:
    """``value`` in a text of plotly's HTML subset (an axis label, a hover text): ``<``, ``>``
    and ``&`` escaped, or a parameter value ``<a href=...>`` drew a link on the figure; its
    control characters written as escapes, as :func:`esc` does; quotes left as they are
    (plotly shows ``&quot;`` as it is)."""
    return html.escape(visible(str(value)), quote=False)


def load_curves_section(report: StudyReport, figures: Figures) -> str:
    """Metrics measured at several load levels are stored as ``metric@level`` (issue #12);
    goodput as ``goodput`` (the highest level whose SLOs hold)."""
    go = _go()
    out = ["<section id='load'><h2>Load curves and goodput</h2>"]
    correct = [r for r in report.rows if r.verdict == "correct"]
    curves: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for row in correct:
        for key, value in row.metrics.items():
            name, level = split_level(key)
            if level is None:
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
        fig.update_layout(
            title=f"{plotly_text(name)} by load level",
            xaxis_title="load level",
            yaxis_title=plotly_text(name),
        )
        out.append(figures.html(fig, f"load-{slug(name)}"))
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


def pareto_section(
    study: optuna.Study, report: StudyReport, trials: list[FrozenTrial], figures: Figures
) -> str:
    if len(report.directions) < 2:
        return ""
    go = _go()
    names = report.metric_names or ("objective 1", "objective 2")
    correct = [t for t in trials if is_verified_feasible(t) and t.values]
    front = {t.number for t in best_trials(study, trials=trials)}
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
        xaxis_title=plotly_text(f"{names[0]} ({report.directions[0]})"),
        yaxis_title=plotly_text(f"{names[1]} ({report.directions[1]})"),
    )
    return f"<section id='pareto'><h2>Pareto front</h2>{figures.html(fig, 'pareto')}</section>"


def ablation_section(report: StudyReport, figures: Figures) -> str:
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
    labels = [
        "without these changes",
        *[plotly_text(c["parameter"]) for c in measured],
        "best config",
    ]
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
        title=f"ablation of trial {data['trial_number']}: {plotly_text(data['metric'])} "
        f"({plotly_text(data['repeats'])} rounds per variant)",
        yaxis_title=plotly_text(data["metric"]),
        showlegend=False,
    )
    rows = "".join(
        f"<tr><td>{esc(c['parameter'])}</td><td>{esc(c['best_value'])}</td>"
        f"<td>{esc(c['reverted_to'])}</td><td>"
        f"{'' if c['delta'] is None else format(c['delta'], '+,.1f')}</td>"
        f"<td>{esc(c['verdict'])}{(' (' + esc(c['detail']) + ')') if c['detail'] else ''}</td></tr>"
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
        f"<p>Minimal config: <code>{esc(minimal)}</code>.{esc(kept)}</p></section>"
    )


def roofline_section(report: StudyReport, figures: Figures) -> str:
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
        measured = row_of(report, report.best[0]).metrics.get("decode_tokens_per_s")
    if measured is None:
        return (
            f"{head}<p>Decode roofline: {bound:,.1f} tok/s ({esc(data.get('label', ''))}); no "
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
    assumptions = "".join(f"<li>{esc(a)}</li>" for a in data.get("assumptions") or [])
    return (
        f"{head}{figures.html(fig, 'roofline', height=320)}<p class='muted'>"
        f"{esc(data.get('label', ''))}; bandwidth {esc(data.get('bandwidth_gbs'))} GB/s per "
        f"device, tp {esc(data.get('tp'))}</p><ul class='muted'>{assumptions}</ul></section>"
    )
