"""Export without a server: the config-file form of a trial's settings for `vllm serve --config`,
read back through vLLM's own config-file loader."""

from __future__ import annotations

import dataclasses

import yaml

from autotune.engines import build_engine
from autotune.spec.load import load_spec
from autotune.study.export import confirmation_notes, export_values
from tests.builders import ROOT


def test_exported_yaml_round_trips_through_vllms_config_loader(tmp_path):
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    spec = load_spec(ROOT / "studies" / "demo.yaml")
    values = {
        "max_num_seqs": 32,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "attention_path": "direct_call",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    }
    out = tmp_path / "best.yaml"
    result = export_values(spec, values, out, title="test")
    config = yaml.safe_load(out.read_text())
    assert config["enable-prefix-caching"] is False and config["enforce-eager"] is True
    assert result.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert '"attention_path": "direct_call"' in result.env["AUTOTUNE_PATCHES"]
    env_text = out.with_suffix(".env").read_text()
    assert env_text.count("\n") == len(result.env) + 1  # a first line: how to use it
    assert env_text.startswith("# NAME=value lines for `docker run --env-file`")
    text = out.read_text()
    assert "# Launch:" in text and "--config" in text
    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(["--config", str(out)])
    assert args.max_num_seqs == 32 and args.enforce_eager is True
    assert args.enable_prefix_caching is False
    assert args.model == spec.model.path and args.max_model_len == 512
    assert build_engine(spec).launch_command(spec.space.resolve(values), str(out))[-2:] == [
        "--config",
        str(out),
    ]


def test_fixed_args_export_as_the_trials_ran_them(tmp_path):
    """The exported config launched another server than the trials measured: a short flag
    (``-tp 2``) was dropped and every value int() or float() accepts became a YAML number
    (a revision ``0123`` came back as ``123``, ``4e35`` as ``4e+35``). Read back by vLLM's own
    parser, the file now gives the trial's values."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    spec = load_spec(ROOT / "studies" / "demo.yaml")
    fixed = ("-tp", "2", "--revision", "4e35", "--tokenizer-revision", "0123", "--seed", "-1")
    spec = dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, args=fixed))
    out = tmp_path / "best.yaml"
    export_values(spec, {"max_num_seqs": 32}, out, title="test")
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--config", str(out)])
    assert args.tensor_parallel_size == 2
    assert (args.revision, args.tokenizer_revision) == ("4e35", "0123")
    assert args.seed == -1 and args.max_num_seqs == 32


def test_a_short_flag_vllm_has_no_long_name_for_is_refused_at_export(tmp_path):
    import pytest

    from autotune.errors import SpecError

    spec = load_spec(ROOT / "studies" / "demo.yaml")
    spec = dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, args=("-O3",)))
    with pytest.raises(SpecError, match="long form") as raised:
        export_values(spec, {"max_num_seqs": 32}, tmp_path / "best.yaml", title="test")
    assert raised.value.key == "engine.args[0]"
    assert not (tmp_path / "best.yaml").exists()


def test_an_export_without_environment_leaves_no_older_env_beside_it(tmp_path):
    """The header says the environment is "in the .env file beside it": an older export's
    .env must not stand there, as if it belonged to a config that needs none."""
    spec = load_spec(ROOT / "studies" / "demo.yaml")
    out = tmp_path / "best.yaml"
    export_values(spec, {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, out, title="first")
    assert "VLLM_CPU_OMP_THREADS_BIND=0-1" in out.with_suffix(".env").read_text()
    bare = dataclasses.replace(spec, engine=dataclasses.replace(spec.engine, env={}))
    result = export_values(bare, {"max_num_seqs": 32}, out, title="second")
    assert result.env == {} and result.env_path == out.with_suffix(".env")
    assert "=" not in result.env_path.read_text()


BASELINE_WINS_SPACE = """
parameters:
  decode_ms:
    type: categorical
    choices: [2, 40]
    baseline: 2
    target: {flag: --decode-ms}
  fault:
    type: categorical
    choices: [null, wrong_text]
    baseline: null
    target: {flag: --fault}
"""


def test_export_writes_the_baseline_when_no_config_beats_it(tmp_path):
    """Every search trial is slower (20x the step time) or wrong: `run` says so in one line,
    `export` exits 0 and writes the baseline with a header saying why; after a confirmation
    that finds no real gain, too."""
    import optuna
    from typer.testing import CliRunner

    from autotune.cli.app import app
    from autotune.study.loop import open_study
    from tests.builders import write_fake_spec

    spec_path = write_fake_spec(tmp_path, BASELINE_WINS_SPACE, name="basewins")
    spec = load_spec(spec_path)
    study, _ = open_study(spec, spec.default_storage())
    study.enqueue_trial({"decode_ms": 40, "fault": None})
    study.enqueue_trial({"decode_ms": 2, "fault": "wrong_text"})
    runner = CliRunner()
    ran = runner.invoke(
        app, ["run", "--spec", str(spec_path), "--trials", "3", "--confirm-top", "0"]
    )
    assert ran.exit_code == 0, ran.output
    said = [ln for ln in ran.output.splitlines() if "no configuration beat the baseline" in ln]
    assert len(said) == 1, ran.output
    study = optuna.load_study(study_name="basewins", storage=spec.default_storage())
    assert [t.user_attrs.get("fail_reason") for t in study.trials[:3]] == [
        None,
        None,
        "incorrect_output",
    ]

    out = tmp_path / "best.yaml"
    exported = runner.invoke(app, ["export", "--spec", str(spec_path), "-o", str(out)])
    assert exported.exit_code == 0, exported.output
    assert "the baseline (trial 0" in exported.output
    text = out.read_text()
    header = text.splitlines()[:3]
    assert "the BASELINE (trial 0): no configuration beat it" in header[0]
    assert "none of the 1 correct search trials measured better" in header[1]
    config = yaml.safe_load(text)
    assert config["decode-ms"] == 2 and "fault" not in config

    confirmed = runner.invoke(
        app, ["confirm", "--spec", str(spec_path), "--top", "2", "--repeats", "2"]
    )
    assert confirmed.exit_code == 0, confirmed.output
    exported = runner.invoke(app, ["export", "--spec", str(spec_path), "-o", str(out)])
    assert exported.exit_code == 0, exported.output
    assert "the confirmation found no real gain (trial 1 measured" in out.read_text()
    assert yaml.safe_load(out.read_text())["decode-ms"] == 2


def test_export_fails_when_the_baseline_failed(tmp_path):
    from typer.testing import CliRunner

    from autotune.cli.app import app
    from tests.builders import write_fake_spec

    space = BASELINE_WINS_SPACE.replace("baseline: null", "baseline: exit_at_start").replace(
        "[null, wrong_text]", "[exit_at_start, null]"
    )
    spec_path = write_fake_spec(tmp_path, space, name="basefails")
    runner = CliRunner()
    ran = runner.invoke(app, ["run", "--spec", str(spec_path), "--trials", "2"])
    assert ran.exit_code == 3, ran.output
    out = tmp_path / "best.yaml"
    exported = runner.invoke(app, ["export", "--spec", str(spec_path), "-o", str(out)])
    assert exported.exit_code == 2 and not out.exists()
    assert "no verified correct trial" in exported.output


def test_the_header_says_whether_the_exported_winner_is_a_confirmed_gain():
    """A demo run ended "no confirmed gain" (+84.7 %, CI -36 % .. +435 %), and the export of
    its (verified correct) winner showed only the winner's single search measurement."""
    unsure = {"metric": "output_tokens_per_s", "repeats": 4, "winner": 4, "gain": 0.847,
              "gain_ci": [-0.363, 4.354]}  # fmt: skip
    lines = confirmation_notes(unsure, 4)
    assert "+84.7%, 95% CI -36.3% .. +435.4%" in lines[0]
    assert "4 interleaved rounds" in lines[0]
    assert "NOT a confirmed gain" in lines[1]
    sure = {**unsure, "gain_ci": [0.141, 3.212]}
    assert "a confirmed gain" in confirmation_notes(sure, 4)[1]
    assert "NOT" not in confirmation_notes(sure, 4)[1]
    # another trial than the confirmation's winner, or no confirmation: nothing to say
    assert confirmation_notes(sure, 7) == ()
    assert confirmation_notes(None, 4) == ()
