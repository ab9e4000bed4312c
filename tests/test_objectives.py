"""Objectives, SLO constraints, confirmation and Pareto export, on the fake server
(command engine): --max-num-seqs really caps its batch (queueing raises TTFT) and
--enforce-eager really makes its steps 1.3x slower."""

from __future__ import annotations

import optuna
import yaml
from typer.testing import CliRunner

from autotune import names
from autotune.cli.app import app
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from autotune.study.results import best_trials
from tests.builders import write_fake_spec

SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [2, 32]
    baseline: 32
    target: {flag: --max-num-seqs}
  enforce_eager:
    type: bool
    baseline: true
    target: {flag: --enforce-eager}
"""
FAST_BUT_SLO_BREAKING = {"max_num_seqs": 2, "enforce_eager": False}
SLOW_FEASIBLE = {"max_num_seqs": 32, "enforce_eager": True}
FAST_FEASIBLE = {"max_num_seqs": 32, "enforce_eager": False}
WORKLOAD = {"concurrency": 16, "num_requests": 32, "max_tokens": 16, "single_requests": 2}


def run_enqueued(spec_path, configs, **options):
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    for config in configs:
        study.enqueue_trial(config)
    run_study(spec, RunOptions(trials=len(configs) + 1, validate=False, **options))
    return spec, optuna.load_study(study_name=spec.name, storage=spec.default_storage())


def test_slo_constraint_confirmation_and_export(tmp_path):
    spec_path = write_fake_spec(
        tmp_path,
        SPACE,
        name="slo",
        args=("--decode-ms", "6"),
        workload=WORKLOAD,
        objective={"metric": "decode_tokens_per_s", "constraints": ["ttft_p95_ms <= 250"]},
    )
    spec, study = run_enqueued(spec_path, [FAST_BUT_SLO_BREAKING, SLOW_FEASIBLE, FAST_FEASIBLE])
    by_params = {tuple(sorted(t.params.items())): t for t in study.trials[1:]}
    breaking = by_params[tuple(sorted(FAST_BUT_SLO_BREAKING.items()))]
    assert breaking.state == optuna.trial.TrialState.COMPLETE
    assert breaking.user_attrs[names.CORRECT] is True
    assert breaking.constraints["slo:ttft_p95_ms"] > 0  # measured, correct, but infeasible
    assert breaking.number not in {t.number for t in best_trials(study)}

    runner = CliRunner()
    unconfirmed = runner.invoke(
        app, ["export", "--spec", str(spec_path), "-o", str(tmp_path / "x.yaml")]
    )
    assert unconfirmed.exit_code == 2 and "not been confirmed" in unconfirmed.output

    result = runner.invoke(
        app, ["confirm", "--spec", str(spec_path), "--top", "2", "--repeats", "2"]
    )
    assert result.exit_code == 0, result.output
    confirmation = optuna.load_study(study_name="slo", storage=spec.default_storage()).user_attrs[
        names.CONFIRMATION
    ]
    labels = [c["label"] for c in confirmation["candidates"]]
    assert labels[0] == "baseline" and len(labels) == 3
    assert f"trial {breaking.number}" not in labels  # infeasible trials are never candidates
    winner = study.trials[confirmation["winner"]]
    assert winner.params == FAST_FEASIBLE
    low, high = confirmation["gain_ci"]
    assert low <= confirmation["gain"] <= high and confirmation["gain"] > 0
    assert "over the baseline" in result.output

    out = tmp_path / "best.yaml"
    # the gain's interval is the fake server's and excludes zero here; asking for the best
    # measured config keeps the export's check independent of how busy the machine is
    exported = runner.invoke(
        app, ["export", "--spec", str(spec_path), "-o", str(out), "--allow-unconfirmed"]
    )
    assert exported.exit_code == 0, exported.output
    config = yaml.safe_load(out.read_text())
    assert config["max-num-seqs"] == 32 and "enforce-eager" not in config


def test_multi_objective_front_and_pareto_export(tmp_path):
    """Throughput against inter-token latency is a real trade-off on the fake server, so the
    front has two points by construction, not by timing luck: 2 sequences per step give the
    lowest ITL (10 ms x 1.1) and the lowest throughput; 32 (16 running) give 16 tokens per
    25 ms step (10 ms x (1 + 0.1 x 15)), about 4x the throughput at 2.3x the ITL."""
    spec_path = write_fake_spec(
        tmp_path,
        SPACE,
        name="pareto",
        args=("--decode-ms", "10", "--batch-penalty", "0.1"),
        workload=WORKLOAD,
        objective={"metrics": ["output_tokens_per_s", "itl_p50_ms"]},
    )
    spec, study = run_enqueued(spec_path, [FAST_BUT_SLO_BREAKING, SLOW_FEASIBLE, FAST_FEASIBLE])
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    front = best_trials(study)
    assert all(t.user_attrs[names.CORRECT] for t in front)
    on_front = [t.params for t in front]
    assert FAST_BUT_SLO_BREAKING in on_front and FAST_FEASIBLE in on_front, [
        (t.params, t.values) for t in study.trials
    ]
    # every trial here is correct, so autotune's front must be Optuna's own Pareto front
    assert all(t.user_attrs.get(names.CORRECT) for t in study.trials)
    assert {t.number for t in front} == {t.number for t in study.best_trials}
    runner = CliRunner()
    single = runner.invoke(
        app, ["export", "--spec", str(spec_path), "-o", str(tmp_path / "b.yaml")]
    )
    assert single.exit_code == 2 and "--pareto" in single.output  # no single best: say so
    result = runner.invoke(
        app, ["export", "--spec", str(spec_path), "--pareto", "-o", str(tmp_path / "front.yaml")]
    )
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in tmp_path.glob("front-trial*.yaml"))
    assert written == sorted(f"front-trial{t.number}.yaml" for t in front)


def test_confirmation_interval_is_honest_about_two_rounds():
    from autotune.analysis.confirm import gain_with_ci

    # the demo's confirmation: +7.4% from two rounds each is not distinguishable from zero
    gain, (low, high) = gain_with_ci((1157.0, 1138.9), (1070.1, 1066.9), 1.0)
    assert 0.07 < gain < 0.08 and low < 0 < high
    gain, (low, high) = gain_with_ci((100, 101, 99, 100, 102), (90, 91, 89, 90, 92), 1.0)
    assert 0 < low < gain < high
    # minimizing a latency: 50 ms vs 60 ms is a gain
    gain, _ = gain_with_ci((50.0, 50.0), (60.0, 60.0), -1.0)
    assert gain > 0
