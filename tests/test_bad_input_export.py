"""Bad input to `recheck`, `export` and `ablate`: one error naming the file (and the key), exit
code 2, no traceback, and nothing written or launched.

* `recheck` of a malformed record (not UTF-8, a number of 5000 digits, nesting deeper than the
  parser goes, a field of the wrong type) crashed with a traceback (exit 1);
* `recheck` of a config whose spec `run` refuses (a model that is not there) created a study and
  its artifacts and launched servers;
* `export -o` overwrote its own .env or a file of the study (the spec, the search space, the
  workload file, the SQLite storage) with exit 0;
* `ablate --trial 0` (the baseline: no change) launched servers to ablate nothing;
* `export -o`, `report -o`, `ablate -o`, `bench --json` over a device or a FIFO replaced it with
  a regular file (`export -o /dev/null` as root replaced the system's /dev/null).

None of these tests launches a server: every study is built from stored trials.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from autotune import names
from autotune._files import write_files_atomically
from autotune.cli.app import app
from autotune.spec.load import load_spec
from autotune.study.loop import open_study
from tests.builders import DECODE_MS_SPACE, verified_trial, write_fake_spec

SPACE = DECODE_MS_SPACE
CHOICES = [2, 40]


def _snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every path under ``directory`` with its bytes (None for a folder): what "nothing written"
    is checked against."""
    return {
        str(p.relative_to(directory)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(directory.rglob("*"))
    }


def _refused(ran, *fragments: str) -> str:
    """The run ended with exit 2 and one error line holding every fragment, no traceback."""
    assert ran.exit_code == 2, ran.output
    assert ran.exception is None or isinstance(ran.exception, SystemExit), ran.exception
    assert "Traceback" not in ran.output
    errors = [line for line in ran.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, ran.output
    for fragment in fragments:
        assert fragment in errors[0], ran.output
    return errors[0]


def _study(tmp_path: Path, *, name: str = "bad", workload: dict | None = None) -> Path:
    """A study of the fake spec with its verified baseline and a faster verified trial, stored
    without launching anything; returns the spec's path."""
    spec_path = write_fake_spec(tmp_path, SPACE, name=name, workload=workload)
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    study.add_trial(verified_trial(names.BASELINE, 40, 100.0, CHOICES))
    study.add_trial(verified_trial("search", 2, 150.0, CHOICES))
    return spec_path


# --- recheck: a malformed record ----------------------------------------------------------------


def _record(spec_path: Path, **extra) -> str:
    fields = {"version": 1, "spec": str(spec_path.resolve()), "values": {"decode_ms": 2}}
    return json.dumps({**fields, **extra}, ensure_ascii=False)


MALFORMED = {
    # a Latin-1 byte (the audit's best_latin1.yaml)
    "latin1": (
        lambda spec: ("# autotune-record: " + _record(spec, x="caf\xe9")).encode("latin-1"),
        ("not UTF-8 text",),
    ),
    # a 5000-digit integer: json.loads raises ValueError (Python's int conversion limit)
    "bigint": (
        lambda spec: (
            "# autotune-record: " + _record(spec)[:-1] + ', "x": ' + "9" * 5000 + "}"
        ).encode(),
        ("autotune-record: malformed record line", "4300 digits"),
    ),
    # nesting deeper than the parser goes: RecursionError
    "deep": (
        lambda spec: (
            "# autotune-record: " + _record(spec)[:-1] + ', "x": ' + "[" * 100_000
        ).encode(),
        ("autotune-record: malformed record line: nested too deeply",),
    ),
    # "spec": 5: TypeError from Path(5)
    "spec_int": (
        lambda spec: b'# autotune-record: {"spec": 5, "values": {"decode_ms": 2}}',
        ("autotune-record.spec: must be the path of the study spec",),
    ),
    # the figures recheck compares with, of the wrong type: an AttributeError after launching
    "metrics_list": (
        lambda spec: ("# autotune-record: " + _record(spec, metrics=[1, 2])).encode(),
        ("autotune-record.metrics: must be an object of metric names and numbers",),
    ),
    "metric_text": (
        lambda spec: (
            "# autotune-record: " + _record(spec, metrics={"decode_tokens_per_s": "fast"})
        ).encode(),
        ("autotune-record.metrics: must be an object of metric names and numbers",),
    ),
    "value_object": (
        lambda spec: (
            "# autotune-record: " + _record(spec, values={"decode_ms": {"a": 1}})
        ).encode(),
        ("autotune-record.values.decode_ms: must be a parameter value",),
    ),
    "record_list": (lambda spec: b"# autotune-record: [1, 2]", ("autotune-record: must be",)),
    # a value of 400 digits: outside the domain, said as such (and not printed whole)
    "value_huge": (
        lambda spec: (
            "# autotune-record: " + _record(spec, values={"decode_ms": int("9" * 400)})
        ).encode(),
        ("autotune-record.values.decode_ms", "outside the parameter's domain", "..."),
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_recheck_of_a_malformed_record_exits_2_naming_the_file(tmp_path, case):
    spec_path = _study(tmp_path)
    make, fragments = MALFORMED[case]
    best = tmp_path / "best.yaml"
    best.write_bytes(make(spec_path) + b"\ndecode_ms: 2\n")
    before = _snapshot(tmp_path)
    ran = CliRunner().invoke(app, ["recheck", str(best)])
    _refused(ran, str(best), *fragments)
    assert _snapshot(tmp_path) == before  # no recheck study, no artifacts


def test_recheck_of_a_record_without_a_spec_asks_for_spec(tmp_path):
    spec_path = _study(tmp_path)
    best = tmp_path / "best.yaml"
    best.write_text('# autotune-record: {"values": {"decode_ms": 2}}\ndecode_ms: 2\n')
    before = _snapshot(tmp_path)
    ran = CliRunner().invoke(app, ["recheck", str(best)])
    _refused(ran, str(best), "autotune-record.spec", "--spec")
    assert _snapshot(tmp_path) == before
    assert spec_path.exists()


# --- recheck: what `run` refuses ----------------------------------------------------------------


def test_recheck_runs_the_preflight_of_run_before_creating_anything(tmp_path):
    """A spec whose model is not there: `run` refuses it in its preflight (exit 2); `recheck`
    refuses it with the same error, before its study, its artifacts or any launch."""
    spec_path = write_fake_spec(tmp_path, SPACE, name="nomodel")
    spec = yaml.safe_load(spec_path.read_text())
    spec["model"]["path"] = "/nonexistent/model"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    best = tmp_path / "best.yaml"
    best.write_text(f"# autotune-record: {_record(spec_path)}\ndecode_ms: 2\n")
    before = _snapshot(tmp_path)

    ran = CliRunner().invoke(app, ["recheck", str(best)])
    line = _refused(ran, str(spec_path.resolve()), "model.path", "model not found")
    assert _snapshot(tmp_path) == before  # no nomodel.db, no recheck-*-artifacts

    by_run = CliRunner().invoke(app, ["run", "--spec", str(spec_path), "--trials", "1"])
    assert by_run.exit_code == 2, by_run.output
    assert line.replace(str(spec_path.resolve()), str(spec_path)) in by_run.output.replace(
        str(spec_path.resolve()), str(spec_path)
    )
    # --spec names the same spec: refused the same way
    ran = CliRunner().invoke(app, ["recheck", str(best), "--spec", str(spec_path)])
    _refused(ran, "model.path", "model not found")
    assert not (tmp_path / "nomodel.db").exists()


# --- export -o: its own .env, the study's files -------------------------------------------------


@pytest.mark.parametrize(
    ("output", "what"),
    [
        ("out.env", "both the config and the .env file"),
        ("space.yaml", "is the search-space file"),
        ("bad.yaml", "is the study spec"),
        ("bad.db", "is the study's SQLite storage"),
        ("sub/../bad.db", "is the study's SQLite storage"),
    ],
)
def test_export_refuses_to_overwrite_its_env_or_the_studys_files(
    tmp_path, monkeypatch, output, what
):
    spec_path = _study(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    ran = CliRunner().invoke(
        app, ["export", "--spec", str(spec_path), "-o", output, "--allow-unconfirmed"]
    )
    _refused(ran, "--output", what)
    assert _snapshot(tmp_path) == before
    assert load_spec(spec_path).name == "bad"  # the spec (and its space) still load


def test_export_refuses_a_config_whose_env_would_overwrite_a_study_file(tmp_path):
    """``-o space.yaml`` of a study whose search space is ``space.env``: the config is no study
    file, but the .env written beside it would be."""
    spec_path = _study(tmp_path)
    spec = yaml.safe_load(spec_path.read_text())
    spec["search_space"] = "space.env"
    (tmp_path / "space.yaml").rename(tmp_path / "space.env")
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    before = _snapshot(tmp_path)
    out = tmp_path / "space.yaml"
    ran = CliRunner().invoke(
        app, ["export", "--spec", str(spec_path), "-o", str(out), "--allow-unconfirmed"]
    )
    _refused(ran, "--output", f"(the .env beside {out}) is the search-space file")
    assert _snapshot(tmp_path) == before


def test_export_refuses_the_workload_file_and_the_storage_given_with_storage(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1 2 3"}\n{"prompt": "a b c"}\n')
    spec_path = write_fake_spec(tmp_path, SPACE, name="wl")
    spec = yaml.safe_load(spec_path.read_text())
    del spec["workload"]["prompts"]
    spec["workload"]["file"] = "prompts.jsonl"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    loaded = load_spec(spec_path)
    for storage in (None, url):
        study, _ = open_study(loaded, storage or loaded.default_storage())
        study.add_trial(verified_trial(names.BASELINE, 40, 100.0, CHOICES))
        study.add_trial(verified_trial("search", 2, 150.0, CHOICES))
    before = _snapshot(tmp_path)
    runner = CliRunner()
    export = ["export", "--spec", str(spec_path), "--allow-unconfirmed"]
    ran = runner.invoke(app, [*export, "-o", str(prompts)])
    _refused(ran, "--output", "is the workload file")
    ran = runner.invoke(app, [*export, "--storage", url, "-o", str(tmp_path / "elsewhere.db")])
    _refused(ran, "--output", "is the study's SQLite storage")
    assert _snapshot(tmp_path) == before
    # and a plain name is written, both files
    ran = runner.invoke(app, [*export, "--storage", url, "-o", str(tmp_path / "best.yaml")])
    assert ran.exit_code == 0, ran.output
    assert (tmp_path / "best.yaml").is_file() and (tmp_path / "best.env").is_file()


def test_export_pareto_checks_every_file_before_writing_any(tmp_path, monkeypatch):
    spec_path = _study(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    ran = CliRunner().invoke(app, ["export", "--spec", str(spec_path), "--pareto", "-o", "out.env"])
    _refused(ran, "--output", "both the config and the .env file")
    assert _snapshot(tmp_path) == before


# --- ablate -------------------------------------------------------------------------------------


def _trials(spec_path: Path) -> list[optuna.trial.FrozenTrial]:
    spec = load_spec(spec_path)
    return optuna.load_study(study_name=spec.name, storage=spec.default_storage()).trials


def _stored(spec_path: Path, role: str) -> int:
    """The number of the stored (COMPLETE) trial of ``role`` (``open_study`` may have queued a
    baseline before it)."""
    [number] = [
        t.number
        for t in _trials(spec_path)
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get(names.ROLE) == role
    ]
    return number


def test_ablate_of_the_baseline_trial_is_refused_before_any_launch(tmp_path):
    """Without --trial, a study whose best is the baseline is refused ("no change to ablate");
    naming the baseline with --trial is refused the same way, before anything is launched."""
    spec_path = _study(tmp_path)
    base = _stored(spec_path, names.BASELINE)
    trials, before = len(_trials(spec_path)), _snapshot(tmp_path)
    ran = CliRunner().invoke(app, ["ablate", "--spec", str(spec_path), "--trial", str(base)])
    _refused(ran, "--trial", f"trial {base} is the baseline: there is no change to ablate")
    assert len(_trials(spec_path)) == trials  # no ablation trial
    assert not (tmp_path / "bad-artifacts").exists()
    assert _snapshot(tmp_path).keys() == before.keys()


def test_ablate_of_a_trial_with_the_baselines_values_is_refused(tmp_path):
    spec_path = _study(tmp_path)
    spec = load_spec(spec_path)
    study = optuna.load_study(study_name=spec.name, storage=spec.default_storage())
    study.add_trial(verified_trial("repeat", 40, 101.0, CHOICES))  # the baseline's values
    number = _stored(spec_path, "repeat")
    trials = len(_trials(spec_path))
    ran = CliRunner().invoke(app, ["ablate", "--spec", str(spec_path), "--trial", str(number)])
    _refused(
        ran, "--trial", f"trial {number} runs the baseline's values: there is no change to ablate"
    )
    assert len(_trials(spec_path)) == trials
    assert not (tmp_path / "bad-artifacts").exists()


def test_ablate_of_a_best_with_the_baselines_values_is_refused(tmp_path):
    """Without --trial: the best is a search trial that drew the baseline's values (measured
    faster by noise); there is nothing to revert, so nothing is launched."""
    spec_path = _study(tmp_path)
    spec = load_spec(spec_path)
    study = optuna.load_study(study_name=spec.name, storage=spec.default_storage())
    study.add_trial(verified_trial("search", 40, 500.0, CHOICES))  # the baseline's values
    number = max(t.number for t in _trials(spec_path))
    trials = len(_trials(spec_path))
    ran = CliRunner().invoke(app, ["ablate", "--spec", str(spec_path)])
    _refused(
        ran,
        "--trial",
        f"trial {number} (the best config) runs the baseline's values: there is no change",
    )
    assert len(_trials(spec_path)) == trials
    assert not (tmp_path / "bad-artifacts").exists()


def test_ablate_output_over_a_study_file_is_refused_before_any_launch(tmp_path):
    spec_path = _study(tmp_path)
    number = _stored(spec_path, "search")
    trials, before = len(_trials(spec_path)), _snapshot(tmp_path)
    space = tmp_path / "space.yaml"
    ran = CliRunner().invoke(
        app, ["ablate", "--spec", str(spec_path), "--trial", str(number), "-o", str(space)]
    )
    _refused(ran, "--output", "is the search-space file")
    assert len(_trials(spec_path)) == trials
    assert _snapshot(tmp_path).keys() == before.keys()
    assert space.read_bytes() == before["space.yaml"]


# --- -o over a FIFO, a device, a folder: refused, never replaced --------------------------------
# The write renames a new file over the name: `export -o /dev/null` run as root replaced the
# system's /dev/null with a regular file (and wrote /dev/null.env). These tests use a FIFO made
# in tmp_path (never a system path) and a symlink to it.


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _still_a_fifo(path: Path) -> None:
    assert stat.S_ISFIFO(os.stat(path).st_mode), f"{path} was replaced"


@pytest.mark.parametrize("how", ["fifo", "symlink_to_fifo", "env_is_fifo", "folder"])
def test_export_refuses_an_output_that_is_not_a_regular_file(tmp_path, how):
    spec_path = _study(tmp_path)
    fifo = _fifo(tmp_path / "pipe")
    out = {
        "fifo": fifo,
        "symlink_to_fifo": tmp_path / "link.yaml",
        "env_is_fifo": tmp_path / "best.yaml",
        "folder": tmp_path / "folder",
    }[how]
    if how == "symlink_to_fifo":
        out.symlink_to(fifo)
    elif how == "env_is_fifo":
        fifo.rename(tmp_path / "best.env")
        fifo = tmp_path / "best.env"
    elif how == "folder":
        out.mkdir()
    before = _snapshot(tmp_path)
    ran = CliRunner().invoke(
        app, ["export", "--spec", str(spec_path), "-o", str(out), "--allow-unconfirmed"]
    )
    kind = "a folder" if how == "folder" else "a FIFO"
    _refused(ran, "--output", f"is {kind}, not a regular file")
    assert _snapshot(tmp_path) == before  # no config, no .env, no .tmp
    _still_a_fifo(fifo)
    if how == "symlink_to_fifo":
        assert out.is_symlink()


def test_export_over_a_symlink_to_a_regular_file_still_writes(tmp_path):
    """What the write did before the check, it still does: the link is replaced by the file."""
    spec_path = _study(tmp_path)
    target = tmp_path / "target.yaml"
    target.write_text("old")
    link = tmp_path / "best.yaml"
    link.symlink_to(target)
    ran = CliRunner().invoke(
        app, ["export", "--spec", str(spec_path), "-o", str(link), "--allow-unconfirmed"]
    )
    assert ran.exit_code == 0, ran.output
    assert link.is_file() and (tmp_path / "best.env").is_file()


@pytest.mark.parametrize("symlink", [False, True])
def test_report_refuses_an_output_that_is_a_fifo(tmp_path, symlink):
    spec_path = _study(tmp_path)
    fifo = _fifo(tmp_path / "pipe")
    out = fifo
    if symlink:
        out = tmp_path / "report.html"
        out.symlink_to(fifo)
    before = _snapshot(tmp_path)
    ran = CliRunner().invoke(app, ["report", "--spec", str(spec_path), "-o", str(out)])
    _refused(ran, "--output", "is a FIFO, not a regular file")
    assert _snapshot(tmp_path) == before
    _still_a_fifo(fifo)


def test_ablate_output_that_is_a_fifo_is_refused_before_any_launch(tmp_path):
    spec_path = _study(tmp_path)
    number = _stored(spec_path, "search")
    fifo = _fifo(tmp_path / "best.env")  # the .env written beside -o best.yaml
    trials, before = len(_trials(spec_path)), _snapshot(tmp_path)
    ran = CliRunner().invoke(
        app,
        [
            "ablate",
            "--spec",
            str(spec_path),
            "--trial",
            str(number),
            "-o",
            str(tmp_path / "best.yaml"),
        ],
    )
    _refused(ran, "--output", "is a FIFO, not a regular file")
    assert len(_trials(spec_path)) == trials
    assert _snapshot(tmp_path).keys() == before.keys()
    _still_a_fifo(fifo)


def test_bench_json_that_is_a_fifo_is_refused_before_the_benchmark(tmp_path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="bench")
    fifo = _fifo(tmp_path / "out.json")
    ran = CliRunner().invoke(
        app,
        ["bench", "--spec", str(spec_path), "--url", "http://127.0.0.1:9", "--json", str(fifo)],
    )
    _refused(ran, "--json", "is a FIFO, not a regular file")
    _still_a_fifo(fifo)


def test_a_stale_tmp_that_is_a_fifo_or_a_symlink_is_not_written_through(tmp_path):
    """``NAME.tmp`` left where the text goes first: a FIFO there blocked the open for ever, a
    symlink there sent the text into its target."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "a.yaml.tmp").symlink_to(victim)
    _fifo(tmp_path / "b.yaml.tmp")
    write_files_atomically(
        {tmp_path / "a.yaml": "a\n", tmp_path / "b.yaml": "b\n"}, option="--output"
    )
    assert victim.read_text() == "keep"
    assert (tmp_path / "a.yaml").read_text() == "a\n" and (tmp_path / "b.yaml").read_text() == "b\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "b.yaml", "victim"]
