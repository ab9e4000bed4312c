"""Unit tests of autotune.spec.load: what a study spec file turns into, its defaults, and which file
and key a bad value is blamed on. (The long list of bad inputs is test_bad_input.py's; this file
is the loader's own contract.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.errors import SpecError
from autotune.names import METRIC_DIRECTIONS, direction
from autotune.spec.load import load_spec
from tests.builders import FAKE_CHECK, FAKE_SERVER_COMMAND, FAKE_WORKLOAD, fake_spec, save_spec

SPACE = """
parameters:
  max_num_seqs: {type: int, low: 1, high: 8, target: {flag: --max-num-seqs}}
"""


def write(tmp_path: Path, **overrides) -> Path:
    spec = fake_spec("unit", args=["--decode-ms", "1"])
    spec.update(overrides)
    return save_spec(tmp_path, spec, SPACE, file="unit.yaml")


def test_a_fake_spec_loads_into_typed_fields(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path))
    assert spec.name == "unit"
    assert spec.path == tmp_path / "unit.yaml"
    assert spec.directory == tmp_path
    assert spec.engine.kind == "command"
    assert spec.engine.command == tuple(FAKE_SERVER_COMMAND)
    assert spec.engine.args == ("--decode-ms", "1")
    # a relative model folder that exists next to the spec is resolved to an absolute path
    assert spec.model.path == str((tmp_path / "model").resolve())
    assert spec.model.served_name == "fake-unit"
    assert spec.check.prompts == tuple(FAKE_CHECK["prompts"])
    assert spec.check.max_tokens == FAKE_CHECK["max_tokens"]
    assert spec.workload.prompts == tuple(FAKE_WORKLOAD["prompts"])
    assert spec.workload.concurrency == FAKE_WORKLOAD["concurrency"]
    assert spec.workload.concurrency_levels == (FAKE_WORKLOAD["concurrency"],)
    assert spec.workload.target_precision == 0
    assert spec.startup_timeout_s == 20
    assert spec.space.names == ["max_num_seqs"]


def test_defaults_where_the_spec_says_nothing(tmp_path: Path) -> None:
    spec = fake_spec("defaults", check={"prompts": ["a b c"]}, workload={"prompts": ["1 2 3"]})
    del spec["timeouts"]
    loaded = load_spec(save_spec(tmp_path, spec, SPACE, file="d.yaml"))
    assert loaded.objective.metrics == ("single_tokens_per_s",)  # a user's tok/s: tokens / e2e
    assert loaded.objective.directions == ["maximize"]
    assert loaded.startup_timeout_s == 300
    assert loaded.max_consecutive_infra_failures == 3
    assert loaded.check.max_tokens == 32
    assert loaded.check.logprob_tolerance is None  # derived from the baseline ("auto")
    assert loaded.workload.repeats == 2
    assert loaded.workload.target_precision == 0.03
    assert loaded.storage is None
    assert loaded.default_storage() == f"sqlite:///{(tmp_path / 'defaults.db').resolve()}"


def test_objective_metrics_and_their_directions(tmp_path: Path) -> None:
    objective = {"metrics": ["output_tokens_per_s", "ttft_p95_ms"]}
    spec = load_spec(write(tmp_path, objective=objective))
    assert spec.objective.metrics == ("output_tokens_per_s", "ttft_p95_ms")
    assert spec.objective.directions == ["maximize", "minimize"]


def test_direction_of_every_metric_and_of_a_load_level() -> None:
    assert set(METRIC_DIRECTIONS.values()) == {"maximize", "minimize"}
    for name, better in METRIC_DIRECTIONS.items():
        assert direction(name) == better
        assert direction(f"{name}@16") == better
    with pytest.raises(KeyError):
        direction("tokens_per_banana")


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ({"engine": {"kind": "tgi", "command": ["x"]}}, "engine.kind", "unknown engine"),
        ({"engine": {"kind": "command"}}, "engine.command", "needs a command template"),
        ({"objective": {"metric": "speed"}}, "objective.metric", "unknown metric"),
        ({"objective": {"metrics": ["e2e_p95_ms", "x"]}}, "objective.metrics[1]", "unknown"),
        ({"search_space": "missing.yaml"}, "search_space", "file not found"),
        ({"timeouts": {"startup_s": -1}}, "timeouts.startup_s", ""),
        ({"storage": 5}, "storage", "SQLAlchemy URL"),
    ],
)
def test_a_bad_value_names_the_file_and_the_key(
    tmp_path: Path, overrides: dict, key: str, words: str
) -> None:
    path = write(tmp_path, **overrides)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert info.value.key == key
    assert Path(info.value.file) == path
    assert words in info.value.message


def test_a_missing_required_section_is_named(tmp_path: Path) -> None:
    spec = fake_spec("unit")
    del spec["workload"]
    path = save_spec(tmp_path, spec, SPACE, file="unit.yaml")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert "workload" in str(info.value)
    assert str(path) in str(info.value)


def test_spec_values_are_argv_words_never_a_shell_string(tmp_path: Path) -> None:
    """A value with shell syntax stays one argv word (the command engine never uses a shell)."""
    spec = load_spec(
        write(
            tmp_path,
            engine={
                "kind": "command",
                "command": [
                    sys.executable,
                    "-c",
                    "print(1); echo $HOME > /tmp/x",
                    "{host}",
                    "{port}",
                ],
            },
        )
    )
    assert spec.engine.command[2] == "print(1); echo $HOME > /tmp/x"
