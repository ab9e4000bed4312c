"""``autotune compare``: two studies or two exported configs side by side."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from autotune.analysis.compare import (
    ConfigComparison,
    MetricStat,
    StudyComparison,
    compare_configs,
    compare_studies,
    config_values,
    kind_of,
    verdict_line,
)
from autotune.cli.common import console, fail
from autotune.cli.options import (
    DEFAULT_SPEC,
    SpecOpt,
    StorageOpt,
)
from autotune.cli.render import literal
from autotune.errors import AutotuneError, SpecError
from autotune.spec.load import load_spec
from autotune.storage import safe_url


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
        code = _run(a, b, spec_path=spec, storage=storage, repeats=repeats)
    except AutotuneError as exc:
        raise fail(exc) from None
    raise typer.Exit(code=code)


def _run(a: str, b: str, *, spec_path: Path, storage: str | None, repeats: int) -> int:
    """`autotune compare A B`: check both arguments, compare, print. Returns the exit code."""
    kinds = (kind_of(a), kind_of(b))
    if kinds[0] != kinds[1]:
        raise SpecError(
            f"compare two studies or two exported configs, not a {kinds[0]} ({a}) with a "
            f"{kinds[1]} ({b})",
            key="A B",
        )
    if kinds[0] == "study":
        comparison = compare_studies(a, b)
        _print_studies(comparison)
        return 0

    spec = load_spec(spec_path)
    for path in (a, b):
        config_values(spec, Path(path))  # both checked before anything is launched
    result = compare_configs(
        spec,
        Path(a),
        Path(b),
        repeats=repeats,
        storage=storage,
        on_phase=lambda n, p: (
            console.print(f"[dim]trial {n}: {p}[/]") if p == "launching" else None
        ),
    )
    _print_configs(result)
    return 0 if result.a.samples and result.b.samples else 1


def _print_studies(c: StudyComparison) -> None:
    table = Table(title="compare: best config of each study")
    table.add_column("")
    table.add_column(f"A: {literal(c.a.ref.label)}", overflow="fold")
    table.add_column(f"B: {literal(c.b.ref.label)}", overflow="fold")
    table.add_row("study", literal(c.a.ref.name), literal(c.b.ref.name))
    table.add_row("engine", literal(c.a.engine or "-"), literal(c.b.engine or "-"))
    table.add_row("objective", ", ".join(c.a.objective), ", ".join(c.b.objective))
    table.add_row(
        "best trial",
        "none verified" if c.a.best is None else str(c.a.best),
        "none verified" if c.b.best is None else str(c.b.best),
    )
    table.add_row("verdicts", _verdicts(c.a.verdicts), _verdicts(c.b.verdicts))
    table.add_section()
    param_names = list(dict.fromkeys([*c.a.params, *c.b.params]))
    for name in param_names:
        style = "yellow" if name in c.changed else ""
        table.add_row(
            f"param {literal(name)}",
            literal(str(c.a.params.get(name, "-"))),
            literal(str(c.b.params.get(name, "-"))),
            style=style,
        )
    table.add_section()
    for name in dict.fromkeys([*c.a.metrics, *c.b.metrics]):
        table.add_row(
            literal(name), _stat_text(c.a.metrics.get(name)), _stat_text(c.b.metrics.get(name))
        )
    console.print(table)
    console.print(f"params that differ: {literal(', '.join(c.changed) or 'none')}")
    for note in c.notes:
        console.print(f"[yellow]{literal(note)}[/]")
    if c.metric and not c.notes:
        console.print(f"{c.metric}: {verdict_line(c)}")


def _verdicts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "no trials"


def _stat_text(stat: MetricStat | None) -> str:
    if stat is None:
        return "-"
    if stat.ci is None:
        return f"{stat.median:,.1f} (n=1, no interval)"
    return (
        f"{stat.median:,.1f} (95% CI {stat.ci[0]:,.1f} .. {stat.ci[1]:,.1f}, n={len(stat.samples)})"
    )


def _print_configs(c: ConfigComparison) -> None:
    for note in c.notes:
        console.print(f"[dim]{literal(note)}[/]")
    table = Table(title=f"compare: {c.metric} ({c.direction}), interleaved rounds through the gate")
    for col in ("config", "values", "samples", "median", "failures"):
        table.add_column(col, overflow="fold")
    for r in (c.a, c.b):
        table.add_row(
            literal(r.label),
            literal(", ".join(f"{k}={v}" for k, v in r.values.items()) or "(engine defaults)"),
            ", ".join(f"{x:,.1f}" for x in r.samples),
            f"{statistics.median(r.samples):,.1f}" if r.samples else "",
            literal(", ".join(r.failures)),
        )
    console.print(table)
    for r in (c.a, c.b):
        if r.failures and not r.samples:
            console.print(
                f"[red]{literal(r.label)} never passed the gate[/]: "
                f"{literal(', '.join(r.failures))}"
            )
    console.print(verdict_line(c))
    console.print(f"[dim]trials kept in study {c.study} ({literal(safe_url(c.storage_url))})[/]")
