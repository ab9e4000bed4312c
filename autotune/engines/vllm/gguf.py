"""Whether the installed vLLM can load a GGUF model, and what to do when it cannot.

vLLM dropped its own GGUF loader in 0.24; the out-of-tree ``vllm-gguf-plugin`` (entry point
``vllm.general_plugins: gguf``) brings it back, and dequantizes with Triton kernels that need
CUDA tensors. So vLLM 0.32 without the plugin fails on a ``.gguf`` deep in its config code
(``OSError: It looks like the config file at '....gguf' is not a valid JSON file``), and on the
CPU build with the plugin it loads the file for minutes and then fails the first forward
(``Triton dequant kernels require CUDA tensors``; both measured with vLLM 0.32). Both would
cost the baseline's whole startup and end in a root cause that does not say what to do; the
preflight asks this module first and refuses the study with the two ways out: the plugin on a
GPU machine, or a dequantized copy (``python -m autotune.model.dequantize``) here.

The facts are read without importing vLLM: its version from the distribution metadata, the
plugin from the import system, the CPU build from the distribution's name.
"""

from __future__ import annotations

import importlib.util
import re

from autotune.engines.vllm.machine import _is_cpu_build
from autotune.engines.vllm.version import installed_vllm_version
from autotune.model.gguf_reader import gguf_model_file

#: the first vLLM without a GGUF loader of its own
LOADER_REMOVED_IN = (0, 24)
#: the import name of vllm-gguf-plugin
PLUGIN_MODULE = "vllm_gguf_plugin"
PLUGIN_PACKAGE = "vllm-gguf-plugin"


def gguf_load_problem(
    version: str | None, *, plugin_installed: bool, cpu_build: bool
) -> str | None:
    """Why vLLM ``version`` cannot load a GGUF model on this machine, or None when it can (or
    when vLLM is absent: the preflight says that on its own). Pure: the facts are arguments."""
    if version is None:
        return None
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is not None and (int(match[1]), int(match[2])) < LOADER_REMOVED_IN:
        return None  # the built-in loader
    if not plugin_installed:
        return (
            f"vLLM {version} has no GGUF loader of its own (it moved to the {PLUGIN_PACKAGE} "
            f"package in vLLM 0.24) and {PLUGIN_PACKAGE} is not installed"
        )
    if cpu_build:
        return (
            f"{PLUGIN_PACKAGE} is installed, but it dequantizes with Triton kernels that need "
            f"CUDA tensors, and this is vLLM {version}'s CPU build"
        )
    return None


def probe_gguf_load_problem() -> str | None:
    """:func:`gguf_load_problem` for the vLLM installed here."""
    return gguf_load_problem(
        installed_vllm_version(),
        plugin_installed=importlib.util.find_spec(PLUGIN_MODULE) is not None,
        cpu_build=_is_cpu_build(),
    )


def remedy(gguf_path: str) -> str:
    """The two ways to serve a GGUF model that this vLLM cannot load."""
    return (
        f"on a machine with an NVIDIA GPU, pip install {PLUGIN_PACKAGE}; on this one, serve a "
        f"dequantized bf16 copy: python -m autotune.model.dequantize {gguf_path} OUTDIR, "
        f"then set model.path to OUTDIR"
    )


def model_problem(model_path: str, problem: str | None = None) -> str | None:
    """Why vLLM here cannot serve ``model_path`` (a GGUF file, or a folder holding only GGUF
    files), with the remedy, or None. ``problem`` is the loader's problem when already known
    (tests give it; by default it is probed)."""
    gguf = gguf_model_file(model_path)
    if gguf is None:
        return None
    problem = problem if problem is not None else probe_gguf_load_problem()
    if problem is None:
        return None
    return f"{model_path} is a GGUF model and {problem}: {remedy(str(gguf))}"
