"""The options several ``autotune`` commands share, declared once (typer's ``Annotated`` form)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DEFAULT_SPEC = Path("studies/demo.yaml")
SpecOpt = Annotated[Path, typer.Option("--spec", help="Study spec YAML.")]
StudyOpt = Annotated[str | None, typer.Option("--study", help="Study name (default: the spec's).")]
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage", help="SQLAlchemy URL (default: SQLite studies/<study>.db beside the spec)."
    ),
]
ArtifactDirOpt = Annotated[
    str | None,
    typer.Option(
        "--artifact-dir",
        help="Where server logs and outputs are stored (default: <study>-artifacts beside the "
        "SQLite file).",
    ),
]
#: NumPy's and Optuna's generators take 0 .. 2**32 - 1; outside it they raised a traceback
SeedOpt = Annotated[int | None, typer.Option("--seed", min=0, max=2**32 - 1, help="Sampler seed.")]
