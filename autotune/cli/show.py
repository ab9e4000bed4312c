"""``autotune show``: the study's trials as a table."""

from __future__ import annotations

from autotune.cli import render
from autotune.cli.common import fail, open_spec
from autotune.cli.options import (
    DEFAULT_SPEC,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.errors import AutotuneError
from autotune.storage import load_study


def show(spec: SpecOpt = DEFAULT_SPEC, study: StudyOpt = None, storage: StorageOpt = None) -> None:
    """A table of trials: state, verdict, key params, metrics, reason; best marked with *."""
    try:
        _, url, name = open_spec(spec, study, storage)
        render.print_report(url, name)
        # the verdict a reader needs first: a winner, or "the baseline stands" and why
        render.say_if_baseline_is_best(load_study(url, name))
    except AutotuneError as exc:
        raise fail(exc) from None
