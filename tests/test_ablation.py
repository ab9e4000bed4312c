"""`autotune ablate`: a planted change that does nothing is reported as unnecessary, a change
that matters as helping. Driven by the fake server (command engine), whose --max-num-seqs
really caps its batch and whose --block-size is accepted and ignored."""

from __future__ import annotations

import optuna
from typer.testing import CliRunner

from autotune import names
from autotune.analysis.ablation import HELPS, NO_EFFECT, changes_from_baseline, revert
from autotune.cli.app import app
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from tests.builders import write_fake_spec

SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [2, 32]
    baseline: 2
    target: {flag: --max-num-seqs}
  block_size:
    type: categorical
    choices: [16, 64]
    baseline: 16
    target: {flag: --block-size}
  prefix_caching:
    type: bool
    target: {flag: --enable-prefix-caching}
"""


def test_revert_and_changes(tmp_path):
    spec = load_spec(write_fake_spec(tmp_path, SPACE))
    best = {"max_num_seqs": 32, "block_size": 64, "prefix_caching": True}
    assert changes_from_baseline(spec, best) == ["max_num_seqs", "block_size", "prefix_caching"]
    assert revert(spec, best, "block_size") == {
        "max_num_seqs": 32,
        "block_size": 16,
        "prefix_caching": True,
    }
    # no baseline value: reverting means leaving it to the engine's default
    assert revert(spec, best, "prefix_caching") == {"max_num_seqs": 32, "block_size": 64}


def test_ablate_finds_the_change_that_matters_and_the_one_that_does_not(tmp_path):
    """Robust to a busy machine by a wide margin, not by luck: with 16 concurrent requests,
    reverting max_num_seqs 32 -> 2 makes the fake server about 5x slower (2 instead of 16
    sequences per 10 ms step), while the two ignored flags change nothing. A minimum effect of
    30% (``--min-effect 0.3``) sits far from both: a no-op is misjudged only if the median of 5
    interleaved rounds moves by 30%, and the real change would have to lose 4/5 of its effect.
    10 ms steps keep the event loop's own (load-dependent) overhead small beside the sleep."""
    spec_path = write_fake_spec(
        tmp_path,
        SPACE,
        name="ablate",
        args=("--decode-ms", "10"),
        workload={"concurrency": 16, "num_requests": 32, "max_tokens": 24},
        objective={"metric": "output_tokens_per_s"},
    )
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    # the "best": one change that matters, two the fake server ignores
    study.enqueue_trial({"max_num_seqs": 32, "block_size": 64, "prefix_caching": True})
    run_study(spec, RunOptions(trials=2, validate=False))
    result = CliRunner().invoke(
        app,
        [
            "ablate",
            "--spec",
            str(spec_path),
            "--repeats",
            "5",
            "--min-effect",
            "0.3",
            "-o",
            str(tmp_path / "minimal.yaml"),
        ],
    )
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name="ablate", storage=spec.default_storage())
    report = study.user_attrs[names.ABLATION_REPORT]
    assert report["min_effect"] == 0.3
    assert report["noise_band"] >= 0.3 * report["best_median"]
    verdicts = {c["parameter"]: c["verdict"] for c in report["contributions"]}
    assert verdicts == {
        "max_num_seqs": HELPS,
        "block_size": NO_EFFECT,
        "prefix_caching": NO_EFFECT,
    }, report
    assert report["minimal_values"] == {"max_num_seqs": 32, "block_size": 16}
    assert report["minimal_keeps_gain"] is True
    assert "no effect" in result.output and "helps" in result.output
    ablation_trials = [t for t in study.trials if t.user_attrs.get(names.ROLE) == "ablation"]
    assert len(ablation_trials) == 4 * 5 + 5  # 4 variants x 5 rounds, then the minimal x 5
    assert all(t.user_attrs.get(names.CORRECT) for t in ablation_trials)
    assert (tmp_path / "minimal.yaml").exists()
