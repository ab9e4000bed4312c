"""The search-space parser: types, targets, conditions, constraints, and their errors."""

from __future__ import annotations

import textwrap

import optuna
import pytest

from autotune.errors import SpecError
from autotune.space.load import load_space
from autotune.space.model import is_one_line

GOOD = """
parameters:
  enforce_eager:
    type: bool
    baseline: true
    target: {flag: --enforce-eager}
  cudagraph_mode:
    type: categorical
    choices: [PIECEWISE, FULL]
    target: {json: --compilation-config, key: cudagraph_mode}
    when: {enforce_eager: false}
  cudagraph_capture_sizes:
    type: int_list
    choices: [[1, 2, 4], [1, 2, 4, 8, 16]]
    target: {json: --compilation-config, key: cudagraph_capture_sizes}
    when: {enforce_eager: false}
  max_num_seqs:
    type: int
    low: 4
    high: 256
    log: true
    target: {flag: --max-num-seqs}
  max_num_batched_tokens:
    type: int
    low: 64
    high: 8192
    step: 64
    target: {flag: --max-num-batched-tokens}
  NCCL_PROTO:
    type: categorical
    choices: [LL, LL128, Simple]
    target: {env: NCCL_PROTO}
  prefix:
    type: bool
    target: {flag: --enable-prefix-caching, false_flag: --no-enable-prefix-caching}
  mla_path:
    type: categorical
    choices: [custom_op, direct_call]
    baseline: custom_op
    target: {patch: mla_path}
constraints:
  - max_num_batched_tokens >= max_num_seqs
  - max(cudagraph_capture_sizes) <= max_num_seqs
"""


def write(tmp_path, text: str):
    path = tmp_path / "space.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_parses_every_type_and_target(tmp_path):
    space = load_space(write(tmp_path, GOOD))
    assert space.names[:3] == ["enforce_eager", "cudagraph_mode", "cudagraph_capture_sizes"]
    settings = space.resolve(
        {
            "enforce_eager": False,
            "cudagraph_mode": "FULL",
            "cudagraph_capture_sizes": [1, 2, 4],
            "max_num_seqs": 8,
            "max_num_batched_tokens": 512,
            "NCCL_PROTO": "LL",
            "prefix": False,
            "mla_path": "direct_call",
        }
    )
    assert settings.flags == {
        "--enforce-eager": False,
        "--max-num-seqs": 8,
        "--max-num-batched-tokens": 512,
        "--no-enable-prefix-caching": True,
    }
    assert settings.json_flags == {
        "--compilation-config": {"cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2, 4]}
    }
    assert settings.env == {"NCCL_PROTO": "LL"}
    assert settings.patches == {"mla_path": "direct_call"}
    argv = settings.flag_argv()
    assert argv[:6] == [
        "--max-num-seqs",
        "8",
        "--max-num-batched-tokens",
        "512",
        "--no-enable-prefix-caching",
        "--compilation-config",
    ]
    assert argv[6] == '{"cudagraph_capture_sizes":[1,2,4],"cudagraph_mode":"FULL"}'


def test_each_parameter_states_the_distribution_it_asks_optuna_for(tmp_path):
    """``Parameter.distribution`` is what a resumed study is checked against: it must be what
    ``suggest`` records, for every type."""
    floats = (
        "  frac:\n    type: float\n    low: 0.5\n    high: 0.95\n    step: 0.05\n"
        "    target: {flag: --gpu-memory-utilization}\n"
        "  scale:\n    type: float\n    low: 0.1\n    high: 10\n    log: true\n"
        "    target: {env: SCALE}\n"
    )
    space = load_space(write(tmp_path, GOOD.replace("constraints:", floats + "constraints:")))
    assert {p.type for p in space.parameters} == {"bool", "categorical", "int_list", "int", "float"}
    trial = optuna.create_study().ask()
    for parameter in space.parameters:
        parameter.suggest(trial)
        assert trial.distributions[parameter.name] == parameter.distribution(), parameter.name


def test_conditional_parameters_follow_their_condition(tmp_path):
    space = load_space(write(tmp_path, GOOD))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen_eager, seen_graphs = False, False
    for _ in range(30):
        trial = study.ask()
        values = space.suggest(trial)
        if values["enforce_eager"]:
            seen_eager = True
            assert "cudagraph_mode" not in values
        else:
            seen_graphs = True
            assert values["cudagraph_mode"] in ("PIECEWISE", "FULL")
            assert values["cudagraph_capture_sizes"] in ([1, 2, 4], [1, 2, 4, 8, 16])
        assert 4 <= values["max_num_seqs"] <= 256
        assert values["max_num_batched_tokens"] % 64 == 0
        study.tell(trial, 1.0)
    assert seen_eager and seen_graphs


def test_constraints_evaluate_and_skip_inactive_parameters(tmp_path):
    space = load_space(write(tmp_path, GOOD))
    base = {"enforce_eager": True, "max_num_seqs": 64, "max_num_batched_tokens": 64}
    assert space.violated(base) == []
    assert space.violated({**base, "max_num_batched_tokens": 32}) == [
        "max_num_batched_tokens >= max_num_seqs"
    ]
    graphs = {
        **base,
        "enforce_eager": False,
        "cudagraph_capture_sizes": [1, 2, 4, 8, 16],
        "max_num_seqs": 8,
        "max_num_batched_tokens": 64,
    }
    assert space.violated(graphs) == ["max(cudagraph_capture_sizes) <= max_num_seqs"]


def test_baseline_uses_only_declared_baseline_values(tmp_path):
    space = load_space(write(tmp_path, GOOD))
    assert space.baseline_values() == {"enforce_eager": True, "mla_path": "custom_op"}
    assert space.baseline_optuna_params() == {"enforce_eager": True, "mla_path": "custom_op"}


@pytest.mark.parametrize(
    ("snippet", "key", "message"),
    [
        (
            "  x:\n    type: int\n    low: 5\n    high: 1\n    target: {flag: --x}\n",
            "parameters.x",
            "empty domain",
        ),
        (
            "  x:\n    type: float\n    low: 0\n    high: 1\n    log: true\n"
            "    target: {flag: --x}\n",
            "parameters.x.low",
            "log domain",
        ),
        ("  x:\n    type: intt\n    target: {flag: --x}\n", "parameters.x.type", "unknown type"),
        (
            "  x:\n    type: categorical\n    choices: []\n    target: {flag: --x}\n",
            "parameters.x.choices",
            "non-empty",
        ),
        (
            "  x:\n    type: bool\n    target: {flag: x}\n",
            "parameters.x.target.flag",
            "starts with",
        ),
        (
            "  x:\n    type: bool\n    target: {flag: --x, env: X}\n",
            "parameters.x.target",
            "exactly one",
        ),
        (
            "  x:\n    type: bool\n    colour: red\n    target: {flag: --x}\n",
            "parameters.x.colour",
            "unknown key",
        ),
        (
            "  x:\n    type: int\n    low: 1\n    high: 2\n    baseline: 9\n"
            "    target: {flag: --x}\n",
            "parameters.x.baseline",
            "outside",
        ),
        (
            "  x:\n    type: bool\n    when: {y: 1}\n    target: {flag: --x}\n",
            "parameters.x.when.y",
            "declared earlier",
        ),
        (
            "  x:\n    type: int_list\n    choices: [[1, 0]]\n    target: {flag: --x}\n",
            "parameters.x.choices[0]",
            "positive integers",
        ),
    ],
)
def test_bad_parameters_name_file_key_and_line(tmp_path, snippet, key, message):
    path = write(tmp_path, "parameters:\n" + snippet)
    with pytest.raises(SpecError) as info:
        load_space(path)
    error = info.value
    assert error.file == str(path)
    assert error.key == key
    assert message in error.message
    assert error.line is not None and error.line >= 2


def test_unsatisfiable_constraints_are_refused(tmp_path):
    text = """
    parameters:
      a: {type: int, low: 1, high: 10, target: {flag: --a}}
      b: {type: int, low: 20, high: 30, target: {flag: --b}}
    constraints:
      - a > b
    """
    with pytest.raises(SpecError, match="no configuration satisfies"):
        load_space(write(tmp_path, text))


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("a >= nope", "unknown parameter 'nope'"),
        ("__import__('os')", "only len, max, min may be called"),
        ("a.real > 1", "Attribute is not allowed"),
        ("a >=", "invalid expression"),
    ],
)
def test_constraint_expressions_are_checked_not_evaluated(tmp_path, expr, message):
    text = f"""
    parameters:
      a: {{type: int, low: 1, high: 10, target: {{flag: --a}}}}
    constraints:
      - "{expr}"
    """
    with pytest.raises(SpecError, match=message):
        load_space(write(tmp_path, text))


def test_malformed_yaml_reports_line(tmp_path):
    path = write(tmp_path, "parameters:\n  x: [unclosed\n  y: 2\n")
    with pytest.raises(SpecError) as info:
        load_space(path)
    assert "malformed YAML" in str(info.value) and info.value.line is not None


def test_demo_and_glm5_spaces_load():
    """The shipped spaces load with exactly their parameters, baselines, targets and
    constraints, and the constraints reject what the engine would refuse."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    demo = load_space(root / "search_spaces" / "cpu-demo.yaml")
    assert demo.names == [
        "max_num_seqs",
        "max_num_batched_tokens",
        "enforce_eager",
        "block_size",
        "enable_chunked_prefill",
        "enable_prefix_caching",
        "async_scheduling",
        "VLLM_CPU_OMP_THREADS_BIND",
        "kv_cache_dtype",
        "attention_path",
        "qkv_shard_swap",
        "speculative_method",
        "num_speculative_tokens",
        "prompt_lookup_max",
        "prompt_lookup_min",
    ]
    # the baseline fixes only what has a baseline (the fault patch off); the rest is the engine's
    assert demo.baseline_values() == {
        "max_num_seqs": 4,
        "enforce_eager": True,
        "kv_cache_dtype": "auto",
        "attention_path": "custom_op",
        "qkv_shard_swap": False,
        "speculative_method": None,  # null: no --speculative-config at all
    }
    settings = demo.resolve(demo.baseline_values())
    assert settings.flags == {
        "--max-num-seqs": 4,
        "--enforce-eager": True,
        "--kv-cache-dtype": "auto",
    }
    assert settings.env == {} and settings.json_flags == {}
    assert settings.patches == {"attention_path": "custom_op", "qkv_shard_swap": False}
    assert demo.parameter("enable_chunked_prefill").target.false_flag == (
        "--no-enable-chunked-prefill"
    )
    assert [c.expr for c in demo.constraints] == [
        "max_num_batched_tokens >= max_num_seqs",
        "enable_chunked_prefill or max_num_batched_tokens >= 512",
        'not (async_scheduling and speculative_method == "ngram")',
    ]
    refused = {"max_num_seqs": 512, "max_num_batched_tokens": 256, "enable_chunked_prefill": False}
    refused |= {"async_scheduling": True, "speculative_method": "ngram"}
    assert demo.violated(refused) == [c.expr for c in demo.constraints]
    fixed = {"max_num_seqs": 4, "enable_chunked_prefill": True, "async_scheduling": False}
    assert demo.violated({**refused, **fixed}) == []

    glm5 = load_space(root / "search_spaces" / "glm5-8gpu.yaml")
    assert len(glm5.names) == 26 and glm5.names[:3] == [
        "enforce_eager",
        "cudagraph_mode",
        "cudagraph_capture_sizes",
    ]
    assert glm5.baseline_values() == {
        "enforce_eager": True,
        "mla_path": "custom_op",
        "kv_cache_dtype": "auto",
        "speculative_method": None,
    }
    # CUDA-graph parameters exist only when graphs are on
    assert glm5.parameter("cudagraph_mode").when == {"enforce_eager": False}
    assert not glm5.is_active(glm5.parameter("cudagraph_mode"), {"enforce_eager": True})
    graphs = glm5.resolve(
        {"enforce_eager": False, "cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2]}
    )
    assert graphs.json_flags == {
        "--compilation-config": {"cudagraph_mode": "FULL", "cudagraph_capture_sizes": [1, 2]}
    }
    assert [c.expr for c in glm5.constraints] == [
        "max_num_batched_tokens >= max_num_seqs",
        "max(cudagraph_capture_sizes) <= max_num_batched_tokens",
        "NCCL_MIN_NCHANNELS <= NCCL_MAX_NCHANNELS",
        'not (async_scheduling and speculative_method == "ngram")',
    ]


def test_an_env_value_is_one_line_without_a_line_feed_or_carriage_return():
    """The one rule for env values (a space's env choices and the spec's engine.env), both of
    which export writes into a .env file, one line per variable."""
    assert is_one_line("") and is_one_line("a b\t=c")
    assert not is_one_line("a\nb") and not is_one_line("a\rb") and not is_one_line("a\r\n")
