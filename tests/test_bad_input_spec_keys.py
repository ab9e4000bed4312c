"""Spec keys that used to slip through the loader: one SpecError naming the file and the key.

* ``engine.args`` (and a command template) may not set what autotune sets per launch: the
  address (``--host``, ``--port``, ``--uds``: a fixed ``--host 0.0.0.0`` came after autotune's
  ``--host 127.0.0.1`` and opened the server to the network) or the engine's own flags. A flag
  the search space tunes may stay there: it is the value while its parameter is left out.
* A model path, served name or tokenizer longer than one argv word can be (Linux's
  MAX_ARG_STRLEN) failed the first launch with "Argument list too long", after the study was
  created.
* A present value of the wrong type (``objective: 0``, ``timeouts: []``) was read as the
  default by ``raw.get(key) or default``; absent or null still means the default.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.errors import SpecError
from autotune.space.load import MAX_ARG_BYTES, load_space
from autotune.spec.load import load_spec
from tests.builders import FAKE_SERVER_COMMAND, fake_spec, save_spec

SPACE: dict[str, Any] = {
    "parameters": {
        "max_num_seqs": {"type": "int", "low": 1, "high": 8, "target": {"flag": "--max-num-seqs"}},
        "prefix": {
            "type": "bool",
            "target": {"flag": "--enable-prefix-caching"},
        },
    }
}


def write(
    tmp: Path,
    *,
    kind: str = "command",
    args: list | None = None,
    command: list | None = None,
    space: dict | None = None,
    **changes: Any,
) -> Path:
    """A valid spec (the fake server's, or vLLM's / llama.cpp's) in ``tmp`` with ``changes``
    (``a.b``-dotted keys -> value; ``...`` removes the key) and ``SPACE``."""
    spec = fake_spec("keys")
    if kind != "command":
        spec["engine"] = {"kind": kind}
        spec["model"] = {"path": "model", "served_name": "keys"}
    if command is not None:
        spec["engine"]["command"] = command
    if args is not None:
        spec["engine"]["args"] = args
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value
    return save_spec(tmp, spec, SPACE if space is None else space, file="spec.yaml")


def refused(path: Path, key: str, *needles: str) -> SpecError:
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    error = caught.value
    assert error.key == key, str(error)
    assert error.file is not None and error.file.endswith(".yaml"), str(error)
    assert f"{key}: " in str(error), str(error)
    for needle in needles:
        assert needle in str(error), (needle, str(error))
    return error


# --- engine.args: what autotune sets per launch -----------------------------------------------


@pytest.mark.parametrize("kind", ["vllm", "llamacpp"])
@pytest.mark.parametrize(
    ("args", "index", "flag"),
    [
        (["--host", "0.0.0.0"], 0, "--host"),
        (["--host=0.0.0.0"], 0, None),  # the address itself
        (["--enforce-eager", "0.0.0.0:8000"], 1, None),
        (["--host", "10.0.0.5"], 0, "--host"),
        (["--enforce-eager", "--host=10.0.0.5"], 1, "--host"),
        (["--port", "80"], 0, "--port"),
        (["--port=80"], 0, "--port"),
        (["--uds", "/tmp/s.sock"], 0, "--uds"),
        (["--ho", "10.0.0.5"], 0, "--host"),  # vLLM's parser reads an unambiguous prefix
        (["--api_key", "x"], 0, "--api-key"),  # and _ as -
    ],
)
def test_engine_args_cannot_move_the_address(
    tmp_path: Path, kind: str, args: list, index: int, flag: str | None
) -> None:
    path = write(tmp_path, kind=kind, args=args)
    error = refused(path, f"engine.args[{index}]")
    if flag is None:
        assert "every network interface" in str(error) and "127.0.0.1" in str(error)
    else:
        assert flag in str(error) and "autotune sets itself" in str(error)
    assert error.line is not None


@pytest.mark.parametrize(
    ("kind", "flag"),
    [
        ("vllm", "--served-model-name"),
        ("vllm", "--model"),
        ("llamacpp", "--alias"),
        ("llamacpp", "--metrics"),
        # llama-server's short spellings, and other sources of weights than model.path
        ("llamacpp", "-m"),
        ("llamacpp", "-a"),
        ("llamacpp", "-m=other.gguf"),
        ("llamacpp", "-hf"),
        ("llamacpp", "--model-url"),
    ],
)
def test_engine_args_cannot_set_the_engine_s_own_flags(
    tmp_path: Path, kind: str, flag: str
) -> None:
    path = write(tmp_path, kind=kind, args=["--enforce-eager", flag, "x"])
    refused(path, "engine.args[1]", flag, "autotune sets itself")


@pytest.mark.parametrize(
    "args", [["--max-num-seqs", "16"], ["--max_num_seqs=16"], ["--no-enable-prefix-caching"]]
)
@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "command"])
def test_engine_args_may_hold_the_value_a_tuned_flag_has_when_left_out(
    tmp_path: Path, kind: str, args: list
) -> None:
    """Not a clash: a fixed flag is the launch's value while its parameter is left out, and
    the tuned value, placed after it, wins (the export says where each flag comes from)."""
    assert load_spec(write(tmp_path, kind=kind, args=args)).engine.args == tuple(args)


#: the fake template after its ``--host {host}``, with ``{host}`` elsewhere: a template without
#: it is refused whole (``engine.command``), before its ``--host`` word is looked at
AFTER_HOST = (*FAKE_SERVER_COMMAND[5:], "--advertise", "{host}")


@pytest.mark.parametrize(
    ("where", "words", "index", "needle"),
    [
        ("args", ["--host", "0.0.0.0"], 0, "{host}"),
        ("args", ["--host", "127.0.0.2"], 0, "{host}"),
        ("args", ["--host=0.0.0.0"], 0, "every network interface"),
        ("args", ["--port", "80"], 0, "{port}"),
        ("args", ["--uds", "/tmp/x.sock"], 0, "--uds"),
        ("args", ["--bind", "[::]:8000"], 1, "every network interface"),
        ("command", [*FAKE_SERVER_COMMAND[:4], "0.0.0.0", *AFTER_HOST], 3, "{host}"),
        ("command", [*FAKE_SERVER_COMMAND[:4], "localhost", *AFTER_HOST], 3, "{host}"),
        ("command", [*FAKE_SERVER_COMMAND, "--bind", "0.0.0.0"], 10, "every network interface"),
        ("command", [*FAKE_SERVER_COMMAND, "--port", "8000"], 9, "{port}"),
        ("args", ["--model", "other"], 0, "the spec's engine command sets it"),
    ],
)
def test_a_command_template_takes_its_address_from_the_placeholders(
    tmp_path: Path, where: str, words: list, index: int, needle: str
) -> None:
    path = write(tmp_path, **{where: words})
    refused(path, f"engine.{where}[{index}]", needle)


def test_a_template_flag_written_with_equals_is_the_template_s(tmp_path: Path) -> None:
    command = [*FAKE_SERVER_COMMAND[:-2], "--model={served_name}"]
    path = write(tmp_path, command=command, args=["--model", "x"])
    refused(path, "engine.args[0]", "the spec's engine command sets it (--model={served_name})")
    space = {
        "parameters": {
            "m": {"type": "categorical", "choices": ["x"], "target": {"flag": "--model"}}
        }
    }
    path = write(tmp_path, command=command, space=space)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.key == "parameters.m.target.flag", str(caught.value)
    assert "--model cannot be tuned" in str(caught.value)


def test_fixed_args_autotune_does_not_own_still_load(tmp_path: Path) -> None:
    """The refusals are narrow: other flags, and the placeholders themselves, load."""
    spec = load_spec(
        write(tmp_path, kind="vllm", args=["--enforce-eager", "--max-model-len", "512"])
    )
    assert spec.engine.args == ("--enforce-eager", "--max-model-len", "512")
    spec = load_spec(write(tmp_path, args=["--host={host}", "--hostname", "x", "--port-offset=1"]))
    assert spec.engine.args[0] == "--host={host}"
    spec = load_spec(write(tmp_path, kind="llamacpp", args=["--api-key-fileish", "x"]))
    assert spec.engine.args[0] == "--api-key-fileish"


def test_the_cli_refuses_a_public_host_with_exit_2_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, kind="vllm", args=["--host", "0.0.0.0"])
    result = CliRunner().invoke(app, ["run", "--spec", str(path)])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "engine.args[0]" in lines[0], lines
    assert "Traceback" not in result.output
    left = [p.name for p in tmp_path.rglob("*")]
    assert not [n for n in left if n.endswith(".db") or n.endswith("-artifacts")], left


def test_a_tuned_flag_spelled_with_underscores_is_still_reserved(tmp_path: Path) -> None:
    space = {
        "parameters": {
            "n": {
                "type": "categorical",
                "choices": ["x"],
                "target": {"flag": "--served_model_name"},
            }
        }
    }
    path = write(tmp_path, kind="vllm", space=space)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.key == "parameters.n.target.flag"
    assert "--served_model_name cannot be tuned" in str(caught.value)


def test_a_tuned_uds_is_refused(tmp_path: Path) -> None:
    space = {
        "parameters": {
            "s": {"type": "categorical", "choices": ["/tmp/a"], "target": {"flag": "--uds"}}
        }
    }
    path = write(tmp_path, space=space)
    with pytest.raises(SpecError) as caught:
        load_space(tmp_path / "space.yaml")
    assert caught.value.key == "parameters.s.target.flag" and "--uds" in str(caught.value)
    assert caught.value.file == str(path.parent / "space.yaml")


# --- one argv word per model key -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["command", "vllm", "llamacpp"])
@pytest.mark.parametrize("key", ["served_name", "tokenizer", "path"])
def test_a_model_key_longer_than_one_argv_word_is_refused(
    tmp_path: Path, kind: str, key: str
) -> None:
    path = write(tmp_path, kind=kind, **{f"model__{key}": "m" * MAX_ARG_BYTES})
    refused(path, f"model.{key}", "longer than a command-line word can be")


def test_a_template_word_that_a_long_served_name_fills_is_refused(tmp_path: Path) -> None:
    """Each key fits alone, but the template's word that holds it does not."""
    command = [*FAKE_SERVER_COMMAND[:-2], "--model={served_name}"]
    path = write(tmp_path, command=command, model__served_name="m" * (MAX_ARG_BYTES - 4))
    refused(path, "model.served_name", "Argument list too long")


def test_the_cli_refuses_a_long_served_name_before_the_study_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, model__served_name="n" * (MAX_ARG_BYTES + 10))
    result = CliRunner().invoke(app, ["run", "--spec", str(path)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "model.served_name" in result.stderr and str(path) in result.stderr
    assert not list(tmp_path.rglob("*.db"))


# --- present values of the wrong type are not the default ------------------------------------


@pytest.mark.parametrize(
    ("dotted", "value", "key"),
    [
        ("objective", 0, "objective"),
        ("objective", [], "objective"),
        ("timeouts", [], "timeouts"),
        ("timeouts", 0, "timeouts"),
        ("engine__env", 0, "engine.env"),
        ("engine__env", [], "engine.env"),
        ("engine__args", {}, "engine.args"),
        ("engine__args", 0, "engine.args"),
        ("engine__version_command", False, "engine.version_command"),
        ("engine__version_command", "", "engine.version_command"),
        ("engine__patch_dirs", "", "engine.patch_dirs"),
        ("engine__patch_dirs", 0, "engine.patch_dirs"),
        ("check__known_answers", 0, "check.known_answers"),
        ("check__known_answers", {}, "check.known_answers"),
        ("workload__slo", {}, "workload.slo"),
        ("workload__slo", "", "workload.slo"),
        ("objective__constraints", "", "objective.constraints"),
        ("objective__constraints", {}, "objective.constraints"),
        ("model__served_name", "", "model.served_name"),
        ("model__tokenizer", "", "model.tokenizer"),
    ],
)
def test_an_empty_value_of_the_wrong_type_is_refused(
    tmp_path: Path, dotted: str, value: Any, key: str
) -> None:
    error = refused(write(tmp_path, **{dotted: value}), key)
    assert error.line is not None


def test_search_space_constraints_of_the_wrong_type_are_refused(tmp_path: Path) -> None:
    for value in ({}, "", 0):
        write(tmp_path, space={**SPACE, "constraints": value})
        with pytest.raises(SpecError) as caught:
            load_spec(tmp_path / "spec.yaml")
        assert caught.value.key == "constraints", str(caught.value)
        assert caught.value.file == str(tmp_path / "space.yaml")
        assert "must be a list" in str(caught.value)


def test_absent_or_null_keys_still_mean_the_default(tmp_path: Path) -> None:
    absent = load_spec(
        write(tmp_path, objective=..., timeouts=..., engine__args=..., check__known_answers=...)
    )
    nulls = load_spec(
        write(
            tmp_path,
            objective=None,
            timeouts=None,
            engine__args=None,
            engine__env=None,
            engine__version_command=None,
            engine__patch_dirs=None,
            check__known_answers=None,
            workload__slo=None,
            model__served_name=None,
            space={**SPACE, "constraints": None},
        )
    )
    for spec in (absent, nulls):
        assert spec.objective == load_spec(write(tmp_path, objective={})).objective
        assert spec.startup_timeout_s == 300 and spec.max_consecutive_infra_failures == 3
        assert spec.engine.args == () and spec.engine.env == {}
        assert spec.engine.patch_dirs == ((tmp_path / "../patches").resolve(),)
        assert spec.check.known_answers == () and spec.workload.slos == ()
    assert nulls.model.served_name == "model" and nulls.space.constraints == ()


def test_an_empty_patch_dirs_list_means_no_patch_directory(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, engine__patch_dirs=[]))
    assert spec.engine.patch_dirs == ()


def test_a_numeric_served_name_zero_is_the_name_zero(tmp_path: Path) -> None:
    """``served_name: 0`` was read as no name (the model folder's); a number is its text."""
    assert load_spec(write(tmp_path, model__served_name=0)).model.served_name == "0"


def test_the_fake_command_itself_still_loads(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path))
    assert spec.engine.command[0] == sys.executable
    assert yaml.safe_load((tmp_path / "spec.yaml").read_text())["engine"]["kind"] == "command"


# --- a red team's specs: the server stays on 127.0.0.1 ----------------------------------------


def cli_refused(tmp_path: Path, path: Path, *needles: str) -> str:
    """``autotune run`` of ``path``: exit 2, one error line with ``needles``, no study."""
    result = CliRunner().invoke(app, ["run", "--spec", str(path)])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not list(tmp_path.rglob("*.db")) and not list(tmp_path.rglob("*-artifacts"))
    return lines[0]


def test_a_command_template_without_host_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``[{python}, -m, http.server, {port}]`` validated, and the server listened on 0.0.0.0:
    a server not told its address picks its own."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, command=["{python}", "-m", "http.server", "{port}"])
    error = refused(path, "engine.command", "must contain {host}")
    assert error.line is not None
    cli_refused(tmp_path, path, f"{path}:", "engine.command", "{host}")


@pytest.mark.parametrize(
    ("kind", "target", "owned"),
    [
        # argparse reads --hos as --host: ["0.0.0.0", ...] opened the server to the network
        ("command", {"flag": "--hos"}, "--host"),
        ("vllm", {"flag": "--hos"}, "--host"),
        ("vllm", {"flag": "--served_model"}, "--served-model-name"),
        ("command", {"flag": "--mod"}, "--model"),  # the template's --model {served_name}
        ("llamacpp", {"flag": "--x", "false_flag": "--por"}, "--port"),
    ],
)
def test_a_tuned_flag_that_is_a_prefix_of_one_autotune_sets(
    tmp_path: Path, kind: str, target: dict, owned: str
) -> None:
    domain = {"type": "bool"} if "false_flag" in target else {"type": "categorical"}
    if "false_flag" not in target:
        domain["choices"] = ["127.0.0.2", "10.0.0.5"]
    path = write(tmp_path, kind=kind, space={"parameters": {"h": {**domain, "target": target}}})
    what = "false_flag" if "false_flag" in target else "flag"
    error = refused(path, f"parameters.h.target.{what}", f"is read as {owned} (a prefix of it)")
    assert error.file == str(tmp_path / "space.yaml")


@pytest.mark.parametrize(
    ("domain", "key"),
    [
        # the red team's: a prefix of --host, and the address of every interface
        ({"choices": ["0.0.0.0", "127.0.0.1"], "target": {"flag": "--hos"}}, "choices[0]"),
        ({"choices": ["127.0.0.1", "0.0.0.0"], "target": {"flag": "--bind"}}, "choices[1]"),
        (
            {"choices": ["::", "127.0.0.1"], "baseline": "::", "target": {"flag": "--listen"}},
            "choices[0]",
        ),
        ({"choices": ["a", "0:8000"], "target": {"flag": "--x"}}, "choices[1]"),
        ({"choices": [1, 0], "target": {"env": "SERVER_HOST"}}, "choices[1]"),
        (
            {"choices": ["0x0"], "target": {"json": "--server-config", "key": "http.ip"}},
            "choices[0]",
        ),
        ({"type": "int", "low": 0, "high": 3, "target": {"flag": "--bind"}}, "low"),
    ],
)
def test_a_tuned_value_that_names_every_interface(tmp_path: Path, domain: dict, key: str) -> None:
    space = {"parameters": {"h": {"type": "categorical", **domain}}}
    refused(write(tmp_path, space=space), f"parameters.h.{key}", "every network interface")


@pytest.mark.parametrize(
    ("args", "index"),
    [
        # getaddrinfo and inet_aton read each of these as 0.0.0.0
        (["--bind", "0"], 1),
        (["--listen", "0x0"], 1),
        (["--bind-address", "0.0"], 1),
        (["--bind=0"], 0),
        (["--x", "000.000.000.000"], 1),
        (["--x", "0:8000"], 1),
        (["--x", ":8000"], 1),
        (["--x", "::ffff:0.0.0.0"], 1),
    ],
)
def test_spellings_of_every_interface_in_engine_args(
    tmp_path: Path, args: list, index: int
) -> None:
    refused(write(tmp_path, args=args), f"engine.args[{index}]", "every network interface")


def test_words_that_only_look_like_an_address_are_accepted(tmp_path: Path) -> None:
    """A zero is an address only as the value of a flag named for one (``--bind 0``)."""
    args = ["--temperature", "0.0", "--max-loras", "0", "--x", "8000", "--listen-port", "0"]
    space = {
        "parameters": {
            "t": {"type": "categorical", "choices": [0.0, "0x0"], "target": {"flag": "--t"}},
            "n": {"type": "int", "low": 0, "high": 4, "target": {"flag": "--max-loras"}},
            # vLLM's CPU threads, bound to core 0
            "b": {
                "type": "categorical",
                "choices": ["0", "all"],
                "target": {"env": "VLLM_CPU_OMP_THREADS_BIND"},
            },
        }
    }
    spec = load_spec(write(tmp_path, args=args, space=space))
    assert spec.engine.args == tuple(args) and len(spec.space.parameters) == 3


# --- YAML read otherwise than written, and keys that would break the error's one line ---------


@pytest.mark.parametrize(
    ("section", "key", "words"),
    [
        # env: {MASK: 0755} was launched as MASK=493; 0777 as 511, 1:2 as 62
        ("env: {MASK: 0755}", "engine.env.MASK", "the YAML number 0755 is read as the octal 493"),
        ("args: [--cpu-mask, 0777]", "engine.args[1]", "quote it as '0777'"),
        ("args: [--ratio, 1:2]", "engine.args[1]", "read in base 60 as 62"),
        # ValueError: Exceeds the limit (4300 digits) for integer string conversion
        (f"health_path: 1{'0' * 5000}", "engine.health_path", "more digits than can be read"),
    ],
)
def test_yaml_numbers_not_read_as_written_in_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, section: str, key: str, words: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path)
    path.write_text(path.read_text().replace("engine:\n", f"engine:\n  {section}\n", 1))
    error = refused(path, key, words)
    assert error.line == 3  # study: line 1, engine: line 2
    cli_refused(tmp_path, path, f"{path}:3:", key)


def test_a_quoted_octal_is_text(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace("engine:\n", "engine:\n  env: {MASK: '0755'}\n", 1))
    assert load_spec(path).engine.env == {"MASK": "0755"}


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("x\\x1b[31mRED\\nfake: line", "x\\x1b[31mRED\\nfake: line"),
        ("x\\0y", "x\\x00y"),
        ("x\\u2028y\\u202ez", "x\\u2028y\\u202ez"),
    ],
)
def test_a_key_with_control_characters_stays_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, shown: str
) -> None:
    """A key ``"x\\x1b[31mRED\\nfake: line"`` printed a raw ANSI escape and a second line that
    read as another message; a NUL went to the terminal as is."""
    monkeypatch.chdir(tmp_path)
    space = f'parameters:\n  n: {{type: bool, "{name}": 1, target: {{flag: --n}}}}\n'
    path = write(tmp_path, space=space)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    text = str(caught.value)
    assert text.isprintable() and f"parameters.n.{shown}: unknown key" in text, text
    assert caught.value.key == f"parameters.n.{name.encode().decode('unicode_escape')}"
    cli_refused(tmp_path, path, f"parameters.n.{shown}")


def test_a_spec_error_is_one_printable_line() -> None:
    error = SpecError("bad\nvalue", file="dir\x1b[2J/spec.yaml", key="a\rb", line=3)
    assert str(error) == "dir\\x1b[2J/spec.yaml:3: a\\rb: bad\\nvalue"
    assert (error.file, error.key, error.message) == ("dir\x1b[2J/spec.yaml", "a\rb", "bad\nvalue")
