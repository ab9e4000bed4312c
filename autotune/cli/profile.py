"""``autotune profile``: where the step time goes, per category."""

from __future__ import annotations

from typing import Annotated

import typer

from autotune.analysis.profile import run_profiles
from autotune.cli import render
from autotune.cli.common import fail, open_spec
from autotune.cli.options import (
    DEFAULT_SPEC,
    ArtifactDirOpt,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.errors import AutotuneError
from autotune.storage import artifact_dir_for, load_study


def profile(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    trial: Annotated[
        list[int] | None,
        typer.Option("--trial", help="Trial to profile (repeatable; default: baseline and best)."),
    ] = None,
    tokens: Annotated[
        int, typer.Option("--tokens", min=8, help="Output tokens in the profiled decode window.")
    ] = 128,
    artifact_dir: ArtifactDirOpt = None,
) -> None:
    """Where the step time goes: launch configs with the engine's profiler, ms per token by
    category (baseline and best side by side), stored in the study."""
    try:
        study_spec, url, name = open_spec(spec, study, storage)
        directory = artifact_dir_for(url, name, artifact_dir)
        loaded = load_study(url, name, heartbeat=True)
        results = run_profiles(
            study_spec,
            loaded,
            directory,
            trials=trial or (),
            tokens=tokens,
            on_phase=render.print_trial_phase,
        )
    except AutotuneError as exc:
        raise fail(exc) from None
    render.print_profile_run(results, chosen_by_default=not trial)
