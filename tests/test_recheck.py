"""`autotune recheck BEST.yaml` on the fake server (test double): exit 0 on a fresh export;
exit 1 naming the parameter when the exported config selects a fault that breaks the output
(found by reverting each change, the ablation machinery); the verdict's arithmetic on its own;
bad input exits 2."""

from __future__ import annotations

import optuna
import pytest
from typer.testing import CliRunner

from autotune import names
from autotune.analysis.recheck import Measured, blame_slower, blame_wrong, judge
from autotune.cli.app import app
from autotune.spec.load import load_spec
from autotune.storage import open_storage
from autotune.study.export import export_values, read_record
from autotune.study.loop import RunOptions, open_study, run_study
from tests.builders import write_fake_spec

SPACE = """
parameters:
  decode_ms:
    type: categorical
    choices: [20, 10]
    baseline: 20
    target: {flag: --decode-ms}
  fault:
    type: categorical
    choices: [null, corrupt_words]
    baseline: null
    target: {flag: --fault}
"""


def _exported_study(tmp_path):
    """A study with its baseline and one faster correct trial, exported (no confirmation)."""
    spec_path = write_fake_spec(tmp_path, SPACE, name="rechk")
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    study.enqueue_trial({"decode_ms": 10, "fault": None}, user_attrs={names.ROLE: "search"})
    summary = run_study(spec, RunOptions(trials=2, seed=0, validate=False))
    assert summary.stopped_because is None, summary.stopped_because
    out = tmp_path / "best.yaml"
    ran = CliRunner().invoke(
        app, ["export", "--spec", str(spec_path), "-o", str(out), "--allow-unconfirmed"]
    )
    assert ran.exit_code == 0, ran.output
    return spec_path, out


def test_recheck_of_a_fresh_export_exits_0(tmp_path):
    spec_path, out = _exported_study(tmp_path)
    record = read_record(out)
    assert record["values"] == {"decode_ms": 10, "fault": None}
    assert record["metrics"]["decode_tokens_per_s"] > 0
    assert record["baseline_metrics"]["decode_tokens_per_s"] > 0
    assert record["spec"] == str(spec_path.resolve())
    # a generous band: this test is about the gate and the flow, not timing on a busy machine
    ran = CliRunner().invoke(app, ["recheck", str(out), "--min-effect", "0.5"])
    assert ran.exit_code == 0, ran.output
    assert "ok: still correct and not slower beyond noise" in ran.output
    name = next(
        s.study_name
        for s in optuna.get_all_study_summaries(
            open_storage(load_spec(spec_path).default_storage(), heartbeat=False)
        )
        if s.study_name.startswith("recheck-")
    )
    study = optuna.load_study(study_name=name, storage=load_spec(spec_path).default_storage())
    roles = [(t.user_attrs[names.ROLE], t.user_attrs[names.VARIANT]) for t in study.trials]
    assert roles == [("baseline", "baseline"), ("confirm", "exported")]  # two launches
    assert all(t.user_attrs[names.CORRECT] is True for t in study.trials)
    assert study.user_attrs["recheck"]["status"] == "ok"


def test_recheck_names_the_parameter_that_breaks_the_output(tmp_path):
    spec_path, good = _exported_study(tmp_path)
    spec = load_spec(spec_path)
    # As if the fault had been harmless on the engine it was exported from: the same record,
    # but the config also selects the fault that now corrupts every 7th token.
    metrics = read_record(good)["metrics"]
    bad = tmp_path / "bad.yaml"
    export_values(
        spec, {"decode_ms": 10, "fault": "corrupt_words"}, bad, title="test", metrics=metrics
    )
    ran = CliRunner().invoke(app, ["recheck", str(bad), "--spec", str(spec_path)])
    assert ran.exit_code == 1, ran.output
    assert "wrong: the exported config no longer passes: incorrect_output" in ran.output
    assert "guilty parameter: fault" in ran.output
    url = spec.default_storage()
    studies = [s.study_name for s in optuna.get_all_study_summaries(open_storage(url))]
    [name] = [n for n in studies if n.startswith("recheck-")]
    study = optuna.load_study(study_name=name, storage=url)
    variants = [t.user_attrs[names.VARIANT] for t in study.trials]
    # baseline, exported, then each change reverted once (decode_ms alone does not fix it)
    assert variants == ["baseline", "exported", "revert:decode_ms", "revert:fault"]
    verdicts = [t.user_attrs.get(names.FAIL_REASON) for t in study.trials]
    assert verdicts == [None, "incorrect_output", "incorrect_output", None]
    assert study.user_attrs["recheck"]["guilty"] == ["fault"]


def test_recheck_of_a_file_without_a_record_exits_2(tmp_path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="norecord")
    plain = tmp_path / "plain.yaml"
    plain.write_text("# hand-written\nmax-num-seqs: 4\n")
    ran = CliRunner().invoke(app, ["recheck", str(plain), "--spec", str(spec_path)])
    assert ran.exit_code == 2, ran.output
    assert "no '# autotune-record:' line" in ran.output


def _m(*samples, failures=(), spread=0.0):
    return Measured(samples=tuple(samples), failures=tuple(failures), spread=spread)


def test_judge_ok_slower_wrong_and_broken_baseline():
    kw = dict(metric="tok/s", sign=1.0, recorded=100.0, recorded_baseline=60.0)
    ok = judge(baseline=_m(60.0), exported=_m(95.0), **kw)
    assert ok.ok and "now 95.0 (at export 100.0)" in ok.reason
    slower = judge(baseline=_m(60.0), exported=_m(80.0), **kw)
    assert slower.status == "slower" and slower.band == pytest.approx(10.0)
    # the benchmark's own spread widens the band
    assert judge(baseline=_m(60.0), exported=_m(80.0, spread=0.25), **kw).ok
    # slower than today's baseline, although no export figure was recorded
    behind = judge(
        metric="tok/s",
        sign=1.0,
        recorded=None,
        recorded_baseline=None,
        baseline=_m(100.0),
        exported=_m(80.0),
    )
    assert behind.status == "slower" and "slower than the baseline" in behind.reason
    # latency metrics: smaller is better
    assert (
        judge(
            metric="ms",
            sign=-1.0,
            recorded=10.0,
            recorded_baseline=None,
            baseline=_m(12.0),
            exported=_m(12.5),
        ).status
        == "slower"
    )
    wrong = judge(baseline=_m(60.0), exported=_m(failures=["incorrect_output"]), **kw)
    assert wrong.status == "wrong"
    broken = judge(baseline=_m(failures=["server_crashed"]), exported=_m(90.0), **kw)
    assert broken.status == "baseline_broken"


def test_blame():
    reverted = {"a": _m(failures=["incorrect_output"]), "b": _m(50.0)}
    assert blame_wrong(reverted) == ["b"]
    exported = _m(80.0)
    speed = {"a": _m(85.0), "b": _m(99.0), "c": _m(failures=["oom"])}
    assert blame_slower(speed, exported, 1.0, band=10.0) == ["b"]
    assert blame_slower(speed, exported, 1.0, band=30.0) == []
