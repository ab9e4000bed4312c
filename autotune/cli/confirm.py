"""``autotune confirm``: re-measure the top configs against the baseline."""

from __future__ import annotations

from typing import Annotated

import typer

from autotune import names
from autotune.cli import render
from autotune.cli.common import fail, open_spec
from autotune.cli.options import (
    DEFAULT_SPEC,
    ArtifactDirOpt,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.cli.run import confirm_phase
from autotune.errors import AutotuneError
from autotune.storage import artifact_dir_for, load_study
from autotune.study.budget import MAX_ROUNDS
from autotune.study.results import load_report


def confirm(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Candidates to re-measure.")] = 2,
    repeats: Annotated[
        int,
        typer.Option(
            "--repeats",
            min=2,
            help="Interleaved rounds of every candidate: the launches are repeats x (baseline "
            "+ candidates); the race stops earlier once the ranking is settled, and a dropped "
            "candidate's launches go to more rounds of the others.",
        ),
    ] = MAX_ROUNDS,
    artifact_dir: ArtifactDirOpt = None,
) -> None:
    """Re-measure the top configs interleaved with the baseline, racing (a candidate clearly
    below the leader is dropped, and it stops once settled); declare the winner with its gain
    and a 95% confidence interval."""
    try:
        study_spec, url, name = open_spec(spec, study, storage)
        artifact_dir_for(url, name, artifact_dir)
        load_study(url, name)  # a mistyped --study is an error, never a new study
        confirm_phase(study_spec, url, name, top=top, rounds=repeats, artifact_dir=artifact_dir)
        data = load_report(url, name).attrs.get(names.CONFIRMATION)
        if data:
            render.print_confirmation(data)
    except AutotuneError as exc:
        raise fail(exc) from None
