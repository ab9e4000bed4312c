"""The env vars a vLLM server reads beyond ``vllm.envs``, with checks for their values.

vLLM's own registry (``vllm.envs.environment_variables``) is asked first (``validate.py``); a
variable it does not list may still be read by a library below it: NCCL (documented list, value
checks where the domain is closed), the CUDA runtime, PyTorch, OpenMP, tokenizers. A name in none
of these tables is reported, because a misspelled env var is silently ignored by every process.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence

# -------------------------------------------------------------------

_NCCL_ALGOS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
_NCCL_PROTOS = ("LL", "LL128", "Simple")
_NCCL_COLLECTIVES = (
    "allreduce",
    "allgather",
    "reducescatter",
    "broadcast",
    "reduce",
    "sendrecv",
    "alltoall",
)


def _nccl_list(allowed: Sequence[str], what: str) -> Callable[[str], str | None]:
    """NCCL's list syntax for NCCL_ALGO / NCCL_PROTO: ``a,b``, ``^a`` (all but a), and since
    NCCL 2.24 per-collective ``allreduce:tree,ring;broadcast:ring``. Names are matched
    case-insensitively, as NCCL does (``strcasecmp``)."""
    by_lower = {name.lower(): name for name in allowed}

    def check(text: str) -> str | None:
        for clause in text.split(";"):
            items = clause
            if ":" in clause:
                coll, items = clause.split(":", 1)
                if coll.strip().lower() not in _NCCL_COLLECTIVES:
                    return f"unknown collective {coll.strip()!r} in {text!r}"
            items = items.strip().removeprefix("^")
            for item in items.split(","):
                name = item.strip()
                if name.lower() not in by_lower:
                    hint = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
                    extra = f" (did you mean {by_lower[hint[0]]}?)" if hint else ""
                    return (
                        f"{name!r} is not an NCCL {what}{extra}; NCCL accepts "
                        f"{', '.join(allowed)} (case-insensitive, comma list, ^ negates)"
                    )
        return None

    return check


def _int_check(
    low: int | None = None, high: int | None = None, allowed: Sequence[int] | None = None
) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        try:
            value = int(text)
        except ValueError:
            return f"{text!r} is not an integer"
        if allowed is not None and value not in allowed:
            return f"{value} is not one of {', '.join(map(str, allowed))}"
        if low is not None and value < low:
            return f"{value} is below the minimum {low}"
        if high is not None and value > high:
            return f"{value} is above the maximum {high}"
        return None

    return check


def _choice_check(*allowed: str, integers: bool = False) -> Callable[[str], str | None]:
    def check(text: str) -> str | None:
        if text.upper() in allowed or (integers and text.isdigit()):
            return None
        return f"{text!r} is not one of {', '.join(allowed)}"

    return check


_BOOL01 = _choice_check("0", "1")

#: NCCL variables (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html) with a
#: value check where the documented domain is closed; None means free-form.
NCCL_ENV: dict[str, Callable[[str], str | None] | None] = {
    "NCCL_ALGO": _nccl_list(_NCCL_ALGOS, "algorithm"),
    "NCCL_PROTO": _nccl_list(_NCCL_PROTOS, "protocol"),
    "NCCL_MIN_NCHANNELS": _int_check(1, 64),
    "NCCL_MAX_NCHANNELS": _int_check(1, 64),
    "NCCL_NTHREADS": _int_check(allowed=(64, 128, 256, 512)),
    "NCCL_BUFFSIZE": _int_check(1),
    "NCCL_LL_BUFFSIZE": _int_check(1),
    "NCCL_LL128_BUFFSIZE": _int_check(1),
    "NCCL_P2P_DISABLE": _BOOL01,
    "NCCL_P2P_DIRECT_DISABLE": _BOOL01,
    "NCCL_P2P_READ_ENABLE": _BOOL01,
    "NCCL_P2P_LEVEL": _choice_check("LOC", "NVL", "PIX", "PXB", "PHB", "SYS", integers=True),
    "NCCL_P2P_NET_CHUNKSIZE": _int_check(1),
    "NCCL_P2P_NVL_CHUNKSIZE": _int_check(1),
    "NCCL_P2P_PCI_CHUNKSIZE": _int_check(1),
    "NCCL_P2P_LL_THRESHOLD": _int_check(0),
    "NCCL_SHM_DISABLE": _BOOL01,
    "NCCL_SHM_USE_CUDA_MEMCPY": _BOOL01,
    "NCCL_IB_DISABLE": _BOOL01,
    "NCCL_IB_HCA": None,
    "NCCL_IB_TIMEOUT": _int_check(1, 31),
    "NCCL_IB_RETRY_CNT": _int_check(0, 7),
    "NCCL_IB_GID_INDEX": _int_check(0),
    "NCCL_IB_SL": _int_check(0, 15),
    "NCCL_IB_TC": _int_check(0, 255),
    "NCCL_IB_QPS_PER_CONNECTION": _int_check(1),
    "NCCL_IB_PCI_RELAXED_ORDERING": _int_check(0, 2),
    "NCCL_NET": None,
    "NCCL_NET_PLUGIN": None,
    "NCCL_NET_GDR_LEVEL": _choice_check("LOC", "PIX", "PXB", "PHB", "SYS", integers=True),
    "NCCL_NET_GDR_READ": _BOOL01,
    "NCCL_NET_SHARED_BUFFERS": _BOOL01,
    "NCCL_NET_SHARED_COMMS": _BOOL01,
    "NCCL_SOCKET_IFNAME": None,
    "NCCL_SOCKET_FAMILY": _choice_check("AF_INET", "AF_INET6"),
    "NCCL_SOCKET_NTHREADS": _int_check(1, 16),
    "NCCL_NSOCKS_PERTHREAD": _int_check(1),
    "NCCL_CROSS_NIC": _int_check(0, 2),
    "NCCL_DEBUG": _choice_check("VERSION", "WARN", "INFO", "TRACE"),
    "NCCL_DEBUG_SUBSYS": None,
    "NCCL_DEBUG_FILE": None,
    "NCCL_CHECKS_DISABLE": _BOOL01,
    "NCCL_CHECK_POINTERS": _BOOL01,
    "NCCL_LAUNCH_MODE": _choice_check("PARALLEL", "GROUP"),
    "NCCL_IGNORE_CPU_AFFINITY": _BOOL01,
    "NCCL_COLLNET_ENABLE": _BOOL01,
    "NCCL_COLLNET_NODE_THRESHOLD": _int_check(1),
    "NCCL_TOPO_FILE": None,
    "NCCL_TOPO_DUMP_FILE": None,
    "NCCL_GRAPH_DUMP_FILE": None,
    "NCCL_GRAPH_FILE": None,
    "NCCL_NVB_DISABLE": _BOOL01,
    "NCCL_PXN_DISABLE": _BOOL01,
    "NCCL_P2P_PXN_LEVEL": _int_check(0, 2),
    "NCCL_GRAPH_REGISTER": _BOOL01,
    "NCCL_LOCAL_REGISTER": _BOOL01,
    "NCCL_SET_STACK_SIZE": _BOOL01,
    "NCCL_SET_THREAD_NAME": _BOOL01,
    "NCCL_GRAPH_MIXING_SUPPORT": _BOOL01,
    "NCCL_DMABUF_ENABLE": _BOOL01,
    "NCCL_ALLOC_P2P_NET_LL_BUFFERS": _BOOL01,
    "NCCL_COMM_BLOCKING": _BOOL01,
    "NCCL_CUMEM_ENABLE": _BOOL01,
    "NCCL_CUMEM_HOST_ENABLE": _BOOL01,
    "NCCL_NVLS_ENABLE": _BOOL01,
    "NCCL_NVLS_CHUNKSIZE": _int_check(1),
    "NCCL_MNNVL_ENABLE": _int_check(0, 2),
    "NCCL_RUNTIME_CONNECT": _BOOL01,
    "NCCL_WORK_FIFO_DEPTH": _int_check(1),
    "NCCL_NCHANNELS_PER_NET_PEER": _int_check(1),
    "NCCL_MIN_CTAS": _int_check(1),
    "NCCL_MAX_CTAS": _int_check(1),
    "NCCL_CGA_CLUSTER_SIZE": _int_check(0, 8),
    "NCCL_CONF_FILE": None,
    "NCCL_HOSTID": None,
    "NCCL_TUNER_PLUGIN": None,
    "NCCL_PROFILER_PLUGIN": None,
}

#: other runtime variables a vLLM server reads (CUDA runtime, PyTorch, OpenMP, tokenizers)
OTHER_ENV: dict[str, Callable[[str], str | None] | None] = {
    "OMP_NUM_THREADS": _int_check(1),
    "MKL_NUM_THREADS": _int_check(1),
    "CUDA_DEVICE_MAX_CONNECTIONS": _int_check(1, 32),
    "CUDA_VISIBLE_DEVICES": None,
    "CUDA_LAUNCH_BLOCKING": _BOOL01,
    "CUDA_MODULE_LOADING": _choice_check("LAZY", "EAGER"),
    "CUDA_DEVICE_ORDER": _choice_check("FASTEST_FIRST", "PCI_BUS_ID"),
    "PYTORCH_CUDA_ALLOC_CONF": None,
    "PYTORCH_ALLOC_CONF": None,
    "TOKENIZERS_PARALLELISM": _choice_check("TRUE", "FALSE", "1", "0"),
    "HF_HUB_OFFLINE": _BOOL01,
    "TRANSFORMERS_OFFLINE": _BOOL01,
}
#: prefixes of families too large to list (PyTorch, Inductor, Triton): any name is accepted
OTHER_ENV_PREFIXES = ("TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_")
#: env vars older vLLM versions read that are gone, with what replaced them
RENAMED_ENV = {
    "VLLM_ATTENTION_BACKEND": "--attention-backend (or --attention-config '{\"backend\": ...}')",
    "VLLM_USE_V1": "nothing (V1 is the only engine)",
}
