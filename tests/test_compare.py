"""`autotune compare A B`: two studies side by side, and two exported configs launched
interleaved through the gate (fake server, 2 rounds each)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.analysis.compare import ConfigComparison, ConfigResult, config_values, verdict_line
from autotune.cli.app import app
from autotune.errors import SpecError
from autotune.spec.load import load_spec
from autotune.study.export import export_values
from tests.report_studies import build_broken_study, build_rich_study, fake_spec


def test_two_exported_configs_are_launched_and_compared(tmp_path) -> None:
    spec_path = fake_spec(tmp_path / "cfg", name="cfg")
    spec = load_spec(spec_path)
    slow, fast = tmp_path / "slow.yaml", tmp_path / "fast.yaml"
    export_values(spec, {"max_num_seqs": 1}, slow, title="one sequence at a time")
    export_values(spec, {"max_num_seqs": 8}, fast, title="eight")
    assert config_values(spec, slow) == {"max_num_seqs": 1, "fault": None}
    assert config_values(spec, fast) == {"max_num_seqs": 8, "fault": None}
    result = CliRunner().invoke(
        app, ["compare", str(slow), str(fast), "--spec", str(spec_path), "--repeats", "2"]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "the baseline ran first to record the reference" in out
    assert "A: slow.yaml" in out and "B: fast.yaml" in out
    # 8 sequences at concurrency 8 against 1: B serves several times the output tokens
    assert re.search(r"B \+\d[\d.]*% against A \(95% CI", out), out
    assert "trials kept in study cfg-compare" in out


def test_config_outside_the_space_is_refused(tmp_path) -> None:
    spec_path = fake_spec(tmp_path / "cfg", name="cfg")
    spec = load_spec(spec_path)
    odd = tmp_path / "odd.yaml"
    export_values(spec, {"max_num_seqs": 8}, odd, title="x")
    odd.write_text(odd.read_text().replace("max-num-seqs: 8", "max-num-seqs: 3"))
    with pytest.raises(SpecError, match="max-num-seqs"):
        config_values(spec, odd)
    result = CliRunner().invoke(app, ["compare", str(odd), str(odd), "--spec", str(spec_path)])
    assert result.exit_code == 2
    assert "odd.yaml" in result.output and "max-num-seqs" in result.output


def test_bad_arguments_exit_2(tmp_path) -> None:
    spec_path = fake_spec(tmp_path / "cfg", name="cfg")
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "nope.yaml"), str(spec_path)])
    assert result.exit_code == 2 and "nope.yaml" in result.output
    exported = tmp_path / "c.yaml"
    export_values(load_spec(spec_path), {"max_num_seqs": 4}, exported, title="x")
    result = CliRunner().invoke(app, ["compare", str(exported), str(spec_path)])
    assert result.exit_code == 2 and "not a config" in result.output


def test_two_studies_side_by_side(tmp_path) -> None:
    rich = build_rich_study(tmp_path / "rich", ablate=False)
    broken = build_broken_study(tmp_path / "broken")
    url = f"sqlite:///{broken.parent / 'broken.db'}"
    result = CliRunner().invoke(app, ["compare", str(rich), f"broken@{url}"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "none verified" in out  # the broken study has no best config
    assert "incorrect: 1" in out and "startup_failed: 1" in out and "oom: 1" in out
    assert "95% CI" in out  # the winner was measured in the search and the confirmation
    assert "param max_num_seqs" in out
    result = CliRunner().invoke(app, ["compare", str(rich), str(rich)])
    assert result.exit_code == 0, result.output
    assert "params that differ: none" in result.output
    assert "within the noise" in result.output  # the same measurements on both sides


def test_verdict_line_says_whether_the_difference_is_real() -> None:
    def comparison(gain, ci):
        side = ConfigResult("A", Path("a"), {}, (1.0, 1.0), ())
        return ConfigComparison("m", "maximize", side, side, gain, ci, "s", "sqlite:///x")

    assert "the difference is real" in verdict_line(comparison(0.3, (0.1, 0.5)))
    assert "A is better" in verdict_line(comparison(-0.3, (-0.5, -0.1)))
    assert "within the noise" in verdict_line(comparison(0.05, (-0.1, 0.2)))
    assert "no claim" in verdict_line(comparison(0.05, None))


def test_compare_intervals_of_positive_figures_never_go_below_zero() -> None:
    """One slow round among fast ones printed an e2e p50 interval of -1,206 .. 3,573 ms: the
    interval is taken on the log scale, as the trial's own intervals are."""
    from autotune.analysis.compare import _stat

    stat = _stat([120.0, 3300.0, 150.0])
    assert stat.ci is not None
    low, high = stat.ci
    assert 0 < low < 120.0 and high > 3300.0
    assert stat.median == 150.0


def test_two_studies_under_different_workloads_claim_no_gain() -> None:
    """Two engines on one model compare only under one load: studies whose pinned workloads
    differ get their figures side by side and a note, never a gain; the same workload does."""
    from autotune.analysis.compare import StudyRef, StudySide, _workload_notes

    def side(workload: dict | None) -> StudySide:
        ref = StudyRef("x", "sqlite://", "x")
        return StudySide(
            ref, 0, {}, {}, {}, ("output_tokens_per_s",), ("maximize",), None, workload
        )

    four = {"hash": "a" * 64, "source": "inline"}
    eight = {"hash": "b" * 64, "source": "inline"}
    assert _workload_notes(side(four), side(four)) == ()
    (note,) = _workload_notes(side(four), side(eight))
    assert "different workloads" in note and "no gain is claimed" in note
    assert "no workload" in _workload_notes(side(None), side(four))[0]


def test_a_study_url_with_a_password_is_never_printed_as_typed(tmp_path) -> None:
    spec_path = fake_spec(tmp_path / "cfg", name="cfg")
    for url in ("postgresql://bob:s3cretpw@localhost:abc/x", "postgresql://bob:s3cretpw@[::1/x"):
        result = CliRunner().invoke(app, ["compare", f"other@{url}", str(spec_path)])
        assert result.exit_code == 2, result.output
        assert "s3cretpw" not in result.output and "Traceback" not in result.output
