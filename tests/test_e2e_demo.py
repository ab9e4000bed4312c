"""End to end with the real vLLM CPU server and the demo model (about 2-3 minutes).

One short study through the real command line: baseline, an enqueued fault config and a sampled
one; then `show`, plain Optuna, `export` (and the exported YAML really starts vLLM), and resume.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import optuna
import pytest
import yaml

from autotune import names
from autotune.spec.load import load_spec
from autotune.study.loop import open_study
from tests.builders import DEMO_MODEL, write_demo_spec
from tests.helpers import export_unconfirmed, processes_matching, run_unconfirmed, show_wide

pytestmark = pytest.mark.e2e

SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [4, 16, 64]
    target: {flag: --max-num-seqs}
  block_size:
    type: categorical
    choices: [32, 64]
    target: {flag: --block-size}
  attention_path:
    type: categorical
    choices: [custom_op, direct_call]
    baseline: custom_op
    target: {patch: attention_path}
  qkv_shard_swap:
    type: bool
    baseline: false
    target: {patch: qkv_shard_swap}
"""


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("e2e")
    spec_path = write_demo_spec(directory, SPACE)
    spec = load_spec(spec_path)
    study, created = open_study(spec, spec.default_storage())
    assert created
    # Trial 1 is the fault: it starts, answers, and is wrong. The gate must say so.
    study.enqueue_trial(
        {
            "max_num_seqs": 16,
            "block_size": 32,
            "attention_path": "custom_op",
            "qkv_shard_swap": True,
        }
    )
    run_unconfirmed(spec_path, 3, "--seed", "7", cwd=directory)
    return directory, spec_path, spec


def load(spec):
    return optuna.load_study(study_name=spec.name, storage=spec.default_storage())


def test_study_file_holds_three_verified_trials(study_dir):
    directory, _, spec = study_dir
    assert (directory / "e2e.db").exists()
    trials = load(spec).trials
    assert len(trials) == 3
    baseline = trials[0]
    assert baseline.user_attrs[names.ROLE] == "baseline"
    assert baseline.user_attrs[names.CORRECT] is True
    assert baseline.user_attrs[names.METRICS]["decode_tokens_per_s"] > 0
    server = baseline.user_attrs[names.SERVER]
    assert server["engine_version"] == "0.32.0" and server["startup_s"] > 0
    assert server["stopped_cleanly"] is True
    assert "VLLM_API_KEY" in server["env"] and server["env"]["VLLM_API_KEY"] == "***"
    assert "--host" in server["argv"] and "127.0.0.1" in server["argv"]
    assert load(spec).user_attrs[names.REFERENCE]["tolerance"] > 0


def test_fault_patch_is_recorded_incorrect_and_never_best(study_dir):
    _, _, spec = study_dir
    study = load(spec)
    faulty = [t for t in study.trials if t.params.get("qkv_shard_swap") is True]
    assert faulty, "the enqueued fault trial ran"
    for trial in faulty:
        assert trial.state == optuna.trial.TrialState.PRUNED
        assert trial.user_attrs[names.FAIL_REASON] == "incorrect_output"
        assert trial.user_attrs[names.CORRECT] is False
        divergence = trial.user_attrs[names.EVIDENCE]["first_divergence"]
        assert divergence["position"] == 0
        assert divergence["expected_text"] != divergence["got_text"]
        assert names.METRICS not in trial.user_attrs  # never scored
        assert trial.constraints[names.CORRECTNESS_CONSTRAINT] > 0
    from autotune.study.results import best_trials

    assert all(t.params.get("qkv_shard_swap") is not True for t in best_trials(study))


def test_show_lists_trials_with_verdicts(study_dir):
    directory, spec_path, _ = study_dir
    shown = show_wide(spec_path, cwd=directory)
    assert "baseline" in shown and "incorrect" in shown
    assert "best (verified correct): trial" in shown


def test_no_server_survives(study_dir):
    assert not processes_matching(str(DEMO_MODEL))


def test_exported_yaml_starts_vllm(study_dir, tmp_path):
    directory, spec_path, _ = study_dir
    out = tmp_path / "best.yaml"
    config = yaml.safe_load(export_unconfirmed(spec_path, out, cwd=directory))
    assert config["model"] == str(DEMO_MODEL) and config["enforce-eager"] is True
    env = dict(os.environ)
    env_file = out.with_suffix(".env")
    if env_file.exists():
        env.update(line.split("=", 1) for line in env_file.read_text().splitlines())
    uds = tmp_path / "server.sock"  # a Unix socket: no TCP port to pick, none to be taken
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--config",
        str(out),
        "--uds",
        str(uds),
    ]
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        answer = None
        client = httpx.Client(transport=httpx.HTTPTransport(uds=str(uds)), trust_env=False)
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                response = client.post(
                    "http://localhost/v1/completions",
                    json={
                        "model": "demo",
                        "prompt": "one two three",
                        "max_tokens": 4,
                        "temperature": 0,
                    },
                    timeout=10,
                )
                if response.status_code == 200:
                    answer = response.json()["choices"][0]["text"]
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        assert answer is not None, (tmp_path / "server.log").read_text()[-3000:]
        assert answer.startswith(" four five")
    finally:
        client.close()
        os.killpg(proc.pid, 9)
        proc.wait()
        log.close()


def test_resume_adds_trials_and_keeps_the_old_ones(study_dir):
    """``--trials N`` is the study's launches in all: the same command again launches nothing,
    one more than were made launches one."""
    directory, spec_path, spec = study_dir
    before = {t.number: (t.state, t.values) for t in load(spec).trials}

    def run(trials: int) -> None:
        run_unconfirmed(spec_path, trials, cwd=directory, timeout=600)

    from autotune.study.budget import launches_made

    made = launches_made(load(spec).trials)
    run(made)
    assert len(load(spec).trials) == len(before)
    run(made + 1)
    trials = load(spec).trials
    assert len(trials) == len(before) + 1
    assert {t.number: (t.state, t.values) for t in trials[: len(before)]} == before
    assert trials[-1].user_attrs[names.ROLE] == "search"
    # the reference was recorded once, by the first baseline, and reused
    assert sum(1 for t in trials if t.user_attrs.get(names.ROLE) == "baseline") == 1
