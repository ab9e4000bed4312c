"""``autotune dashboard``: optuna-dashboard on the study's storage."""

from __future__ import annotations

import os
import subprocess
from typing import Annotated

import typer

from autotune.cli import render
from autotune.cli.common import console, fail, open_spec
from autotune.cli.options import (
    DEFAULT_SPEC,
    ArtifactDirOpt,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.errors import AutotuneError
from autotune.storage import artifact_dir_for, dashboard_command


def dashboard(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 8080,
    artifact_dir: ArtifactDirOpt = None,
) -> None:
    """Open optuna-dashboard on the study's storage (with its artifacts)."""
    try:
        _, url, name = open_spec(spec, study, storage)
        artifacts = artifact_dir_for(url, name, artifact_dir)
        argv, env = dashboard_command(url, artifacts, port)
    except AutotuneError as exc:
        raise fail(exc) from None
    console.print(f"optuna-dashboard on http://127.0.0.1:{port} (study {render.literal(name)})")
    raise typer.Exit(code=subprocess.call(argv, env={**os.environ, **env}))
