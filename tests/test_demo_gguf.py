"""The demo model as GGUF on llama.cpp (``studies/demo-llamacpp.yaml``).

The conversion keeps what the gate's prompts depend on: the GGUF's tokenizer encodes text into
the ids transformers' tokenizer gives (GPT-2's pre-tokenizer, BOS first; with llama.cpp's
"default" pre-tokenizer "17 18 19" became "1" "7" " " "1" "8" ... and the model answered
" 9 20 11"). A short study of the shipped spec on the real llama-server gates, measures and
exports. Skipped, saying why, where the binary is missing.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import optuna
import pytest
import yaml

from autotune import names
from autotune.engines.llamacpp import binary
from autotune.spec.load import load_spec
from autotune.testing.demo_gguf import main as write_demo_gguf
from tests.helpers import export_unconfirmed, missing, processes_matching, run_unconfirmed

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
REAL = binary.resolve_program(binary.PROGRAM)


@pytest.fixture
def needs_server() -> None:
    if REAL is None:
        missing("no llama-server (run `make llama-server`)")


LISTENING = re.compile(rb"listening on (http://127\.0\.0\.1:\d+)")


@pytest.fixture(scope="module")
def demo_gguf(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / "demo-q8_0.gguf"
    assert write_demo_gguf(["--src", str(DEMO), "--out", str(out)]) == 0
    return out


def test_the_gguf_tokenizer_splits_as_transformers_does(demo_gguf):
    import gguf
    from transformers import AutoTokenizer

    reader = gguf.GGUFReader(str(demo_gguf))

    def field(name: str):
        f = reader.fields[name]
        return bytes(f.parts[f.data[0]]).decode() if f.types[0] == gguf.GGUFValueType.STRING else (
            f.parts[f.data[0]][0]
        )  # fmt: skip

    assert field("tokenizer.ggml.pre") == "gpt-2"
    assert bool(field("tokenizer.ggml.add_bos_token")) is True
    assert int(field("tokenizer.ggml.bos_token_id")) == 0
    ids = AutoTokenizer.from_pretrained(DEMO)("17 18 19").input_ids
    assert ids[0] == 0 and len(ids) == 6  # <s> 1 7 " 18" " 1" 9: the merges the model learned


@pytest.mark.usefixtures("needs_server")
def test_llama_server_tokenizes_the_demo_s_prompts_as_transformers_does(demo_gguf, tmp_path):
    """The real llama-server's ids for the check prompts equal transformers' (BOS included)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEMO)
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [REAL, "-m", str(demo_gguf), "--host", "127.0.0.1", "--port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and proc.poll() is None and time.monotonic() < deadline:
            found = LISTENING.search(log_path.read_bytes())
            url = found.group(1).decode() if found else None
            time.sleep(0.2)
        assert url, log_path.read_text(errors="replace")[-2000:]
        for prompt in ("17 18 19", "one two three", "monday tuesday wednesday"):
            response = httpx.post(f"{url}/tokenize", json={"content": prompt, "add_special": True})
            while response.status_code == 503:  # the model is still loading
                time.sleep(0.2)
                response = httpx.post(
                    f"{url}/tokenize", json={"content": prompt, "add_special": True}
                )
            assert response.json()["tokens"] == tok(prompt).input_ids, prompt
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.usefixtures("needs_server")
def test_the_demo_study_runs_on_llama_cpp(tmp_path):
    """``studies/demo-llamacpp.yaml`` as shipped, its model written as ``make model`` does: the
    baseline and one tuned config are gated against the baseline's reference, the known answers
    hold, the export is llama.cpp's own, and no server is left."""
    spec_data = yaml.safe_load((ROOT / "studies" / "demo-llamacpp.yaml").read_text())
    gguf_path = tmp_path / "demo-q8_0.gguf"
    assert write_demo_gguf(["--src", str(DEMO), "--out", str(gguf_path)]) == 0
    spec_data["model"]["path"] = str(gguf_path)
    spec_data["search_space"] = str(ROOT / "search_spaces" / "demo-llamacpp.yaml")
    spec_data["workload"].update({"num_requests": 16, "repeats": 1, "target_precision": 0})
    spec_path = tmp_path / "demo-llamacpp.yaml"
    spec_path.write_text(yaml.safe_dump(spec_data, sort_keys=False))
    spec = load_spec(spec_path)

    from autotune.study.loop import open_study

    study, _ = open_study(spec, spec.default_storage())
    # the baseline's values but 4 slots, every other knob pinned at llama-server's default (a
    # partial enqueue lets the sampler draw the rest: a q4_0 K cache is rightly rejected)
    tuned = {
        **spec.space.baseline_values(),
        "parallel": 4,
        "batch_size": 2048,
        "ubatch_size": 512,
        "flash_attn": "auto",
        "cache_type_k": "f16",
        "cont_batching": True,
    }
    assert set(tuned) == {p.name for p in spec.space.parameters}
    study.enqueue_trial(spec.space.to_optuna_params(tuned))
    run_unconfirmed(spec_path, 2, cwd=tmp_path)
    study = optuna.load_study(study_name=spec.name, storage=spec.default_storage())
    baseline, tuned = study.trials[:2]
    assert baseline.user_attrs[names.CORRECT] is True, baseline.user_attrs.get(names.FAIL_DETAIL)
    assert tuned.params["parallel"] == 4
    assert tuned.user_attrs[names.CORRECT] is True, tuned.user_attrs.get(names.FAIL_DETAIL)
    capabilities = study.user_attrs[names.REFERENCE]["capabilities"]
    assert capabilities["token_ids"] and capabilities["top_logprobs"], capabilities

    out = tmp_path / "best.sh"
    assert str(gguf_path) in export_unconfirmed(spec_path, out, cwd=tmp_path)
    assert not processes_matching(str(gguf_path))
