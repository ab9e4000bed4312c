"""`autotune export` for llama.cpp: a launch script and the ``LLAMA_ARG_*`` variables it hands
llama-server, read back by ``compare`` and ``recheck``.

Without the binary: the captured ``--help`` (``tests/fixtures/llamacpp/help.txt``) says which
flag has which variable, and the script is run by the real ``sh`` with an argv printer in the
server's place. With the real llama-server and the SmolLM2 GGUF (skipped, saying which is
missing, elsewhere): the exported script starts the server exactly as the files say.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
import yaml
from typer.testing import CliRunner

from autotune import names
from autotune._proc import free_port
from autotune.analysis.compare import config_values
from autotune.cli.app import app
from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.engines.registry import build_engine
from autotune.errors import SpecError
from autotune.spec.load import load_spec
from autotune.study.export import default_output, export_values, read_record
from tests import reaper
from tests.test_bad_input import SPEC
from tests.test_llamacpp_engine import GGUF, HELP, REAL, needs_real

SPACE: dict[str, Any] = {
    "parameters": {
        "threads": {"type": "int", "low": 1, "high": 4, "target": {"flag": "--threads"}},
        # its variable is not named after the flag: LLAMA_ARG_N_PARALLEL
        "parallel": {"type": "categorical", "choices": [1, 2, 4], "target": {"flag": "--parallel"}},
        "cache_k": {
            "type": "categorical",
            "choices": ["f16", "q8_0"],
            "target": {"flag": "--cache-type-k"},
        },
        "cont_batching": {
            "type": "bool",
            "target": {"flag": "--cont-batching", "false_flag": "--no-cont-batching"},
        },
        # help names no variable for it: it stays on the command line
        "threads_batch": {
            "type": "int",
            "low": 1,
            "high": 4,
            "target": {"flag": "--threads-batch"},
        },
        # engine.args set it too: on the command line after them, where the last one wins
        "ctx": {"type": "categorical", "choices": [2048, 8192], "target": {"flag": "--ctx-size"}},
        "template": {
            "type": "categorical",
            "choices": ["plain", 'it\'s "q" $HOME `x`', "two\nlines"],
            "target": {"flag": "--chat-template"},
        },
        "omp": {"type": "categorical", "choices": ["1", "2"], "target": {"env": "OMP_NUM_THREADS"}},
    }
}
VALUES = {
    "threads": 3,
    "parallel": 2,
    "cache_k": "q8_0",
    "cont_batching": False,
    "threads_batch": 2,
    "ctx": 8192,
    "template": 'it\'s "q" $HOME `x`',
    "omp": "2",
}
#: what stands in for llama-server: prints its argv and the environment it was given
PRINTER = """\
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()
                  if k.startswith(("LLAMA_", "OMP_", "MY_"))}}))
"""


def write_spec(tmp_path: Path, space: dict, *, model: Path | None = None) -> Path:
    """A llamacpp spec with fixed ``--ctx-size 4096`` and a variable of its own."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    if model is None:
        model = tmp_path / "model.gguf"
        model.write_bytes(b"")
    spec = {
        **{k: v for k, v in SPEC.items() if k not in ("engine", "model")},
        "engine": {
            "kind": "llamacpp",
            "args": ["--ctx-size", "4096"],
            "env": {"MY_VAR": "x y"},
        },
        "model": {"path": str(model), "served_name": "smol"},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture
def printer_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A llamacpp spec whose "binary" is the argv printer, with the captured help."""
    printer = tmp_path / "llama-server"
    printer.write_text(f"#!{sys.executable}\n{PRINTER}")
    printer.chmod(0o755)
    monkeypatch.setattr(LlamaCppEngine, "program", lambda self: str(printer))
    monkeypatch.setattr(LlamaCppEngine, "server_help", lambda self: HELP)
    return load_spec(write_spec(tmp_path, SPACE))


def run_script(script: Path, *args: str, api_key: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "API_KEY"))}
    if api_key is not None:
        env["API_KEY"] = api_key
    return subprocess.run(
        ["sh", str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",  # the script finds its .env beside itself, not in the caller's folder
    )


# --- the files ------------------------------------------------------------------------------


def test_the_export_is_a_script_and_llama_server_s_own_variables(printer_spec, tmp_path):
    out = tmp_path / "out" / "best.sh"
    result = export_values(printer_spec, VALUES, out, title="test")
    assert result.env_path == tmp_path / "out" / "best.env" and result.command == ["sh", str(out)]
    text = out.read_text()
    assert text.startswith("# autotune export: study ")
    assert read_record(out)["values"] == VALUES  # what `autotune recheck` reads back
    assert 'LLAMA_API_KEY="${API_KEY}"\n' in result.env_path.read_text()

    ran = run_script(out, "--port", "9999", api_key="user's key")
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    assert seen["env"] == {
        "MY_VAR": "x y",
        "OMP_NUM_THREADS": "2",
        "LLAMA_ARG_THREADS": "3",
        "LLAMA_ARG_N_PARALLEL": "2",
        "LLAMA_ARG_CACHE_TYPE_K": "q8_0",
        "LLAMA_ARG_CONT_BATCHING": "false",  # --no-cont-batching
        "LLAMA_ARG_CHAT_TEMPLATE": 'it\'s "q" $HOME `x`',  # never expanded by the shell
        "LLAMA_API_KEY": "user's key",
    }
    assert seen["argv"] == [
        "-m",
        printer_spec.model.path,
        "--alias",
        "smol",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--ctx-size",
        "4096",
        "--threads-batch",
        "2",
        "--ctx-size",
        "8192",
        "--port",  # the caller's flags come last: llama-server takes the last one given
        "9999",
    ]


def test_the_script_refuses_to_start_without_the_user_s_key(printer_spec, tmp_path):
    """An empty LLAMA_API_KEY makes llama-server serve anyone: no key, no server."""
    out = tmp_path / "best.sh"
    export_values(printer_spec, VALUES, out, title="test")
    ran = run_script(out, api_key=None)
    assert ran.returncode != 0 and ran.stdout == ""
    assert "API_KEY" in ran.stderr and "the key clients must send" in ran.stderr


def test_a_value_that_does_not_fit_one_line_stays_on_the_command_line(printer_spec, tmp_path):
    out = tmp_path / "best.sh"
    values = {**VALUES, "template": "two\nlines"}
    export_values(printer_spec, values, out, title="test")
    assert "LLAMA_ARG_CHAT_TEMPLATE" not in out.with_suffix(".env").read_text()
    lines = out.read_text().splitlines()
    body = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert lines[body].startswith(': "${API_KEY')  # the header's comments all stayed comments
    assert read_record(out)["values"] == values
    seen = json.loads(run_script(out, api_key="k").stdout)
    assert seen["argv"][-2:] == ["--chat-template", "two\nlines"]
    assert "LLAMA_ARG_CHAT_TEMPLATE" not in seen["env"]


def test_where_an_export_holds_each_flag(printer_spec):
    engine = build_engine(printer_spec)
    assert engine.exported_at("--parallel") == ("env", "LLAMA_ARG_N_PARALLEL")
    assert engine.exported_at("--threads") == ("env", "LLAMA_ARG_THREADS")
    assert engine.exported_at("--threads-batch") == ("config", "threads-batch")
    assert engine.exported_at("--ctx-size") == ("config", "ctx-size")  # engine.args set it


def test_without_help_every_flag_stays_on_the_command_line(printer_spec, tmp_path, monkeypatch):
    from autotune.engines.llamacpp.help import HelpError

    def unreadable(self):
        raise HelpError("no help here")

    monkeypatch.setattr(LlamaCppEngine, "server_help", unreadable)
    out = tmp_path / "best.sh"
    export_values(printer_spec, {"threads": 3, "parallel": 2}, out, title="test")
    seen = json.loads(run_script(out, api_key="k").stdout)
    assert seen["argv"][-4:] == ["--threads", "3", "--parallel", "2"]
    assert not any(k.startswith("LLAMA_ARG_") for k in seen["env"])
    assert config_values(printer_spec, out)["threads"] == 3


# --- read back: compare and the default name ------------------------------------------------


def test_compare_reads_two_llama_cpp_exports_back_into_their_values(printer_spec, tmp_path):
    a, b = tmp_path / "a.sh", tmp_path / "b.sh"
    values_b = {**VALUES, "threads": 1, "parallel": 4, "cont_batching": True, "template": "plain"}
    export_values(printer_spec, VALUES, a, title="a")
    export_values(printer_spec, values_b, b, title="b")
    assert config_values(printer_spec, a) == VALUES
    assert config_values(printer_spec, b) == values_b
    engine = build_engine(printer_spec)
    read = engine.parse_export(a.read_text(), a.with_suffix(".env").read_text())
    assert read.env["LLAMA_ARG_THREADS"] == "3" and read.env["LLAMA_API_KEY"] == "$API_KEY"
    assert read.config["threads-batch"] == "2" and read.config["alias"] == "smol"


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("LLAMA_ARG_N_PARALLEL=2", "LLAMA_ARG_N_PARALLEL=3", "env LLAMA_ARG_N_PARALLEL"),
        ("--threads-batch 2", "--threads-batch two", "threads-batch"),
    ],
)
def test_an_edited_export_is_refused_naming_what_no_value_gives(
    printer_spec, tmp_path, old, new, key
):
    out = tmp_path / "best.sh"
    export_values(printer_spec, VALUES, out, title="a")
    for path in (out, out.with_suffix(".env")):
        path.write_text(path.read_text().replace(old, new))
    with pytest.raises(SpecError, match=key) as info:
        config_values(printer_spec, out)
    assert str(out) in str(info.value)


def test_an_exported_number_outside_the_space_is_refused_naming_its_parameter(
    printer_spec, tmp_path
):
    """``--threads-batch 9`` in a space of 1..4: the flag's value reads back as a number, but
    no trial of this space could have run it; compare must not measure it under the spec's name."""
    out = tmp_path / "best.sh"
    export_values(printer_spec, VALUES, out, title="a")
    out.write_text(out.read_text().replace("--threads-batch 2", "--threads-batch 9"))
    with pytest.raises(SpecError, match="9 is outside the domain of parameter 'threads_batch'"):
        config_values(printer_spec, out)


def test_a_config_file_is_no_llama_cpp_export(printer_spec, tmp_path):
    odd = tmp_path / "best.yaml"
    odd.write_text("# autotune export: study x, trial 1\nthreads: 3\n")
    with pytest.raises(SpecError, match="not a llama.cpp export"):
        config_values(printer_spec, odd)


def test_export_writes_best_sh_by_default(printer_spec, tmp_path, monkeypatch):
    assert default_output(printer_spec) == Path("best.sh")
    space = {"parameters": {"parallel": SPACE["parameters"]["parallel"]}}
    spec_path = write_spec(tmp_path / "one", space)
    spec = load_spec(spec_path)
    study = optuna.create_study(
        storage=spec.default_storage(), study_name=spec.name, direction="maximize"
    )
    for role, parallel, tps in ((names.BASELINE, 1, 10.0), (names.SEARCH, 4, 20.0)):
        study.add_trial(
            optuna.trial.create_trial(
                params={"parallel": parallel},
                distributions={"parallel": optuna.distributions.CategoricalDistribution([1, 2, 4])},
                value=tps,
                user_attrs={
                    names.CORRECT: True,
                    names.ROLE: role,
                    names.PARAMS_RESOLVED: {"parallel": parallel},
                    names.METRICS: {spec.objective.metrics[0]: tps},
                    names.CHECK: {"passed": True},
                },
                system_attrs={f"constraints:{names.CORRECTNESS_CONSTRAINT}": 0.0},
            )
        )
    monkeypatch.chdir(tmp_path)
    ran = CliRunner().invoke(app, ["export", "--spec", str(spec_path), "--allow-unconfirmed"])
    assert ran.exit_code == 0, ran.output
    assert "NOT a confirmed gain" in (tmp_path / "best.sh").read_text().splitlines()[0]
    assert "LLAMA_ARG_N_PARALLEL=4" in (tmp_path / "best.env").read_text()


# --- the real llama-server ------------------------------------------------------------------


@needs_real
def test_the_real_server_runs_as_the_exported_files_say(tmp_path: Path) -> None:
    """Start llama-server with the exported script alone (a free port and the key are the
    caller's), and see the tuned settings in what it serves and logs."""
    space = {"parameters": {k: SPACE["parameters"][k] for k in ("threads", "parallel", "cache_k")}}
    # a switch turned off through its variable: /props says whether the web UI is on
    space["parameters"]["ui"] = {
        "type": "bool",
        "target": {"flag": "--ui", "false_flag": "--no-ui"},
    }
    spec = load_spec(write_spec(tmp_path, space, model=GGUF))
    values = {"threads": 1, "parallel": 2, "cache_k": "q8_0", "ui": False}
    out = tmp_path / "best.sh"
    export_values(spec, values, out, title="real")
    assert {
        "LLAMA_ARG_THREADS=1",
        "LLAMA_ARG_N_PARALLEL=2",
        "LLAMA_ARG_CACHE_TYPE_K=q8_0",
        "LLAMA_ARG_UI=false",
    } <= set(out.with_suffix(".env").read_text().splitlines())
    assert str(REAL) in out.read_text()
    key, port = "k" * 40, free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_")}
    log = tmp_path / "server.log"
    with log.open("wb") as fh:
        server = subprocess.Popen(
            # -lv 4: llama.cpp logs the KV cache's types only at this verbosity
            ["sh", str(out), "--port", str(port), "-lv", "4"],
            env={**env, "API_KEY": key},
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    reaper.own(server)
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {key}"}
    try:
        with httpx.Client(base_url=url, timeout=120, trust_env=False) as client:
            deadline = time.monotonic() + 300
            while True:
                assert server.poll() is None, f"exited {server.returncode}: {log.read_text()}"
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/health", timeout=5).status_code == 200:
                        break
                assert time.monotonic() < deadline, "not healthy in 300 s: " + log.read_text()
                time.sleep(0.5)
            body = {"model": "smol", "prompt": "The capital of France is", "max_tokens": 4}
            answer = client.post("/v1/completions", json={**body, "temperature": 0}, headers=auth)
            refused = client.post("/v1/completions", json=body)
            slots = client.get("/slots", headers=auth)
            props = client.get("/props", headers=auth)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        reaper.release(server)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == "smol" and answer.json()["choices"][0]["text"]
    assert refused.status_code == 401  # the key is the user's API_KEY
    assert len(slots.json()) == 2  # --parallel 2, from LLAMA_ARG_N_PARALLEL
    assert props.json()["ui"] is False  # --no-ui, from LLAMA_ARG_UI=false
    text = log.read_text()
    assert "n_threads = 1" in text and "n_slots = 2" in text
    assert "K (q8_0)" in text
    assert "will be overwritten" not in text  # no tuned flag given twice
