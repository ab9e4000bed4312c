"""Speculative decoding gated as lossless, and its acceptance read from ``/metrics``.

* Parsing: vLLM's spec-decode counters (summed over label sets) give the acceptance rate and the
  mean accepted length; an exposition without them gives None.
* Space: ``speculative_method: null`` passes no ``--speculative-config`` at all; ``ngram``
  passes the keys of its active sub-parameters as one JSON object.
* REAL vLLM (mark ``e2e``; three server starts, enforce-eager): the baseline; n-gram
  speculation, which passes the gate (lossless) with its acceptance stored; the same n-gram
  config with ``patches/spec_accept_all.py``, which accepts every draft token and is rejected as
  ``incorrect_output`` with the divergence as evidence, after the test has checked from
  ``/metrics`` that drafts were really proposed (else the verdict would prove nothing).
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotune import names
from autotune.cli import render
from autotune.engines.vllm import speculative
from autotune.space.load import load_space
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from tests.builders import ROOT, write_demo_spec

METRICS_TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="demo"} 40.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="demo"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="demo"} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="demo"} 60.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="demo",position="0"} 35.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="demo",position="2"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="demo",position="1"} 20.0
vllm:num_requests_running{engine="0",model_name="demo"} 0.0
"""


def test_parse_metrics_sums_label_sets_and_derives_acceptance():
    stats = speculative.parse_metrics(METRICS_TEXT)
    assert stats is not None
    assert (stats.drafts, stats.draft_tokens, stats.accepted_tokens) == (50.0, 150.0, 60.0)
    assert stats.accepted_per_position == (35.0, 20.0, 5.0)
    assert stats.acceptance_rate == pytest.approx(0.4)
    assert stats.mean_accepted_length == pytest.approx(1 + 60 / 50)
    shown = render.describe_speculation(stats.to_dict())
    assert "acceptance 40.0% (60/150 draft tokens, 50 drafts)" in shown and "2.20" in shown


def test_parse_metrics_without_spec_decode_counters_is_none():
    assert speculative.parse_metrics('vllm:num_requests_running{engine="0"} 1.0\n') is None
    assert speculative.parse_metrics("") is None
    zero = speculative.parse_metrics(
        "vllm:spec_decode_num_drafts_total 0\nvllm:spec_decode_num_draft_tokens_total 0\n"
        "vllm:spec_decode_num_accepted_tokens_total 0\n"
    )
    assert zero is not None and zero.acceptance_rate is None
    assert render.describe_speculation(zero.to_dict()) == "no drafts proposed"


def test_scrape_records_an_error_instead_of_failing():
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        return httpx.Response(404, text="not here")

    async def go():
        async with httpx.AsyncClient(
            base_url="http://t", transport=httpx.MockTransport(handler)
        ) as client:
            return await speculative.scrape(client)

    import asyncio

    got = asyncio.run(go())
    assert set(got) == {"error"} and "404" in got["error"]


def test_demo_space_speculation_is_one_json_flag_or_none():
    space = load_space(ROOT / "search_spaces" / "cpu-demo.yaml")
    base = space.resolve(space.baseline_values())
    assert speculative.FLAG not in base.json_flags
    assert speculative.FLAG not in base.flag_argv()
    on = space.resolve(
        {
            "speculative_method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }
    )
    assert on.json_flags[speculative.FLAG] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    # the sub-parameters only exist when speculation is on
    sub = space.parameter("num_speculative_tokens")
    assert not space.is_active(sub, {"speculative_method": None})
    assert space.is_active(sub, {"speculative_method": "ngram"})


DEMO_SPACE = """
parameters:
  speculative_method:
    type: categorical
    choices: [null, ngram]
    baseline: null
    target: {json: --speculative-config, key: method}
  num_speculative_tokens:
    type: categorical
    choices: [3]
    target: {json: --speculative-config, key: num_speculative_tokens}
    when: {speculative_method: ngram}
  prompt_lookup_max:
    type: categorical
    choices: [3]
    target: {json: --speculative-config, key: prompt_lookup_max}
    when: {speculative_method: ngram}
  prompt_lookup_min:
    type: categorical
    choices: [1]
    target: {json: --speculative-config, key: prompt_lookup_min}
    when: {speculative_method: ngram}
  spec_accept_all:
    type: bool
    baseline: false
    target: {patch: spec_accept_all}
"""

NGRAM = {
    "speculative_method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}

#: Prompts whose last words occur earlier, followed by other words: the n-gram proposer then
#: drafts the earlier continuation, which the counting model does not agree with (a lossless
#: decoder rejects it; one that accepts every draft copies it into the answer).
REPETITIVE = [
    "three four nine one two three",
    "17 18 40 41 17 18",
    "d e x y z a b c d e",
    "monday tuesday sunday friday monday tuesday",
]
#: the benchmark's own repetitive prompts: distinct from the check's (a prompt in both would be
#: recorded once, at the check's max_tokens, and the benchmark's longer answers then differ)
WORKLOAD = [
    "one two nine one two",
    "5 6 30 31 5 6",
    "k l p q r k l",
    "march april july march april",
]


@pytest.mark.e2e
def test_vllm_ngram_is_lossless_and_accept_all_is_rejected(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    spec_path = write_demo_spec(
        tmp_path, DEMO_SPACE, name="speculative", workload={"prompts": WORKLOAD}
    )
    data = yaml.safe_load(spec_path.read_text())
    data["check"]["prompts"] = list(data["check"]["prompts"]) + REPETITIVE
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(spec_path)
    study, created = open_study(spec, spec.default_storage())
    assert created
    study.enqueue_trial({**NGRAM, "spec_accept_all": False}, user_attrs={names.ROLE: "search"})
    study.enqueue_trial({**NGRAM, "spec_accept_all": True}, user_attrs={names.ROLE: "search"})
    summary = run_study(spec, RunOptions(trials=3, seed=0, validate=False))
    assert summary.stopped_because is None, summary.stopped_because
    study = optuna.load_study(study_name=spec.name, storage=spec.default_storage())
    baseline, ngram, lossy = study.trials

    assert baseline.user_attrs[names.ROLE] == "baseline"
    assert baseline.state == TrialState.COMPLETE, baseline.user_attrs
    assert "--speculative-config" not in baseline.user_attrs[names.SERVER]["argv"]
    assert names.SPECULATIVE not in baseline.user_attrs  # nothing scraped when not speculating

    # n-gram speculation: drafts proposed, some rejected, and the output is the baseline's
    assert "--speculative-config" in ngram.user_attrs[names.SERVER]["argv"]
    assert ngram.state == TrialState.COMPLETE, (
        ngram.user_attrs.get(names.FAIL_REASON),
        ngram.user_attrs.get(names.FAIL_DETAIL),
    )
    assert ngram.user_attrs[names.CORRECT] is True
    stats = ngram.user_attrs[names.SPECULATIVE]
    assert "error" not in stats, stats
    assert stats["drafts"] > 0 and stats["draft_tokens"] > 0, stats
    assert 0 <= stats["accepted_tokens"] < stats["draft_tokens"], stats  # some drafts were wrong
    assert stats["acceptance_rate"] == pytest.approx(
        stats["accepted_tokens"] / stats["draft_tokens"], abs=1e-3
    )
    assert stats["config"] == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    check = ngram.user_attrs[names.CHECK]
    assert check["passed"] and check["under_load_checked"] > 0, check

    # the planted lossy speculation: applied, drafts proposed (from /metrics), then rejected
    [log_path] = tmp_path.rglob("trial-00002.log")
    log = log_path.read_text(errors="replace")
    assert re.search(r"AUTOTUNE_PATCH_APPLIED name=spec_accept_all value=true", log), log[-3000:]
    assert "AUTOTUNE_SPEC_ACCEPT_ALL drafts=" in log, log[-3000:]
    attrs = lossy.user_attrs
    lossy_stats = attrs[names.EVIDENCE]["speculative"]
    assert lossy_stats["drafts"] > 0 and lossy_stats["draft_tokens"] > 0, lossy_stats
    # every proposed draft counts as accepted: the counters of a lossy run read 100%
    assert lossy_stats["accepted_tokens"] == lossy_stats["draft_tokens"], lossy_stats
    assert attrs[names.SPECULATIVE] == lossy_stats
    assert lossy.state == TrialState.PRUNED
    assert attrs[names.FAIL_REASON] == "incorrect_output", attrs.get(names.FAIL_DETAIL)
    assert attrs[names.CORRECT] is False
    divergence = attrs[names.EVIDENCE]["first_divergence"]
    assert divergence["prompt"] in spec.check.prompts
    assert divergence["got_text"] != divergence["expected_text"]

    # `autotune show` lists both speculative trials with their acceptance
    lines = render.study_speculation_lines(spec.default_storage(), spec.name)
    assert len(lines) == 2, lines
    assert lines[0].startswith("trial 1 (correct; method=ngram") and "acceptance" in lines[0]
    assert lines[1].startswith("trial 2 (incorrect_output;") and "100.0%" in lines[1]
