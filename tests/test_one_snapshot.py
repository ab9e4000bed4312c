"""One snapshot per read (issue #31 item 8).

``report``, ``show``, ``compare`` and ``export`` read a study's trials once and pass that list
down, so a trial a live study adds between two reads cannot make them disagree (``report``
crashed with StopIteration during a live study). Shown two ways: each reader calls
``get_trials`` exactly once on a study that grows at every call, and readers running while a
thread adds realistic trials never crash.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune import names
from autotune.analysis import compare as compare_mod
from autotune.report.html import build_report
from autotune.spec.load import load_spec
from autotune.study.export import export_best
from autotune.study.loop import open_study
from autotune.study.results import ReportSource, load_report, report_of
from tests.builders import DECODE_MS_SPACE, verified_trial, write_fake_spec

SPACE = DECODE_MS_SPACE
DIST = {"decode_ms": optuna.distributions.CategoricalDistribution([2, 40])}


def _trial(role: str, decode_ms: int, tps: float) -> optuna.trial.FrozenTrial:
    return verified_trial(role, decode_ms, tps, [2, 40])


@pytest.fixture
def study_setup(tmp_path: Path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="snap")
    spec = load_spec(spec_path)
    url = spec.default_storage()
    study, _ = open_study(spec, url)
    study.add_trial(_trial(names.BASELINE, 40, 100.0))
    return spec, url, study


class _Growing:
    """A study whose every ``get_trials`` returns one trial more (a live study, at its worst):
    the readers must ask once."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study
        self.reads = 0

    def get_trials(self, *args, **kwargs):
        self.reads += 1
        trials = self._study.get_trials(deepcopy=False)
        if self.reads > 1:  # a faster search trial appears after the first read
            extra = _trial("search", 2, 1000.0 + self.reads)
            trials = [*trials, extra]
        return trials

    @property
    def trials(self):
        return self.get_trials()

    def __getattr__(self, name):
        return getattr(self._study, name)


def test_report_reads_the_trials_once(study_setup) -> None:
    _, url, study = study_setup
    grown = _Growing(study)
    report_of(grown)
    assert grown.reads == 1
    grown = _Growing(study)
    build_report(grown, ReportSource(url))
    assert grown.reads == 1


def test_export_reads_the_trials_once(study_setup, tmp_path: Path) -> None:
    spec, _, study = study_setup
    grown = _Growing(study)
    export_best(spec, grown, tmp_path / "best.yaml", require_confirmed=False)
    assert grown.reads == 1


def test_compare_reads_the_trials_once(study_setup, monkeypatch: pytest.MonkeyPatch) -> None:
    _, url, study = study_setup
    grown = _Growing(study)
    monkeypatch.setattr(compare_mod, "load_study", lambda _url, _name: grown)
    compare_mod._side(compare_mod.StudyRef("snap", url, "snap"))
    assert grown.reads == 1


def test_readers_survive_a_live_study(study_setup, tmp_path: Path) -> None:
    spec, url, _ = study_setup
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        live = optuna.load_study(study_name="snap", storage=url)
        i = 0
        while not stop.is_set() and i < 400:
            try:
                live.add_trial(_trial("search", 2 if i % 2 else 40, 90.0 + i % 30))
                if i % 7 == 0:  # a trial still running, as a live study has
                    live.ask(DIST)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                return
            i += 1

    def reader(index: int) -> None:
        # show, report, compare and export, each from its own connection, all at once
        from rich.console import Console

        from autotune.cli import render

        quiet = Console(file=open(tmp_path / f"show{index}.txt", "w"), width=200)  # noqa: SIM115
        try:
            for round_ in range(5):
                study = optuna.load_study(study_name="snap", storage=url)
                build_report(study, ReportSource(url))
                load_report(url, "snap")
                with render_to(render, quiet):
                    render.print_report(url, "snap")
                compare_mod._side(compare_mod.StudyRef("snap", url, "snap"))
                out = tmp_path / f"best{index}-{round_}.yaml"
                export_best(spec, study, out, require_confirmed=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            quiet.file.close()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    readers = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(3)]
    try:
        for r in readers:
            r.start()
        for r in readers:
            r.join(timeout=600)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive() and not any(r.is_alive() for r in readers)
    assert not errors, errors


_RENDER_LOCK = threading.Lock()


@contextlib.contextmanager
def render_to(render, console) -> Iterator[None]:
    """``render.console`` swapped for ``console`` while one reader prints (the module global
    is shared by the threads, so one swaps it at a time)."""
    with _RENDER_LOCK:
        saved, render.console = render.console, console
        try:
            yield
        finally:
            render.console = saved
