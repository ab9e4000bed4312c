"""The report's "where the step time goes" section, from the study's stored profiles.

Kept apart from ``html.py`` (page assembly) because it reads one attribute with its own
shape (``autotune.analysis.profile``): baseline and winner as stacked bars of ms per output token by
category, and the table ``autotune show`` prints, so the page and the terminal agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune import names
from autotune.analysis.profile import sort_profiles, table_rows
from autotune.report.format import esc

HEAD = "<section id='step-time'><h2>Where the step time goes</h2>"


def section(attrs: dict[str, Any], plot: Callable[[Any, str], str]) -> str:
    """HTML for the section; ``plot(fig, name)`` renders a plotly figure into the page."""
    stored = attrs.get(names.PROFILES)
    if not stored:
        return (
            f"{HEAD}<p class='note'>No profile stored. <code>autotune profile</code> launches "
            "the baseline and the best config with the engine's profiler and splits the time "
            "per output token into categories.</p></section>"
        )
    import plotly.graph_objects as go  # heavy: only when there is something to draw

    profiles = sort_profiles(stored)
    labels = [f"trial {p['trial']} ({p['role']})" for p in profiles]
    categories: list[str] = []
    for p in profiles:
        categories += [c for c in p["per_token_ms"] if c not in categories]
    fig = go.Figure(
        [
            go.Bar(name=c, x=labels, y=[p["per_token_ms"].get(c) for p in profiles])
            for c in categories
        ]
    )
    fig.add_trace(
        go.Scatter(
            name="client per token (profiled)",
            x=labels,
            y=[p["profiled_ms_per_token"] for p in profiles],
            mode="markers",
            marker={"symbol": "diamond", "size": 12, "color": "black"},
        )
    )
    fig.update_layout(
        barmode="stack", title="ms per output token (decode)", yaxis_title="ms / token"
    )
    header, rows = table_rows(profiles)
    head_html = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    notes = "".join(
        f"<p class='note'>trial {p['trial']}: the trace accounts for {p['coverage']:.0%} of "
        "the time the client measured per token; read its categories with care.</p>"
        for p in profiles
        if not p.get("consistent", True)
    )
    table = f"<table><tr>{head_html}</tr>{body}</table>"
    return f"{HEAD}{plot(fig, 'step-time')}{table}{notes}</section>"
