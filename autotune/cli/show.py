"""``autotune show``: the study's trials as a table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.cli import render
from autotune.cli.common import fail, open_study_of
from autotune.cli.options import (
    DEFAULT_SPEC,
    StorageOpt,
    StudyOpt,
)
from autotune.errors import AutotuneError


def show(
    spec: Annotated[
        Path | None,
        typer.Option("--spec", help="Study spec YAML (not needed with --study and --storage)."),
    ] = None,
    study: StudyOpt = None,
    storage: StorageOpt = None,
) -> None:
    """A table of trials: state, verdict, key params, metrics, reason; best marked with *."""
    try:
        url, name = open_study_of(spec, study, storage, DEFAULT_SPEC)
        opened, trials = render.print_report(url, name)
        # the verdict a reader needs first: a winner, or "the baseline stands" and why; from
        # the same snapshot as the table, so a trial added meanwhile cannot make them disagree
        render.say_if_baseline_is_best(opened, trials=trials)
    except AutotuneError as exc:
        raise fail(exc) from None
