"""`autotune show` on a finished study: failures by reason, the reference, the roofline line."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from tests.builders import write_fake_spec

SPACE = """
parameters:
  fault:
    type: categorical
    choices: [null, oom]
    baseline: null
    target: {flag: --fault}
"""


def test_show_reports_failures_reference_and_roofline(tmp_path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="report")
    raw = yaml.safe_load(spec_path.read_text())
    # 1e6 active params at 16 bits = 2 MB per token over 20 GB/s: a 10,000 tok/s ceiling
    raw["roofline"] = {"active_params": 1.0e6, "bits": 16, "bandwidth_gbs": 20}
    spec_path.write_text(yaml.safe_dump(raw))
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    study.enqueue_trial({"fault": "oom"})
    run_study(spec, RunOptions(trials=2, validate=False))
    result = CliRunner().invoke(app, ["show", "--spec", str(spec_path)])
    assert result.exit_code == 0, result.output
    assert "failures by reason: oom: 1" in result.output
    assert "reference: 6 prompts" in result.output  # 3 check + 3 workload prompts
    assert "decode roofline: 10000.0 tok/s; best measured" in result.output
    assert "best (verified correct): trial 0" in result.output
