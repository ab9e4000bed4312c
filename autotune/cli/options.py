"""The options several ``autotune`` commands share, declared once (typer's ``Annotated`` form)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from autotune.cli import render
from autotune.errors import SpecError
from autotune.spec.checks import unknown_scheme


def _checked(option: str, *, url: bool = False) -> Callable[[str | None], str | None]:
    """A path or URL option, refused at once in the one-line form of every bad input when it
    holds a NUL character (``ValueError: embedded null byte``, a traceback with exit code 1,
    came from deep inside the storage or the artifact store) or, for a URL, names a database
    SQLAlchemy does not know (that read "storage unreachable: NoSuchModuleError")."""

    def check(value: str | None) -> str | None:
        problem = None
        if value is not None and "\0" in value:
            problem = f"contains a NUL character: {value!r}"
        elif value is not None and url:
            problem = unknown_scheme(value)
        if problem:
            render.print_error(SpecError(problem, key=option))
            raise typer.Exit(code=2)
        return value

    return check


def worker_env_problem(value: str) -> str | None:
    """Why ``--worker-env`` is not a JSON object of strings to strings (the environment a
    ``--parallel`` parent hands each worker), or None."""
    try:
        env = json.loads(value)
    except ValueError as exc:  # JSONDecodeError, and a lone surrogate's UnicodeDecodeError
        return f"not JSON: {exc}"
    if not isinstance(env, dict):
        return f"must be a JSON object of names to strings, got {type(env).__name__}"
    for name, text in env.items():
        if not name or "=" in name or "\0" in name:
            return f"{name!r} is not an environment variable name"
        if not isinstance(text, str):
            return f"{name}: must be a string, got {json.dumps(text)}"
        if "\0" in text:
            return f"{name}: a value cannot hold a NUL character"
    return None


def _checked_worker_env(value: str | None) -> str | None:
    """``--worker-env``, refused at option parsing (exit 2) before anything is written: a list
    or a number there raised a TypeError traceback after the study and its artifact directory
    were made."""
    if value is not None:
        problem = worker_env_problem(value)
        if problem:
            render.print_error(SpecError(problem, key="--worker-env"))
            raise typer.Exit(code=2)
    return value


DEFAULT_SPEC = Path("studies/demo.yaml")
SpecOpt = Annotated[Path, typer.Option("--spec", help="Study spec YAML.")]
StudyOpt = Annotated[str | None, typer.Option("--study", help="Study name (default: the spec's).")]
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="SQLAlchemy URL (default: SQLite studies/<study>.db beside the spec).",
        callback=_checked("--storage", url=True),
    ),
]
ArtifactDirOpt = Annotated[
    str | None,
    typer.Option(
        "--artifact-dir",
        help="Where server logs and outputs are stored (default: <study>-artifacts beside the "
        "SQLite file).",
        callback=_checked("--artifact-dir"),
    ),
]
#: NumPy's and Optuna's generators take 0 .. 2**32 - 1; outside it they raised a traceback
SeedOpt = Annotated[int | None, typer.Option("--seed", min=0, max=2**32 - 1, help="Sampler seed.")]
WorkerEnvOpt = Annotated[
    str | None,
    typer.Option(
        "--worker-env",
        hidden=True,
        help="JSON env of one worker's device set (internal).",
        callback=_checked_worker_env,
    ),
]
