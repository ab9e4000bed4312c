"""``autotune compare``: two studies or two exported configs side by side."""

from __future__ import annotations

from typing import Annotated

import typer

from autotune.analysis.compare import run_compare_command
from autotune.cli.common import console, fail
from autotune.cli.options import (
    DEFAULT_SPEC,
    SpecOpt,
    StorageOpt,
)
from autotune.errors import AutotuneError


def compare(
    a: Annotated[str, typer.Argument(help="A study (spec file or NAME@URL) or exported config.")],
    b: Annotated[str, typer.Argument(help="The other, of the same kind.")],
    spec: SpecOpt = DEFAULT_SPEC,
    storage: StorageOpt = None,
    repeats: Annotated[int, typer.Option("--repeats", min=2, help="Rounds per config.")] = 2,
) -> None:
    """Two studies or two exported configs side by side; configs are launched, interleaved,
    through the gate, and the answer says whether the difference is real."""
    try:
        code = run_compare_command(console, a, b, spec_path=spec, storage=storage, repeats=repeats)
    except AutotuneError as exc:
        raise fail(exc) from None
    raise typer.Exit(code=code)
