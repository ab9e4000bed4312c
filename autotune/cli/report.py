"""``autotune report``: one self-contained HTML page of a study."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.cli import render
from autotune.cli.common import console, fail, open_study_of
from autotune.cli.options import (
    DEFAULT_SPEC,
    StorageOpt,
    StudyOpt,
)
from autotune.errors import AutotuneError
from autotune.report.html import write_report


def report(
    spec: Annotated[Path | None, typer.Option("--spec", help="Study spec YAML.")] = None,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="HTML file to write.")] = Path(
        "report.html"
    ),
) -> None:
    """Write one self-contained HTML report of a study (opens from disk, no network)."""
    try:
        url, name = open_study_of(spec, study, storage, DEFAULT_SPEC)
        path = write_report(url, name, output, spec_path=str(spec) if spec else None)
    except AutotuneError as exc:
        raise fail(exc) from None
    console.print(f"report of study {render.literal(name)} -> {render.literal(path)}")
