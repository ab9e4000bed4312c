"""Machine limits: choices this machine cannot run are dropped before any trial, with one notice
line each, recorded in the study, and never proposed (no launch is spent on them)."""

from __future__ import annotations

import optuna
from typer.testing import CliRunner

from autotune import names
from autotune.cli.app import app
from autotune.engines import build_engine
from autotune.engines.base import DroppedChoice
from autotune.engines.command import CommandEngine
from autotune.engines.vllm import machine as vllm_machine
from autotune.engines.vllm.machine import Machine, cpu_flags, machine_limits
from autotune.search.guide import GuidedSampler
from autotune.spec.load import load_spec
from tests.builders import ROOT, write_fake_spec

CPUINFO_AVX2 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Core(TM) i7-8700 CPU
flags\t\t: fpu vme de pse sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma
"""
CPUINFO_AVX512 = CPUINFO_AVX2.replace("fma", "fma avx512f avx512bw")
CPUINFO_AMX = CPUINFO_AVX2.replace("fma", "fma amx_bf16 amx_tile")


def demo_space():
    return load_spec(ROOT / "studies" / "demo.yaml").space


def cpu_machine(cpuinfo: str, cpus=(0, 1)) -> Machine:
    return Machine(cpu_build=True, cpu_flags=cpu_flags(cpuinfo), cpus=frozenset(cpus))


def test_fp8_kv_cache_is_dropped_without_avx512_or_amx():
    dropped = machine_limits(demo_space(), cpu_machine(CPUINFO_AVX2))
    fp8 = [d for d in dropped if d.parameter == "kv_cache_dtype"]
    assert [d.value for d in fp8] == ["fp8"]
    assert "AVX-512 or AMX" in fp8[0].reason
    assert fp8[0].notice().startswith("dropped kv_cache_dtype='fp8': ")


def test_fp8_kv_cache_is_kept_with_avx512_or_amx():
    for cpuinfo in (CPUINFO_AVX512, CPUINFO_AMX):
        dropped = machine_limits(demo_space(), cpu_machine(cpuinfo))
        assert not [d for d in dropped if d.parameter == "kv_cache_dtype"], cpuinfo


def test_thread_binding_to_cores_that_do_not_exist_is_dropped():
    dropped = machine_limits(demo_space(), cpu_machine(CPUINFO_AVX512, cpus=(0,)))
    assert [(d.parameter, d.value) for d in dropped] == [("VLLM_CPU_OMP_THREADS_BIND", "0-1")]
    assert "core(s) 1" in dropped[0].reason
    assert not machine_limits(demo_space(), cpu_machine(CPUINFO_AVX512, cpus=(0, 1)))


def test_gpu_rules_ask_the_engine_with_the_compute_capability():
    from dataclasses import replace

    from autotune.space.model import Parameter, Target

    space = demo_space()
    backend = Parameter(
        name="VLLM_ATTENTION_BACKEND",
        type="categorical",
        target=Target("env", "VLLM_ATTENTION_BACKEND"),
        choices=("FLASH_ATTN", "FLASHMLA"),
    )
    space = replace(space, parameters=(*space.parameters, backend))
    ampere = Machine(cpu_build=False, cpu_flags=frozenset(), cpus=frozenset({0}), capability=(8, 0))
    dropped = machine_limits(
        space, ampere, attention_ok=lambda name, cap: name != "FLASHMLA" or cap[0] >= 9
    )
    assert [(d.parameter, d.value) for d in dropped] == [("VLLM_ATTENTION_BACKEND", "FLASHMLA")]
    assert "8.0" in dropped[0].reason
    # a GPU machine never applies the CPU build's rules (fp8 KV cache is not dropped there)
    assert not [d for d in dropped if d.parameter == "kv_cache_dtype"]


def test_vllm_engine_reads_the_cpu_flags(monkeypatch):
    spec = load_spec(ROOT / "studies" / "demo.yaml")
    monkeypatch.setattr(vllm_machine, "_is_cpu_build", lambda: True)
    monkeypatch.setattr(vllm_machine, "_read", lambda _path: CPUINFO_AVX2)
    assert ("kv_cache_dtype", "fp8") in {
        (d.parameter, d.value) for d in build_engine(spec).machine_limits(spec.space)
    }
    monkeypatch.setattr(vllm_machine, "_read", lambda _path: CPUINFO_AVX512)
    assert "kv_cache_dtype" not in {
        d.parameter for d in build_engine(spec).machine_limits(spec.space)
    }


def test_guided_sampler_never_proposes_a_dropped_choice():
    space = demo_space()
    dropped = [DroppedChoice("kv_cache_dtype", "fp8", "no avx512")]
    sampler = GuidedSampler(
        optuna.samplers.TPESampler(seed=3, n_startup_trials=5), space, dropped=dropped, seed=3
    )
    study = optuna.create_study(sampler=sampler, direction="maximize")
    for _ in range(30):
        trial = study.ask()
        values = space.suggest(trial)
        study.tell(trial, float(values.get("max_num_seqs", 1)))
    seen = {t.params.get("kv_cache_dtype") for t in study.trials}
    assert seen == {"auto"}


SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [2, 8]
    target: {flag: --max-num-seqs}
  kv_cache_dtype:
    type: categorical
    choices: [auto, fp8]
    baseline: auto
    target: {flag: --kv-cache-dtype}
"""


def test_run_drops_with_one_notice_records_it_and_never_launches_it(tmp_path, monkeypatch):
    no_avx512 = cpu_machine(CPUINFO_AVX2)
    monkeypatch.setattr(
        CommandEngine, "machine_limits", lambda self, space: machine_limits(space, no_avx512)
    )
    spec_path = write_fake_spec(tmp_path, SPACE, name="limits")
    result = CliRunner().invoke(
        app,
        ["run", "--spec", str(spec_path), "--trials", "4", "--seed", "1", "--confirm-top", "0"],
    )
    assert result.exit_code == 0, result.output
    notices = [line for line in result.output.splitlines() if "machine:" in line]
    assert len(notices) == 1 and "kv_cache_dtype='fp8'" in notices[0], notices
    assert "AVX-512 or AMX" in notices[0]
    spec = load_spec(spec_path)
    study = optuna.load_study(study_name="limits", storage=spec.default_storage())
    recorded = study.user_attrs[names.MACHINE_LIMITS]
    assert [(r["parameter"], r["value"]) for r in recorded] == [("kv_cache_dtype", "fp8")]
    assert "AVX-512" in recorded[0]["reason"]
    assert len([t for t in study.trials if t.state.is_finished()]) >= 4
    assert all(t.params.get("kv_cache_dtype") != "fp8" for t in study.trials)
