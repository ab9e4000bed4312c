"""Files written for the user: whole or not at all, and an unwritable path is bad input."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune._files import write_files_atomically, write_text_atomically
from autotune.cli.app import app
from autotune.errors import SpecError


def test_writes_the_text_and_creates_the_folders(tmp_path: Path) -> None:
    out = write_text_atomically(tmp_path / "a" / "b" / "x.yaml", "hello\n", option="--output")
    assert out.read_text() == "hello\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["x.yaml"]  # no .tmp left


@pytest.mark.parametrize("where", ["file/x.yaml", "file/sub/x.yaml"])
def test_a_file_where_a_folder_should_be_is_bad_input(tmp_path: Path, where: str) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(SpecError, match="--output") as caught:
        write_text_atomically(tmp_path / where, "x", option="--output")
    assert "a file stands where its folder should be" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_existing_file_is_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "x.yaml"
    out.write_text("old")
    write_text_atomically(out, "new", option="--output")
    assert out.read_text() == "new"


def test_report_to_an_unwritable_path_exits_2_without_a_traceback(tmp_path: Path) -> None:
    """``autotune report -o`` (and ``export -o``, ``bench --json``) raised a FileNotFoundError
    traceback for a path it could not write."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    optuna.create_study(storage=url, study_name="s", direction="maximize")
    (tmp_path / "file").write_text("not a folder")
    result = CliRunner().invoke(
        app, ["report", "--storage", url, "--study", "s", "--output", str(tmp_path / "file/r.html")]
    )
    assert result.exit_code == 2, (result.output, result.exception)
    assert "--output" in result.stderr and "cannot write" in result.stderr
    assert (tmp_path / "file").read_text() == "not a folder"


def test_files_that_belong_together_are_written_together_or_not_at_all(tmp_path: Path) -> None:
    """An exported config and its ``.env``: when the second cannot be written, the first must
    not be replaced either (written one by one, a new config stood beside an old .env)."""
    old = tmp_path / "best.yaml"
    old.write_text("old config")
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(SpecError, match="cannot write .*file/best.env"):
        write_files_atomically(
            {old: "new config", tmp_path / "file" / "best.env": "A=1\n"}, option="--output"
        )
    assert old.read_text() == "old config"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.yaml", "file"]  # no .tmp left
    pair = {old: "new config", tmp_path / "best.env": "A=1\n"}
    write_files_atomically(pair, option="--output")
    assert {p: p.read_text() for p in pair} == pair
