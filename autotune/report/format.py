"""`autotune report`'s shared formatting: verdict colours, HTML escaping, and the names the
page shows for a study's model, engine, objective and storage (password hidden); and what
"where the time went" shows, which `show` prints too.

"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from autotune import names
from autotune.errors import AutotuneError, visible
from autotune.spec.load import load_spec
from autotune.study.results import (
    NOT_MEASURED_ON,
    ReportSource,
    StudyReport,
    TrialRow,
    time_spent,
)

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


OTHER_COLOUR = "#555555"


#: verdicts that are no failure (a screened trial is correct, only clearly slower)
OK_VERDICTS = ("correct", "running", "waiting", *NOT_MEASURED_ON)


def diff_table(base: dict[str, Any], other: dict[str, Any], labels: Sequence[str]) -> str:
    names = list(dict.fromkeys([*base, *other]))
    if not names:
        return "<p class='muted'>No tuned parameters.</p>"
    rows = []
    for name in names:
        a = shown(base.get(name, "(engine default)"))
        b = shown(other.get(name, "(engine default)"))
        changed = a != b
        rows.append(
            f"<tr{' class=changed' if changed else ''}><td>{esc(name)}</td><td>{esc(a)}</td>"
            f"<td>{esc(b)}{' &larr; changed' if changed else ''}</td></tr>"
        )
    return (
        f"<table class='diff'><tr><th>parameter</th><th>{esc(labels[0])}</th>"
        f"<th>{esc(labels[1])}</th></tr>{''.join(rows)}</table>"
    )


def shown(value: Any) -> str:
    return "null" if value is None else str(value)


def row_of(report: StudyReport, number: int) -> TrialRow:
    return next(r for r in report.rows if r.number == number)


def model_of(spec_path: str | None) -> str:
    """The model the study tuned, as its spec names it (``model.path``, and the name it was
    served under): every engine spells its model flag its own way (``--model``, ``-m``), the
    spec once."""
    if not spec_path:
        return "unknown (the study records no spec)"
    try:
        model = load_spec(Path(spec_path)).model
    except (AutotuneError, OSError):
        return f"unknown (the spec {spec_path} no longer loads)"
    if model.served_name and model.served_name != model.path:
        return f"{model.path} (served as {model.served_name})"
    return model.path


def engine_of(trials: list[FrozenTrial], report: StudyReport, source: ReportSource) -> str:
    versions = {
        (t.user_attrs.get(names.SERVER) or {}).get("engine_version")
        for t in trials
        if (t.user_attrs.get(names.SERVER) or {}).get("engine_version")
    }
    if report.engine_version:
        versions.add(report.engine_version)
    kind = spec_kind(source.spec_path or report.attrs.get(names.SPEC_PATH))
    text = ", ".join(sorted(map(str, versions))) or "version unknown"
    return f"{kind} {text}" if kind else text


def spec_kind(path: str | None) -> str | None:
    """The engine kind (vllm, command, ...) from the study's spec, if it still loads."""
    if not path:
        return None
    try:
        return load_spec(Path(path)).engine.kind
    except (AutotuneError, OSError):
        return None


def end_of(trial: FrozenTrial) -> dt.datetime | None:
    return trial.datetime_complete or trial.datetime_start


def iso(value: dt.datetime | None) -> str | None:
    return value.isoformat(sep=" ", timespec="seconds") if value else None


def timestamp(value: dt.datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")


def colour(verdict: str) -> str:
    return VERDICT_COLOURS.get(verdict, OTHER_COLOUR)


def ramp(x: float) -> str:
    """Light blue (worst) to dark blue (best)."""
    lo, hi = (190, 205, 235), (20, 50, 140)
    r, g, b = (round(a + (c - a) * x) for a, c in zip(lo, hi, strict=True))
    return f"rgb({r},{g},{b})"


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text)


def esc(value: Any) -> str:
    """``value`` as HTML text that shows as it is: its markup escaped, and its control
    characters written as escapes (``errors.visible``; a log tail keeps its lines and tabs): a
    bidi control (``\\u202e``) in a parameter value reversed the text around it in the trial
    table, and a server's log line, stored with its ESC sequences, shows them written out."""
    return html.escape(visible("" if value is None else str(value), keep="\n\t"), quote=True)


def confirmation_ran(trials: Sequence[FrozenTrial]) -> bool:
    """Whether a confirmation trial recorded its time: "where the time went" leaves the
    confirmation out otherwise (``--confirm-top 0``), as a figure never measured, not 0.0 s."""
    return any(
        t.state.is_finished()
        and t.user_attrs.get(names.ROLE) == names.CONFIRM
        and t.user_attrs.get(names.TIME_S)
        for t in trials
    )


def time_lines(trials: Sequence[FrozenTrial]) -> list[str]:
    """``show``'s "where the time went", without a confirmation that never ran: with
    ``--confirm-top 0`` it said ``confirmation: 0.0 s (0%)``, a figure nobody measured
    (``TimeSpent.lines`` writes that line whatever ran)."""
    lines = time_spent(trials).lines()
    if confirmation_ran(trials):
        return lines
    return [line for line in lines if not line.startswith("confirmation: ")]


def machine_text(machine: dict[str, Any]) -> str:
    """``study.hardware.describe_machine``'s dict in words: CPU model, logical cores, memory,
    GPUs (identical ones counted); a figure it lacks is left out, never written as 0."""
    parts = []
    if machine.get("cpu_model"):
        parts.append(str(machine["cpu_model"]))
    if machine.get("logical_cores"):
        parts.append(f"{machine['logical_cores']} logical cores")
    if machine.get("memory_gib"):
        parts.append(f"{machine['memory_gib']:g} GiB memory")
    gpus = machine.get("gpus")
    if gpus:
        counts: dict[str, int] = {}
        for gpu in gpus:
            memory = gpu.get("memory_mib")
            label = f"{gpu.get('name', 'GPU')}" + (f" ({memory} MiB)" if memory else "")
            counts[label] = counts.get(label, 0) + 1
        parts.append("GPUs: " + ", ".join(f"{n} x {label}" for label, n in counts.items()))
    elif "gpus" not in machine:
        parts.append("no NVIDIA GPU seen")
    return ", ".join(parts) or "not recorded"


def metric_html(metrics: dict[str, Any], name: str, shape: dict[str, Any] | None) -> str:
    """One metric's figure: its value; "bursty (not measurable)" for an ITL percentile that
    bursts made meaningless; empty when it was never measured (never 0.0)."""
    value = metrics.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:,.1f}"
    if name.startswith("itl_") and (shape or {}).get("itl") == "bursty":
        return "bursty (not measurable)"
    return ""


def doubts_html(trial: FrozenTrial | None) -> str:
    """What makes a trial's figures doubtful, as a warning: autotune's token count disagreeing
    with the server's (``measurement_suspect``), a host other work kept busy (``host``)."""
    attrs = trial.user_attrs if trial is not None else {}
    items = []
    suspect = attrs.get(names.MEASUREMENT_SUSPECT)
    if suspect:
        counts = ", ".join(
            f"{who} {suspect[key]}"
            for key, who in (("autotune", "autotune"), ("usage", "usage"), ("metrics", "/metrics"))
            if suspect.get(key) is not None
        )
        items.append(f"measurement suspect: output tokens counted by {counts}")
    host = attrs.get(names.HOST) or {}
    if host.get("noisy"):
        items.append("noisy host: " + "; ".join(map(str, host.get("reasons") or ())))
    if not items:
        return ""
    lis = "".join(f"<li>{esc(item)}</li>" for item in items)
    return f"<div class='warn doubts'><b>doubtful figures</b>: <ul>{lis}</ul></div>"


def traps_html(trial: FrozenTrial | None) -> str:
    """The measurement traps a trial was flagged for (a warm prefix cache, eager batches, a
    client that could not keep up), or nothing when none was flagged or none was recorded."""
    traps = (trial.user_attrs.get(names.TRAPS) if trial is not None else None) or {}
    flagged = [str(reason) for reason in traps.get("flagged") or []]
    if not flagged:
        return ""
    items = "".join(f"<li>{esc(reason)}</li>" for reason in flagged)
    return f"<div class='warn traps'><b>measurement traps</b>: <ul>{items}</ul></div>"
