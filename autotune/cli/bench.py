"""``autotune bench --url``: measure a server autotune did not start."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from autotune._files import check_output_target, write_text_atomically
from autotune.bench.remote import bench_remote, check_url, study_reference
from autotune.cli.common import console, fail
from autotune.cli.options import (
    DEFAULT_SPEC,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.cli.render import literal
from autotune.engines import build_engine
from autotune.engines.base import MetricsMap
from autotune.errors import AutotuneError, SpecError
from autotune.gate.reference import Reference
from autotune.spec.load import load_spec
from autotune.spec.model import StudySpec
from autotune.study.loop import study_target


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
        code = _run(
            study_spec,
            url,
            api_key=api_key,
            model=model,
            json_path=json_path,
            reference=reference,
            metrics_map=build_engine(study_spec).server_metrics_map(),
        )
    except AutotuneError as exc:
        raise fail(exc) from None
    raise typer.Exit(code=code)


def _run(
    spec: StudySpec,
    url: str,
    *,
    api_key: str | None,
    model: str | None,
    json_path: Path | None,
    reference: Reference | None,
    metrics_map: MetricsMap | None,
) -> int:
    """The body of ``autotune bench``: measure, print, write JSON. Returns the exit code."""

    if json_path is not None and not json_path.parent.is_dir():
        raise SpecError(f"directory does not exist: {json_path.parent}", key="--json")
    if json_path is not None:  # refused before the benchmark, not after it
        check_output_target(json_path, option="--json")
    result = asyncio.run(
        bench_remote(
            spec, url, api_key=api_key, model=model, reference=reference, metrics_map=metrics_map
        )
    )
    for notice in result.notices:  # the gate's limits, the count cross-check, the replay check
        console.print(f"[yellow]note:[/] {literal(notice)}")
    if result.check is not None:
        passed = result.check["passed"] and not (result.check.get("under_load") or {}).get(
            "divergent"
        )
        first = result.check.get("first_divergence") or (
            (result.check.get("under_load") or {}).get("first_divergence")
        )
        line = "[green]check passed[/]" if passed else "[bold red]check FAILED[/]"
        console.print(f"{line} ({result.check['prompts_checked']} prompts)")
        if first:
            console.print(
                f"  first divergence: prompt {first['prompt']!r} at {first['kind']} "
                f"{first['position']}: expected {first['expected_token']!r}, got "
                f"{first['got_token']!r}",
                markup=False,
                highlight=False,
            )
    if result.metrics and result.failure:
        # the figures of a failed benchmark (requests that failed, a runaway stream, answers
        # replayed from a cache) are not the server's speed
        console.print("[bold red]no figures:[/] the benchmark failed (below)")
    elif result.metrics:
        spread = result.bench.get("spread") or {}
        table = Table(title=literal(f"{result.url} ({result.model}), workload {spec.name}"))
        for col in ("metric", "value", "spread"):
            table.add_column(col)
        for name, value in sorted(result.metrics.items()):
            s = spread.get(name)
            table.add_row(name, f"{value:.2f}", "" if s is None else f"{s:.1%}")
        console.print(table)
    server = result.server_metrics
    if server.get("available"):
        total = server.get("total") or {}
        shown = ", ".join(f"{k} {v:g}" for k, v in sorted(total.items()))
        console.print(f"server metrics: {literal(shown)}")
        if total.get("preemptions"):
            console.print(f"[yellow]preemptions:[/] {total['preemptions']:g} during the benchmark")
    elif server:
        console.print(f"[dim]server metrics unavailable: {literal(str(server.get('reason')))}[/]")
    if json_path is not None:
        text = json.dumps(result.to_json(spec), indent=2, default=str) + "\n"
        write_text_atomically(json_path, text, option="--json")
        console.print(f"wrote {literal(json_path)}")
    if result.failure:
        console.print(f"[bold red]failed:[/] {literal(result.failure)}", soft_wrap=True)
        return 1
    return 0
