"""What machine a study ran on, in words a reader can compare: the CPU model, its logical
cores, the total memory, and the GPUs (name and memory) where ``nvidia-smi`` answers.

A hostname ("vm") says nothing about the hardware; this is what the report shows instead. The
loop records it once per study as ``user_attrs["machine"]`` (:data:`names.MACHINE`). A figure that
could not be read is absent from the dict, never 0 or "unknown".
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

_GPU_QUERY = ["--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]


def cpu_model_from_cpuinfo(text: str) -> str | None:
    """The CPU's model name from ``/proc/cpuinfo`` (x86 "model name", ARM "Model"/"Hardware"
    or "CPU part" lines), or None."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip().lower(), value.strip())
    for key in ("model name", "model", "hardware", "cpu model", "processor"):
        value = fields.get(key)
        if value and not value.isdigit():  # x86's "processor : 0" is an index, not a name
            return value
    return None


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader[,nounits]`` lines ->
    ``[{"name": ..., "memory_mib": ...}]`` (memory absent where it is not a number)."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, _, memory = line.rpartition(",")
        if not name:  # one column only: a name
            name, memory = memory, ""
        gpu: dict[str, Any] = {"name": name.strip()}
        number = memory.strip().removesuffix("MiB").strip()
        with contextlib.suppress(ValueError):
            gpu["memory_mib"] = int(float(number))
        gpus.append(gpu)
    return gpus


def _nvidia_smi() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, *_GPU_QUERY], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def describe_machine(
    *,
    cpuinfo: Path = Path("/proc/cpuinfo"),
    smi: Callable[[], str | None] = _nvidia_smi,
) -> dict[str, Any]:
    """``{"cpu_model", "logical_cores", "memory_gib", "gpus"}``; a key whose figure could not
    be read is left out (no ``gpus`` where ``nvidia-smi`` is absent or fails)."""
    machine: dict[str, Any] = {}
    model = cpu_model_from_cpuinfo(_read(cpuinfo)) or platform.processor() or None
    if model:
        machine["cpu_model"] = model
    cores = os.cpu_count()
    if cores:
        machine["logical_cores"] = cores
    try:
        total = psutil.virtual_memory().total
    except (OSError, RuntimeError):
        total = 0
    if total > 0:
        machine["memory_gib"] = round(total / 2**30, 1)
    out = smi()
    if out is not None:
        gpus = parse_gpus(out)
        if gpus:
            machine["gpus"] = gpus
    return machine
