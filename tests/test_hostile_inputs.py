"""Hostile and odd inputs that were accepted wrongly, crashed with a traceback, or broke a later
step: each is now one error line naming the file and the key, exit code 2, nothing written
(the rules and helpers of ``tests/test_bad_input.py``). The export header and the merge keys
that stay accepted are checked here too."""

from __future__ import annotations

import errno
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.errors import SpecError
from autotune.space.load import load_space
from autotune.spec.checks import ARG_MAX_CAP, arg_max, exec_bytes
from autotune.spec.load import load_spec
from tests.test_bad_input import SPEC, assert_bad_input, invoke, with_, write


@pytest.fixture(autouse=True)
def _work_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def run_with_space(tmp: Path, text: str | bytes, *needles: str) -> str:
    """``autotune run`` with the search space ``text``: bad input naming the space file."""
    path = write(tmp)
    space = tmp / "space.yaml"
    if isinstance(text, bytes):
        space.write_bytes(text)
    else:
        space.write_text(text)
    return assert_bad_input(invoke("run", "--spec", str(path)), tmp, f"{space}:", *needles)


def run_with_spec(tmp: Path, spec: dict[str, Any], *needles: str) -> str:
    path = write(tmp, spec)
    return assert_bad_input(invoke("run", "--spec", str(path)), tmp, f"{path}:", *needles)


def param(body: str, name: str = "x") -> str:
    return f"parameters:\n  {name}: {body}\n"


# --- the YAML itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        # the second max_num_seqs replaced the first without a word
        (
            "parameters:\n  n: {type: int, low: 1, high: 8, target: {flag: --n}}\n"
            "  n: {type: int, low: 1, high: 2, target: {flag: --m}}\n",
            "parameters.n",
            "3",
        ),
        (
            "parameters:\n  n: {type: int, low: 1, high: 8, low: 4, target: {flag: --n}}\n",
            "parameters.n.low",
            "2",
        ),  # fmt: skip
        (
            "parameters:\n  a: {type: bool, target: {flag: --a}}\n"
            "parameters:\n  b: {type: bool, target: {flag: --b}}\n",
            "parameters",
            "3",
        ),
        # one key as YAML reads it: on and yes are both true
        (
            "parameters:\n  on: {type: bool, target: {flag: --a}}\n"
            "  yes: {type: bool, target: {flag: --b}}\n",
            "parameters.yes",
            "3",
        ),
    ],
)
def test_a_duplicate_key_is_refused(tmp_path: Path, text: str, key: str, line: str) -> None:
    result = run_with_space(tmp_path, text, key, "duplicate key")
    assert f"space.yaml:{line}:" in result


def test_a_duplicate_key_in_the_spec(tmp_path: Path) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text() + "study: other\n")
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, "study:", "duplicate key")


def test_anchors_and_merge_keys_are_accepted(tmp_path: Path) -> None:
    """``<<: *base`` merges, and the mapping's own keys win: no duplicate there."""
    (tmp_path / "space.yaml").write_text(
        "parameters:\n"
        "  a: &base {type: int, low: 1, high: 8, target: {flag: --a}}\n"
        "  b:\n    <<: *base\n    low: 2\n    target: {flag: --b}\n"
        "  c: {<<: [*base], high: 4, target: {flag: --c}}\n"
    )
    space = load_space(tmp_path / "space.yaml")
    bounds = [(p.name, p.low, p.high, p.target.name) for p in space.parameters]
    assert bounds == [("a", 1, 8, "--a"), ("b", 2, 8, "--b"), ("c", 1, 4, "--c")]


def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """A UnicodeDecodeError traceback, exit 1, before."""
    text = b"parameters:\n  x: {type: categorical, choices: ['\xff\xfe'], target: {flag: --x}}\n"
    run_with_space(tmp_path, text, "space.yaml:2:", "not UTF-8")
    run_with_space(tmp_path, "parameters: {}\n".encode("utf-16"), "space.yaml:1:", "not UTF-8")
    path = write(tmp_path)
    path.write_bytes(b"# caf\xe9\n" + path.read_bytes())
    assert_bad_input(invoke("run", "--spec", str(path)), tmp_path, f"{path}:1:", "not UTF-8")


def test_yaml_nested_too_deeply(tmp_path: Path) -> None:
    """PyYAML recursed per level: a RecursionError traceback at a few hundred levels."""
    run_with_space(tmp_path, "parameters: " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply")


def test_a_lone_surrogate(tmp_path: Path) -> None:
    """``"\\ud800"`` is no text: the launch and the export raised UnicodeEncodeError."""
    run_with_space(
        tmp_path,
        param('{type: categorical, choices: [a, "b\\ud800"], target: {flag: --x}}'),
        "parameters.x.choices[1]",
        "surrogate",
    )


# --- numeric domains --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        # int(0.5) == 0: Optuna raised "step > 0 must hold" in the first trial
        ("{type: int, low: 1, high: 8, step: 0.5, target: {flag: --x}}", "x.step", "whole number"),
        # int(1.5) == 1: a step of 1 was searched, silently
        ("{type: int, low: 1, high: 7, step: 1.5, target: {flag: --x}}", "x.step", "whole number"),
        # Optuna lowered high to 7 with a warning: 8 was never tried
        (
            "{type: int, low: 1, high: 8, step: 3, target: {flag: --x}}",
            "x.step",
            "does not divide high - low = 7: the last value would be 7; make high 7 or 10",
        ),
        (
            "{type: float, low: 0, high: 1, step: 0.3, target: {flag: --x}}",
            "x.step",
            "make high 0.9 or 1.2",
        ),
        # numpy's uniform overflowed: OverflowError in every sampler, mid-study
        (
            "{type: float, low: -1.0e+308, high: 1.0e+308, target: {flag: --x}}",
            "parameters.x",
            "too wide",
        ),
        # the baseline is not a value of the grid, so Optuna never proposes it
        (
            "{type: int, low: 1, high: 9, step: 4, baseline: 2, target: {flag: --x}}",
            "x.baseline",
            "outside",
        ),  # fmt: skip
        # list(4) raised TypeError: a traceback
        (
            "{type: int_list, choices: [[1, 2], [4]], baseline: 4, target: {flag: --x}}",
            "x.baseline",
            "outside",
        ),  # fmt: skip
    ],
)
def test_numeric_domains(tmp_path: Path, body: str, key: str, words: str) -> None:
    run_with_space(tmp_path, param(body), key, words)


def test_stepped_domains_that_divide_are_accepted(tmp_path: Path) -> None:
    import optuna

    (tmp_path / "space.yaml").write_text(
        "parameters:\n"
        "  a: {type: float, low: 0.8, high: 0.95, step: 0.05, baseline: 0.85,\n"
        "      target: {flag: --a}}\n"
        "  b: {type: int, low: 64, high: 8192, step: 64, baseline: 128.0, target: {flag: --b}}\n"
    )
    space = load_space(tmp_path / "space.yaml")
    # an int parameter's 128.0 went to the engine as "--b 128.0", which an int flag refuses
    assert space.baseline_values() == {"a": 0.85, "b": 128}
    assert type(space.baseline_values()["b"]) is int
    # every value Optuna proposes is in the domain (0.8 + 2 * 0.05 is 0.9000000000000001)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(40):
        values = space.suggest(study.ask())
        assert all(space.parameter(k).contains(v) for k, v in values.items()), values
    assert space.parameter("a").contains(0.8 + 2 * 0.05)
    assert not space.parameter("a").contains(0.82) and not space.parameter("b").contains(100)


# --- when ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        # list(4) raised TypeError: a traceback
        ("when: {sizes: 4}", "parameters.x.when.sizes", "not in the domain"),
        # never active, so never tuned
        ("when: {mode: {in: []}}", "parameters.x.when.mode.in", "non-empty list"),
        ("when: {dep: true, mode: b}", "parameters.x.when", "never active"),
        # read as no condition at all
        ("when: false", "parameters.x.when", "must be a mapping"),
        ("when: ''", "parameters.x.when", "must be a mapping"),
    ],
)
def test_conditions(tmp_path: Path, extra: str, key: str, words: str) -> None:
    text = (
        "parameters:\n"
        "  sizes: {type: int_list, choices: [[1, 2], [4]], target: {flag: --sizes}}\n"
        "  mode: {type: categorical, choices: [a, b], target: {flag: --run-mode}}\n"
        "  dep: {type: bool, target: {flag: --dep}, when: {mode: a}}\n"
        f"  x: {{type: bool, target: {{flag: --x}}, {extra}}}\n"
    )
    run_with_space(tmp_path, text, key, words)


# --- names and targets ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        # constraints read `None`/`if`/`True` as Python, not as the parameter
        (param("{type: bool, target: {flag: --x}}", "None"), "parameters.None", "keyword"),
        (param("{type: bool, target: {flag: --x}}", "'True'"), "parameters.True", "keyword"),
        # `len > 1` raised KeyError: 'len', a traceback
        (
            param("{type: int, low: 1, high: 3, target: {flag: --x}}", "len")
            + "constraints: ['len > 1']\n",
            "parameters.len",
            "function",
        ),
        # Python reads the ligature ﬁ as fi: a constraint on ﬁ named another parameter
        (param("{type: bool, target: {flag: --x}}", "\ufb01"), "parameters.\ufb01", "ASCII"),
        (
            param("{type: int, low: 1, high: 3, target: {flag: --x}}", "n")
            + "constraints: ['len > 1']\n",
            "constraints[0]",
            "len is a function",
        ),
        # flags: the value is the parameter's, one argv word
        (param("{type: int, low: 1, high: 2, target: {flag: '--x=3'}}"), "target.flag", "no '='"),
        (param("{type: int, low: 1, high: 2, target: {flag: '--x y'}}"), "target.flag", "spaces"),
        (param("{type: int, low: 1, high: 2, target: {flag: '--'}}"), "target.flag", "a name"),
        (
            param("{type: int, low: 1, high: 2, target: {json: '--c=1', key: a}}"),
            "target.json",
            "no '='",
        ),  # fmt: skip
        # false launched as the flag itself: both values ran with the flag on
        (
            param("{type: bool, target: {flag: --x, false_flag: --x}}"),
            "target.false_flag",
            "must differ",
        ),  # fmt: skip
        (
            param("{type: int, low: 1, high: 2, target: {json: --c, key: 'a..b'}}"),
            "target.key",
            "empty part",
        ),  # fmt: skip
        # two parameters, one flag: one value replaced the other, or the flag came twice
        (
            "parameters:\n  a: {type: bool, target: {flag: --a, false_flag: --b}}\n"
            "  b: {type: bool, target: {flag: --b}}\n",
            "parameters.b.target",
            "--b is also set by parameter 'a'",
        ),
        (
            "parameters:\n  a: {type: int, low: 1, high: 2, target: {json: --c, key: a}}\n"
            "  b: {type: int, low: 1, high: 2, target: {flag: --c}}\n",
            "parameters.b.target",
            "--c is also set by parameter 'a'",
        ),
        # setting a.b inside the number a raised TypeError at the launch
        (
            "parameters:\n  a: {type: int, low: 1, high: 2, target: {json: --c, key: a}}\n"
            "  b: {type: int, low: 1, high: 2, target: {json: --c, key: a.b}}\n",
            "parameters.b.target",
            "inside key a",
        ),
        (param("{type: bool, target: {patch: ../../etc/passwd}}"), "target.patch", "patch name"),
        (param("{type: bool, help: [1], target: {flag: --x}}"), "parameters.x.help", "text"),
        (
            param("{type: bool, target: {flag: --x}}") + "description: {a: 1}\n",
            "description",
            "text",
        ),  # fmt: skip
    ],
)
def test_names_and_targets(tmp_path: Path, text: str, key: str, words: str) -> None:
    run_with_space(tmp_path, text, key, words)


@pytest.mark.parametrize(
    ("var", "words"),
    [
        # the launch looked the engine up in the tuned PATH: "command not found" was blamed
        # on the configuration
        ("PATH", "which program starts"),
        # replaced by the per-trial key (or the patch selection) at every launch
        ("AUTOTUNE_API_KEY", "autotune sets"),
        ("AUTOTUNE_PATCHES", "autotune sets"),
    ],
)
def test_env_targets_autotune_sets(tmp_path: Path, var: str, words: str) -> None:
    run_with_space(
        tmp_path,
        param(f"{{type: categorical, choices: [a, b], target: {{env: {var}}}}}"),
        "parameters.x.target.env",
        words,
    )


def run_vllm_space(tmp_path: Path, target: dict) -> Any:
    """`autotune run` on the demo's vLLM spec with a one-parameter space ``x: target``."""
    spec = yaml.safe_load((Path(__file__).parents[1] / "studies" / "demo.yaml").read_text())
    spec.update(search_space="space.yaml", model={"path": "model"})
    path = write(tmp_path, spec, {"parameters": {"x": target}})
    return invoke("run", "--spec", str(path))


def test_env_target_of_the_engines_key(tmp_path: Path) -> None:
    """vLLM's key variable, set per trial, is the engine's own: refused in its space only."""
    target = {"type": "categorical", "choices": ["a", "b"], "target": {"env": "VLLM_API_KEY"}}
    assert_bad_input(
        run_vllm_space(tmp_path, target),
        tmp_path,
        f"{tmp_path / 'space.yaml'}:",
        "parameters.x.target.env",
        "API key",
    )
    space = load_space(tmp_path / "space.yaml")  # another engine may read it
    assert space.parameter("x").target.name == "VLLM_API_KEY"
    # the spec's own engine.env: replaced by the key at every launch
    run_with_spec(
        tmp_path, with_(SPEC, "engine.env", {"AUTOTUNE_API_KEY": "x"}), "engine.env", "sets"
    )


@pytest.mark.parametrize(
    ("var", "demo"),
    [
        ("CUDA_VISIBLE_DEVICES", False),
        # vLLM's CPU core binding, which a worker without GPUs sets
        ("VLLM_CPU_OMP_THREADS_BIND", True),
    ],
)
def test_env_targets_a_parallel_worker_sets(tmp_path: Path, var: str, demo: bool) -> None:
    """Each worker of ``--parallel`` gives its servers their own devices in these variables,
    replacing the tuned value: every trial measured the worker's devices under the tuned
    label (it was a warning on the console). Refused before anything is written, whatever the
    storage; a run without --parallel may tune them."""
    spec = SPEC
    if demo:
        spec = yaml.safe_load((Path(__file__).parents[1] / "studies" / "demo.yaml").read_text())
        spec.update(search_space="space.yaml", model={"path": "model"})
    x = {"type": "categorical", "choices": ["0", "1"], "target": {"env": var}}
    path = write(tmp_path, spec, {"parameters": {"x": x}})
    line = assert_bad_input(
        invoke("run", "--spec", str(path), "--trials", "2", "--parallel", "2"),
        tmp_path,
        f"{tmp_path / 'space.yaml'}:",
        "parameters.x.target.env",
        f"{var} cannot be tuned with --parallel",
    )
    assert "worker" in line
    assert load_spec(path).space.parameter("x").target.name == var


@pytest.mark.parametrize(
    ("choice", "target", "words"),
    [
        # the launch raised "ValueError: embedded null byte", a traceback mid-study
        ('"b\\0"', "{flag: --x}", "NUL"),
        # Linux's limit on one argv word: every launch failed "Argument list too long"
        ("x" * 140_000, "{flag: --x}", "longer than"),
        ("x" * 140_000, "{env: X}", "longer than"),
        # a line break in an env value: the export's .env file broke
        ('"b\\nc"', "{env: X}", ".env"),
        ('"b\\rc"', "{env: X}", ".env"),
        # \x85 and \u2028 end a line for YAML and Python: the export's .env and header broke
        ('"a\\x85b"', "{env: X}", "line break"),
        ('"a\\u2028b"', "{env: X}", "line break"),
        ('"a\\x01b"', "{env: X}", "control character"),
    ],
)
def test_values_no_launch_or_export_can_carry(
    tmp_path: Path, choice: str, target: str, words: str
) -> None:
    run_with_space(
        tmp_path,
        param(f"{{type: categorical, choices: [a, {choice}], target: {target}}}"),
        "parameters.x.choices[1]",
        words,
    )


class _Aliasing(yaml.SafeDumper):
    """Dumps a long string once and aliases its repeats."""

    def ignore_aliases(self, data: Any) -> bool:
        return not isinstance(data, str) or len(data) < 1000


def test_a_space_whose_longest_launch_is_over_arg_max(tmp_path: Path) -> None:
    """Every value fits one argv word, but together they pass the kernel's limit on a launch:
    each trial that drew them failed to start with E2BIG, blamed on the configuration."""
    limit = arg_max()
    assert limit is not None
    count = limit // 120_000 + 1
    # one 120 kB value named once and aliased: the file stays under the 1 MiB bound on specs
    big = "x" * 120_000
    text = "parameters:\n" + "".join(
        f"  p{i}: {{type: categorical, choices: [a, {'&big ' + big if i == 0 else '*big'}], "
        f"target: {{{'env: P' if i % 2 else 'flag: --p'}{i}}}}}\n"
        for i in range(count)
    )
    line = run_with_space(tmp_path, text, "parameters:", "Argument list too long")
    assert f"ARG_MAX {limit:,}" in line
    assert re.search(r"The largest parameters, in bytes: p\d+ 120,0\d\d", line), line


def test_an_engine_launch_over_arg_max(tmp_path: Path) -> None:
    """The spec's own words can pass the limit together too: named in the spec."""
    words = ["x" * 120_000] * (arg_max() // 120_000 + 1)
    path = write(tmp_path)
    # the word written once and aliased: the file stays under the 1 MiB bound on specs
    text = yaml.dump(with_(SPEC, "engine.args", words), Dumper=_Aliasing, sort_keys=False)
    path.write_text(text)
    line = assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, f"{path}:", "engine:", "too long"
    )
    assert "with no parameter set" in line


def test_the_launch_size_is_what_the_kernel_counts(tmp_path: Path) -> None:
    """``exec_bytes`` and the program's path, at ARG_MAX: the program runs; a byte more and
    execve refuses it (E2BIG). The check's count is the kernel's, not a guess.

    The child's stack limit is set to 8 MiB before it execs, so the kernel's limit is known
    (a quarter of it, fs/exec.c) on any machine, whatever ``ulimit -s`` the tests run under:
    the test never has a reason to be skipped."""
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    stack = 8 * 1024 * 1024
    if hard != resource.RLIM_INFINITY:
        stack = min(stack, hard)
    limit = min(stack // 4, ARG_MAX_CAP)

    def fixed_stack() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (stack, hard))

    program = sys.executable
    env = {"A": "1"}
    # each word under 128 KiB (one word's limit): the last one fills up to ARG_MAX
    words = [program, "-c", "pass"] + ["x" * 100_000] * ((limit - 8192) // 100_009) + [""]
    words[-1] = "x" * (limit - exec_bytes(words, env) - len(os.fsencode(program)) - 1)
    subprocess.run(words, env=env, check=True, preexec_fn=fixed_stack)
    with pytest.raises(OSError) as refused:
        subprocess.run([*words[:-1], words[-1] + "x"], env=env, check=True, preexec_fn=fixed_stack)
    assert refused.value.errno == errno.E2BIG


# --- the spec ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dotted", "value", "words"),
    [
        # a list of 1e30 requests took all memory in the baseline's first round
        ("workload.num_requests", 10**30, "at most 1,000,000"),
        ("workload.concurrency", 1e300, "at most 1,000,000"),
        ("check.max_tokens", 10**12, "at most 1,000,000"),
        ("timeouts.max_consecutive_infra_failures", 10**30, "at most 1,000,000"),
        # a socket or lock wait that long raised OverflowError in every request
        ("workload.request_timeout_s", 1e10, "at most 604,800 seconds"),
        ("timeouts.startup_s", 1e300, "at most 604,800 seconds"),
        ("workload.max_measure_s", 1e12, "at most 604,800 seconds"),
        # an empty list meant the default metric; a metric twice, two equal objectives
        ("objective", {"metrics": []}, "non-empty list"),
        ("objective", {"metrics": ["ttft_p95_ms", "ttft_p95_ms"]}, "named twice"),
        # a string was read letter by letter: "objective.constraints[0]: ... got 't'"
        ("objective", {"constraints": "ttft_p95_ms <= 5"}, "must be a list"),
        # never met, or always: no metric is negative
        ("workload.slo", ["ttft_p95_ms <= -5"], "never negative"),
        # the list was sent as the prompt "['x']"
        ("check.known_answers", [{"prompt": ["x"], "expect": "a"}], "non-empty string"),
        ("check.known_answers", {"prompt": "x", "expect": "a"}, "must be a list"),
        ("model.served_name", ["x"], "must be a string"),
        ("model.tokenizer", {"a": 1}, "must be a string"),
        # appended to the server's address: http://127.0.0.1:8000health was never healthy
        ("engine.health_path", "health", "a path such as /health"),
        # TypeError: unsupported operand type(s) for /: 'PosixPath' and 'int'
        ("engine.patch_dirs", [1], "list of directories"),
        ("engine.command", ["", "{port}"], "cannot be empty"),
        ("engine.version_command", [""], "cannot be empty"),
        ("engine.args", ["--x", "y" * 140_000], "longer than"),
        ("engine.args", ["--x", float("nan")], "finite"),
        ("engine.env", {"A": "y" * 140_000}, "longer than"),
        ("engine.env", {"A": "a\u2028b"}, "one line"),
        ("description", ["x"], "text"),
        # accepted, then "--storage: storage unreachable: NoSuchModuleError" when run
        ("storage", "foo://host/db", "unknown database scheme 'foo'"),
    ],
)
def test_spec_values(tmp_path: Path, dotted: str, value: Any, words: str) -> None:
    run_with_spec(tmp_path, with_(SPEC, dotted, value), dotted.split(".")[0], words)


@pytest.mark.parametrize(
    ("roofline", "key", "words"),
    [
        # dict([1, 2]) raised TypeError when the spec was loaded
        ([1, 2], "roofline", "must be a mapping"),
        # these failed only after the study was created (a half-written study)
        ({"device": "h200", "tpp": 8}, "roofline.tpp", "unknown key"),
        ({"device": "no-such-gpu"}, "roofline.device", "unknown device"),
        ({"device": "h200", "tp": "eight"}, "roofline.tp", "must be a number"),
        ({"device": "h200", "efficiency": 2}, "roofline.efficiency", "(0, 1]"),
        ({"tp": 8}, "roofline", "give device"),
        ({"device": "h200", "active_params": 1e9}, "roofline", "both active_params and bits"),
    ],
)
def test_roofline_section(tmp_path: Path, roofline: Any, key: str, words: str) -> None:
    run_with_spec(tmp_path, with_(SPEC, "roofline", roofline), key, words)


def test_a_roofline_the_model_cannot_give(tmp_path: Path) -> None:
    """Without active_params and bits the roofline inspects the model; a folder with no model
    in it failed that only after the study was created (a study with a baseline queued)."""
    result = run_with_spec(tmp_path, with_(SPEC, "roofline", {"device": "h200"}), "roofline")
    assert "cannot compute the roofline" in result


def test_roofline_numbers_written_without_a_sign_are_read(tmp_path: Path) -> None:
    """YAML 1.1 reads ``40.0e9`` as a string; roofline numbers always accepted it."""
    path = write(tmp_path, with_(SPEC, "roofline", {"device": "h200", "tp": 2}))
    path.write_text(path.read_text().replace("tp: 2", "tp: 2\n  active_params: 40.0e9\n  bits: 4"))
    roofline = load_spec(path).roofline
    assert roofline == {"device": "h200", "tp": 2, "active_params": 4e10, "bits": 4.0}


# --- CLI values --------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--storage", "--artifact-dir"])
def test_a_nul_character_in_a_cli_path(tmp_path: Path, option: str) -> None:
    """``ValueError: embedded null byte``, a traceback with exit code 1, before."""
    path = write(tmp_path)
    value = "sqlite:///a\0b.db" if option == "--storage" else "a\0b"
    assert_bad_input(
        invoke("run", "--spec", str(path), option, value), tmp_path, option, "NUL character"
    )


# --- the export writes any launch word on its header's one line --------------------------------


def test_export_header_with_line_breaks_in_the_launch(tmp_path: Path) -> None:
    """A word with a line break (a two-line ``python -c`` script, a flag choice) ended the
    header's ``# Launch:`` comment: the rest was read as YAML, a broken config or a stray key.
    Now the word is ``$'...'``-quoted on one line, and bash runs exactly the same argv."""
    from autotune.study.export import export_values

    script = "import sys\nprint(repr(sys.argv[1:]))"
    command = [sys.executable, "-c", script, "--host", "{host}", "--port", "{port}"]
    spec = with_(SPEC, "engine.command", command)
    spec["engine"]["args"] = ["--note", "it's a\u2028b"]
    path = write(tmp_path, spec)
    (tmp_path / "space.yaml").write_text(
        param('{type: categorical, choices: [plain, "x\\ny: 1"], target: {flag: --x}}')
    )
    out = tmp_path / "out" / "best.yaml"
    export_values(load_spec(path), {"x": "x\ny: 1"}, out, title="test")
    text = out.read_text()
    assert yaml.safe_load(text) == {"x": "x\ny: 1"}  # the config, and nothing else
    lines = text.splitlines()
    launch = lines[lines.index("# Launch:") + 1]
    assert launch.startswith("#   ")
    done = subprocess.run(
        ["bash", "-c", launch.removeprefix("#   ")],
        env={**os.environ, "LC_ALL": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    address = ["--host", "127.0.0.1", "--port", "8000"]
    expected = [*address, "--note", "it's a\u2028b", "--x", "x\ny: 1"]
    assert done.stdout.strip() == repr(expected), done


def test_load_space_names_the_problem_not_a_type_error(tmp_path: Path) -> None:
    """The library call too: a SpecError with file, key and line, never a Python error."""
    (tmp_path / "space.yaml").write_text(
        param("{type: int_list, choices: [[1]], baseline: 1, target: {flag: --x}}")
    )
    with pytest.raises(SpecError) as caught:
        load_space(tmp_path / "space.yaml")
    assert caught.value.key == "parameters.x.baseline" and caught.value.line == 2


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        # json.loads recursed per level: RecursionError, a traceback
        ("[" * 100_000 + "]" * 100_000, "", "nested too deeply"),
        ('{"prompt": "a"}\n{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}", ":2:", "nested"),
        # Python refuses to read an integer of over 4300 digits: ValueError, a traceback
        ('{"prompt": "a", "max_tokens": ' + "9" * 5000 + "}", ":1:", "4300 digits"),
        # sent to the server as asked, in every trial
        ('{"prompt": "a", "max_tokens": 1000000000000}', ":1:", "up to 1,000,000"),
        # no text: the request and the workload hash raised UnicodeEncodeError
        ('{"prompt": "a\\ud800b"}', ":1:", "lone surrogate"),
    ],
)
def test_a_prompt_file_that_no_request_can_carry(
    tmp_path: Path, text: str, line: str, words: str
) -> None:
    (tmp_path / "prompts.jsonl").write_text(text + "\n")
    workload = {"file": "prompts.jsonl", "max_tokens": 4, "num_requests": 2, "repeats": 1}
    path = write(tmp_path, with_(SPEC, "workload", workload))
    assert_bad_input(
        invoke("run", "--spec", str(path)), tmp_path, f"{tmp_path / 'prompts.jsonl'}{line}", words
    )


@pytest.mark.parametrize("url", ["foo://host/db", "ftp://host/db"])
def test_a_storage_url_of_an_unknown_database(tmp_path: Path, url: str) -> None:
    """Was "storage unreachable: NoSuchModuleError: Can't load plugin": now what it is."""
    path = write(tmp_path)
    assert_bad_input(
        invoke("show", "--spec", str(path), "--storage", url),
        tmp_path,
        "--storage",
        f"unknown database scheme '{url.split(':')[0]}'",
    )


def test_two_yaml_documents_in_one_file(tmp_path: Path) -> None:
    text = "parameters:\n  a: {type: bool, target: {flag: --a}}\n---\nparameters: {}\n"
    run_with_space(tmp_path, text, "space.yaml:3:", "a second document begins here")


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        # the server listened where autotune never looked: a startup timeout blamed on the
        # config; the fake spec's template says `--port {port}`
        ("--port", "the spec's engine command sets it (--port {port})"),
        ("--host", "the spec's engine command sets it (--host {host})"),
        # `--model {served_name}`: the requests named another model than the server's
        ("--model", "the spec's engine command sets it (--model {served_name})"),
    ],
)
def test_a_flag_autotune_sets_cannot_be_tuned(tmp_path: Path, flag: str, words: str) -> None:
    run_with_space(
        tmp_path,
        param(f"{{type: categorical, choices: ['1', '2'], target: {{flag: {flag}}}}}"),
        "parameters.x.target.flag",
        words,
    )


def test_the_address_flags_are_autotunes_for_every_engine(tmp_path: Path) -> None:
    """vLLM's command has no placeholders: autotune adds --host and --port itself."""
    target = {"type": "int", "low": 8000, "high": 8001, "target": {"flag": "--port"}}
    assert_bad_input(
        run_vllm_space(tmp_path, target),
        tmp_path,
        "parameters.x.target.flag",
        "--port cannot be tuned: autotune gives each server its address",
    )


@pytest.mark.parametrize("flag", ["--served-model-name", "--model", "--tokenizer", "--api-key"])
def test_the_flags_vllms_launch_sets_cannot_be_tuned(tmp_path: Path, flag: str) -> None:
    """vLLM's launch sets the model, its served name, the tokenizer and (through VLLM_API_KEY)
    the key: a tuned --served-model-name made every request name a model the server did not
    serve, and the trial's failure was blamed on the configuration."""
    target = {"type": "categorical", "choices": ["a", "b"], "target": {"flag": flag}}
    assert_bad_input(
        run_vllm_space(tmp_path, target),
        tmp_path,
        "parameters.x.target.flag",
        f"{flag} cannot be tuned",
    )


# --- a red team's search spaces: refused by load_space, one line naming the key ----------------


def space_error(tmp: Path, text: str, key: str, *needles: str) -> SpecError:
    """``load_space`` of ``text``: one SpecError, on one line, naming the file and ``key``."""
    path = tmp / "space.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_space(path)
    error = caught.value
    assert error.file == str(path) and error.key == key, str(error)
    assert error.line is not None and "\n" not in str(error), str(error)
    for needle in needles:
        assert needle in str(error), (needle, str(error))
    return error


@pytest.mark.parametrize(
    ("first", "second", "words"),
    [
        # vLLM reads --max_num_seqs as --max-num-seqs: one value replaced the other
        ("{flag: --max-num-seqs}", "{flag: --max_num_seqs}", "same target as parameter 'a'"),
        (
            "{json: --compilation-config, key: level}",
            "{json: --compilation_config, key: level}",
            "same target as parameter 'a'",
        ),
        # two keys of one JSON flag, spelled two ways: the launch had the flag twice
        (
            "{json: --compilation-config, key: level}",
            "{json: --compilation_config, key: mode}",
            "--compilation_config is also set by parameter 'a' (as --compilation-config)",
        ),
        (
            "{flag: --x, false_flag: --no-x}",
            "{flag: --no_x}",
            "--no_x is also set by parameter 'a' (as --no-x)",
        ),
    ],
)
def test_one_flag_spelled_two_ways(tmp_path: Path, first: str, second: str, words: str) -> None:
    def body(target: str) -> str:
        kind = "bool" if "json" not in target else "int, low: 1, high: 2"
        return f"{{type: {kind}, target: {target}}}"

    text = f"parameters:\n  a: {body(first)}\n  b: {body(second)}\n"
    space_error(tmp_path, text, "parameters.b.target", words)


def test_a_false_flag_that_is_its_flag_spelled_otherwise(tmp_path: Path) -> None:
    """False was launched as the flag itself: both values ran with it on."""
    text = param("{type: bool, target: {flag: --a-b, false_flag: --a_b}}")
    space_error(tmp_path, text, "parameters.x.target.false_flag", "must differ")


@pytest.mark.parametrize(
    ("domain", "key", "words"),
    [
        # decimal.InvalidOperation: Optuna divides in 28 digits, and so did the loader
        ("type: float, low: 0, high: 1, step: 1.0e-30", "x.step", "step 1e-30 is too fine"),
        ("type: float, low: 0, high: 1, step: 5.0e-324", "x.step", "too fine"),
        # OverflowError: int too large to convert to float
        (f"type: int, low: 0, high: 1{'0' * 400}", "x.high", "finite"),
        (f"type: int, low: 0, high: 9, baseline: 1{'0' * 400}", "x.baseline", "outside"),
        # an integer's step is divided exactly: no rounding in the message
        (
            f"type: int, low: 0, high: 1{'0' * 31}, step: 3",
            "x.step",
            f"make high {'9' * 31} or 1{'0' * 30}2",
        ),
    ],
)
def test_numbers_past_what_floats_and_decimals_hold(
    tmp_path: Path, domain: str, key: str, words: str
) -> None:
    text = param(f"{{{domain}, target: {{flag: --x}}}}")
    space_error(tmp_path, text, f"parameters.{key}", words)


def test_a_wide_integer_domain_with_a_step_loads(tmp_path: Path) -> None:
    """``high: 1e31, step: 1`` raised decimal.InvalidOperation; an int divides exactly."""
    (tmp_path / "space.yaml").write_text(
        param(f"{{type: int, low: 0, high: 1{'0' * 31}, step: 1, target: {{flag: --x}}}}")
    )
    assert load_space(tmp_path / "space.yaml").parameter("x").high == 10**31


@pytest.mark.parametrize(
    ("value", "words"),
    [
        # ValueError: Exceeds the limit (4300 digits) for integer string conversion
        ("1" + "0" * 5000, "more digits than can be read or written"),
        ("0x" + "f" * 4000, "more digits than can be read or written"),
        # ValueError from PyYAML's constructors: a traceback
        ("2001-13-01", "cannot be read as timestamp: month must be in 1..12"),
        ("!!int abc", "cannot be read as int"),
        ("!!bool maybe", "cannot be read as bool: not a bool"),
    ],
)
def test_a_scalar_yaml_cannot_construct(tmp_path: Path, value: str, words: str) -> None:
    text = param(f"{{type: categorical, choices: [a, {value}], target: {{flag: --x}}}}")
    space_error(tmp_path, text, "parameters.x.choices[1]", words)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("010", "the YAML number 010 is read as the octal 8 (YAML 1.1); quote it as '010'"),
        ("0755", "read as the octal 493"),
        ("1:2", "the YAML number 1:2 is read in base 60 as 62 (YAML 1.1); quote it as '1:2'"),
        ("1:30.5", "read in base 60 as 90.5"),
    ],
)
def test_yaml11_octal_and_base_60_are_refused(tmp_path: Path, value: str, words: str) -> None:
    """``choices: [010, 08]`` read as (8, '08'), ``1:2`` as 62: not what was written."""
    text = param(f"{{type: categorical, choices: [08, {value}], target: {{env: MASK}}}}")
    space_error(tmp_path, text, "parameters.x.choices[1]", words)


def test_numbers_that_read_as_written_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(
        param("{type: categorical, choices: [08, '0755', '1:2', 0, 10, 0x10], target: {env: M}}")
    )
    assert load_space(tmp_path / "space.yaml").parameter("x").choices == (
        "08",
        "0755",
        "1:2",
        0,
        10,
        16,
    )


def test_many_choices_are_checked_in_linear_time(tmp_path: Path) -> None:
    """Each pair of choices was compared: 20,000 of them took 33 s to load."""
    import time

    choices = ", ".join(str(i) for i in range(20_000))
    (tmp_path / "space.yaml").write_text(
        param(f"{{type: categorical, choices: [{choices}], target: {{flag: --x}}}}")
    )
    start = time.perf_counter()
    assert len(load_space(tmp_path / "space.yaml").parameter("x").choices) == 20_000
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize(
    ("choices", "words"),
    [
        ("[1, a, true]", "choices 1 and True are the same value"),
        ("[16, b, 16.0]", "choices 16 and 16.0 are the same value"),
        ("[16, c, '16']", "choices 16 and '16' are the same value"),
        ("[0, false]", "choices 0 and False"),
        ("[x, x]", "must be distinct"),
    ],
)
def test_choices_the_engine_cannot_tell_apart(tmp_path: Path, choices: str, words: str) -> None:
    text = param(f"{{type: categorical, choices: {choices}, target: {{flag: --x}}}}")
    space_error(tmp_path, text, "parameters.x.choices", words)


def test_choices_that_differ_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(
        param("{type: categorical, choices: [null, 'None', 1, '1.0'], target: {env: X}}")
    )
    assert load_space(tmp_path / "space.yaml").parameter("x").choices == (None, "None", 1, "1.0")
    (tmp_path / "space.yaml").write_text(
        param("{type: int_list, choices: [[1, 2], [2, 1], [1, 2]], target: {flag: --x}}")
    )
    with pytest.raises(SpecError, match="must be distinct"):
        load_space(tmp_path / "space.yaml")
