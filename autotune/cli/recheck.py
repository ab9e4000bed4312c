"""``autotune recheck``: is an exported config still correct and not slower?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.analysis.recheck import run_recheck
from autotune.cli import render
from autotune.cli.common import fail
from autotune.cli.options import (
    StorageOpt,
)
from autotune.errors import AutotuneError


def recheck(
    best: Annotated[Path, typer.Argument(help="A file written by `autotune export`.")],
    spec: Annotated[
        Path | None,
        typer.Option("--spec", help="Study spec (default: the one recorded at export)."),
    ] = None,
    storage: StorageOpt = None,
    rounds: Annotated[
        int, typer.Option("--rounds", min=1, help="Interleaved rounds (2 launches each).")
    ] = 1,
    min_effect: Annotated[
        float,
        typer.Option("--min-effect", min=0.0, max=1.0, help="Noise band floor (default 10%)."),
    ] = 0.10,
) -> None:
    """After an upgrade: is the exported config still correct and not slower? Exit 0 if so,
    1 with the reason (and the guilty parameter) if not."""
    try:
        result = run_recheck(
            best,
            spec_path=spec,
            storage=storage,
            rounds=rounds,
            min_effect=min_effect,
            on_phase=render.print_trial_phase,
        )
    except AutotuneError as exc:
        raise fail(exc) from None
    render.print_recheck(best, result)
    if not result.ok:
        raise typer.Exit(code=1)
