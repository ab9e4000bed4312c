"""Bad input never starts anything: exit code 2, one error line naming the file and the key,
and the study storage untouched (no database file, no artifact directory, no trial).

Driven through ``autotune.cli.app.app`` with typer's CliRunner, plus direct ``load_spec`` /
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

from autotune.cli.app import app
from autotune.errors import SpecError
from autotune.space.load import load_space
from autotune.spec.load import load_spec
from tests.builders import fake_spec, write_fake_spec

SPACE: dict[str, Any] = {
    "parameters": {
        "max_num_seqs": {"type": "int", "low": 1, "high": 8, "target": {"flag": "--max-num-seqs"}},
        "fault": {"type": "categorical", "choices": [None, "oom"], "target": {"flag": "--fault"}},
    }
}
SPEC: dict[str, Any] = fake_spec(
    "bad",
    command=[
        sys.executable,
        "-m",
        "autotune.testing.fake_server",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--model",
        "{served_name}",
    ],
    served_name="toy",
    check={"prompts": ["1 2 3"], "max_tokens": 4},
    workload={"prompts": ["a b c"], "max_tokens": 4, "num_requests": 2, "repeats": 1},
    timeouts={"startup_s": 5},
)


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
    """No database, no artifact directory, in ``tmp`` (also the working directory, where a
    server URL's artifacts would go: ``studies/<name>-artifacts``) or anywhere below it."""
    left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
    assert not [n for n in left if n.endswith(".db") or n.endswith("-artifacts")], left
    assert not (tmp / "studies").exists(), left


@pytest.fixture(autouse=True)
def _work_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths the tool derives (``studies/...``) land in the test's own folder."""
    monkeypatch.chdir(tmp_path)


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


@pytest.mark.parametrize(
    ("option", "value"),
    [("--trials", v) for v in ("0", "-3", "abc", "1.5")]
    # NumPy's generator raised a traceback (exit 1) for seeds outside 0 .. 2**32 - 1
    + [("--seed", v) for v in ("-1", str(2**32))],
)
def test_bad_cli_numbers(tmp_path: Path, option: str, value: str) -> None:
    path = write(tmp_path)
    result = invoke("run", "--spec", str(path), option, value)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert_untouched(tmp_path)


@pytest.mark.parametrize("port", ["-1", "65536"])
def test_dashboard_port_out_of_range(tmp_path: Path, port: str) -> None:
    path = write(tmp_path)
    result = invoke("dashboard", "--spec", str(path), "--port", port)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--port'" in result.output
    assert_untouched(tmp_path)


@pytest.mark.parametrize(
    ("args", "key", "expected"),
    [
        (("--gpus", "0-x", "--parallel", "2"), "--gpus", "cannot read '0-x'"),
        (("--gpus", "0-x"), "--gpus", "cannot read '0-x'"),
        # without --parallel the device options did nothing, silently
        (("--gpus", "0-3"), "--gpus", "needs --parallel N > 1"),
        (("--cpus", "0-1", "--cpus-per-trial", "1"), "--cpus", "needs --parallel N > 1"),
        (("--gpus-per-trial", "2"), "--gpus-per-trial", "needs --parallel N > 1"),
    ],
)
def test_device_options(tmp_path: Path, args: tuple[str, ...], key: str, expected: str) -> None:
    path = write(tmp_path)
    assert_bad_input(invoke("run", "--spec", str(path), *args), tmp_path, key, expected)


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


# --- constraints: type errors and memory bombs are refused when the space is loaded -------------

SPACE_STR = {
    "parameters": {
        "n": {"type": "int", "low": 1, "high": 8, "target": {"flag": "--max-num-seqs"}},
        "mode": {"type": "categorical", "choices": ["a", "b"], "target": {"flag": "--run-mode"}},
        "sizes": {"type": "int_list", "choices": [[1, 2], [4]], "target": {"flag": "--sizes"}},
    }
}


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("mode > 3", "'>' not supported between instances of 'str' and 'int'"),
        ("len(n) > 2", "object of type 'int' has no len()"),
        ("max(n) > 1", "not iterable"),
        ("-mode < 0", "needs a number"),
        ("n in 'abc'", "'in' needs a list"),
        ("sizes + n > 1", "can only concatenate list"),
        # would build a 20 GB string, or format a 1 GB one: refused, never evaluated
        ("len('a' * 20000000000) > n", "applies to numbers only"),
        ("len([0] * 20000000000) > n", "applies to numbers only"),
        ("len('%0999999999d' % n) > 1", "applies to numbers only"),
        ("len(mode * 20000000000) > n", "applies to numbers only"),
        ("len(sizes * n) > 1", "applies to numbers only"),
        ("len(b'x') > 0", "not allowed"),
        ("n ** 99999999 > 1", "Pow is not allowed"),
        ("n > 1 and " * 200 + "n > 0", "too long"),
    ],
)
def test_constraint_type_errors_and_bombs(tmp_path: Path, expr: str, words: str) -> None:
    path = write(tmp_path, space={**SPACE_STR, "constraints": ["n >= 1", expr]})
    line = assert_bad_input(
        invoke("run", "--spec", str(path), "--trials", "1"),
        tmp_path,
        f"{tmp_path / 'space.yaml'}:",
        "constraints[1]",
        words,
    )
    assert "Traceback" not in line


def test_constraint_guarded_by_and_is_accepted(tmp_path: Path) -> None:
    """Short-circuiting is the interpreter's own: ``fault`` is compared with a number only
    where it is not None... and None never reaches ``>``; both choices are tried at load."""
    space = {
        "parameters": {
            "n": {"type": "int", "low": 1, "high": 8, "target": {"flag": "--max-num-seqs"}},
            "level": {"type": "categorical", "choices": [None, 2, 4], "target": {"flag": "--l"}},
        },
        "constraints": ["level == None or level <= n"],
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    loaded = load_space(tmp_path / "space.yaml")
    assert loaded.violated({"n": 1, "level": 4}) == ["level == None or level <= n"]
    assert loaded.violated({"n": 1, "level": None}) == []
    # unguarded, the None choice breaks it: found at load, not in a trial
    space["constraints"] = ["level <= n"]
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    with pytest.raises(SpecError) as caught:
        load_space(tmp_path / "space.yaml")
    assert caught.value.key == "constraints[0]" and "level=None" in str(caught.value)


def test_constraint_evaluation_never_raises_a_python_error(tmp_path: Path) -> None:
    """Values the load check never saw (a caller's own) still give a SpecError naming the
    constraint, never a TypeError."""
    space = {**SPACE_STR, "constraints": ["n >= 1"]}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    loaded = load_space(tmp_path / "space.yaml")
    with pytest.raises(SpecError) as caught:
        loaded.violated({"n": "eight", "mode": "a", "sizes": [4]})
    assert caught.value.key == "constraints[0]"
    assert caught.value.file == str(tmp_path / "space.yaml")


def test_yaml_alias_bomb(tmp_path: Path) -> None:
    path = write(tmp_path)
    rows = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdef", "bcdefg", strict=True):
        rows.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    (tmp_path / "space.yaml").write_text("\n".join(rows) + "\nparameters: {}\n")
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, "space.yaml", "aliases")


# --- YAML 1.1 booleans where a string was meant ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "word"),
    [
        (
            "parameters:\n  mode:\n    type: categorical\n    choices: [auto, off]\n"
            "    target: {flag: --mode}\n",
            "parameters.mode.choices[1]",
            "off",
        ),
        (
            "parameters:\n  mode:\n    type: categorical\n    choices: [auto, 'on']\n"
            "    baseline: On\n    target: {env: MODE}\n",
            "parameters.mode.baseline",
            "On",
        ),
        (
            "parameters:\n  mode:\n    type: categorical\n    choices: [auto, 'off']\n"
            "    target: {json: --compilation-config, key: mode}\n"
            "  n:\n    type: int\n    low: 1\n    high: 4\n    target: {flag: --n}\n"
            "    when: {mode: {in: [auto, off]}}\n",
            "parameters.n.when.mode.in[1]",
            "off",
        ),
        # a parameter named on: YAML 1.1 reads the KEY as true, and a parameter "True" would run
        ("parameters:\n  on:\n    type: bool\n    target: {flag: --on}\n", "parameters.on", "on"),
        (
            "parameters:\n  'no':\n    type: bool\n    target: {flag: --no}\n"
            "  n:\n    type: int\n    low: 1\n    high: 4\n    target: {flag: --n}\n"
            "    when: {no: true}\n",
            "parameters.n.when.no",
            "no",
        ),
    ],
)
def test_yaml11_boolean_in_choices(tmp_path: Path, text: str, key: str, word: str) -> None:
    path = write(tmp_path)
    (tmp_path / "space.yaml").write_text(text)
    line = assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, "space.yaml:", key, f"quote it as '{word}'"
    )
    what = "value" if "[" in key or key.endswith("baseline") else "key"
    assert f"the YAML {what} {word} was read as" in line


def test_quoted_off_and_real_booleans_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(
        "parameters:\n"
        "  mode: {type: categorical, choices: [auto, 'off', \"on\"], target: {flag: --mode}}\n"
        "  flag: {type: categorical, choices: [true, false], target: {flag: --x}}\n"
        "  eager: {type: bool, baseline: no, target: {flag: --enforce-eager}}\n"
    )
    space = load_space(tmp_path / "space.yaml")
    assert space.parameter("mode").choices == ("auto", "off", "on")
    assert space.parameter("flag").choices == (True, False)
    assert space.parameter("eager").baseline is False  # a bool parameter: no is false


def test_yaml11_boolean_in_engine_args(tmp_path: Path) -> None:
    path = write(tmp_path, with_(SPEC, "engine.args", ["--x", "X"]))
    path.write_text(path.read_text().replace("- X", "- off"))
    assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, str(path), "engine.args[1]", "quote it"
    )


def test_a_parameter_name_that_is_not_a_string(tmp_path: Path) -> None:
    path = write(tmp_path)
    (tmp_path / "space.yaml").write_text(
        "parameters:\n  123:\n    type: bool\n    target: {flag: --x}\n"
    )
    assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, "space.yaml:", "must be a string, got 123"
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [({True: "1"}, "engine.env.on"), ({"A=B": "1"}, "not a variable name")],
)
def test_engine_env_names(tmp_path: Path, env: dict, expected: str) -> None:
    path = write(tmp_path, with_(SPEC, "engine.env", env))
    path.write_text(path.read_text().replace("true: '1'", "on: '1'"))
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, str(path), expected)


@pytest.mark.parametrize(
    ("field", "key", "expected"),
    [
        ("low: .nan\n    high: 1", "parameters.x.low", "must be a finite number"),
        ("low: 0\n    high: .inf", "parameters.x.high", "must be a finite number"),
        ("low: 0\n    high: 1\n    step: .nan", "parameters.x.step", "positive number"),
    ],
)
def test_non_finite_numeric_domains(tmp_path: Path, field: str, key: str, expected: str) -> None:
    """NaN compares false with everything, so ``low > high`` never caught it, and only vLLM's
    own config check (not another engine's) refused the value later."""
    path = write(tmp_path)
    text = f"parameters:\n  x:\n    type: float\n    {field}\n    target: {{flag: --x}}\n"
    (tmp_path / "space.yaml").write_text(text)
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, "space.yaml:", key, expected)


def test_a_non_finite_choice(tmp_path: Path) -> None:
    path = write(tmp_path)
    (tmp_path / "space.yaml").write_text(
        "parameters:\n  x:\n    type: categorical\n    choices: [1, .nan]\n"
        "    target: {flag: --x}\n"
    )
    assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, "parameters.x.choices[1]", "must be finite"
    )


@pytest.mark.parametrize(
    ("dotted", "value", "key"),
    [
        # the launch raised "ValueError: embedded null byte", a traceback mid-study
        ("engine.args", ["--decode-ms", "1\0"], "engine.args[1]"),
        ("model.served_name", "fake\0", "model.served_name"),
    ],
)
def test_a_nul_character_in_the_spec(tmp_path: Path, dotted: str, value: Any, key: str) -> None:
    path = write(tmp_path, with_(SPEC, dotted, value))
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, str(path), key, "NUL character")


@pytest.mark.parametrize("value", ["1\n2", "1\r2"])
def test_an_engine_env_value_on_two_lines(tmp_path: Path, value: str) -> None:
    """Export writes ``engine.env`` into the .env beside the config, one line per variable."""
    path = write(tmp_path, with_(SPEC, "engine.env", {"A": value}))
    assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, str(path), "engine.env.A", "one line"
    )


@pytest.mark.parametrize(
    ("choices", "pair"),
    [
        # Optuna finds a choice by ==: `1` was recorded and launched as `true`
        ("[true, 1]", "True and 1"),
        ("[16, 16.0]", "16 and 16.0"),
        # the same text on a command line or in an env var
        ("[16, '16']", "16 and '16'"),
    ],
)
def test_choices_that_are_the_same_value_to_the_engine(
    tmp_path: Path, choices: str, pair: str
) -> None:
    path = write(tmp_path)
    (tmp_path / "space.yaml").write_text(
        f"parameters:\n  x:\n    type: categorical\n    choices: {choices}\n"
        "    target: {flag: --x}\n"
    )
    assert_bad_input(
        invoke("run", "--spec", str(path)),
        tmp_path,
        "parameters.x.choices",
        f"choices {pair} are the same value to the engine",
    )


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("workload.target_precision", float("nan")),
        ("workload.max_measure_s", float("inf")),
        ("workload.request_timeout_s", float("nan")),
        ("timeouts.startup_s", float("nan")),
        ("check.logprob_tolerance", float("inf")),
    ],
)
def test_non_finite_spec_numbers(tmp_path: Path, dotted: str, value: float) -> None:
    """A NaN timeout or precision passed every ``<= 0`` check and would have made a trial
    wait or measure forever."""
    path = write(tmp_path, with_(SPEC, dotted, value))
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, dotted, "finite number")


def test_an_slo_bound_that_is_not_finite(tmp_path: Path) -> None:
    path = write(tmp_path, with_(SPEC, "workload.slo", ["ttft_p95_ms <= 1e999"]))
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, "workload.slo", "finite")


# --- storage URLs and study names --------------------------------------------------------------


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused(tmp_path: Path, url: str) -> None:
    path = write(tmp_path)
    result = invoke("run", "--spec", str(path), "--trials", "1", "--storage", url)
    assert_bad_input(result, tmp_path, "--storage", "in-memory SQLite")


def test_in_memory_sqlite_in_the_spec(tmp_path: Path) -> None:
    path = write(tmp_path, with_(SPEC, "storage", "sqlite:///:memory:"))
    assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, f"{path}:", "storage:", "in-memory"
    )


@pytest.mark.parametrize("name", ["../../x", "a/b", ".hidden", "..", "x y", "/etc/x"])
@pytest.mark.parametrize(
    "command", ["run", "show", "export", "confirm", "ablate", "cleanup", "dashboard"]
)
def test_study_option_is_a_checked_name(tmp_path: Path, command: str, name: str) -> None:
    """``--study ../../x`` would put artifacts outside the storage directory: refused by
    every command, before the storage is opened."""
    path = write(tmp_path)
    assert_bad_input(
        invoke(command, "--spec", str(path), "--study", name), tmp_path, "--study", "must be a name"
    )
    assert not (tmp_path.parent / "x-artifacts").exists()


@pytest.mark.parametrize("name", ["../x", ".x", "a/b"])
def test_study_key_is_a_checked_name(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, with_(SPEC, "study", name))
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, f"{path}:", "study:", "name")


def test_artifact_dir_stays_under_the_storage_directory(tmp_path: Path) -> None:
    from autotune.storage import artifact_dir_for

    url = f"sqlite:///{tmp_path / 'db' / 's.db'}"
    assert artifact_dir_for(url, "my.study-1") == tmp_path / "db" / "my.study-1-artifacts"
    for name in ("../x", "..", "a/../../b"):
        with pytest.raises(SpecError):
            artifact_dir_for(url, name)


@pytest.mark.parametrize("command", ["show", "export", "confirm", "ablate", "cleanup"])
def test_reading_commands_never_create_a_database(tmp_path: Path, command: str) -> None:
    path = write(tmp_path)
    assert_bad_input(
        invoke(command, "--spec", str(path)), tmp_path, "--storage", "no study storage"
    )


def test_cleanup_of_an_unknown_study_creates_none(tmp_path: Path) -> None:
    path = write(tmp_path)
    url = f"sqlite:///{tmp_path / 'keep' / 'studies.db'}"
    (tmp_path / "keep").mkdir()
    optuna.create_study(storage=url, study_name="bad", direction="maximize")
    for command in ("cleanup", "confirm"):
        result = invoke(command, "--spec", str(path), "--storage", url, "--study", "typo")
        assert result.exit_code == 2, result.output
        assert "no study named 'typo'" in result.stderr
    assert optuna.study.get_all_study_names(storage=url) == ["bad"]


# --- the command engine's API key and version --------------------------------------------------


def test_api_key_on_the_command_line_is_refused(tmp_path: Path) -> None:
    command = [*SPEC["engine"]["command"], "--api-key", "{api_key}"]
    path = write(tmp_path, with_(SPEC, "engine.command", command))
    line = assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, f"{path}:", "engine.command[10]", "`ps`"
    )
    assert "engine.env" in line  # says how to pass it instead
    path = write(tmp_path, with_(SPEC, "engine.args", ["--token={api_key}"]))
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, "engine.args[0]", "`ps`")


def test_command_engine_key_travels_by_env_only(tmp_path: Path) -> None:
    """The fake server started from the shared test template: its argv (what ``ps`` shows)
    has no key, yet it requires the key it got in AUTOTUNE_API_KEY, and a spec's own env
    variable gets the key through ``{api_key}`` (redacted in the stored record)."""
    import os
    import signal
    import subprocess
    import time

    import httpx
    import psutil

    from autotune._proc import free_port
    from autotune.engines import build_engine

    spec_path = write_fake_spec(tmp_path, "parameters:\n  x: {type: bool, target: {flag: --y}}\n")
    raw = yaml.safe_load(spec_path.read_text())
    raw["engine"]["env"] = {"MY_SERVER_API_KEY": "{api_key}"}
    spec_path.write_text(yaml.safe_dump(raw))
    spec = load_spec(spec_path)
    key = "k" * 48
    launch = build_engine(spec).build_launch(
        spec.space.resolve({}), host="127.0.0.1", port=free_port(), api_key=key
    )
    assert not [a for a in launch.argv if key in a], launch.argv
    assert launch.env["AUTOTUNE_API_KEY"] == key and launch.env["MY_SERVER_API_KEY"] == key
    assert launch.redacted_env()["MY_SERVER_API_KEY"] == "***"
    proc = subprocess.Popen(
        list(launch.argv),
        env={**os.environ, **launch.env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        base = launch.base_url
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        cmdline = psutil.Process(proc.pid).cmdline()
        assert cmdline and not [a for a in cmdline if key in a], cmdline
        assert httpx.get(f"{base}/v1/models", trust_env=False).status_code == 401
        authorized = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{base}/v1/models", headers=authorized, trust_env=False).is_success
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_command_engine_version_is_not_a_placeholder(tmp_path: Path) -> None:
    from autotune.engines import build_engine

    command = [
        "{python}",
        "-m",
        "autotune.testing.fake_server",
        "--host",
        "{host}",
        "--port",
        "{port}",
    ]
    path = write(tmp_path, with_(SPEC, "engine.command", command))
    version = build_engine(load_spec(path)).version()
    assert "{" not in version and sys.executable in version, version
    assert "autotune.testing.fake_server" in version
    spec = with_(SPEC, "engine.command", command)
    spec["engine"]["version_command"] = ["{python}", "-c", "print('fake-engine 1.2.3')"]
    version = build_engine(load_spec(write(tmp_path, spec))).version()
    assert version.startswith("fake-engine 1.2.3 [") and sys.executable in version, version


def test_export_header_launch_expands_the_key(tmp_path: Path) -> None:
    """The header's launch line, pasted into a shell with API_KEY set, starts the server with
    the key where the spec's env wants it (``'$API_KEY'`` in single quotes never expands)."""
    import os
    import subprocess

    from autotune.study.export import export_values

    show = "import os, sys; print(os.environ['MY_SERVER_API_KEY']); print(sys.argv[1:])"
    command = [sys.executable, "-c", show, "--host", "{host}", "--port", "{port}"]
    spec = with_(SPEC, "engine.command", command)
    spec["engine"]["env"] = {"MY_SERVER_API_KEY": "Bearer {api_key}", "PLAIN": "a b"}
    spec_path = write(tmp_path, spec)
    out = tmp_path / "out" / "best.yaml"
    export_values(load_spec(spec_path), {"max_num_seqs": 4}, out, title="test")
    lines = out.read_text().splitlines()
    launch = lines[lines.index("# Launch:") + 1].removeprefix("#   ")
    assert "'$API_KEY'" not in launch and "{api_key}" not in out.read_text()
    done = subprocess.run(
        ["bash", "-c", launch],
        env={**os.environ, "API_KEY": "s3cret"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    printed = done.stdout.splitlines()
    assert printed[0] == "Bearer s3cret", done
    assert printed[1] == str(["--host", "127.0.0.1", "--port", "8000", "--max-num-seqs", "4"])
    assert "MY_SERVER_API_KEY=Bearer ${API_KEY}" in (tmp_path / "out" / "best.env").read_text()


# --- --artifact-dir is honoured by every command that starts servers ---------------------------


def test_confirm_and_run_honour_artifact_dir(tmp_path: Path) -> None:
    """Confirmation (inside ``run`` and as ``autotune confirm``) writes its server logs under
    ``--artifact-dir``, never into the default ``<study>-artifacts`` beside the database."""
    param = "{type: int, low: 2, high: 16, target: {flag: --max-num-seqs}}"
    spec_path = write_fake_spec(tmp_path, f"parameters:\n  max_num_seqs: {param}\n", name="artdir")
    first, second = tmp_path / "first", tmp_path / "second"
    common = ("--spec", str(spec_path), "--seed", "1")
    # 6 launches: the baseline, one search trial, then 2 rounds x (baseline + 1) confirmation
    result = invoke(
        "run", *common, "--trials", "6", "--confirm-top", "1", "--confirm-repeats", "2",
        "--artifact-dir", str(first),
    )  # fmt: skip
    assert result.exit_code == 0, (result.output, result.exception)
    result = invoke(
        "confirm", "--spec", str(spec_path), "--top", "1", "--repeats", "2",
        "--artifact-dir", str(second),
    )  # fmt: skip
    assert result.exit_code == 0, (result.output, result.exception)
    assert not (tmp_path / "artdir-artifacts").exists()
    study = optuna.load_study(storage=load_spec(spec_path).default_storage(), study_name="artdir")
    confirm_trials = [t.number for t in study.trials if t.user_attrs.get("role") == "confirm"]
    assert len(confirm_trials) == 8, confirm_trials  # 2 confirmations x 2 rounds x 2 variants
    logs = {p.name for d in (first, second) for p in (d / "logs").glob("trial-*.log")}
    for number in confirm_trials:
        assert f"trial-{number:05d}.log" in logs, (number, sorted(logs))
    # the standalone confirmation's logs are all in --artifact-dir of that command
    assert {p.name for p in (second / "logs").glob("*.log")} == {
        f"trial-{n:05d}.log" for n in confirm_trials[4:]
    }
