"""Bad input never starts anything: exit code 2, one error line naming the file and the key,
and the study storage untouched (no database file, no artifact directory, no trial).

Driven through ``autotune.cli.app`` with typer's CliRunner, plus direct ``load_spec`` /
``load_space`` calls for the attributes of :class:`~autotune.errors.SpecError`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import SpecError
from autotune.space import load_space
from autotune.spec import load_spec

SPACE: dict[str, Any] = {
    "parameters": {
        "max_num_seqs": {"type": "int", "low": 1, "high": 8, "target": {"flag": "--max-num-seqs"}},
        "fault": {"type": "categorical", "choices": [None, "oom"], "target": {"flag": "--fault"}},
    }
}
SPEC: dict[str, Any] = {
    "study": "bad",
    "engine": {
        "kind": "command",
        "command": [
            sys.executable,
            "-m",
            "autotune.testing.fake_server",
            "--port",
            "{port}",
            "--model",
            "{served_name}",
        ],
    },
    "model": {"path": "model", "served_name": "toy"},
    "search_space": "space.yaml",
    "check": {"prompts": ["1 2 3"], "max_tokens": 4},
    "workload": {"prompts": ["a b c"], "max_tokens": 4, "num_requests": 2, "repeats": 1},
    "timeouts": {"startup_s": 5},
}


def write(tmp: Path, spec: dict | None = None, space: dict | None = None) -> Path:
    (tmp / "model").mkdir(exist_ok=True)
    (tmp / "space.yaml").write_text(
        yaml.safe_dump(SPACE if space is None else space, sort_keys=False)
    )
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC if spec is None else spec, sort_keys=False))
    return path


def with_(base: dict, dotted: str, value: Any) -> dict:
    """A deep copy of ``base`` with ``a.b.c`` set to ``value``."""
    out = yaml.safe_load(yaml.safe_dump(base))
    node = out
    *parents, last = dotted.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return out


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_bad_input(result, tmp: Path, *needles: str) -> str:
    """Exit 2, exactly one error line on stderr containing every needle, storage untouched."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    for needle in needles:
        assert needle in line, (needle, line)
    assert_untouched(tmp)
    return line


def assert_untouched(tmp: Path) -> None:
    left = sorted(p.name for p in tmp.iterdir())
    assert not [n for n in left if n.endswith(".db") or n.endswith("-artifacts")], left


# --- malformed and invalid YAML -----------------------------------------------------------------


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.write_text("study: bad\nengine:\n  kind: command\n  command: [a, {port}\nmodel: x\n")
    result = invoke("run", "--spec", str(path))
    line = assert_bad_input(result, tmp_path, f"{path}:", "malformed YAML")
    assert f"{path}:5:" in line  # the line where the parser gave up
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.line == 5 and caught.value.file == str(path)


def test_malformed_space_yaml(tmp_path: Path) -> None:
    path = write(tmp_path)
    (tmp_path / "space.yaml").write_text("parameters:\n  x: {type: int,, low: 1}\n")
    result = invoke("run", "--spec", str(path))
    assert_bad_input(result, tmp_path, f"{tmp_path / 'space.yaml'}:2:", "malformed YAML")


@pytest.mark.parametrize(
    ("dotted", "value", "key"),
    [
        ("workload.num_requestz", 3, "workload.num_requestz"),
        ("studyy", "x", "studyy"),
        ("timeouts.startup", 5, "timeouts.startup"),
    ],
)
def test_unknown_key(tmp_path: Path, dotted: str, value: Any, key: str) -> None:
    path = write(tmp_path, with_(SPEC, dotted, value))
    line = assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, str(path), key, "unknown key"
    )
    assert "allowed:" in line


@pytest.mark.parametrize(
    ("dotted", "value", "key", "words"),
    [
        ("workload.num_requests", "many", "workload.num_requests", "must be a number"),
        ("workload.concurrency", 0, "workload.concurrency", "must be > 0"),
        ("check.prompts", "one two", "check.prompts", "non-empty list"),
        ("engine.command", "python -m server", "engine.command", "list of strings"),
        ("timeouts.startup_s", True, "timeouts.startup_s", "must be a number"),
        ("objective", {"metric": "speed"}, "objective.metric", "unknown metric"),
        ("study", "has space", "study", "must be a name"),
    ],
)
def test_wrong_types(tmp_path: Path, dotted: str, value: Any, key: str, words: str) -> None:
    path = write(tmp_path, with_(SPEC, dotted, value))
    line = assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, str(path), key, words)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.key == key and caught.value.line is not None
    assert f":{caught.value.line}:" in line


# --- search-space domains and constraints ---------------------------------------------------


@pytest.mark.parametrize(
    ("param", "key", "words"),
    [
        (
            {"type": "int", "low": 10, "high": 1, "target": {"flag": "--max-num-seqs"}},
            "parameters.max_num_seqs",
            "empty domain: low 10 > high 1",
        ),
        (
            {"type": "categorical", "choices": [], "target": {"flag": "--max-num-seqs"}},
            "parameters.max_num_seqs.choices",
            "non-empty list",
        ),
        (
            {"type": "int", "low": 0, "high": 8, "log": True, "target": {"flag": "--max-num-seqs"}},
            "parameters.max_num_seqs.low",
            "log domain needs low > 0",
        ),
        (
            {"type": "int", "low": 1, "high": "eight", "target": {"flag": "--max-num-seqs"}},
            "parameters.max_num_seqs.high",
            "must be a number",
        ),
        (
            {"type": "integer", "low": 1, "high": 8, "target": {"flag": "--max-num-seqs"}},
            "parameters.max_num_seqs.type",
            "unknown type",
        ),
        (
            {"type": "int", "low": 1, "high": 8, "target": {"flag": "max-num-seqs"}},
            "parameters.max_num_seqs.target.flag",
            "starts with '--'",
        ),
        (
            {"type": "int", "low": 1, "high": 8, "baseline": 99, "target": {"flag": "--x"}},
            "parameters.max_num_seqs.baseline",
            "outside the parameter's domain",
        ),
    ],
)
def test_bad_domains(tmp_path: Path, param: dict, key: str, words: str) -> None:
    space = {"parameters": {"max_num_seqs": param}}
    path = write(tmp_path, space=space)
    space_path = tmp_path / "space.yaml"
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, str(space_path), key, words)
    with pytest.raises(SpecError) as caught:
        load_space(space_path)
    assert caught.value.file == str(space_path) and caught.value.key == key
    assert caught.value.line is not None


def test_unsatisfiable_constraint(tmp_path: Path) -> None:
    path = write(tmp_path, space={**SPACE, "constraints": ["max_num_seqs > 100"]})
    assert_bad_input(
        invoke("run", "--spec", str(path)),
        tmp_path,
        "space.yaml:",
        "constraints",
        "no configuration satisfies",
    )


def test_constraint_naming_an_unknown_parameter(tmp_path: Path) -> None:
    path = write(tmp_path, space={**SPACE, "constraints": ["max_num_sqs >= 2"]})
    line = assert_bad_input(
        invoke("run", "--spec", str(path)),
        tmp_path,
        "space.yaml:",
        "constraints[0]",
        "unknown parameter 'max_num_sqs'",
    )
    assert "[/" not in line  # the key is printed as text, never eaten as rich markup


def test_constraint_with_forbidden_code(tmp_path: Path) -> None:
    path = write(tmp_path, space={**SPACE, "constraints": ["__import__('os').getpid() > 0"]})
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, "space.yaml:", "constraints[0]")


# --- what only `run` can find: the model, the storage, the directories ----------------------


def test_missing_model_path(tmp_path: Path) -> None:
    path = write(tmp_path, with_(SPEC, "model.path", "./no-such-model"))
    assert_bad_input(
        invoke("run", "--spec", str(path), "--trials", "1"),
        tmp_path,
        str(path),
        "model.path",
        "model not found",
    )


@pytest.mark.parametrize(
    "url", ["postgresql+psycopg2://nobody@127.0.0.1:1/x", "postgresql://nobody@127.0.0.1:1/x"]
)
def test_unreachable_storage(tmp_path: Path, url: str) -> None:
    path = write(tmp_path)
    result = invoke("run", "--spec", str(path), "--trials", "1", "--storage", url)
    assert_bad_input(result, tmp_path, "--storage", "storage unreachable")


def test_not_a_storage_url(tmp_path: Path) -> None:
    path = write(tmp_path)
    result = invoke("run", "--spec", str(path), "--storage", "not a url")
    assert_bad_input(result, tmp_path, "--storage", "not a valid SQLAlchemy storage URL")


def test_sqlite_in_a_missing_directory(tmp_path: Path) -> None:
    path = write(tmp_path)
    (tmp_path / "afile").write_text("a file, not a directory")
    result = invoke("run", "--spec", str(path), "--storage", f"sqlite:///{tmp_path}/afile/study.db")
    assert_bad_input(result, tmp_path, "--storage", "does not exist")
    assert not (tmp_path / "afile").is_dir()


def test_sqlite_in_an_unwritable_directory(tmp_path: Path) -> None:
    # /proc exists and takes no new files, for root too (root ignores a 0500 directory's mode)
    path = write(tmp_path)
    result = invoke("run", "--spec", str(path), "--storage", "sqlite:////proc/autotune-s.db")
    assert_bad_input(result, tmp_path, "--storage", "not writable")
    assert not Path("/proc/autotune-s.db").exists()


def test_unwritable_artifact_directory(tmp_path: Path) -> None:
    """A directory that cannot be created (under /proc, or under a file) is bad input, found
    before the study is created."""
    path = write(tmp_path)
    (tmp_path / "afile").write_text("x")
    for target in (tmp_path / "afile" / "artifacts", Path("/proc/autotune-artifacts")):
        result = invoke("run", "--spec", str(path), "--artifact-dir", str(target))
        assert_bad_input(result, tmp_path, "--artifact-dir", str(target))


# --- CLI values -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-3", "abc", "1.5"])
def test_bad_trials(tmp_path: Path, value: str) -> None:
    path = write(tmp_path)
    result = invoke("run", "--spec", str(path), "--trials", value)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--trials'" in result.output
    assert_untouched(tmp_path)


def test_missing_spec_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert_bad_input(invoke("run", "--spec", str(missing)), tmp_path, str(missing), "not found")


def test_spec_naming_a_missing_space(tmp_path: Path) -> None:
    path = write(tmp_path, with_(SPEC, "search_space", "spaces/missing.yaml"))
    assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, str(path), "search_space", "file not found"
    )


def test_bad_input_adds_no_trial_to_an_existing_study(tmp_path: Path) -> None:
    """With a study already in the storage, bad input adds no study and no trial to it."""
    path = write(tmp_path)
    url = f"sqlite:///{tmp_path / 'keep' / 'studies.db'}"
    (tmp_path / "keep").mkdir()
    optuna.create_study(storage=url, study_name="bad", direction="maximize")
    before = (tmp_path / "keep" / "studies.db").read_bytes()
    bad = write(tmp_path, space={**SPACE, "constraints": ["max_num_seqs > 100"]})
    assert bad == path
    result = invoke("run", "--spec", str(path), "--storage", url)
    assert result.exit_code == 2
    result = invoke("run", "--spec", str(path), "--storage", url, "--trials", "0")
    assert result.exit_code == 2
    assert (tmp_path / "keep" / "studies.db").read_bytes() == before
    summaries = optuna.get_all_study_summaries(storage=url)
    assert [(s.study_name, s.n_trials) for s in summaries] == [("bad", 0)]
