"""A response cache is not the config's speed (``bench/replay.py``).

The workload repeats its prompts so that the gate can judge every answer; a server (or a proxy)
that replays a stored answer for a repeated prompt is right token for token and as fast as it
likes. An audit's server measured 7648 tok/s against the engine's 362 and was exported best.
Each round now sends one fresh-prompt control; repeated prompts answered far faster per token
than the control were not decoded, and the trial is refused (``replayed_answers``).

Driven by the fake server's ``replay_cache`` fault (a TEST DOUBLE): 20 ms a decode step, so a
control's time per token is at least 20 ms by the server's own sleeps, whatever the load of
the machine, and a cached answer comes in one write.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from autotune import names
from autotune.bench.loadcurve import record_curve
from autotune.bench.phase import BenchResult, RequestRecord
from autotune.bench.replay import MIN_CONTROL_TOKENS, REPLAY_RATIO, control_prompt, replay_check
from autotune.cli.app import app
from autotune.engines.base import LaunchConfig
from autotune.engines.command import CommandEngine
from autotune.engines.llamacpp.engine import LlamaCppEngine
from autotune.engines.vllm.engine import VllmEngine
from autotune.gate.reference import describe_checks
from autotune.spec.model import EngineSpec, ModelSpec, WorkloadSpec
from autotune.study.outcome import bench_failure
from tests.builders import write_fake_spec
from tests.helpers import run_baseline_then
from tests.test_bench import benchmark_with, stream_body

SPACE = """
parameters:
  fault:
    type: categorical
    choices: [null, replay_cache]
    baseline: null
    target: {flag: --fault}
"""
#: slow enough that a decoded token takes 20 ms on any machine (the fake server sleeps)
ARGS = ("--decode-ms", "20", "--prefill-ms", "1")
WORKLOAD = {"max_tokens": 16, "repeats": 2, "single_requests": 2}


def record(tokens: int, e2e_ms: float, *, burst_ms: float | None = None) -> RequestRecord:
    """A streamed answer of ``tokens`` tokens over ``e2e_ms``: one token a chunk, evenly
    spaced after a 5 % TTFT, or (``burst_ms``) all of them in the last ``burst_ms``, the way
    vLLM's CPU server flushes an answer when its API server was starved of CPU."""
    e2e = e2e_ms / 1000
    first = e2e - (burst_ms / 1000 if burst_ms is not None else 0.95 * e2e)
    step = (e2e - first) / max(1, tokens - 1)
    times = tuple(first + i * step for i in range(tokens))
    return RequestRecord(
        prompt="p", ok=True, ttft_s=first, e2e_s=e2e, token_times_s=times, output_tokens=tokens
    )


def test_repeated_answers_much_faster_than_a_fresh_prompt_are_flagged() -> None:
    cached = replay_check([record(16, 10.0)] * 4, [record(16, 320.0), record(16, 352.0)])
    assert cached["checked"] and cached["flagged"] and cached["refused"]
    assert cached["ratio"] == pytest.approx(33.6)
    assert "replayed from a cache" in cached["reason"] and "2 controls" in cached["reason"]
    honest = replay_check([record(16, 320.0)] * 4, [record(16, 400.0)])
    assert honest["checked"] and not honest["flagged"] and not honest["refused"]
    assert honest["ratio"] == pytest.approx(1.25) and "1 control)" in honest["reason"]
    # just under the limit is a real engine's noise, not a cache
    near = replay_check([record(16, 100.0)], [record(16, 100.0 * REPLAY_RATIO * 0.95)])
    assert not near["flagged"]


def test_answers_that_arrive_in_bursts_are_timed_end_to_end() -> None:
    """vLLM's CPU demo server sends most of an answer in one flush: the time after the first
    token then measures nothing (0.006 ms a token on the demo). An honest server whose
    repeated answers came in bursts and whose controls did not is not flagged; a cache that
    sends its whole answer at once still is."""
    bursty = [record(16, 320.0, burst_ms=0.1)] * 5
    steady = [record(16, 320.0)] * 2
    assert not replay_check(bursty, steady)["flagged"]
    assert not replay_check(steady, bursty)["flagged"]
    dumped = replay_check([record(16, 2.0, burst_ms=0.1)] * 3, steady)
    assert dumped["flagged"] and dumped["repeated_ms_per_token"] == pytest.approx(2.0 / 16)


def test_a_check_that_cannot_run_says_so() -> None:
    short = replay_check([record(16, 10.0)], [record(MIN_CONTROL_TOKENS - 1, 320.0)])
    assert short == {
        "controls": 0,
        "repeated": 1,
        "ratio_limit": REPLAY_RATIO,
        "checked": False,
        "flagged": False,
        "refused": False,
        "reason": "replay check not run: no fresh-prompt control could be timed "
        f"(an answer needs {MIN_CONTROL_TOKENS} tokens or more)",
    }
    failed = RequestRecord(prompt="p", ok=False, error="http 500")
    none = replay_check([failed, record(4, 1.0)], [record(16, 320.0)])
    assert not none["checked"] and "no single-request answer" in none["reason"]
    # and "checks passed" says it was not run rather than nothing
    said = describe_checks({"passed": True, "checks": {"compared_by": "ids"}, "replay": short})
    assert "replay check not run" in said


def test_each_control_prompt_is_new_and_keeps_the_prompt_as_its_prefix() -> None:
    prompts = {control_prompt("1 2 3") for _ in range(50)}
    assert len(prompts) == 50
    assert all(p.startswith("1 2 3\n") for p in prompts)


def test_a_server_replaying_stored_answers_is_refused_not_reported(tmp_path: Path) -> None:
    """The baseline (an honest server) completes with its replay check passed; the same server
    behind a response cache is right token for token, but is refused as ``replayed_answers``
    with the figures as evidence, so it can never be best or exported."""
    spec = write_fake_spec(tmp_path, SPACE, name="replay", args=ARGS, workload=WORKLOAD)
    baseline, cached = run_baseline_then(spec, {"fault": "replay_cache"}).trials
    assert baseline.state == TrialState.COMPLETE, baseline.user_attrs.get(names.FAIL_DETAIL)
    honest = baseline.user_attrs[names.CHECK]["replay"]
    assert honest["checked"] and not honest["flagged"] and honest["controls"] == 2
    assert honest["control_ms_per_token"] > 10.0  # the fake server sleeps 20 ms a step
    assert "no cache replay" in describe_checks(baseline.user_attrs[names.CHECK])

    assert cached.state == TrialState.PRUNED
    assert cached.user_attrs[names.FAIL_REASON] == "replayed_answers", cached.user_attrs.get(
        names.FAIL_DETAIL
    )
    assert cached.user_attrs[names.CHECK]["passed"] is True  # right, token for token
    evidence = cached.user_attrs[names.EVIDENCE]["replay_check"]
    assert evidence["flagged"] is True
    assert evidence["ratio"] is None or evidence["ratio"] >= REPLAY_RATIO  # None: instant
    assert evidence["control_ms_per_token"] > 10.0
    assert "replayed from a cache" in cached.user_attrs[names.FAIL_DETAIL]

    shown = CliRunner().invoke(app, ["show", "--spec", str(spec)])
    assert shown.exit_code == 0, shown.output
    assert "replayed_answers" in shown.output


def bench_url(tmp_path: Path, fake_server, name: str, *fault: str) -> tuple[Any, dict]:
    """`autotune bench --url` against a fake server (with ``--fault ...`` if given): the CLI's
    result and the JSON it wrote."""
    spec = write_fake_spec(tmp_path, SPACE, name=name, args=ARGS, workload=WORKLOAD)
    server = fake_server(*ARGS, *fault, model="served", api_key="k")
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        app,
        ["bench", "--spec", str(spec), "--url", server.url, "--api-key", "k", "--json", str(out)],
        env={"AUTOTUNE_API_KEY": ""},
    )
    return result, json.loads(out.read_text())


def test_bench_url_refuses_a_replaying_server(tmp_path: Path, fake_server) -> None:
    result, data = bench_url(tmp_path, fake_server, "replayurl", "--fault", "replay_cache")
    assert data["passed"] is False, result.output
    assert data["failure"].startswith("replayed_answers: answers to repeated prompts alone came")
    assert data["bench"]["replay_check"]["flagged"] is True


def launch(*argv: str, **env: str) -> LaunchConfig:
    return LaunchConfig(
        argv=("server", *argv), env=env, host="h", port=1, api_key="", served_model="m"
    )


def test_each_engine_says_when_a_launch_speculates() -> None:
    """Speculation drawn from earlier answers (llama.cpp's n-gram cache, vLLM's suffix
    decoding) really speeds repeated prompts: the engine reads it from the launch."""
    model = ModelSpec(path="m", served_name="m")
    vllm = VllmEngine(EngineSpec(kind="vllm", command=("vllm",)), model)
    llama = LlamaCppEngine(EngineSpec(kind="llamacpp", command=("llama-server",)), model)
    command = CommandEngine(EngineSpec(kind="command", command=("server", "{port}")), model)
    assert vllm.speculates(launch("--speculative-config", '{"method": "suffix"}'))
    assert vllm.speculates(launch('--speculative_config={"method": "ngram"}'))
    assert not vllm.speculates(launch("--max-num-seqs", "8"))
    assert llama.speculates(launch("--spec-type", "ngram-cache"))
    assert llama.speculates(launch("--spec_type=none,ngram-simple"))
    assert llama.speculates(launch("-md", "draft.gguf"))
    assert llama.speculates(launch(LLAMA_ARG_SPEC_TYPE="ngram-mod"))
    assert not llama.speculates(launch("--spec-type", "none"))
    assert not llama.speculates(launch("--spec-draft-n-max", "5"))  # drafts with nothing
    # a server autotune knows nothing of cannot speculate as far as it can tell: refused
    assert not command.speculates(launch("--speculative-config", "{}"))


def bench_with(replay: dict) -> BenchResult:
    return BenchResult(
        metrics={}, spread={}, repeats=(), total_requests=4, failed_requests=0, replay=replay
    )


def test_a_speculating_launch_is_said_not_refused() -> None:
    repeated, controls = [record(16, 32.0)] * 4, [record(16, 320.0)]
    said = replay_check(repeated, controls, speculates=True)
    assert said["flagged"] and not said["refused"] and said["speculative"]
    assert "speculative decoding on" in said["reason"]
    assert bench_failure(bench_with(said), None, None) is None
    refused = replay_check(repeated, controls)
    failure = bench_failure(bench_with(refused), None, None)
    assert failure is not None and failure.reason == "replayed_answers"
    assert failure.evidence["replay_check"] == refused
    # and a speculating trial's ratio is a trap, shown, not a pass
    trial = StoredAttrs()
    record_curve(trial, bench_with(said))
    assert trial.user_attrs[names.TRAPS]["repeated_prompts"] == said
    assert trial.user_attrs[names.TRAPS]["flagged"] == [said["reason"]]
    assert "no cache replay" not in describe_checks({"passed": True, "checks": {}, "replay": said})


class StoredAttrs:
    """What ``record_curve`` needs of an ``optuna.Trial``."""

    def __init__(self) -> None:
        self.user_attrs: dict = {}

    def set_user_attr(self, key: str, value) -> None:
        self.user_attrs[key] = value


def test_a_failed_control_is_no_request_error_and_the_check_says_why() -> None:
    """A prompt near the model's context limit, made too long by the control's nonce line,
    is refused by the server: the benchmark's own requests all succeeded, so the config is
    measured as usual, and the replay check says it could not run, and why."""

    def handler(request: httpx.Request) -> httpx.Response:
        if "(request " in json.loads(request.content)["prompt"]:
            return httpx.Response(400, content=b"maximum context length is 64 tokens")
        return httpx.Response(200, content=stream_body(16))

    workload = WorkloadSpec(
        prompts=("a", "b"),
        max_tokens=16,
        concurrency=2,
        num_requests=4,
        repeats=2,
        target_precision=0,  # exactly two rounds
    )

    result = benchmark_with(handler, workload)
    assert result.failed_requests == 0 and result.stopped_by == "repeats"
    assert len(result.repeats) == 2
    replay = result.replay
    assert not replay["checked"] and not replay["refused"]
    assert "the control failed: http 400" in replay["reason"]
    assert "maximum context length" in replay["reason"]


def test_a_speculating_launch_with_fast_repeated_prompts_is_measured_and_its_trap_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial asks its engine whether the launch speculates (``Engine.speculates``) and
    passes that to the benchmark: the same fast repeated answers are then a trap that ``show``
    prints, not a refusal. (The command engine cannot tell; here it is told yes.)"""
    monkeypatch.setattr(CommandEngine, "speculates", lambda self, launch: True)
    spec = write_fake_spec(tmp_path, SPACE, name="specfast", args=ARGS, workload=WORKLOAD)
    _, fast = run_baseline_then(spec, {"fault": "replay_cache"}).trials
    assert fast.user_attrs.get(names.FAIL_REASON) != "replayed_answers"
    trap = fast.user_attrs[names.TRAPS]["repeated_prompts"]
    assert trap["flagged"] and trap["speculative"] and not trap["refused"]
    assert trap["reason"] in fast.user_attrs[names.TRAPS]["flagged"]
    shown = CliRunner().invoke(app, ["show", "--spec", str(spec)])
    assert shown.exit_code == 0, shown.output
    assert "with speculative decoding on" in " ".join(shown.output.split())


def test_bench_url_refuses_a_server_that_replays_only_under_load(tmp_path: Path, fake_server):
    """A cache that replays only while other requests are in flight answered the single
    requests and their control honestly, and the load phases (the headline) from memory: the
    control sent among each load phase's requests shows it."""
    result, data = bench_url(tmp_path, fake_server, "busyurl", "--fault", "replay_when_busy")
    assert data["passed"] is False, result.output
    check = data["bench"]["replay_check"]
    assert check["ratio"] < REPLAY_RATIO  # alone, it was decoded
    assert check["under_load"]["flagged"] is True
    assert data["failure"].startswith("replayed_answers: answers to repeated prompts under load")


def test_an_honest_server_passes_alone_and_under_load(tmp_path: Path, fake_server) -> None:
    result, data = bench_url(tmp_path, fake_server, "honesturl")
    assert result.exit_code == 0, result.output
    check = data["bench"]["replay_check"]
    assert check["checked"] and not check["flagged"]
    assert check["under_load"]["controls"] >= 1 and not check["under_load"]["flagged"]


def test_a_part_of_the_check_that_could_not_run_says_so() -> None:
    """Alone it ran; under load the control was refused (its nonce line took the prompt past
    the context limit): the record and its line say the load part did not run, and why."""
    refused = dataclasses.replace(record(16, 300.0), ok=False, error="http 400: too long")
    check = replay_check(
        [record(16, 320.0)] * 2,
        [record(16, 330.0)],
        load_repeated=[record(16, 900.0)] * 3,
        load_controls=[refused],
    )
    assert check["checked"] and not check["flagged"]
    assert check["under_load"] == {
        "checked": False,
        "reason": "not run (the control failed: http 400: too long)",
    }
    assert "under load not run (the control failed: http 400" in check["reason"]
