"""The ``autotune`` command line: one typer app, one module per command (``cli/<command>.py``).

Each command parses its options, calls one library function and renders the result with
:mod:`autotune.cli.render`; exit codes are in :mod:`autotune.cli.common`.
"""

from __future__ import annotations

import sys

import typer

from autotune.cli import (
    ablate,
    bench,
    cleanup,
    compare,
    confirm,
    dashboard,
    export,
    inspect,
    profile,
    recheck,
    render,
    report,
    run,
    show,
    validate,
)
from autotune.errors import AutotuneError, SpecError
from autotune.study.loop import quiet_optuna
from autotune.study.termination import stop_on_termination

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Autonomous, correctness-gated tuner for LLM inference servers.",
)


@app.callback()
def _quiet() -> None:
    # Optuna's per-trial INFO lines would drown the tables; set here, not at import.
    quiet_optuna()


app.command()(run.run)
app.command()(bench.bench)
app.command()(show.show)
app.command()(export.export)
app.command()(recheck.recheck)
app.command()(dashboard.dashboard)
app.command()(validate.validate)
app.command()(confirm.confirm)
app.command()(ablate.ablate)
app.command()(profile.profile)
app.command()(report.report)
app.command()(compare.compare)
app.command("inspect")(inspect.inspect_cmd)
app.command()(cleanup.cleanup)


def main() -> None:
    stop_on_termination()
    try:
        app()
    except AutotuneError as exc:  # pragma: no cover - commands map their own errors
        render.print_error(exc)
        sys.exit(2 if isinstance(exc, SpecError) else 1)


if __name__ == "__main__":
    main()
