"""``autotune validate`` against the installed vLLM: the GLM-5 space is clean, mistakes are named.

vLLM is imported once for the whole module (``vllm_ctx``, which skips without vLLM); the checks
themselves take milliseconds, so one space with many bad parameters is validated once and each
mistake is asserted separately.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autotune.engines.base import ValidationIssue
from autotune.engines.vllm.validate import NCCL_ENV, validate_space
from autotune.space.load import load_space

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vllm_ctx() -> object:
    """Import vLLM and build its server parser once for every test that needs it (skipped
    without vLLM; the tests that do not need it run anyway)."""
    pytest.importorskip("vllm")
    from autotune.engines.vllm.validate import _context

    return _context()


_STANDIN_MLA_PATCH = """
from autotune.patching import PatchInfo

PATCH = PatchInfo(
    name="mla_path", kind="experimental", engine="vllm", versions=">=0.32",
    targets=("vllm.model_executor.layers.attention.mla_attention.MLAAttention.forward",),
    rationale="test stand-in for patches/mla_path.py", choices=("custom_op", "direct_call"),
    default="custom_op",
)


def apply(value):
    raise AssertionError("validation must never apply a patch")
"""


def _glm5_patch_dirs(tmp_path: Path) -> list[Path]:
    """The repository's patches, or a stand-in ``mla_path`` while that patch is not written."""
    if (REPO / "patches" / "mla_path.py").exists():
        return [REPO / "patches"]
    (tmp_path / "mla_path.py").write_text(_STANDIN_MLA_PATCH)
    return [tmp_path]


def test_glm5_space_validates_clean(vllm_ctx: object, tmp_path: Path) -> None:
    space = load_space(REPO / "search_spaces" / "glm5-8gpu.yaml")
    issues = validate_space(space, _glm5_patch_dirs(tmp_path))
    assert [i.parameter for i in issues] == space.names
    assert [i for i in issues if not i.ok] == []
    # the dimensions of the motivating case are all there
    assert {
        "enforce_eager",
        "cudagraph_mode",
        "cudagraph_capture_sizes",
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_NCHANNELS",
        "disable_custom_all_reduce",
        "mla_path",
        "attention_backend",
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "enable_expert_parallel",
    } <= set(space.names)
    assert space.baseline_values()["enforce_eager"] is True


def test_glm5_study_validates_through_the_engine(vllm_ctx: object) -> None:
    """What ``autotune validate studies/glm5-8gpu.yaml`` runs: spec, engine, space."""
    from autotune.engines.vllm.engine import VllmEngine
    from autotune.spec.load import load_spec

    spec = load_spec(REPO / "studies" / "glm5-8gpu.yaml")
    assert spec.model.path.endswith(".gguf")  # a placeholder: only `run` needs it to exist
    issues = VllmEngine(spec.engine, spec.model).validate_space(spec.space)
    assert [i for i in issues if not i.ok] == []


_BAD_SPACE = """
parameters:
  max_num_seq:                    # misspelled flag
    type: int
    low: 4
    high: 64
    target: {flag: --max-num-seq}
  NCCL_PROTOCOL:                  # misspelled env var: NCCL would silently ignore it
    type: categorical
    choices: [LL, Simple]
    target: {env: NCCL_PROTOCOL}
  NCCL_PROTO:                     # LL256 is not a protocol
    type: categorical
    choices: [LL, LL256]
    target: {env: NCCL_PROTO}
  VLLM_ATTENTON_BACKEND:          # misspelled, and the right spelling is gone in 0.32 too
    type: categorical
    choices: [FLASHMLA]
    target: {env: VLLM_ATTENTON_BACKEND}
  flashinfer_ar:                  # vLLM's own env_with_choices rejects the value
    type: categorical
    choices: [auto, sometimes]
    target: {env: VLLM_FLASHINFER_ALLREDUCE_BACKEND}
  cudagraph_mode:                 # not a CUDAGraphMode
    type: categorical
    choices: [FULL, SOMETIMES]
    target: {json: --compilation-config, key: cudagraph_mode}
  capture_sizes:                  # unknown JSON key
    type: int_list
    choices: [[1, 2, 4]]
    target: {json: --compilation-config, key: cudagraph_capture_size}
  fuse_norm:                      # unknown nested JSON key
    type: bool
    target: {json: --compilation-config, key: pass_config.fuse_norm_quantt}
  block_size:                     # the parser's int type rejects it
    type: categorical
    choices: [16, sixteen]
    target: {flag: --block-size}
  kv_cache_dtype:                 # outside the parser's choices
    type: categorical
    choices: [auto, fp9]
    target: {flag: --kv-cache-dtype}
  gpu_memory_utilization:         # parses as a float, CacheConfig refuses > 1
    type: float
    low: 0.5
    high: 1.5
    target: {flag: --gpu-memory-utilization}
  attention_backend:              # parses as a string, AttentionConfig refuses it
    type: categorical
    choices: [auto, NOPE]
    target: {flag: --attention-backend}
  switch:                         # a patch choice the patch does not offer
    type: categorical
    choices: ["off", sideways]
    target: {patch: demo_switch}
  ancient:                        # a patch for another vLLM version
    type: bool
    target: {patch: ancient_fix}
  missing_patch:
    type: bool
    target: {patch: demo_swich}
  max_num_seqs:                   # fine
    type: int
    low: 1
    high: 256
    target: {flag: --max-num-seqs}
  NCCL_ALGO:                      # fine, including NCCL's list syntax
    type: categorical
    choices: [null, Ring, "Tree,Ring", "^NVLS", "allreduce:tree;broadcast:ring"]
    target: {env: NCCL_ALGO}
  compilation_mode:               # fine: a JSON key
    type: categorical
    choices: [0, 3]
    target: {json: --compilation-config, key: mode}
"""

_PATCH = """
from autotune.patching import PatchInfo

PATCH = PatchInfo(
    name={name!r}, kind="experimental", engine="vllm", versions={versions!r},
    targets=("vllm.envs.environment_variables",), rationale="test patch",
    choices={choices!r}, default={default!r},
)


def apply(value):
    raise AssertionError("validation must never apply a patch")
"""


@pytest.fixture(scope="module")
def bad_issues(
    vllm_ctx: object, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, ValidationIssue]:
    root = tmp_path_factory.mktemp("bad_space")
    patches = root / "patches"
    patches.mkdir()
    (patches / "demo_switch.py").write_text(
        _PATCH.format(name="demo_switch", versions=">=0.1", choices=("off", "on"), default="off")
    )
    (patches / "ancient_fix.py").write_text(
        _PATCH.format(name="ancient_fix", versions="<0.2", choices=(False, True), default=False)
    )
    space_file = root / "bad.yaml"
    space_file.write_text(textwrap.dedent(_BAD_SPACE))
    issues = validate_space(load_space(space_file), [patches])
    return {issue.parameter: issue for issue in issues}


@pytest.mark.parametrize(("parameter", "expected"), [
    ("max_num_seq", ["--max-num-seq is not a flag", "did you mean --max-num-seqs"]),
    ("NCCL_PROTOCOL", ["NCCL_PROTOCOL is not an environment variable", "did you mean NCCL_PROTO"]),
    ("NCCL_PROTO", ["LL256", "not an NCCL protocol"]),
    ("VLLM_ATTENTON_BACKEND", ["did you mean VLLM_ATTENTION_BACKEND", "--attention-backend"]),
    ("flashinfer_ar", ["sometimes", "Invalid value"]),
    ("cudagraph_mode", ["SOMETIMES", "CompilationConfig", "FULL_AND_PIECEWISE"]),
    ("capture_sizes", ["no field 'cudagraph_capture_size'", "mean 'cudagraph_capture_sizes'"]),
    ("fuse_norm", ["pass_config has no field 'fuse_norm_quantt'"]),
    ("block_size", ["sixteen", "invalid int value"]),
    ("kv_cache_dtype", ["fp9", "invalid choice"]),
    ("gpu_memory_utilization", ["1.5", "CacheConfig.gpu_memory_utilization"]),
    ("attention_backend", ["NOPE", "Unknown attention backend"]),
    ("switch", ["sideways is not offered by patch demo_switch"]),
    ("ancient", ["patch ancient_fix is for vLLM '<0.2'"]),
    ("missing_patch", ["no patch named 'demo_swich'", "did you mean demo_switch"]),
])  # fmt: skip
def test_mistakes_are_reported_by_parameter(
    bad_issues: dict[str, ValidationIssue], parameter: str, expected: list[str]
) -> None:
    issue = bad_issues[parameter]
    assert not issue.ok
    for fragment in expected:
        assert fragment in (issue.error or ""), issue.error


def test_only_the_bad_values_are_blamed(bad_issues: dict[str, ValidationIssue]) -> None:
    for good in ("max_num_seqs", "NCCL_ALGO", "compilation_mode"):
        assert bad_issues[good].ok, bad_issues[good].error
    assert "FULL:" not in (bad_issues["cudagraph_mode"].error or "")
    assert not (bad_issues["switch"].error or "").startswith("off")
    assert "auto:" not in (bad_issues["attention_backend"].error or "")


def test_missing_patch_directory_is_reported(vllm_ctx: object, tmp_path: Path) -> None:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        textwrap.dedent("""
        parameters:
          mla_path:
            type: categorical
            choices: [custom_op, direct_call]
            target: {patch: mla_path}
    """)
    )
    (issue,) = validate_space(load_space(space_file), [tmp_path / "nowhere"])
    assert not issue.ok and "does not exist" in (issue.error or "")


def test_nccl_list_syntax_without_vllm() -> None:
    proto, algo = NCCL_ENV["NCCL_PROTO"], NCCL_ENV["NCCL_ALGO"]
    assert proto is not None and algo is not None
    assert proto("LL,LL128") is None and proto("^ll128") is None and proto("simple") is None
    assert "LL128" in (proto("LL256") or "")
    assert algo("allreduce:Tree,Ring;allgather:ring") is None
    assert "collective" in (algo("allreduse:ring") or "")
    assert "NVLSTree" in (algo("NVLStree2") or "")


def test_smollm2_study_validates_through_the_engine(vllm_ctx: object) -> None:
    """``studies/smollm2-vllm.yaml``, the real model on vLLM's CPU build: every parameter
    accepted by the installed vLLM; the baseline eager, unpatched, full-precision KV cache;
    every known answer asked of a check prompt."""
    from autotune.engines.vllm.engine import VllmEngine
    from autotune.spec.load import load_spec

    spec = load_spec(REPO / "studies" / "smollm2-vllm.yaml")
    assert Path(spec.model.path).name == "bf16"  # the dequantized copy (`make smollm2`)
    issues = VllmEngine(spec.engine, spec.model).validate_space(spec.space)
    assert [i for i in issues if not i.ok] == []
    baseline = spec.space.baseline_values()
    assert baseline["enforce_eager"] is True
    assert baseline["kv_cache_dtype"] == "auto"
    assert baseline["qkv_shard_swap"] is False and baseline["attention_path"] == "custom_op"
    assert {k.prompt for k in spec.check.known_answers} <= set(spec.check.prompts)
    assert len(spec.check.known_answers) >= 3


def test_the_gate_benchmarks_configs_fit_the_smollm2_space() -> None:
    """``benchmarks/gate_real_configs.yaml``: every config is launchable in its spec's space
    (checked by the benchmark's own loader), with at least 20 that must keep the output."""
    from benchmarks.gate_real import CONFIGS, KEEP, REJECT, load_cases

    spec, cases = load_cases(CONFIGS, "vllm")
    assert spec.path == REPO / "studies" / "smollm2-vllm.yaml"
    assert sum(c.expect == KEEP for c in cases) >= 20
    rejected = {c.name for c in cases if c.expect == REJECT}
    assert {"fp8_kv_cache", "qkv_shard_swap", "direct_call_compiled"} <= rejected


def test_the_gate_benchmarks_llamacpp_configs_launch_what_they_name() -> None:
    """The llama.cpp section: each lossy K-cache case sets the one ``--cache-type-k`` parameter
    (the extra file widens the study's, it does not add a second one: with two, the flag was on
    the command line twice and the q4_1/q5_0 cases launched f16), and the cases whose drift is
    about the engine's own are ``either``, counted apart."""
    from benchmarks.gate_real import CONFIGS, EITHER, KEEP, REJECT, case_values, load_cases

    spec, cases = load_cases(CONFIGS, "llamacpp")
    on_k_flag = [p.name for p in spec.space.parameters if p.target.name == "--cache-type-k"]
    assert on_k_flag == ["cache_type_k"]
    by_name = {c.name: c for c in cases}
    for kind in ("q4_0", "q4_1", "q5_0"):
        name = f"cache_k_{kind}"
        assert by_name[name].expect == REJECT
        assert case_values(spec.space, by_name[name])["cache_type_k"] == kind
    assert {c.name for c in cases if c.expect == EITHER} == {"flash_attn_off", "cache_k_q8_0"}
    assert sum(c.expect == KEEP for c in cases) >= 20


def test_the_gate_benchmark_refuses_two_parameters_on_one_flag(tmp_path: Path) -> None:
    """A benchmark-only parameter on a flag the study already tunes is a SpecError naming both."""
    from autotune.errors import SpecError
    from autotune.spec.load import load_spec
    from benchmarks.gate_real import _with_parameters

    spec = load_spec(REPO / "studies" / "smollm2-llamacpp.yaml")
    extra = tmp_path / "extra.yaml"
    extra.write_text(
        "parameters:\n  k_again:\n    type: categorical\n    choices: [f16, q4_1]\n"
        "    baseline: f16\n    target: {flag: --cache-type-k}\n",
        encoding="utf-8",
    )
    both = "--cache-type-k is set by both 'cache_type_k' and 'k_again'"
    with pytest.raises(SpecError, match=both):
        _with_parameters(spec, load_space(extra))


def test_the_gate_benchmark_counts_either_apart() -> None:
    """An ``either`` case is never a mistake, whichever verdict it gets; its keeps are counted."""
    from benchmarks.gate_real import EITHER, KEEP, REJECT, counts

    rows = [
        {"expected": EITHER, "verdict": KEEP},
        {"expected": EITHER, "verdict": REJECT},
        {"expected": KEEP, "verdict": REJECT},
        {"expected": REJECT, "verdict": REJECT},
    ]
    c = counts(rows)
    assert (c["expected_either"], c["either_kept"], c["false_rejects"], c["false_accepts"]) == (
        2,
        1,
        1,
        0,
    )
