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

import json
from pathlib import Path

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
from autotune.spec.model import EngineSpec, ModelSpec
from autotune.study.outcome import bench_failure
from tests.builders import write_fake_spec
from tests.helpers import run_baseline_then

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


def record(tokens: int, tpot_ms: float | None, ttft_ms: float = 5.0) -> RequestRecord:
    """A streamed answer of ``tokens`` tokens, one a chunk every ``tpot_ms`` after the first
    (None: all in one chunk)."""
    first = ttft_ms / 1000
    step = (tpot_ms or 0) / 1000
    times = tuple(first + i * step for i in range(tokens))
    return RequestRecord(
        prompt="p",
        ok=True,
        ttft_s=first,
        e2e_s=times[-1] if tpot_ms else first,
        token_times_s=times,
        output_tokens=tokens,
    )


def test_repeated_answers_much_faster_than_a_fresh_prompt_are_flagged() -> None:
    cached = replay_check([record(16, 0.5)] * 4, [record(16, 20.0), record(16, 22.0)])
    assert cached["checked"] and cached["flagged"]
    assert cached["ratio"] == pytest.approx(42, rel=0.01)
    assert "replayed from a cache" in cached["reason"] and "2 controls" in cached["reason"]
    honest = replay_check([record(16, 20.0)] * 4, [record(16, 25.0)])
    assert honest["checked"] and not honest["flagged"]
    assert honest["ratio"] == pytest.approx(1.25) and "1 control)" in honest["reason"]
    # just under the limit is a real engine's noise, not a cache
    near = replay_check([record(16, 10.0)], [record(16, 10.0 * REPLAY_RATIO * 0.95)])
    assert not near["flagged"]


def test_an_answer_in_one_chunk_is_timed_end_to_end() -> None:
    """No TPOT (one chunk): the end-to-end time per token stands in, so a cache that sends its
    whole answer at once is still seen, and an honest one-chunk server is not flagged."""
    dumped = replay_check([record(16, None, ttft_ms=2.0)] * 3, [record(16, 20.0)])
    assert dumped["flagged"], dumped
    assert dumped["repeated_ms_per_token"] == pytest.approx(2.0 / 16)
    whole = replay_check([record(16, None, ttft_ms=320.0)] * 3, [record(16, 20.0)])
    assert not whole["flagged"], whole


def test_a_check_that_cannot_run_says_so() -> None:
    short = replay_check([record(16, 1.0)], [record(MIN_CONTROL_TOKENS - 1, 20.0)])
    assert short == {
        "controls": 0,
        "repeated": 1,
        "ratio_limit": REPLAY_RATIO,
        "checked": False,
        "flagged": False,
        "refused": False,
        "reason": "replay check not run: no fresh-prompt control could be timed "
        f"(a control needs {MIN_CONTROL_TOKENS} tokens or more)",
    }
    failed = RequestRecord(prompt="p", ok=False, error="http 500")
    none = replay_check([failed], [record(16, 20.0)])
    assert not none["checked"] and "no single-request answer" in none["reason"]
    # and "checks passed" says it was not run rather than nothing
    said = describe_checks({"passed": True, "checks": {"compared_by": "ids"}, "replay": short})
    assert "replay check not run" in said


def test_each_control_prompt_is_new_and_ends_with_the_prompt() -> None:
    prompts = {control_prompt("1 2 3") for _ in range(50)}
    assert len(prompts) == 50
    assert all(p.endswith("\n1 2 3") for p in prompts)


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
    assert honest["control_ttft_ms"] > 0 and honest["repeated_ttft_ms"] > 0
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


def test_bench_url_refuses_a_replaying_server(tmp_path: Path, fake_server) -> None:
    spec = write_fake_spec(tmp_path, SPACE, name="replayurl", args=ARGS, workload=WORKLOAD)
    server = fake_server(*ARGS, "--fault", "replay_cache", model="served", api_key="k")
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(
        app,
        ["bench", "--spec", str(spec), "--url", server.url, "--api-key", "k", "--json", str(out)],
        env={"AUTOTUNE_API_KEY": ""},
    )
    data = json.loads(out.read_text())
    assert data["passed"] is False, result.output
    assert data["failure"].startswith("replayed_answers: answers to repeated prompts came")
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
    repeated, controls = [record(16, 2.0)] * 4, [record(16, 20.0)]
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
