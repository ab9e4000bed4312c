"""``autotune export``: the best confirmed config in the engine's own terms."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.cli import render
from autotune.cli.common import fail, open_spec
from autotune.cli.options import (
    DEFAULT_SPEC,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.errors import AutotuneError
from autotune.storage import load_study
from autotune.study.export import default_output, export_best


def export(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="File to write, with its .env beside it (default: best.yaml, a config file, "
            "for vLLM and the command engine; best.sh, a launch script, for llama.cpp).",
        ),
    ] = None,
    pareto: Annotated[
        bool, typer.Option("--pareto", help="Export the whole Pareto front.")
    ] = False,
    allow_unconfirmed: Annotated[
        bool,
        typer.Option(
            "--allow-unconfirmed",
            help="Export the best measured verified trial even if it is not a confirmed gain "
            "(no confirmation ran, or its interval includes no change); the file's first "
            "line then says so.",
        ),
    ] = False,
) -> None:
    """Write the best verified config in the engine's own terms: a YAML file for `vllm serve
    --config FILE`, a launch script for llama.cpp's llama-server; a .env file beside it."""
    try:
        study_spec, url, name = open_spec(spec, study, storage)
        loaded = load_study(url, name)
        results = export_best(
            study_spec,
            loaded,
            output or default_output(study_spec),
            pareto=pareto,
            require_confirmed=not allow_unconfirmed,
            storage_url=url,
        )
    except AutotuneError as exc:
        raise fail(exc) from None
    render.print_exports(results)
