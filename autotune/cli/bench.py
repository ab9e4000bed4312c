"""``autotune bench --url``: measure a server autotune did not start."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.bench.remote import check_url, run_command, study_reference
from autotune.cli.common import console, fail
from autotune.cli.options import (
    DEFAULT_SPEC,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.engines import build_engine
from autotune.errors import AutotuneError
from autotune.spec.load import load_spec
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
        raise fail(exc) from None
    raise typer.Exit(code=code)
