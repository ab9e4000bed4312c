"""The gate verifies or refuses, whatever the server returns (fake server dialects).

A server that returns text but no token ids (llama.cpp, TGI, SGLang, most proxies) used to be
"verified" by comparing two empty id lists. Each dialect of the test double is run through the
real study loop: a config that corrupts every 7th word is ``incorrect_output``, never measured,
never best; a harmless change passes with the checks the server allows, and the stored record
says which ran. A server that returns no text stops the study at its baseline.
"""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotune import names
from autotune.errors import PreflightError
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, open_study, run_study
from autotune.study.results import best_trials, is_verified_feasible
from tests.builders import fake_spec, save_spec, write_fake_spec
from tests.helpers import export_unconfirmed, measured_or_screened, run_autotune, show_wide

SPACE = """
parameters:
  fault:
    type: categorical
    choices: [null, corrupt_words]
    baseline: null
    target: {flag: --fault}
  max_num_seqs:
    type: categorical
    choices: [4, 16]
    baseline: 16
    target: {flag: --max-num-seqs}
"""

#: dialect -> (how outputs are compared, teacher-forced scoring mode); llama.cpp's server gives
#: ids only in its logprobs' per-token ``content`` entries and scores no given continuation
DIALECTS = {
    "vllm": ("token_ids", "prompt_logprobs"),
    "openai": ("token_strings", "echo"),
    "llamacpp": ("token_ids", None),
    "text": ("text", None),
}
#: the dialects whose answers carry token ids
WITH_IDS = ("vllm", "llamacpp")


def _run(tmp: Path, dialect: str) -> tuple[optuna.Study, Path, str]:
    path = write_fake_spec(
        tmp, SPACE, name=f"gate-{dialect}", args=("--dialect", dialect, "--decode-ms", "1")
    )
    spec = load_spec(path)
    url = f"sqlite:///{tmp / 'gate.db'}"
    study, created = open_study(spec, url)
    assert created
    study.enqueue_trial({"fault": "corrupt_words", "max_num_seqs": 16})
    study.enqueue_trial({"fault": None, "max_num_seqs": 4})
    summary = run_study(spec, RunOptions(trials=3, storage_url=url, seed=0))
    assert summary.stopped_because is None
    return optuna.load_study(study_name=spec.name, storage=url), path, url


@pytest.fixture(scope="module", params=sorted(DIALECTS))
def dialect_run(request, tmp_path_factory) -> tuple[str, optuna.Study, Path, str]:
    return request.param, *_run(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture
def dialect_study(dialect_run) -> tuple[str, optuna.Study]:
    return dialect_run[0], dialect_run[1]


def test_reference_records_what_the_server_allows(dialect_study) -> None:
    dialect, study = dialect_study
    compared_by, teacher = DIALECTS[dialect]
    capabilities = study.user_attrs[names.REFERENCE]["capabilities"]
    assert capabilities["token_ids"] is (dialect in WITH_IDS)
    assert capabilities["top_logprobs"] is (dialect != "text")
    assert capabilities["token_strings"] is (dialect != "text")
    assert capabilities["teacher_forced"] == teacher
    baseline = study.trials[0]
    assert baseline.state == TrialState.COMPLETE
    assert baseline.user_attrs[names.CHECK]["checks"]["compared_by"] == compared_by


def test_fluent_but_wrong_config_is_rejected_and_never_measured(dialect_study) -> None:
    dialect, study = dialect_study
    corrupt = next(t for t in study.trials if t.params.get("fault") == "corrupt_words")
    attrs = corrupt.user_attrs
    assert corrupt.state == TrialState.PRUNED
    assert attrs[names.FAIL_REASON] == "incorrect_output"
    assert attrs[names.CORRECT] is False
    assert names.METRICS not in attrs and names.BENCH not in attrs
    divergence = attrs[names.EVIDENCE]["first_divergence"]
    assert divergence["expected_text"] != divergence["got_text"]
    expected_kind = "text" if dialect == "text" else "token"
    assert divergence["kind"] == expected_kind
    if dialect != "text":
        assert divergence["position"] == 6  # the 7th generated token
    assert not is_verified_feasible(corrupt)
    assert corrupt.number not in {t.number for t in best_trials(study)}


def test_harmless_change_passes_with_the_checks_that_ran(dialect_study) -> None:
    dialect, study = dialect_study
    compared_by, teacher = DIALECTS[dialect]
    good = next(
        t for t in study.trials if t.params.get("max_num_seqs") == 4 and not t.params.get("fault")
    )
    assert measured_or_screened(good), good.user_attrs.get(names.FAIL_DETAIL)
    check = good.user_attrs[names.CHECK]
    assert check["checks"]["compared_by"] == compared_by
    assert check["checks"]["teacher_forced"] == teacher
    # Under load, every response is compared by ids where the stream carries them, else text.
    load_method = "token_ids" if dialect == "vllm" else "text"
    assert check["under_load_compared_by"] == {load_method: check["under_load_checked"]}
    # a streamed answer has ids, not per-token strings: under load the margin alone excuses
    assert check["under_load_tie_flips_by"] == ("margin_only" if dialect == "vllm" else None)
    assert check["under_load_checked"] > 0 and check["under_load_divergent"] == 0
    assert is_verified_feasible(good)


def test_server_without_text_stops_the_study_at_its_baseline(tmp_path: Path) -> None:
    path = write_fake_spec(tmp_path, SPACE, name="notext", args=("--fault", "no_text"))
    spec = load_spec(path)
    url = f"sqlite:///{tmp_path / 'notext.db'}"
    with pytest.raises(PreflightError, match="returns no text"):
        run_study(spec, RunOptions(trials=3, storage_url=url))
    study = optuna.load_study(study_name=spec.name, storage=url)
    assert len(study.trials) == 1  # nothing launched after the baseline
    assert study.trials[0].user_attrs[names.FAIL_REASON] == "unverifiable"
    assert study.user_attrs.get(names.REFERENCE) is None


def test_cli_refuses_a_server_without_text_with_exit_3(tmp_path: Path) -> None:
    raw = yaml.safe_load(
        write_fake_spec(tmp_path, SPACE, name="notextcli", args=("--fault", "no_text")).read_text()
    )
    raw["storage"] = f"sqlite:///{tmp_path / 'cli.db'}"
    spec_path = tmp_path / "cli.yaml"
    spec_path.write_text(yaml.safe_dump(raw))
    assert "returns no text" in _preflight_failure(tmp_path, spec_path, "--confirm-top", "0")


def _preflight_failure(tmp_path: Path, spec_path: Path, *extra: str) -> str:
    """``autotune run`` stopped at its baseline: exit 3 and exactly one line on stderr."""
    done = run_autotune(
        "run", "--trials", "2", "--spec", str(spec_path), *extra, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_show_and_export_name_the_checks_that_ran(dialect_run) -> None:
    dialect, _study, spec_path, url = dialect_run
    compared_by = {"openai": "per-token strings", "text": "text"}.get(dialect, "token ids")
    shown = show_wide(spec_path, "--storage", url)
    assert f"passed: {compared_by} (" in shown
    has_notice = "server returns no token ids" in shown
    assert has_notice is (dialect not in WITH_IDS)
    assert ("teacher-forced logprob check is skipped" in shown) is (dialect == "text")
    # no teacher-forced scoring, but logprobs: the greedy tokens' own are compared, and said so
    said = " ".join(shown.split())
    assert ("greedy tokens' own logprobs are compared instead" in said) is (dialect == "llamacpp")
    assert ("the greedy tokens' logprobs" in said) is (dialect == "llamacpp")
    out = spec_path.parent / "best.yaml"
    export_unconfirmed(spec_path, out, "--storage", url)
    header = [line for line in out.read_text().splitlines() if line.startswith("# Checks passed:")]
    assert len(header) == 1 and f"{compared_by} (" in header[0]
    assert "corrupt_words" not in out.read_text()


#: a web server that is not an inference server: healthy on GET, an HTML page on POST
WEB_PAGE_SERVER = """
import http.server, sys
host, port, status = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
PAGE = b"<html>\\n  <body>\\n    <h1>Not an API</h1>\\n  </body>\\n</html>\\n"
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def do_POST(self):
        self.send_response(status); self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE))); self.end_headers()
        self.wfile.write(PAGE)
    def log_message(self, *args):
        pass
http.server.HTTPServer((host, port), Page).serve_forever()
"""


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (501, "first completion failed with 501: Not an API"),
        (404, "no POST /v1/completions here"),
        (401, "refused autotune's per-trial API key"),
        # a 200 that is not JSON was a JSONDecodeError traceback
        (200, "not an OpenAI completions answer: Not an API"),
    ],
)
def test_a_web_server_that_is_not_an_inference_server(
    tmp_path: Path, status: int, expected: str
) -> None:
    """The engine's command starts something that answers HTTP but not the completions API:
    the run stops at its baseline with one line of evidence (exit 3), not a dozen lines of
    HTML markup or a traceback."""
    command = [sys.executable, "-c", WEB_PAGE_SERVER, "{host}", "{port}", str(status)]
    spec = fake_spec("web", command=command, storage=f"sqlite:///{tmp_path / 'web.db'}")
    spec_path = save_spec(tmp_path, spec, SPACE, file="web.yaml")
    assert expected in _preflight_failure(tmp_path, spec_path)


def test_a_server_autotune_cannot_count_stops_the_study_at_its_baseline(tmp_path: Path) -> None:
    """Text without token ids, and no tokenizer in the model folder: every speed would be the
    server's own word (its usage). The baseline fails as ``uncountable``, saying what to give;
    nothing is measured or scored."""
    path = write_fake_spec(
        tmp_path, SPACE, name="nocount", args=("--dialect", "text", "--decode-ms", "1")
    )
    (tmp_path / "model" / "tokenizer.json").unlink()
    spec = load_spec(path)
    url = f"sqlite:///{tmp_path / 'nocount.db'}"
    with pytest.raises(PreflightError, match="uncountable.*model.tokenizer"):
        run_study(spec, RunOptions(trials=3, storage_url=url))
    study = optuna.load_study(study_name=spec.name, storage=url)
    assert len(study.trials) == 1
    baseline = study.trials[0]
    assert baseline.user_attrs[names.FAIL_REASON] == "uncountable"
    assert not baseline.user_attrs.get(names.METRICS)
