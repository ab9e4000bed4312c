"""``autotune cleanup``: stop what killed runs left behind."""

from __future__ import annotations

from autotune.cli import render
from autotune.cli.common import console, fail, open_spec
from autotune.cli.options import (
    DEFAULT_SPEC,
    SpecOpt,
    StorageOpt,
    StudyOpt,
)
from autotune.errors import AutotuneError
from autotune.storage import load_study
from autotune.study.cleanup import cleanup_stale
from autotune.study.loop import open_study


def cleanup(
    spec: SpecOpt = DEFAULT_SPEC, study: StudyOpt = None, storage: StorageOpt = None
) -> None:
    """Stop servers left by killed runs and mark their trials interrupted (re-enqueued)."""
    try:
        study_spec, url, name = open_spec(spec, study, storage)
        load_study(url, name)  # a mistyped --study is an error, never a new study
        loaded, _ = open_study(study_spec, url, study_name=name)
        messages = cleanup_stale(loaded)
    except AutotuneError as exc:
        raise fail(exc) from None
    for line in messages or ["nothing to clean up"]:
        console.print(render.literal(line))
