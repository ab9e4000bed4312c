"""TEST DOUBLE's command line: options, faults and the simulated config they imply.

Typed once into :class:`ServerOptions` by :func:`parse_options`, so the scheduler, the HTTP layer
and the process code read fields, never argparse's namespace. The flags mimic vLLM's (the
fake is started by the same command templates); the behaviour each one has is described in
:mod:`autotune.testing.fake_server`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FAULTS = (
    "exit_at_start",
    "crash_mid_bench",
    "self_sigkill",
    "hang",
    "slow_start",
    "oom",
    "http_500",
    "flaky_500",
    "wrong_text",
    "wrong_when_batched",
    "ignore_sigterm",
    "healthy_but_broken",
    "unknown_flag",
    "corrupt_words",
    "no_text",
    "hang_in_bench",
    "preempt",
    "no_metrics",
    "stale_keepalive",
    "one_500_in_bench",
    "wrong_late",
    "wrong_alone_in_bench",
    "replay_cache",
    "replay_when_busy",
)
#: which response fields the server speaks: vLLM's (token ids, prompt_logprobs), the plain
#: OpenAI completions API (text, logprobs, echo), llama.cpp's llama-server's (logprobs in the
#: chat API's per-token ``content`` shape, with ids; no echo, no prompt scoring), or text only
#: (what many proxies return)
DIALECTS = ("vllm", "openai", "llamacpp", "text")
SIMULATIONS = ("glm5-8gpu",)
MAX_LOGPROBS = 20
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE")


def log(message: str) -> None:
    """Print one log line to stderr (where real engines log, and where autotune reads tails)."""
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [fake_server] {message}", file=sys.stderr)
    sys.stderr.flush()


def _json_object(text: str) -> dict[str, Any]:
    """argparse type for ``--compilation-config``: a JSON object."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


@dataclass(frozen=True)
class ServerOptions:
    """Everything the command line decides, typed; built once by :func:`parse_options`."""

    host: str
    port: int
    port_file: str | None
    api_key: str | None
    model: str
    served_model_name: str
    max_model_len: int
    decode_ms: float
    prefill_ms: float
    batch_penalty: float
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enforce_eager: bool
    compilation_config: dict[str, Any]
    gpu_memory_utilization: float
    disable_custom_all_reduce: bool
    kv_cache_dtype: str
    seed: int
    fault: str | None
    fault_after: int
    startup_delay_s: float
    ready_delay_s: float
    spawn_child: bool
    child_title: str
    spawn_detached: bool
    simulate: str | None
    time_scale: float
    sim_noise: float
    sim_seed: int | None
    dialect: str = "vllm"
    wake_noise: float = 0.0
    wake_noise_seed: int | None = None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; vLLM-style flags plus the fake's own knobs."""
    p = argparse.ArgumentParser(
        prog="python -m autotune.testing.fake_server",
        description="TEST DOUBLE: fake OpenAI-compatible completion server (see module doc).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: the OS picks one (see --port-file)")
    p.add_argument("--port-file", default=None, help="write the listening port here")
    p.add_argument(
        "--api-key",
        default=os.environ.get("AUTOTUNE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 (default: $AUTOTUNE_API_KEY)",
    )
    p.add_argument("--model", default="toy", help="model name (also the served name)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-model-len", type=int, default=4096)
    # Speed model.
    p.add_argument("--decode-ms", type=float, default=2.0, help="ms per decode step at batch 1")
    p.add_argument("--prefill-ms", type=float, default=5.0, help="ms to prefill one request")
    p.add_argument("--batch-penalty", type=float, default=0.05, help="step cost per extra seq")
    # vLLM engine flags that change the speed model (or, in simulation, the config).
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("-O", "--compilation-config", type=_json_object, default={})
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3"])
    p.add_argument("--seed", type=int, default=0)
    # Accepted for compatibility with vLLM command lines; no effect.
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    # Faults and process shape.
    p.add_argument("--fault", choices=FAULTS, default=None, help="or env FAKE_FAULT")
    p.add_argument(
        "--fault-after",
        type=int,
        default=5,
        help="completions before crash_mid_bench/self_sigkill (one_500_in_bench: requests)",
    )
    p.add_argument("--startup-delay-s", type=float, default=2.0, help="slow_start's sleep")
    p.add_argument("--ready-delay-s", type=float, default=0.0, help="/health 503 for this long")
    p.add_argument("--spawn-child", action="store_true", help="start an EngineCore-like child")
    p.add_argument("--child-title", default="FAKE::EngineCore")
    p.add_argument("--spawn-detached", action="store_true", help="setsid + double-fork helper")
    # Simulation.
    p.add_argument("--simulate", choices=SIMULATIONS, default=None)
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every sleep by this")
    p.add_argument("--sim-noise", type=float, default=0.05, help="run-level noise (std dev)")
    p.add_argument("--sim-seed", type=int, default=None, help="noise seed (default: random)")
    p.add_argument("--dialect", choices=DIALECTS, default="vllm", help="response fields spoken")
    p.add_argument("--wake-noise", type=float, default=0.0, help="speed factor 1 +- F per wake")
    p.add_argument("--wake-noise-seed", type=int, default=None)
    return p


def parse_options(argv: Sequence[str] | None = None) -> ServerOptions:
    """Parse and validate ``argv``; exits 2 on unknown or invalid arguments, like argparse."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    fault = ns.fault or os.environ.get("FAKE_FAULT") or None
    if fault is not None and fault not in FAULTS:
        parser.error(f"unknown fault {fault!r} (FAKE_FAULT); choose from {', '.join(FAULTS)}")
    mode = ns.compilation_config.get("cudagraph_mode")
    if mode is not None and mode not in CUDAGRAPH_MODES:
        parser.error(f"argument -O/--compilation-config: invalid cudagraph_mode {mode!r}")
    if ns.time_scale <= 0:
        parser.error("argument --time-scale: must be > 0")
    return ServerOptions(
        host=ns.host,
        port=ns.port,
        port_file=ns.port_file,
        api_key=ns.api_key,
        model=ns.model,
        served_model_name=ns.served_model_name or ns.model,
        max_model_len=ns.max_model_len,
        decode_ms=ns.decode_ms,
        prefill_ms=ns.prefill_ms,
        batch_penalty=ns.batch_penalty,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        enforce_eager=ns.enforce_eager,
        compilation_config=ns.compilation_config,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        disable_custom_all_reduce=ns.disable_custom_all_reduce,
        kv_cache_dtype=ns.kv_cache_dtype,
        seed=ns.seed,
        fault=fault,
        fault_after=ns.fault_after,
        startup_delay_s=ns.startup_delay_s,
        ready_delay_s=ns.ready_delay_s,
        spawn_child=ns.spawn_child,
        child_title=ns.child_title,
        spawn_detached=ns.spawn_detached,
        simulate=ns.simulate,
        time_scale=ns.time_scale,
        sim_noise=ns.sim_noise,
        sim_seed=ns.sim_seed,
        dialect=ns.dialect,
        wake_noise=ns.wake_noise,
        wake_noise_seed=ns.wake_noise_seed,
    )


class StartupError(Exception):
    """The server refuses to start; ``message`` goes to stderr, ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
