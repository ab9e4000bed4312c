"""``autotune ablate``: revert each change of the best config: what really helped?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune._files import check_output_target
from autotune.analysis.ablation import run_ablation
from autotune.cli import render
from autotune.cli.common import console, fail, open_spec
from autotune.cli.options import (
    DEFAULT_SPEC,
    ArtifactDirOpt,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.engines.export_files import env_path_for
from autotune.errors import AutotuneError
from autotune.storage import artifact_dir_for, load_study
from autotune.study.export import check_output, export_values


def ablate(
    spec: SpecOpt = DEFAULT_SPEC,
    study: StudyOpt = None,
    storage: StorageOpt = None,
    repeats: Annotated[int, typer.Option("--repeats", min=2, help="Rounds per variant.")] = 3,
    trial: Annotated[
        int | None, typer.Option("--trial", help="Trial to ablate (default: best).")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Write the minimal config as export does."),
    ] = None,
    min_effect: Annotated[
        float,
        typer.Option(
            "--min-effect",
            min=0.0,
            max=1.0,
            help="Smallest relative change counted as an effect (default 5%).",
        ),
    ] = 0.05,
    artifact_dir: ArtifactDirOpt = None,
) -> None:
    """Revert each change of the best config one at a time: what really helped?"""
    try:
        study_spec, url, name = open_spec(spec, study, storage)
        artifact_dir_for(url, name, artifact_dir)
        if output is not None:  # refused before the first launch, not after the ablation
            check_output(study_spec, output, storage_url=url)
            for target in (output, env_path_for(output)):  # not a device, a FIFO, a folder
                check_output_target(target, option="--output")
        loaded = load_study(url, name, heartbeat=True)
        report = run_ablation(
            study_spec,
            loaded,
            url,
            repeats=repeats,
            trial_number=trial,
            min_effect=min_effect,
            artifact_dir=artifact_dir,
            on_phase=render.print_trial_phase,
        )
        render.print_ablation(report.to_dict())
        if output is not None:
            result = export_values(
                study_spec,
                report.minimal_values,
                output,
                title=f"minimal config from ablation of trial {report.trial_number}",
            )
            console.print(f"minimal config -> {render.literal(result.path)}")
    except AutotuneError as exc:
        raise fail(exc) from None
