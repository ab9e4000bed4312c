"""What every command shares: the consoles, and one way to turn an error into an exit code.

Exit codes: 0 success, 1 a run ended without success, 2 bad input (spec, search space, CLI value,
storage URL), 3 preflight failed (engine missing, baseline broken), 130 interrupted.
"""

from __future__ import annotations

from pathlib import Path

import typer

from autotune.analysis.compare import study_ref
from autotune.cli import render
from autotune.errors import AutotuneError, PreflightError, SpecError
from autotune.spec.load import load_spec
from autotune.spec.model import StudySpec
from autotune.storage import check_study_name, resolve_url
from autotune.study.loop import study_target

console, err = render.console, render.err


def fail(exc: AutotuneError) -> typer.Exit:
    """Bad input exits 2, a failed preflight 3, anything else 1 (see the module docstring)."""
    render.print_error(exc)
    return typer.Exit(
        code=2 if isinstance(exc, SpecError) else 3 if isinstance(exc, PreflightError) else 1
    )


def open_spec(
    spec_path: Path, study: str | None, storage: str | None, *, existing: bool = True
) -> tuple[StudySpec, str, str]:
    """The spec, the storage URL and the study name from the options (the spec's defaults
    otherwise), every one checked before anything is written (``study.study_target``)."""
    study_spec = load_spec(spec_path)
    return (study_spec, *study_target(study_spec, study, storage, existing=existing))


def open_study_of(
    spec_path: Path | None, study: str | None, storage: str | None, default_spec: Path
) -> tuple[str, str]:
    """The storage URL and study name a reading command opens: ``--study`` with ``--storage``
    need no spec file (the study is read from its storage alone); otherwise the spec's
    (``default_spec`` when none is given)."""
    if spec_path is None and study is not None and storage is not None:
        # each checked under its own option first: study_ref names a bad one by its whole
        # NAME@URL argument, which would print the URL's password
        check_study_name(study)
        resolve_url(storage)
        ref = study_ref(f"{study}@{storage}")
        return ref.url, ref.name
    _, url, name = open_spec(spec_path or default_spec, study, storage)
    return url, name
