"""``autotune validate``: every parameter checked against the installed engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.cli import render
from autotune.cli.common import console, err, fail
from autotune.cli.render import literal
from autotune.engines import build_engine
from autotune.errors import AutotuneError
from autotune.spec.load import load_spec


def validate(spec: Annotated[Path, typer.Argument(help="Study spec YAML.")]) -> None:
    """Check every parameter against the installed engine; exit 2 on any error."""
    try:
        study_spec = load_spec(spec)
        engine = build_engine(study_spec)
        issues = engine.validate_space(study_spec.space)
    except AutotuneError as exc:
        raise fail(exc) from None
    bad = render.print_validation(issues)
    if bad:
        err.print(
            f"{bad} of {len(issues)} parameters invalid in {literal(str(study_spec.space.path))}"
        )
        raise typer.Exit(code=2)
    against = literal(f"{study_spec.engine.kind} {engine.version()}")
    unchecked = sum(1 for issue in issues if issue.unchecked)
    if unchecked:
        console.print(
            f"{unchecked} of {len(issues)} parameters could not be checked against {against} "
            f"(no error found in the {len(issues) - unchecked} checked)"
        )
    else:
        console.print(f"all {len(issues)} parameters valid against {against}")
    # the parameters are the check; a model this engine cannot load here is worth a line, since
    # `autotune run` will stop at its preflight
    problem = engine.model_problem()
    if problem is not None:
        err.print(f"note: autotune run will refuse this spec on this machine: {literal(problem)}")
