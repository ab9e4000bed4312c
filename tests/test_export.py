"""Export without a server: the config-file form of a trial's settings for `vllm serve --config`,
read back through vLLM's own config-file loader."""

from __future__ import annotations

import yaml

from autotune.engines import build_engine
from autotune.export import export_values
from autotune.spec import load_spec
from tests.conftest import ROOT


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
    assert out.with_suffix(".env").read_text().count("\n") == len(result.env)
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
