"""TEST DOUBLE's scheduler: vLLM-like continuous batching over the toy model, in scaled time.

A step emits one token for every running sequence and sleeps its (scaled) cost; the cost comes
from the plain speed model or, with ``--simulate glm5-8gpu``, from :mod:`glm5_sim`. The faults
that live in generation (wrong text, corrupted words, a crash after N completions, wrong when
batched) are applied here, token by token. Named ``FakeScheduler`` (not ``Engine``) so it is
never mistaken for :class:`autotune.engines.base.Engine`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.testing import glm5_sim
from autotune.testing.fake_options import ServerOptions, StartupError, log
from autotune.testing.toy_model import EOS_ID, TokenScore, ToyModel


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
    #: every token of this request is wrong (a fault chose it at submission)
    broken: bool = False


@dataclass
class SchedulerStats:
    """Counters in simulated time (what ``/sim/stats`` reports)."""

    steps: int = 0
    sim_time_ms: float = 0.0
    busy_decode_ms: float = 0.0
    tokens: int = 0
    completed: int = 0
    max_batch: int = 0


class FakeScheduler:
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
        self.stats = SchedulerStats()
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
            broken = (
                batched
                or request.broken
                or (self.wrong_from is not None and len(request.generated) >= self.wrong_from)
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


def build_scheduler(
    opts: ServerOptions, env: dict[str, str]
) -> tuple[FakeScheduler, dict[str, Any]]:
    """The scheduler for ``opts``, plus the simulation facts ``/sim/stats`` reports.

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
        log(f"SIMULATION glm5-8gpu config={config} noise_seed={seed} factor={factor:.4f}")
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
    scheduler = FakeScheduler(
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
    return scheduler, sim
