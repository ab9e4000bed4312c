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
* ``one_500_in_bench``: the ``--fault-after``-th benchmark request (streamed with
  ``stream_options.include_usage``) answers 500, once; every other request is served.
* ``wrong_late``: right for its first ``--fault-after`` benchmark requests (streamed with
  ``stream_options.include_usage``), then every token is wrong (whitespace, as ``wrong_text``):
  a server that goes wrong in a late benchmark round, which only a sample of every round sees.
* ``wrong_alone_in_bench``: a benchmark request (streamed with
  ``stream_options.include_usage``) that arrives while no other request is in flight is wrong
  in every token (whitespace, as ``wrong_text``): right under load and in the quiet check,
  wrong in the single-request phase, whose numbers are the default objective's.
* ``replay_cache``: a response cache in front of the engine: a benchmark request (streamed with
  ``stream_options.include_usage``) whose prompt and ``max_tokens`` an earlier one had gets
  that answer's chunks again at once, undecoded (right ids and text, any speed it likes).
* ``replay_when_busy``: the same cache, replaying only while other requests are in flight:
  the single-request phase is decoded honestly, the load phases (the headline's) are not.
* ``stale_keepalive``: llama.cpp's llama-server's connections: every answer advertises
  ``Keep-Alive``, but a connection that carried a streamed answer is closed when the next
  request arrives on it, unanswered (a client that pools connections loses that request).

``GET /metrics`` (no key needed, as vLLM) serves a few of vLLM's Prometheus metrics in the text
format: ``vllm:num_requests_running``/``waiting`` and ``vllm:kv_cache_usage_perc`` (running over
``--max-num-seqs``) gauges, ``vllm:generation_tokens_total`` and ``vllm:num_preemptions_total``.

``--dialect`` chooses the response fields: ``vllm`` (default: ``token_ids``,
``prompt_token_ids``, ``prompt_logprobs``), ``openai`` (the plain OpenAI completions API: text,
``logprobs`` with per-token strings, ``echo``; vLLM's extra fields are ignored, as TGI or a
proxy would), ``llamacpp`` (llama.cpp's llama-server: ``logprobs`` in the chat API's shape,
``{content: [{id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]}]}``, no
``token_ids`` field; ``echo`` and vLLM's fields ignored, ``ignore_eos`` honoured), ``text``
(text only: no logprobs, no ids, no echo).

Unknown command-line arguments are rejected (exit 2), as vLLM's parser does. ``--spawn-child``
starts a child process in the server's process group, named like vLLM's ``EngineCore`` (via
setproctitle when available), so teardown tests have a child to kill; a clean SIGTERM stops it,
a SIGKILL of the server alone orphans it. ``--spawn-detached`` starts a helper that calls
``setsid`` and double-forks (its own session and group, re-parented away from the server, named
``<child-title>-detached``) and sleeps: only a tracker that saw it can stop it.

The code is split by job: :mod:`~autotune.testing.fake_options` (command line),
:mod:`~autotune.testing.fake_scheduler` (batching, speed model, generation faults),
:mod:`~autotune.testing.fake_http` (routes and response shapes); this module is the process:
startup faults, children, signals, the listening socket.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import uvicorn

from autotune.testing.fake_http import FakeServer
from autotune.testing.fake_options import (
    ServerOptions,
    StartupError,
    build_parser,
    log,
    parse_options,
)
from autotune.testing.fake_scheduler import build_scheduler

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


def _spawn_child(opts: ServerOptions) -> subprocess.Popen[bytes]:
    ignore = "1" if opts.fault == "ignore_sigterm" else "0"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_CODE, opts.child_title, ignore],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log(f"spawned child pid={child.pid} title={opts.child_title}")
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
    log(f"spawned detached helper pid={out.decode().strip()} (setsid, double fork)")


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


def _serve(server: FakeServer) -> None:
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
    log(
        f"fake server (TEST DOUBLE) pid={os.getpid()} started_at={time.time():.6f} "
        f"args={sys.argv[1:] if argv is None else argv}"
    )
    child: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, _frame: Any) -> None:
        log(f"signal {signum}: shutting down")
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
        scheduler, sim = build_scheduler(opts, dict(os.environ))
    except StartupError as exc:
        return _die(exc.message, exc.code, child)
    if opts.fault == "slow_start":
        log(f"slow start: sleeping {opts.startup_delay_s} s before listening")
        time.sleep(opts.startup_delay_s)
    server = FakeServer(opts, scheduler, sim=sim)
    server.child = child
    try:
        _serve(server)
    finally:
        _stop_child(child)
    return 0


if __name__ == "__main__":
    sys.exit(main())
