"""llama.cpp-style answers and connections, engine-neutral (issue #29).

llama-server answers ``/v1/completions``' ``logprobs`` in the chat API's per-token ``content``
shape, with token ids, and no ``token_ids`` field: read through the completions shape only, the
gate compared its answers by text, excused no near tie and saw no logprob drift (a q4_0 K cache
that moved logprobs by 0.027 nats passed). It also advertises keep-alive and closes the
connection after each streamed answer: a client that reused it lost about half its streamed
requests, the benchmark stopped at the first, and ``show`` and the report said "No trial
failed". Against the test double's ``llamacpp`` dialect and ``stale_keepalive`` fault
(``autotune/testing/fake_http.py``), and a server that really fails one request.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from autotune import names
from autotune.bench.loadcurve import run_benchmark
from autotune.bench.phase import bench_summary, stream_request
from autotune.bench.tokens import BY_IDS
from autotune.cli.app import app
from autotune.client.choice import TokenScores, token_ids, token_scores
from autotune.client.http import connect
from autotune.engines.dialect import OPENAI
from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.gate import collect_outputs, compare, record_reference
from autotune.gate.requests import complete_greedy
from autotune.report.html import write_report
from autotune.spec.load import load_spec
from autotune.spec.model import CheckSpec, WorkloadSpec
from autotune.study.loop import RunOptions, run_study
from tests.builders import write_fake_spec
from tests.fake_proc import KEY

#: the command engine's dialect: it asks for vLLM's token ids, which llama-server ignores
DIALECT = VLLM_DIALECT
CHECK = CheckSpec(prompts=("one two three", "17 18 19", "d e f"), max_tokens=8)


def _content_entry(token_id: int, token: str, logprob: float, top: dict) -> dict:
    return {
        "id": token_id,
        "token": token,
        "bytes": list(token.encode()),
        "logprob": logprob,
        "top_logprobs": [{"id": i, "token": t, "logprob": lp} for t, (i, lp) in top.items()],
    }


def test_one_reader_gives_the_same_tokens_from_either_logprobs_shape() -> None:
    top = [{" 4": -0.1, " x": -2.5}, {" 5": -0.2, " 4": -1.7}]
    completions = {
        "text": " 4 5",
        "logprobs": {"tokens": [" 4", " 5"], "token_logprobs": [-0.1, -0.2], "top_logprobs": top},
    }
    content = {
        "text": " 4 5",
        "logprobs": {
            "content": [
                _content_entry(55, " 4", -0.1, {" 4": (55, -0.1), " x": (9, -2.5)}),
                _content_entry(57, " 5", -0.2, {" 5": (57, -0.2), " 4": (55, -1.7)}),
            ]
        },
    }
    read = token_scores(DIALECT, content)
    assert read == TokenScores(
        ids=(55, 57), tokens=(" 4", " 5"), logprobs=(-0.1, -0.2), tops=tuple(top)
    )
    assert token_scores(DIALECT, completions) == TokenScores(
        tokens=(" 4", " 5"), logprobs=(-0.1, -0.2), tops=tuple(top)
    )
    # the dialect's own field wins where the answer has it; ids only where every entry has one
    assert token_ids(DIALECT, {**content, "token_ids": [1, 2]}) == [1, 2]
    assert token_ids(OPENAI, content) == [55, 57]
    del content["logprobs"]["content"][1]["id"]
    assert token_ids(DIALECT, content) == []
    content["logprobs"]["content"][1]["id"] = "57"
    with pytest.raises(TypeError):
        token_ids(DIALECT, content)


def test_the_benchmark_counts_ids_from_content_entries() -> None:
    """A stream whose chunks carry ids only in ``logprobs.content`` is counted by ids."""

    def chunk(i: int) -> dict:
        entry = _content_entry(i, f" t{i}", -0.1, {f" t{i}": (i, -0.1)})
        return {"choices": [{"index": 0, "text": f" t{i}", "logprobs": {"content": [entry]}}]}

    body = "".join(f"data: {json.dumps(chunk(i))}\n\n" for i in range(5)) + "data: [DONE]\n\n"

    async def go():
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body.encode()))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await stream_request(client, "m", "p", 5, dialect=DIALECT)

    record = asyncio.run(go())
    assert record.ok and record.count_source == BY_IDS
    assert record.token_ids == (0, 1, 2, 3, 4) and record.output_tokens == 5


def _reference_and_outputs(url: str, trial_url: str, check: CheckSpec = CHECK):
    async def go():
        async with connect(url, KEY) as client:
            reference = await record_reference(client, "toy", check, [], 8, dialect=DIALECT)
        async with connect(trial_url, KEY) as client:
            outputs = await collect_outputs(
                client, "toy", reference, list(check.prompts), dialect=DIALECT
            )
        return reference, outputs

    return asyncio.run(go())


def test_the_gate_compares_ids_and_top2_of_a_content_shape_server(fake_server) -> None:
    proc = fake_server("--dialect", "llamacpp")
    reference, (completions, teacher) = _reference_and_outputs(proc.url, proc.url)
    caps = reference.capabilities
    assert caps.token_ids and caps.top_logprobs and caps.token_logprobs and caps.token_strings
    assert caps.teacher_forced is None  # no echo, no prompt scoring on this server
    notices = " ".join(caps.notices())
    assert "no token ids" not in notices and "no top-2" not in notices
    assert "greedy tokens' own logprobs are compared instead" in notices
    for entry in reference.entries.values():
        done = entry.completion
        assert len(done.token_ids) == len(done.tokens) == len(done.logprobs) == 8
        assert all(m is not None for m in done.margins) and all(done.runner_ups)
    result = compare(reference, completions, teacher, CHECK)
    assert result.passed, result.problems
    assert result.checks["compared_by"] == "token_ids"
    assert result.checks["greedy_logprobs"] == len(CHECK.prompts)
    assert result.checks["tie_flips_by"] == "runner_up"


def test_a_logprob_drift_in_the_content_shape_is_rejected(fake_server) -> None:
    """The test double's fp8 KV cache keeps every greedy token and moves logprobs by up to
    0.02 nats: beyond the 0.01 floor the deterministic baseline derives."""
    baseline = fake_server("--dialect", "llamacpp")
    drifted = fake_server("--dialect", "llamacpp", "--kv-cache-dtype", "fp8")
    reference, (completions, teacher) = _reference_and_outputs(baseline.url, drifted.url)
    assert reference.tolerance == pytest.approx(0.01)
    for prompt, got in completions.items():  # the same tokens: only logprobs tell
        assert got.token_ids == reference.entries[prompt].completion.token_ids
    result = compare(reference, completions, teacher, CHECK)
    assert not result.passed
    divergence = result.first_divergence
    assert divergence.kind == "logprob" and "greedy-token logprob drift" in divergence.detail
    assert result.max_logprob_drift > 0.01
    # a tolerance the spec pins above that drift accepts it: the drift was the reason
    loose = CheckSpec(prompts=CHECK.prompts, max_tokens=8, logprob_tolerance=0.05)
    reference, (completions, teacher) = _reference_and_outputs(baseline.url, drifted.url, loose)
    assert compare(reference, completions, teacher, loose).passed


WORKLOAD = WorkloadSpec(
    prompts=("1 2 3", "a b c"),
    max_tokens=8,
    concurrency=2,
    num_requests=8,
    single_requests=2,
    warmup_requests=1,
    repeats=1,
    request_timeout_s=20.0,
    target_precision=0,
)


def test_a_server_that_drops_kept_alive_connections_loses_no_request(fake_server) -> None:
    """Every reuse of a connection that carried a streamed answer fails before any answer.
    The one retry goes to a new connection (a pooled one would be as dead) and is counted;
    an engine that declares it (``reuses_connections`` False) needs none."""
    proc = fake_server("--dialect", "llamacpp", "--fault", "stale_keepalive")

    async def go(reuses: bool):
        async with connect(proc.url, KEY, max_connections=4, reuses_connections=reuses) as c:
            for prompt in CHECK.prompts:  # the gate's requests (httpx) hit the same
                await complete_greedy(c, "toy", prompt, 4, dialect=DIALECT, fixed_length=True)
            gate_retries = c.transport_retries
            bench = await run_benchmark(c, "toy", WORKLOAD, dialect=DIALECT)
            return gate_retries, bench, c.transport_retries

    gate_retries, bench, client_retries = asyncio.run(go(True))
    assert bench.failed_requests == 0, bench.errors
    assert bench.total_requests == 1 + 2 + 8  # warm-up, single, load (not the control)
    assert gate_retries >= 1 and bench.transport_retries >= 1
    assert client_retries == gate_retries + bench.transport_retries
    assert bench_summary(bench)["transport_retries"] == bench.transport_retries
    gate_retries, bench, client_retries = asyncio.run(go(False))
    assert bench.failed_requests == 0, bench.errors
    assert gate_retries == bench.transport_retries == client_retries == 0


def test_a_failed_request_is_counted_and_shown(tmp_path: Path) -> None:
    """One benchmark request of 62 answers 500: within the 2% a trial tolerates, so the trial
    completes and its benchmark stops at that round; ``show`` and the report say so."""
    path = write_fake_spec(
        tmp_path,
        "parameters:\n  max_num_seqs: {type: categorical, choices: [4, 8], baseline: 4,"
        " target: {flag: --max-num-seqs}}\n",
        name="onefail",
        args=("--fault", "one_500_in_bench", "--decode-ms", "1"),
        workload={"num_requests": 60, "max_tokens": 4, "concurrency": 4},
    )
    spec = load_spec(path)
    run_study(spec, RunOptions(trials=1, validate=False))
    study = optuna.load_study(study_name=spec.name, storage=spec.default_storage())
    trial = study.trials[0]
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get(names.FAIL_DETAIL)
    bench = trial.user_attrs[names.BENCH]
    assert bench["failed_requests"] == 1 and bench["total_requests"] == 62
    assert bench["errors"][0].startswith("http 500") and bench["stopped_by"] == "request_errors"
    shown = CliRunner().invoke(app, ["show", "--spec", str(path)])
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.output.split())
    assert "trial 0: 1 of 62 benchmark requests failed (first: http 500" in said
    assert "the benchmark stopped after that round" in said
    page = write_report(spec.default_storage(), spec.name, tmp_path / "report.html").read_text()
    assert "No trial failed" not in page
    assert "id='failed-requests'><li>trial 0: 1 of 62 benchmark requests failed" in page
