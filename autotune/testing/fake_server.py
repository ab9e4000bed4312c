"""TEST DOUBLE: a fake OpenAI-compatible completion server with a speed model and fault injection.

Never used by ``autotune run`` by default; it exists so the server lifecycle, correctness gate,
benchmark client and study loop can be tested without an inference engine. Run it as::

    AUTOTUNE_API_KEY=K python -m autotune.testing.fake_server --port 8000 --model toy

(the key from ``--api-key`` or, as autotune's command engine passes it, ``AUTOTUNE_API_KEY``).

``--port 0`` lets the operating system pick a free port (no pick-then-bind race); the server
logs ``ready on http://HOST:PORT`` with the real port and, with ``--port-file F``, writes it to
``F`` (atomically, once listening).

It speaks the subset of vLLM's API autotune uses: ``GET /health``, ``GET /v1/models``,
``GET /version`` and ``POST /v1/completions`` (``prompt`` as text or token ids, ``max_tokens``,
``temperature``, ``seed``, ``stream`` with ``stream_options.include_usage``, ``logprobs``,
``prompt_logprobs``, ``return_token_ids``, ``ignore_eos``), with vLLM's response shapes. The
"model" is :class:`autotune.testing.toy_model.ToyModel`: greedy output continues counting.
``GET /sim/stats`` (test hook, no key needed) reports counters since start or the last
``POST /sim/reset``: steps, tokens, completed, max_batch, ``sim_time_ms`` and
``sim_decode_tok_s`` (tokens per simulated second of decode), ``step_ms_batch1``, ``child_pid``
and, in simulation, the config, ``correct`` and the noise factor.

Speed model (why: so flags really change tokens/s and latency, like on a real engine). A step
emits one token for every running sequence and costs
``decode_ms * (1 + batch_penalty * (batch - 1))`` plus, for each request admitted in that step,
``prefill_ms * (1 + prompt_tokens / 512)``; the admitted request's first token comes from that
step (TTFT). At most ``--max-num-seqs`` sequences run; the rest queue. Prompt tokens admitted per
step are limited by ``--max-num-batched-tokens`` minus the running decodes (at least one
request). ``--enforce-eager`` or ``cudagraph_mode: NONE`` makes steps 1.3x slower;
``--kv-cache-dtype fp8*`` makes them 0.92x and moves logprobs by up to 0.02 (ranks unchanged).

``--simulate glm5-8gpu`` replaces the step cost by :mod:`autotune.testing.glm5_sim` (a
SIMULATION), configured from the vLLM-style flags and the env vars ``NCCL_PROTO``,
``NCCL_ALGO``, ``NCCL_MIN_NCHANNELS`` and ``AUTOTUNE_PATCHES`` (``{"mla_path": ...}``). Configs
the model says cannot start exit like vLLM would (OOM, KV cache, invalid); configs it says are
incorrect answer with whitespace. A run-level noise factor (``--sim-noise``, ``--sim-seed``)
models run-to-run variation.

``--wake-noise F`` (with ``--wake-noise-seed``) makes the speed noisy the way a shared machine
is: each time the engine wakes from idle (a benchmark phase, a wave of requests) every step cost
is multiplied by a fresh factor drawn uniformly from [1 - F, 1 + F].

``--time-scale S`` multiplies every decode/prefill sleep by S (0.01 = 100x faster). A client's
wall-clock durations are then S times the simulated ones, and its rates 1/S times: multiply a
measured tokens/s by S (and divide a measured latency by S) to get simulated values. At small S
the event loop's own overhead (tens of microseconds per token) is no longer negligible, so
``/sim/stats`` reports ``sim_time_ms`` and ``sim_decode_tok_s`` in simulated time directly; use
those when exactness matters (measured here: the GLM-5 graphs config at S=0.01 gave 41 instead of
43 simulated tok/s from the wall clock, 4 % low; eager at S=0.1: 19.7 for 19.8). Startup
delays (``--startup-delay-s``, ``--ready-delay-s``, the ``oom`` delay) are real seconds, never
scaled.

Faults (``--fault NAME`` or env ``FAKE_FAULT``), each mimicking a failure real engines show:

* ``exit_at_start``: exit 3 before listening, after an engine-init error message.
* ``crash_mid_bench``: ``os._exit(1)`` once ``--fault-after`` completions (default 5) have
  finished and more work arrives (the readiness check's completion counts).
* ``self_sigkill``: like ``crash_mid_bench``, but the server SIGKILLs itself, printing
  nothing: a SIGKILL nobody can call an OOM.
* ``hang``: accepts completions and never answers them (``/health`` stays 200).
* ``slow_start``: sleeps ``--startup-delay-s`` before listening.
* ``oom``: prints a CUDA out-of-memory traceback to stderr and exits 1 shortly after start.
* ``http_500``: every completion answers 500.
* ``flaky_500``: one streamed completion in three answers 500 (the server stays up).
* ``wrong_text``: fast, but greedy output turns to whitespace from the 2nd generated token.
* ``wrong_when_batched``: every token decoded in a step that holds more than one sequence is
  wrong (whitespace, as ``wrong_text``); a request that runs alone is exactly right, so only a
  check under load can see it (a batching bug: a wrong row index, a padding mask).
* ``ignore_sigterm``: SIGTERM is ignored (server and child); only SIGKILL stops it.
* ``healthy_but_broken``: ``/health`` 200, every completion 500 (vLLM's CPU head_dim case).
* ``unknown_flag``: rejects its arguments like argparse does: exit 2, "unrecognized arguments".
* ``corrupt_words``: fluent but wrong: every 7th generated token is the runner-up instead of the
  greedy choice (sane text, scored logprobs unchanged); only a comparison with the reference
  sees it.
* ``no_text``: every answer's text is empty (token ids and logprobs as usual).
* ``hang_in_bench``: benchmark requests (streamed with ``stream_options.include_usage``) are
  accepted and never answered; readiness and verification requests are served.
* ``preempt``: ``/metrics`` counts one preemption per completed request (the output is right).
* ``no_metrics``: ``/metrics`` answers 404, as a server without Prometheus metrics.

``GET /metrics`` (no key needed, as vLLM) serves a few of vLLM's Prometheus metrics in the text
format: ``vllm:num_requests_running``/``waiting`` and ``vllm:kv_cache_usage_perc`` (running over
``--max-num-seqs``) gauges, ``vllm:generation_tokens_total`` and ``vllm:num_preemptions_total``.

``--dialect`` chooses the response fields: ``vllm`` (default: ``token_ids``,
``prompt_token_ids``, ``prompt_logprobs``), ``openai`` (the plain OpenAI completions API: text,
``logprobs`` with per-token strings, ``echo``; vLLM's extra fields are ignored, as llama.cpp,
TGI or a proxy would), ``text`` (text only: no logprobs, no ids, no echo).

Unknown command-line arguments are rejected (exit 2), as vLLM's parser does. ``--spawn-child``
starts a child process in the server's process group, named like vLLM's ``EngineCore`` (via
setproctitle when available), so teardown tests have a child to kill; a clean SIGTERM stops it,
a SIGKILL of the server alone orphans it. ``--spawn-detached`` starts a helper that calls
``setsid`` and double-forks (its own session and group, re-parented away from the server, named
``<child-title>-detached``) and sleeps: only a tracker that saw it can stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.testing import glm5_sim
from autotune.testing.toy_model import EOS_ID, TokenScore, ToyModel

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
)
#: which response fields the server speaks: vLLM's (token ids, prompt_logprobs), the plain
#: OpenAI completions API (text, logprobs, echo), or text only (what many proxies return)
DIALECTS = ("vllm", "openai", "text")
SIMULATIONS = ("glm5-8gpu",)
MAX_LOGPROBS = 20
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE")

_CHILD_CODE = r"""
import signal, sys, time
title, ignore_term = sys.argv[1], sys.argv[2] == "1"
try:
    import setproctitle
    setproctitle.setproctitle(title)
except ImportError:
    import ctypes
    ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)
if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(3600)
"""

_DETACHED_CODE = r"""
import os, sys, time
os.setsid()
pid = os.fork()
if pid:
    print(pid, flush=True)
    os._exit(0)
os.closerange(0, 3)
while True:
    time.sleep(3600)
"""


def _log(message: str) -> None:
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
        "--fault-after", type=int, default=5, help="completions before crash_mid_bench/self_sigkill"
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


def glm5_config_from(opts: ServerOptions, env: dict[str, str]) -> glm5_sim.Glm5Config:
    """The simulated config implied by the flags and env vars, as a real server would read them.

    Raises:
        StartupError: an env var or patch the simulated engine would reject.
    """
    values: dict[str, Any] = {
        "enforce_eager": opts.enforce_eager,
        "disable_custom_all_reduce": opts.disable_custom_all_reduce,
        "gpu_memory_utilization": opts.gpu_memory_utilization,
    }
    if opts.max_num_seqs is not None:
        values["max_num_seqs"] = opts.max_num_seqs
    if opts.max_num_batched_tokens is not None:
        values["max_num_batched_tokens"] = opts.max_num_batched_tokens
    for key in ("cudagraph_mode", "cudagraph_capture_sizes"):
        if key in opts.compilation_config:
            values[key] = opts.compilation_config[key]
    for name in ("NCCL_PROTO", "NCCL_ALGO"):
        if env.get(name):
            values[name] = env[name]
    if env.get("NCCL_MIN_NCHANNELS"):
        try:
            values["NCCL_MIN_NCHANNELS"] = int(env["NCCL_MIN_NCHANNELS"])
        except ValueError as exc:
            raise StartupError(f"NCCL WARN Invalid value for NCCL_MIN_NCHANNELS: {exc}") from exc
    patches = _read_patches(env)
    for name, value in patches.items():
        if name != "mla_path" or value not in glm5_sim.MLA_PATHS:
            print(
                f"AUTOTUNE_PATCH_FAILED name={name} reason=unknown patch or value", file=sys.stderr
            )
            raise StartupError(f"RuntimeError: patch {name}={value!r} cannot be applied")
        values["mla_path"] = value
        if value != "custom_op":
            print(
                f"AUTOTUNE_PATCH_APPLIED name={name} value={value} pid={os.getpid()}",
                file=sys.stderr,
            )
    try:
        return glm5_sim.Glm5Config.from_mapping(values)
    except (KeyError, ValueError, TypeError) as exc:
        raise StartupError(f"ValueError: {exc}") from exc


def _read_patches(env: dict[str, str]) -> dict[str, Any]:
    raw = env.get("AUTOTUNE_PATCHES", "").strip()
    if not raw:
        return {}
    try:
        patches = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StartupError(f"ValueError: AUTOTUNE_PATCHES is not JSON: {exc}") from exc
    if not isinstance(patches, dict):
        raise StartupError("ValueError: AUTOTUNE_PATCHES must be a JSON object")
    return patches


# ---------------------------------------------------------------------------------------------
# Engine: a step scheduler with vLLM-like continuous batching.


@dataclass
class TokenEvent:
    """One generated token handed from the engine to the request's HTTP handler."""

    chosen: TokenScore
    top: list[TokenScore]
    finish_reason: str | None


@dataclass
class GenRequest:
    """One completion request inside the engine."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    ignore_eos: bool
    rng: random.Random
    generated: list[int] = field(default_factory=list)
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    cancelled: bool = False


@dataclass
class EngineStats:
    """Counters in simulated time (what ``/sim/stats`` reports)."""

    steps: int = 0
    sim_time_ms: float = 0.0
    busy_decode_ms: float = 0.0
    tokens: int = 0
    completed: int = 0
    max_batch: int = 0


class Engine:
    """Runs steps while there is work; each step sleeps its (scaled) cost, then emits tokens.

    Sleeping against absolute deadlines (not ``sleep(step)`` each time) keeps the wall-clock
    rate right even when the event loop adds overhead, as long as the CPU keeps up.
    """

    def __init__(
        self,
        model: ToyModel,
        *,
        step_cost_ms: Callable[[int], float],
        prefill_cost_ms: Callable[[int], float],
        max_num_seqs: int,
        max_num_batched_tokens: int,
        time_scale: float,
        wrong_from: int | None,
        drift: bool,
        crash_after: int | None,
        corrupt_every: int | None = None,
        crash_by_sigkill: bool = False,
        wrong_when_batched: bool = False,
        wake_noise: float = 0.0,
        wake_noise_seed: int | None = None,
    ) -> None:
        self.model = model
        self.step_cost_ms = step_cost_ms
        self.prefill_cost_ms = prefill_cost_ms
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.time_scale = time_scale
        self.wrong_from = wrong_from
        self.drift = drift
        self.crash_after = crash_after
        self.corrupt_every = corrupt_every
        self.crash_by_sigkill = crash_by_sigkill
        self.wrong_when_batched = wrong_when_batched
        self.waiting: deque[GenRequest] = deque()
        self.running: list[GenRequest] = []
        self.stats = EngineStats()
        self._wake = asyncio.Event()
        self.wake_noise = wake_noise
        self._noise_rng = random.Random(wake_noise_seed)
        self._factor = self._draw_factor()

    def _draw_factor(self) -> float:
        if not self.wake_noise:
            return 1.0
        return max(0.05, 1.0 + self.wake_noise * self._noise_rng.uniform(-1.0, 1.0))

    def submit(self, request: GenRequest) -> None:
        """Queue a request; it is admitted at the next step with room."""
        self.waiting.append(request)
        self._wake.set()

    async def run(self) -> None:
        """The engine loop (one asyncio task for the server's lifetime)."""
        next_wall: float | None = None
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                next_wall = None
                self._factor = self._draw_factor()
                continue
            if self.crash_after is not None and self.stats.completed >= self.crash_after:
                if self.crash_by_sigkill:
                    os.kill(os.getpid(), signal.SIGKILL)
                print(
                    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
                    "ERROR [core.py] EngineCore encountered a fatal error.",
                    file=sys.stderr,
                )
                sys.stderr.flush()
                os._exit(1)
            admitted = self._admit()
            self.running = [r for r in self.running if not r.cancelled]
            if not self.running:
                continue
            batch = len(self.running)
            decode_ms = self.step_cost_ms(batch) * self._factor
            step_ms = decode_ms + sum(self.prefill_cost_ms(len(r.prompt_ids)) for r in admitted)
            now = time.monotonic()
            if next_wall is None or next_wall < now - 0.05:
                next_wall = now  # idle, or too far behind: do not burst to catch up
            next_wall += step_ms * self.time_scale / 1000.0
            await asyncio.sleep(max(0.0, next_wall - now))
            self.stats.steps += 1
            self.stats.sim_time_ms += step_ms
            self.stats.busy_decode_ms += decode_ms
            self.stats.max_batch = max(self.stats.max_batch, batch)
            self._emit_tokens()

    def _admit(self) -> list[GenRequest]:
        budget = self.max_num_batched_tokens - len(self.running)
        admitted: list[GenRequest] = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if request.cancelled:
                self.waiting.popleft()
                continue
            if admitted and len(request.prompt_ids) > budget:
                break
            self.waiting.popleft()
            budget -= len(request.prompt_ids)
            admitted.append(request)
            self.running.append(request)
        return admitted

    def _emit_tokens(self) -> None:
        still_running: list[GenRequest] = []
        batched = self.wrong_when_batched and sum(not r.cancelled for r in self.running) > 1
        for request in self.running:
            if request.cancelled:
                continue
            context = [*request.prompt_ids, *request.generated]
            broken = batched or (
                self.wrong_from is not None and len(request.generated) >= self.wrong_from
            )
            top = self.model.distribution(context, broken=broken, drift=self.drift)
            chosen = self.model.sample(
                context, request.temperature, request.rng, broken=broken, drift=self.drift
            )
            every = self.corrupt_every
            if every and len(request.generated) % every == every - 1:
                chosen = top[1]  # fluent but wrong: the runner-up
            request.generated.append(chosen.token_id)
            self.stats.tokens += 1
            finish: str | None = None
            if chosen.token_id == EOS_ID and not request.ignore_eos:
                finish = "stop"
            elif len(request.generated) >= request.max_tokens:
                finish = "length"
            request.events.put_nowait(TokenEvent(chosen, top, finish))
            if finish is None:
                still_running.append(request)
            else:
                self.stats.completed += 1
        self.running = still_running


# ---------------------------------------------------------------------------------------------
# HTTP layer.


class BadRequest(Exception):
    """A request vLLM would answer with 400."""


@dataclass(frozen=True)
class CompletionParams:
    """The validated fields of one ``/v1/completions`` body."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    stream: bool
    include_usage: bool
    logprobs: int | None
    prompt_logprobs: int | None
    return_token_ids: bool
    ignore_eos: bool
    seed: int | None
    echo: bool = False


def _error(status: int, message: str, kind: str) -> Any:
    from starlette.responses import JSONResponse

    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


class FakeServer:
    """The Starlette app plus the engine; one per process."""

    def __init__(self, opts: ServerOptions, engine: Engine, *, sim: dict[str, Any]) -> None:
        self.opts = opts
        self.engine = engine
        self.model = engine.model
        self.sim = sim
        self.started = time.monotonic()
        self.child: subprocess.Popen[bytes] | None = None
        self.port = opts.port  # the real one once bound (--port 0)
        self._engine_task: asyncio.Task[None] | None = None

    def app(self) -> Any:
        """Build the ASGI app."""
        from starlette.applications import Starlette
        from starlette.routing import Route

        @contextlib.asynccontextmanager
        async def lifespan(_app: Any) -> AsyncIterator[None]:
            self._engine_task = asyncio.create_task(self.engine.run())
            _log(f"ready on http://{self.opts.host}:{self.port} (pid {os.getpid()})")
            if self.opts.port_file:  # atomically: a reader never sees a half-written port
                tmp = f"{self.opts.port_file}.tmp"
                with open(tmp, "w") as fh:
                    fh.write(f"{self.port}\n")
                os.replace(tmp, self.opts.port_file)
            yield
            self._engine_task.cancel()

        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/sim/stats", self.sim_stats, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/sim/reset", self.sim_reset, methods=["POST"]),
        ]
        return Starlette(routes=routes, lifespan=lifespan)

    # -- helpers -----------------------------------------------------------------------------
    def _ready(self) -> bool:
        return time.monotonic() - self.started >= self.opts.ready_delay_s

    def _authorized(self, request: Any) -> bool:
        if self.opts.api_key is None:
            return True
        return request.headers.get("authorization", "") == f"Bearer {self.opts.api_key}"

    # -- routes ------------------------------------------------------------------------------
    async def health(self, request: Any) -> Any:
        from starlette.responses import Response

        return Response(status_code=200 if self._ready() else 503)

    async def version(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"version": "0.0.0+fake"})

    async def models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if not self._authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        card = {
            "id": self.opts.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.opts.model,
            "parent": None,
            "max_model_len": self.opts.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def sim_stats(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        stats = self.engine.stats
        decode_s = stats.busy_decode_ms / 1000.0
        body = {
            **asdict(stats),
            "mode": self.opts.simulate or "toy",
            "time_scale": self.opts.time_scale,
            "fault": self.opts.fault,
            "running": len(self.engine.running),
            "waiting": len(self.engine.waiting),
            "sim_decode_tok_s": stats.tokens / decode_s if decode_s > 0 else None,
            "step_ms_batch1": self.engine.step_cost_ms(1),
            "child_pid": self.child.pid if self.child else None,
            **self.sim,
        }
        return JSONResponse(body)

    async def metrics(self, request: Any) -> Any:
        """A few of vLLM's Prometheus metrics (see the module docstring)."""
        from starlette.responses import PlainTextResponse

        if self.opts.fault == "no_metrics":
            return PlainTextResponse("Not Found", status_code=404)
        engine, stats = self.engine, self.engine.stats
        label = f'{{model_name="{self.opts.served_model_name}"}}'
        preempted = stats.completed if self.opts.fault == "preempt" else 0
        rows = [
            ("vllm:num_requests_running", "gauge", len(engine.running)),
            ("vllm:num_requests_waiting", "gauge", len(engine.waiting)),
            ("vllm:kv_cache_usage_perc", "gauge", len(engine.running) / engine.max_num_seqs),
            ("vllm:generation_tokens", "counter", stats.tokens),
            ("vllm:num_preemptions", "counter", preempted),
        ]
        lines = []
        for name, kind, value in rows:
            sample = f"{name}_total" if kind == "counter" else name
            lines += [f"# TYPE {name} {kind}", f"{sample}{label} {float(value)}"]
        return PlainTextResponse("\n".join(lines) + "\n")

    async def sim_reset(self, request: Any) -> Any:
        """Zero the counters (test hook), e.g. between a warm-up and a measured phase."""
        from starlette.responses import Response

        completed = self.engine.stats.completed  # crash_mid_bench counts from start regardless
        self.engine.stats = EngineStats(completed=completed)
        return Response(status_code=204)

    async def completions(self, request: Any) -> Any:
        from starlette.responses import JSONResponse, StreamingResponse

        if not self._authorized(request):
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        if not self._ready():
            return _error(503, "The server is still loading the model.", "ServiceUnavailable")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "Request body is not valid JSON.", "BadRequestError")
        model = body.get("model") if isinstance(body, dict) else None
        if model is not None and model != self.opts.served_model_name:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        try:
            params = self._parse(body)
        except BadRequest as exc:
            return _error(400, str(exc), "BadRequestError")
        fault = self.opts.fault
        if fault == "http_500":
            return _error(500, "Internal Server Error (injected fault)", "InternalServerError")
        if fault == "flaky_500" and params.stream:
            # Only streamed (benchmark) requests, one in three: the server starts, verifies and
            # stays up, but part of its load fails.
            self._flaky_count = getattr(self, "_flaky_count", 0) + 1
            if self._flaky_count % 3 == 0:
                return _error(
                    500, "Internal Server Error (injected, 1 in 3)", "InternalServerError"
                )
        if fault == "healthy_but_broken":
            return _error(
                500,
                "EngineCore encountered an issue: RuntimeError: Unsupported attention "
                "configuration: head_dim=16",
                "InternalServerError",
            )
        if fault == "hang" or (fault == "hang_in_bench" and params.include_usage):
            await asyncio.Event().wait()  # never set: the request is accepted and never answered
        rng = random.Random(params.seed if params.seed is not None else random.getrandbits(64))
        gen = GenRequest(
            prompt_ids=params.prompt_ids,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            ignore_eos=params.ignore_eos,
            rng=rng,
        )
        request_id = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        self.engine.submit(gen)
        if params.stream:
            return StreamingResponse(
                self._stream(gen, params, request_id, created), media_type="text/event-stream"
            )
        events: list[TokenEvent] = []
        try:
            while not events or events[-1].finish_reason is None:
                events.append(await gen.events.get())
        except asyncio.CancelledError:
            gen.cancelled = True  # the client went away: free the slot
            raise
        return JSONResponse(self._full_response(gen, params, events, request_id, created))

    def _parse(self, body: Any) -> CompletionParams:
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object.")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            prompt_ids = self.model.tokenize(prompt)
        elif isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            prompt_ids = list(prompt)
            bad = [t for t in prompt_ids if not self.model.valid_id(t)]
            if bad:
                raise BadRequest(f"Token id {bad[0]} is out of vocabulary")
        else:
            raise BadRequest("prompt must be a string or a list of token ids (one prompt only)")
        if not prompt_ids:
            raise BadRequest("The prompt cannot be empty.")
        max_tokens = body.get("max_tokens")
        max_tokens = 16 if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest("max_tokens must be an integer >= 1")
        if len(prompt_ids) + max_tokens > self.opts.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.opts.max_model_len} tokens. "
                f"However, you requested {len(prompt_ids) + max_tokens} tokens "
                f"({len(prompt_ids)} in the messages, {max_tokens} in the completion)."
            )
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        logprobs = _optional_count(body, "logprobs")
        prompt_logprobs = _optional_count(body, "prompt_logprobs")
        stream = bool(body.get("stream", False))
        if stream and prompt_logprobs is not None:
            raise BadRequest("prompt_logprobs is not supported with stream=true")
        stream_options = body.get("stream_options") or {}
        seed = body.get("seed")
        dialect = self.opts.dialect
        if dialect != "vllm":  # vLLM's own fields are unknown here: ignored, as proxies do
            prompt_logprobs = None
        if dialect == "text":
            logprobs = None
        echo = dialect == "openai" and bool(body.get("echo", False))
        if echo and stream:
            raise BadRequest("echo is not supported with stream=true")
        return CompletionParams(
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            temperature=temperature,
            stream=stream,
            include_usage=bool(stream_options.get("include_usage", False)),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            return_token_ids=dialect == "vllm" and bool(body.get("return_token_ids", False)),
            ignore_eos=bool(body.get("ignore_eos", False)),
            seed=seed if isinstance(seed, int) else (self.opts.seed if temperature > 0 else None),
            echo=echo,
        )

    def _logprobs_block(self, events: list[TokenEvent], k: int, offset: int) -> dict[str, Any]:
        tokens: list[str] = []
        token_logprobs: list[float] = []
        top_logprobs: list[dict[str, float]] = []
        text_offset: list[int] = []
        for event in events:
            token = self.model.token_str(event.chosen.token_id)
            text_offset.append(offset)
            offset += len(token)
            tokens.append(token)
            token_logprobs.append(event.chosen.logprob)
            top = {self.model.token_str(e.token_id): e.logprob for e in event.top[:k]}
            top.setdefault(token, event.chosen.logprob)
            top_logprobs.append(top)
        return {
            "text_offset": text_offset,
            "token_logprobs": token_logprobs,
            "tokens": tokens,
            "top_logprobs": top_logprobs,
        }

    def _prompt_logprobs(self, prompt_ids: list[int], k: int) -> list[dict[str, Any] | None]:
        out: list[dict[str, Any] | None] = [None]
        wrong = self.engine.wrong_from is not None
        for i in range(1, len(prompt_ids)):
            context = prompt_ids[:i]
            broken = wrong and i >= 2
            actual = self.model.score(
                context, prompt_ids[i], broken=broken, drift=self.engine.drift
            )
            entries = [actual]
            top = self.model.distribution(context, broken=broken, drift=self.engine.drift)
            entries += [e for e in top[:k] if e.token_id != actual.token_id]
            out.append(
                {
                    str(e.token_id): {
                        "logprob": e.logprob,
                        "rank": e.rank,
                        "decoded_token": self.model.token_str(e.token_id),
                    }
                    for e in entries
                }
            )
        return out

    def _full_response(
        self,
        gen: GenRequest,
        params: CompletionParams,
        events: list[TokenEvent],
        request_id: str,
        created: int,
    ) -> dict[str, Any]:
        token_ids = [e.chosen.token_id for e in events]
        text = self._text(token_ids)
        logprobs = None
        if params.logprobs is not None:
            logprobs = self._logprobs_block(events, params.logprobs, 0)
        if params.echo:
            text = self.model.decode(gen.prompt_ids) + text
            if logprobs is not None:
                logprobs = self._echo_logprobs(gen.prompt_ids, logprobs)
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": events[-1].finish_reason,
            "stop_reason": None,
            "token_ids": token_ids if params.return_token_ids else None,
            "prompt_logprobs": (
                self._prompt_logprobs(gen.prompt_ids, params.prompt_logprobs)
                if params.prompt_logprobs is not None
                else None
            ),
            "prompt_token_ids": gen.prompt_ids if params.return_token_ids else None,
        }
        return {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": self.opts.served_model_name,
            "choices": [choice],
            "usage": _usage(len(gen.prompt_ids), len(token_ids)),
        }

    async def _stream(
        self, gen: GenRequest, params: CompletionParams, request_id: str, created: int
    ) -> AsyncIterator[str]:
        head = {"id": request_id, "object": "text_completion", "created": created}
        head["model"] = self.opts.served_model_name
        offset = 0
        first = True
        try:
            while True:
                event = await gen.events.get()
                token = event.chosen.token_id
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": self._text([token]),
                    "logprobs": None,
                    "finish_reason": event.finish_reason,
                    "stop_reason": None,
                }
                if params.logprobs is not None:
                    choice["logprobs"] = self._logprobs_block([event], params.logprobs, offset)
                    offset += len(self.model.token_str(token))
                if params.return_token_ids:
                    choice["prompt_token_ids"] = gen.prompt_ids if first else None
                    choice["token_ids"] = [token]
                first = False
                yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
                if event.finish_reason is not None:
                    break
            if params.include_usage:
                usage = _usage(len(gen.prompt_ids), len(gen.generated))
                yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not gen.events.empty() or len(gen.generated) < gen.max_tokens:
                gen.cancelled = True  # client went away: free the slot

    def _text(self, token_ids: list[int]) -> str:
        return "" if self.opts.fault == "no_text" else self.model.decode(token_ids)

    def _echo_logprobs(self, prompt_ids: list[int], generated: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI ``echo`` shape: the prompt's tokens (the first unscored) before the
        generated ones, offsets counted from the start of the prompt's text."""
        tokens, values, tops, offsets = [], [], [], []
        offset = 0
        for i, token_id in enumerate(prompt_ids):
            token = self.model.token_str(token_id)
            tokens.append(token)
            offsets.append(offset)
            offset += len(token)
            if i == 0:
                values.append(None)
                tops.append(None)
                continue
            scored = self.model.score(prompt_ids[:i], token_id, drift=self.engine.drift)
            values.append(scored.logprob)
            tops.append({token: scored.logprob})
        return {
            "text_offset": offsets + [offset + o for o in generated["text_offset"]],
            "token_logprobs": values + generated["token_logprobs"],
            "tokens": tokens + generated["tokens"],
            "top_logprobs": tops + generated["top_logprobs"],
        }


def _optional_count(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None or value is False:
        return None
    if value is True:
        return 1
    if not isinstance(value, int) or value < 0:
        raise BadRequest(f"{key} must be a non-negative integer")
    if value > MAX_LOGPROBS:
        raise BadRequest(f"Requested {key} of {value}, which is greater than max allowed: 20")
    return value


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


# ---------------------------------------------------------------------------------------------
# Process: startup sequence, faults, child, signals.


def _spawn_child(opts: ServerOptions) -> subprocess.Popen[bytes]:
    ignore = "1" if opts.fault == "ignore_sigterm" else "0"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_CODE, opts.child_title, ignore],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _log(f"spawned child pid={child.pid} title={opts.child_title}")
    return child


def _spawn_detached(opts: ServerOptions) -> None:
    """A helper that leaves the server's session and tree (setsid, fork, parent exits)."""
    middle = subprocess.Popen(
        [sys.executable, "-c", _DETACHED_CODE, f"{opts.child_title}-detached"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    out, _ = middle.communicate(timeout=30)
    _log(f"spawned detached helper pid={out.decode().strip()} (setsid, double fork)")


def _stop_child(child: subprocess.Popen[bytes] | None) -> None:
    if child is None or child.poll() is not None:
        return
    child.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=1.0)


def _die(message: str, code: int, child: subprocess.Popen[bytes] | None) -> int:
    print(message, file=sys.stderr)
    sys.stderr.flush()
    _stop_child(child)
    return code


def build_engine(opts: ServerOptions, env: dict[str, str]) -> tuple[Engine, dict[str, Any]]:
    """The engine for ``opts``, plus the simulation facts ``/sim/stats`` reports.

    Raises:
        StartupError: the (simulated) engine would not start with this config.
    """
    model = ToyModel()
    fault = opts.fault
    wrong_from: int | None = 1 if fault == "wrong_text" else None
    crash_after = opts.fault_after if fault in ("crash_mid_bench", "self_sigkill") else None
    sim: dict[str, Any] = {}
    if opts.simulate == "glm5-8gpu":
        config = glm5_config_from(opts, env)
        failure = glm5_sim.startup_failure(config)
        if failure is not None:
            raise StartupError(failure.message, 1)
        seed = opts.sim_seed if opts.sim_seed is not None else random.getrandbits(32)
        factor = glm5_sim.Glm5Sim(noise=opts.sim_noise, seed=seed).noise_factor()
        if not glm5_sim.is_correct(config):
            wrong_from = 0  # the case: CUDA graphs + MLA direct call answer with whitespace
        _log(f"SIMULATION glm5-8gpu config={config} noise_seed={seed} factor={factor:.4f}")
        sim = {
            "config": asdict(config),
            "correct": glm5_sim.is_correct(config),
            "noise_factor": factor,
            "noise_seed": seed,
        }

        def step_cost(batch: int) -> float:
            return glm5_sim.step_time_ms(config, batch) * factor

        def prefill_cost(prompt_tokens: int) -> float:
            return glm5_sim.prefill_ms(config, prompt_tokens) * factor

        max_seqs = config.max_num_seqs
        max_batched = config.max_num_batched_tokens
    else:
        slow = 1.0
        if opts.enforce_eager or opts.compilation_config.get("cudagraph_mode") == "NONE":
            slow *= 1.3
        if opts.kv_cache_dtype.startswith("fp8"):
            slow *= 0.92

        def step_cost(batch: int) -> float:
            return opts.decode_ms * slow * (1.0 + opts.batch_penalty * (batch - 1))

        def prefill_cost(prompt_tokens: int) -> float:
            return opts.prefill_ms * (1.0 + prompt_tokens / 512)

        max_seqs = opts.max_num_seqs or 256
        max_batched = opts.max_num_batched_tokens or 2048
    engine = Engine(
        model,
        step_cost_ms=step_cost,
        prefill_cost_ms=prefill_cost,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=max_batched,
        time_scale=opts.time_scale,
        wrong_from=wrong_from,
        drift=opts.kv_cache_dtype.startswith("fp8"),
        crash_after=crash_after,
        corrupt_every=7 if fault == "corrupt_words" else None,
        crash_by_sigkill=fault == "self_sigkill",
        wrong_when_batched=fault == "wrong_when_batched",
        wake_noise=opts.wake_noise,
        wake_noise_seed=opts.wake_noise_seed,
    )
    return engine, sim


def _serve(server: FakeServer) -> None:
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn, minus its own signal handling (ours is installed in :func:`main`)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    # Bound here, not by uvicorn, so that --port 0 can report the port the OS picked.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((server.opts.host, server.opts.port))
    sock.listen(2048)  # connections queue from here on, even before uvicorn accepts them
    server.port = sock.getsockname()[1]
    config = uvicorn.Config(
        server.app(),
        host=server.opts.host,
        port=server.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    _Server(config).run(sockets=[sock])


def main(argv: Sequence[str] | None = None) -> int:
    """Start the fake server; returns the exit status for the failure paths."""
    opts = parse_options(argv)
    if opts.fault == "unknown_flag":
        print(f"usage: {build_parser().prog} [options]", file=sys.stderr)
        print(
            f"{build_parser().prog}: error: unrecognized arguments: --fake-unknown-engine-arg",
            file=sys.stderr,
        )
        return 2
    _log(
        f"fake server (TEST DOUBLE) pid={os.getpid()} started_at={time.time():.6f} "
        f"args={sys.argv[1:] if argv is None else argv}"
    )
    child: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, _frame: Any) -> None:
        _log(f"signal {signum}: shutting down")
        _stop_child(child)
        os._exit(0)

    if opts.fault == "ignore_sigterm":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if opts.spawn_child:
        child = _spawn_child(opts)
    if opts.spawn_detached:
        _spawn_detached(opts)
    if opts.fault == "exit_at_start":
        return _die(
            "RuntimeError: Engine core initialization failed. See root cause above. "
            "Failed core proc(s): {} (injected fault exit_at_start)",
            3,
            child,
        )
    if opts.fault == "oom":
        time.sleep(0.3)
        return _die(
            "Traceback (most recent call last):\n"
            '  File "vllm/v1/worker/gpu_model_runner.py", line 2412, in load_model\n'
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 95.59 GiB of which 1.02 GiB is free. Including non-PyTorch memory, "
            "this process has 94.55 GiB memory in use.",
            1,
            child,
        )
    try:
        engine, sim = build_engine(opts, dict(os.environ))
    except StartupError as exc:
        return _die(exc.message, exc.code, child)
    if opts.fault == "slow_start":
        _log(f"slow start: sleeping {opts.startup_delay_s} s before listening")
        time.sleep(opts.startup_delay_s)
    server = FakeServer(opts, engine, sim=sim)
    server.child = child
    try:
        _serve(server)
    finally:
        _stop_child(child)
    return 0


if __name__ == "__main__":
    sys.exit(main())
