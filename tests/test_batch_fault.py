"""Correctness under load: a fault that is wrong only when requests are batched.

The quiet check sends its prompts one at a time, so a batching bug (a wrong row index, a padding
mask that is off when a step holds several sequences) passes it. Such a config must still be
rejected: the benchmark responses, produced at the batch shapes where batching bugs live, are
compared with the reference too (``TrialRunner._check_under_load``). Shown twice:

* on the fake server's ``wrong_when_batched`` fault, through a real trial (command engine);
* on REAL vLLM with ``patches/batch_corrupt.py`` (mark ``e2e``; two server starts: the
  baseline, then the patched config).

In both, the trial is ``incorrect_output`` with a ``token_under_load`` divergence as evidence,
and its stored check shows that the quiet check had passed.
"""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotune import names
from autotune.spec.load import load_spec
from tests.builders import write_demo_spec, write_fake_spec
from tests.helpers import measured_or_screened, run_baseline_then

FAKE_SPACE = """
parameters:
  fault:
    type: categorical
    choices: [null, wrong_when_batched]
    baseline: null
    target: {flag: --fault}
"""

DEMO_SPACE = """
parameters:
  batch_corrupt:
    type: bool
    baseline: false
    target: {patch: batch_corrupt}
"""


def assert_rejected_under_load(study: optuna.Study, params: dict, spec_path: Path) -> dict:
    """The verdicts both tests require; returns the faulty trial's first divergence."""
    spec = load_spec(spec_path)
    baseline, faulty = study.trials
    assert baseline.user_attrs[names.ROLE] == "baseline"
    assert baseline.state == TrialState.COMPLETE, baseline.user_attrs
    assert faulty.params == params
    attrs = faulty.user_attrs
    assert faulty.state == TrialState.PRUNED
    assert attrs[names.FAIL_REASON] == "incorrect_output", (
        attrs.get(names.FAIL_REASON),
        attrs.get(names.FAIL_DETAIL),
    )
    assert attrs[names.CORRECT] is False
    assert faulty.system_attrs.get("constraints:correct") == 1.0
    assert "diverged under load" in attrs[names.FAIL_DETAIL]
    # the quiet (sequential) check ran and passed; only the under-load check failed it
    check = attrs[names.CHECK]
    assert check["passed"] is True, check
    assert check["problems"] == [] and check["first_divergence"] is None
    assert check["prompts_checked"] == len(spec.check.prompts)
    assert check["under_load_checked"] > 0
    assert 1 <= check["under_load_divergent"] <= check["under_load_checked"]
    divergence = attrs[names.EVIDENCE]["first_divergence"]
    assert divergence["kind"] == "token_under_load"
    assert divergence["prompt"] in spec.workload.prompts  # a benchmark request, text as evidence
    assert divergence["got_text"] != divergence["expected_text"]
    assert divergence["got_token"] != divergence["expected_token"]
    return divergence


def test_fake_wrong_when_batched_passes_quietly_and_fails_under_load(tmp_path: Path) -> None:
    # 20 ms steps: the four concurrent benchmark requests share steps however busy the machine.
    spec_path = write_fake_spec(
        tmp_path,
        FAKE_SPACE,
        name="batched",
        args=("--decode-ms", "20"),
        workload={"concurrency": 4, "num_requests": 8, "max_tokens": 8},
    )
    study = run_baseline_then(spec_path, {"fault": "wrong_when_batched"})
    divergence = assert_rejected_under_load(study, {"fault": "wrong_when_batched"}, spec_path)
    # the toy model's fault: whitespace instead of the counting continuation
    assert divergence["got_text"].strip() != divergence["expected_text"].strip()


@pytest.mark.e2e
def test_vllm_batch_corrupt_passes_quietly_and_fails_under_load(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    spec_path = write_demo_spec(
        tmp_path,
        DEMO_SPACE,
        name="batch_corrupt",
        # Long answers, 8 at once, and the patch's 20 ms steps: on a starved machine the API
        # server was seen handing requests to the engine one by one, each finished before the
        # next arrived, so nothing was batched; slow steps keep several in flight together.
        workload={"concurrency": 8, "num_requests": 16, "max_tokens": 192},
    )
    study = run_baseline_then(spec_path, {"batch_corrupt": True})
    # First: the patch was applied, and corrupted batched steps, in the process that runs the
    # model (if it never fired, the verdict below would say nothing about the gate).
    [log_path] = tmp_path.rglob("trial-00001.log")
    log = log_path.read_text(errors="replace")
    applied = re.findall(r"AUTOTUNE_PATCH_APPLIED name=batch_corrupt value=true pid=(\d+)", log)
    corrupted = re.findall(r"AUTOTUNE_BATCH_CORRUPT rows=(\d+) pid=(\d+)", log)
    assert applied and corrupted, log[-4000:]
    assert {pid for _rows, pid in corrupted} <= set(applied)
    assert all(int(rows) > 1 for rows, _pid in corrupted)
    assert "AUTOTUNE_BATCH_CORRUPT" not in next(tmp_path.rglob("trial-00000.log")).read_text()
    divergence = assert_rejected_under_load(study, {"batch_corrupt": True}, spec_path)
    assert divergence["got_token"].startswith("id:")


def test_prompt_shared_by_check_and_workload_is_judged_at_its_own_length(tmp_path: Path) -> None:
    # "1 2 3" is a check prompt (8 tokens) and a workload prompt (16 tokens): its reference is
    # the 8-token answer, so the 16-token benchmark answers to it are not compared (they would
    # all "diverge" by length and fail a correct baseline); the other prompts still are.
    spec_path = write_fake_spec(tmp_path, FAKE_SPACE, name="shared")
    spec = load_spec(spec_path)
    data = yaml.safe_load(spec_path.read_text())
    data["check"]["prompts"] = ["1 2 3", *data["check"]["prompts"]]
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    study = run_baseline_then(spec_path, {"fault": None})
    for trial in study.trials:
        assert measured_or_screened(trial), trial.user_attrs
        check = trial.user_attrs[names.CHECK]
        assert check["under_load_divergent"] == 0
        assert 0 < check["under_load_checked"] < spec.workload.num_requests


LATE_SPACE = """
parameters:
  fault:
    type: categorical
    choices: [null, wrong_late]
    baseline: null
    target: {flag: --fault}
"""


def rejected_fault(
    tmp_path: Path,
    space: str,
    fault: str,
    args: tuple[str, ...],
    *,
    repeats: int,
    sample: int | None = None,
) -> optuna.trial.FrozenTrial:
    """The baseline, then one trial with the fake server's ``fault`` (a warm-up request, then
    1 single, 1 fresh control and 8 load requests a round), which must be rejected as
    ``incorrect_output``."""
    spec_path = write_fake_spec(
        tmp_path,
        space,
        name=fault.replace("_", ""),
        args=("--decode-ms", "1", *args),
        workload={"concurrency": 4, "num_requests": 8, "max_tokens": 8, "repeats": repeats},
    )
    raw = yaml.safe_load(spec_path.read_text())
    if sample is not None:
        raw["check"]["under_load_sample"] = sample
    raw["workload"]["warmup_requests"] = 1
    raw["workload"]["single_requests"] = 1
    spec_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    baseline, faulty = run_baseline_then(spec_path, {"fault": fault}).trials
    assert baseline.state == TrialState.COMPLETE, baseline.user_attrs
    assert faulty.user_attrs[names.FAIL_REASON] == "incorrect_output", faulty.user_attrs.get(
        names.FAIL_DETAIL
    )
    return faulty


def test_a_server_wrong_only_in_its_last_round_is_caught(tmp_path: Path) -> None:
    """Right for its first 3 rounds of benchmark requests (a warm-up, then 1 single, 1 fresh
    control and 8 load requests a round), wrong from the 4th: a sample of 2 answers would fall
    in rounds 1 and 3; the check takes one a round at least, so the last round is seen and the
    trial rejected."""
    late = rejected_fault(
        tmp_path, LATE_SPACE, "wrong_late", ("--fault-after", str(1 + 3 * 10)), repeats=4, sample=2
    )
    check = late.user_attrs[names.CHECK]
    assert check["passed"] is True  # the quiet check, before the benchmark, was right
    assert check["under_load_checked"] >= 4  # one a round, not the 2 asked for
    assert 1 <= check["under_load_divergent"] < check["under_load_checked"]


ALONE_SPACE = """
parameters:
  fault:
    type: categorical
    choices: [null, wrong_alone_in_bench]
    baseline: null
    target: {flag: --fault}
"""


def test_a_server_wrong_only_when_serving_one_request_is_caught_in_that_phase(
    tmp_path: Path,
) -> None:
    """Right in the quiet check and under load, wrong for a benchmark request that arrives
    alone: the single-request phase, whose tok/s is the default objective. Only the main load
    level's answers were judged, so such a config was measured, reported and exported best;
    now every measured phase has an answer judged, and the evidence names the phase."""
    alone = rejected_fault(tmp_path, ALONE_SPACE, "wrong_alone_in_bench", (), repeats=2)
    assert alone.user_attrs[names.CHECK]["passed"] is True  # the quiet check was right
    divergence = alone.user_attrs[names.EVIDENCE]["first_divergence"]
    assert divergence["phase"] == "single-request (round 1)"
    assert "in single-request (round 1)" in alone.user_attrs[names.FAIL_DETAIL]
