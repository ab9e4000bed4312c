"""What this machine can run under vLLM, learned before a trial is spent.

A search space is written once and run on many machines; some of its choices only work on some
hardware. Launching them costs a server start each and ends in a crash whose log names the root
cause (``FP8 KV cache on CPU requires x86 with AVX-512 or AMX.``). Here the same facts are read
up front, from where the engine and the machine expose them:

* CPU build: the CPU flags in ``/proc/cpuinfo`` (vLLM's CPU attention refuses an fp8 KV cache
  without ``avx512f`` or ``amx_tile``, ``vllm/v1/attention/backends/cpu_attn.py``), and the cores
  this process may use (``VLLM_CPU_OMP_THREADS_BIND`` lists naming other cores fail to bind);
* GPU build: the compute capability from ``nvidia-smi`` (no CUDA context is created in the
  tuner), checked with the installed vLLM's own ``supports_compute_capability`` of each attention
  backend and ``get_min_capability`` of each quantization method.

Every probe is best effort: a fact that cannot be read drops nothing (the trial then fails with
its root cause in the record, as before).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.engines.base import DroppedChoice

if TYPE_CHECKING:
    from autotune.space.model import Parameter, SearchSpace

#: flags whose non-default values change the numbers the model computes (first proposals avoid
#: them: the correctness gate may rightly reject them, which teaches a newcomer nothing)
LOSSY_FLAGS = {
    "--kv-cache-dtype": ("auto",),
    "--quantization": (None,),
    "--dtype": ("auto",),
    "--calculate-kv-scales": (False,),
}
_ATTENTION_TARGETS = ("--attention-backend", "VLLM_ATTENTION_BACKEND")
#: env var naming the cores vLLM's CPU worker binds its OpenMP threads to (a Linux cpulist)
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
_QUANTIZATION_TARGETS = ("--quantization",)


@dataclass(frozen=True)
class Machine:
    """The facts the rules below need; tests build one by hand."""

    cpu_build: bool
    cpu_flags: frozenset[str]
    cpus: frozenset[int]
    #: (major, minor) of the first visible GPU, None when unknown or no GPU
    capability: tuple[int, int] | None = None


def probe_machine(cpuinfo_path: str = "/proc/cpuinfo") -> Machine:
    cpu_build = _is_cpu_build()
    return Machine(
        cpu_build=cpu_build,
        cpu_flags=cpu_flags(_read(cpuinfo_path)),
        cpus=frozenset(_usable_cpus()),
        capability=None if cpu_build else _gpu_capability(),
    )


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The ``flags`` of the first processor in ``/proc/cpuinfo`` text (``Features`` on ARM)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def machine_limits(
    space: SearchSpace,
    machine: Machine,
    *,
    attention_ok: Callable[[str, tuple[int, int]], bool | None] | None = None,
    quantization_min: Callable[[str], int | None] | None = None,
) -> list[DroppedChoice]:
    """The choices of ``space`` that ``machine`` cannot run, one entry per (parameter, value)."""
    attention_ok = attention_ok or _vllm_attention_ok
    quantization_min = quantization_min or _vllm_quantization_min
    dropped: list[DroppedChoice] = []
    for param in space.parameters:
        target = param.target.name
        for value in _discrete_values(param):
            reason = None
            if machine.cpu_build:
                reason = _cpu_reason(target, value, machine)
            elif machine.capability is not None:
                reason = _gpu_reason(
                    target, value, machine.capability, attention_ok, quantization_min
                )
            if reason is not None and not (param.has_baseline and param.baseline == value):
                # the baseline's own value is never dropped: if it cannot run, the baseline
                # fails visibly and the study stops with that root cause
                dropped.append(DroppedChoice(param.name, value, reason))
    return dropped


def lossy_reason(target_name: str, value: Any) -> str | None:
    defaults = LOSSY_FLAGS.get(target_name)
    if defaults is None or value in defaults:
        return None
    return f"{target_name} {value} changes the model's numerics"


# --- rules ---------------------------------------------------------------------------------


def _cpu_reason(target: str, value: Any, machine: Machine) -> str | None:
    fp8 = target == "--kv-cache-dtype" and str(value).startswith("fp8")
    if fp8 and not ({"avx512f", "amx_tile"} & machine.cpu_flags):
        return (
            "FP8 KV cache on CPU requires x86 with AVX-512 or AMX "
            "(no avx512f or amx_tile in /proc/cpuinfo)"
        )
    if target == CPU_BIND_ENV and machine.cpus:
        cores = _bind_cores(str(value))
        missing = sorted(cores - machine.cpus) if cores is not None else []
        if missing:
            return (
                f"binds to core(s) {','.join(map(str, missing))}, which this process cannot "
                f"use (usable: {_ranges(machine.cpus)})"
            )
    return None


def _gpu_reason(
    target: str,
    value: Any,
    capability: tuple[int, int],
    attention_ok: Callable[[str, tuple[int, int]], bool | None],
    quantization_min: Callable[[str], int | None],
) -> str | None:
    cap = f"{capability[0]}.{capability[1]}"
    attention = target in _ATTENTION_TARGETS and isinstance(value, str)
    if attention and attention_ok(value, capability) is False:
        return f"attention backend {value} does not support compute capability {cap}"
    if target in _QUANTIZATION_TARGETS and isinstance(value, str):
        needed = quantization_min(value)
        if needed is not None and capability[0] * 10 + capability[1] < needed:
            return (
                f"quantization {value} needs compute capability {needed // 10}.{needed % 10}, "
                f"this GPU has {cap}"
            )
    return None


def _discrete_values(param: Parameter) -> Iterable[Any]:
    if param.type == "bool":
        return (False, True)
    if param.type == "categorical":
        return param.choices
    return ()


def _bind_cores(value: str) -> set[int] | None:
    """Cores named by a ``VLLM_CPU_OMP_THREADS_BIND`` list ("0-3", "0,2|4-5"); None for the
    keywords ("auto", "nobind", "all") and for text that is not a list."""
    cores: set[int] = set()
    for part in value.replace("|", ",").split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        cores.update(range(int(low), int(high or low) + 1))
    return cores


def _ranges(cpus: Iterable[int]) -> str:
    ordered = sorted(cpus)
    out, start = [], None
    for index, cpu in enumerate(ordered):
        if start is None:
            start = cpu
        if index + 1 == len(ordered) or ordered[index + 1] != cpu + 1:
            out.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(out)


# --- probes --------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _usable_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 0))


def _is_cpu_build() -> bool:
    """The community ``vllm-cpu`` distribution, or a ``+cpu`` local version of ``vllm``."""
    try:
        importlib.metadata.version("vllm-cpu")
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return "cpu" in importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False


def _gpu_capability() -> tuple[int, int] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        major, minor = out.splitlines()[0].strip().split(".")
        return int(major), int(minor)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _vllm_attention_ok(name: str, capability: tuple[int, int]) -> bool | None:
    """The installed vLLM's own answer; None when it cannot be asked."""
    try:
        from vllm.platforms.interface import DeviceCapability
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        backend = AttentionBackendEnum[name.upper()].get_class()
        return bool(backend.supports_compute_capability(DeviceCapability(*capability)))
    except Exception:  # noqa: BLE001 - any failure to ask means "unknown", never a drop
        return None


def _vllm_quantization_min(name: str) -> int | None:
    try:
        from vllm.model_executor.layers.quantization import get_quantization_config

        return int(get_quantization_config(name).get_min_capability())
    except Exception:  # noqa: BLE001
        return None
