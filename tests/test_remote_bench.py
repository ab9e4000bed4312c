"""`autotune bench --url` against a server autotune did not start, and server-side evidence
(`/metrics`) stored per trial. Driven by the fake server (the test starts it on port 0)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune import names
from autotune.cli.app import app
from autotune.server.metrics import parse
from autotune.spec.load import load_spec
from autotune.study.loop import RunOptions, run_study
from tests.builders import write_fake_spec

SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [2, 8]
    baseline: 8
    target: {flag: --max-num-seqs}
"""
KEY = "remote-test-key"


@pytest.fixture
def served(fake_server):
    """Fake servers serving the model ``served`` behind ``KEY`` (conftest's ``fake_server``)."""

    def start(*args: str):
        return fake_server(*args, model="served", api_key=KEY)

    return start


def _bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args], env={"AUTOTUNE_API_KEY": ""})


def test_bench_url_writes_metric_names_and_server_metrics(tmp_path, served) -> None:
    spec = write_fake_spec(tmp_path, SPACE, name="remote")
    server = served()
    out = tmp_path / "bench.json"
    result = _bench("--spec", str(spec), "--url", server.url, "--api-key", KEY, "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    for name in ("output_tokens_per_s", "decode_tokens_per_s", "ttft_p50_ms", "itl_p95_ms"):
        assert data[name] > 0, name
    assert data["passed"] is True and data["check"] is None
    assert len(data["workload"]["hash"]) == 64
    server_metrics = data["server_metrics"]
    assert server_metrics["available"] is True
    # 1 warm-up + 1 single + 1 control + 8 load requests of 16 tokens each, all counted by the
    # server
    assert server_metrics["total"]["generation_tokens"] == 11 * 16
    assert {"requests_running_max", "kv_cache_usage_mean"} <= set(server_metrics["total"])
    assert set(server_metrics["phases"]) == {
        "warm-up",
        "single-request (round 1)",
        "control (round 1)",
        "load at 4 (round 1)",
    }
    assert server_metrics["phases"]["load at 4 (round 1)"]["generation_tokens"] == 8 * 16
    assert "output_tokens_per_s" in result.output  # the table


def test_bench_records_a_server_without_metrics_as_unavailable(tmp_path, served) -> None:
    spec = write_fake_spec(tmp_path, SPACE, name="nometrics")
    server = served("--fault", "no_metrics")
    out = tmp_path / "bench.json"
    result = _bench("--spec", str(spec), "--url", server.url, "--api-key", KEY, "--json", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["server_metrics"] == {
        "available": False,
        "reason": "ValueError: GET /metrics answered 404",
        "source": "/metrics",
    }
    assert data["output_tokens_per_s"] > 0


@pytest.mark.parametrize(
    "url, expect",
    [
        ("localhost:8000", "expected http(s)://host:port"),
        ("http://127.0.0.1:9", "cannot reach"),
        # httpx raised InvalidURL mid-run: a traceback
        ("http://127.0.0.1:9/v1 x", "cannot hold spaces or control characters"),
        ("http://127.0.0.1:9/\x01", "cannot hold spaces or control characters"),
        ("http://127.0.0.1:9/\x00", "cannot hold spaces or control characters"),
    ],
)
def test_bench_bad_url_is_a_clean_error(tmp_path, url, expect) -> None:
    spec = write_fake_spec(tmp_path, SPACE, name="badurl")
    out = tmp_path / "bench.json"
    result = _bench("--spec", str(spec), "--url", url, "--json", str(out))
    assert result.exit_code == 2, result.output
    assert "--url" in result.output and expect in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_bench_against_a_server_that_is_not_openai_compatible(tmp_path) -> None:
    """A plain web server (every POST answered with an HTML error page): one failure line,
    exit 1, and no table of zeros presented as the server's speed."""
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's API
            self._page()

        def do_POST(self) -> None:  # noqa: N802
            self._page()

        def _page(self) -> None:
            body = b"<html>\n  <body>\n    <h1>Not here</h1>\n  </body>\n</html>\n"
            self.send_response(501)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)  # the OS picks the port
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        spec = write_fake_spec(tmp_path, SPACE, name="remote")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = _bench("--spec", str(spec), "--url", url)
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 1, result.output
    assert "output_tokens_per_s" not in result.output
    assert "no figures" in result.output
    failed = [line for line in result.output.splitlines() if "failed:" in line]
    assert len(failed) == 1 and "http 501: Not here" in failed[0]


def test_bench_check_without_a_reference_is_bad_input(tmp_path, served) -> None:
    spec_path = write_fake_spec(tmp_path, SPACE, name="noref")
    spec = load_spec(spec_path)
    optuna.create_study(storage=spec.default_storage(), study_name=spec.name)
    server = served()
    result = _bench("--spec", str(spec_path), "--url", server.url, "--api-key", KEY, "--check")
    assert result.exit_code == 2, result.output
    assert "no reference" in result.output and "--check" in result.output


@pytest.fixture
def study_with_reference(tmp_path: Path):
    """A one-trial study (the baseline: records the reference, stores server metrics)."""
    spec_path = write_fake_spec(tmp_path, SPACE, name="gated", args=("--fault", "preempt"))
    spec = load_spec(spec_path)
    summary = run_study(spec, RunOptions(trials=1, validate=False))
    assert summary.stopped_because is None
    return spec_path, spec


def test_trial_stores_server_metrics_and_show_flags_preemptions(study_with_reference) -> None:
    spec_path, spec = study_with_reference
    study = optuna.load_study(storage=spec.default_storage(), study_name=spec.name)
    trial = study.trials[0]
    record = trial.user_attrs[names.SERVER_METRICS]
    assert record["available"] is True
    # the `preempt` fault counts one preemption per completed request
    assert record["total"]["preemptions"] > 0
    assert record["phases"]["load at 4 (round 1)"]["generation_tokens"] == 8 * 16
    shown = CliRunner().invoke(app, ["show", "--spec", str(spec_path)])
    assert shown.exit_code == 0, shown.output
    assert "preemptions:" in shown.output and "trial 0: the server preempted" in shown.output


def test_bench_check_passes_on_a_correct_server_and_fails_on_a_corrupting_one(
    study_with_reference, served, tmp_path
) -> None:
    spec_path, _spec = study_with_reference
    good = served()
    out = tmp_path / "good.json"
    result = _bench(
        "--spec", str(spec_path), "--url", good.url, "--api-key", KEY, "--check", "--json", str(out)
    )
    assert result.exit_code == 0, result.output
    assert "check passed" in result.output
    data = json.loads(out.read_text())
    assert data["check"]["passed"] is True and data["check"]["under_load"]["checked"] > 0
    assert data["output_tokens_per_s"] > 0

    bad = served("--fault", "corrupt_words")
    out = tmp_path / "bad.json"
    result = _bench(
        "--spec", str(spec_path), "--url", bad.url, "--api-key", KEY, "--check", "--json", str(out)
    )
    assert result.exit_code == 1, result.output
    assert "check FAILED" in result.output and "first divergence" in result.output
    data = json.loads(out.read_text())
    assert data["passed"] is False and data["failure"].startswith("incorrect_output")
    assert data["check"]["first_divergence"]["kind"] == "token"
    assert "output_tokens_per_s" not in data  # no figures for a server that fails the gate


def test_parse_prometheus_text() -> None:
    text = (
        "# TYPE vllm:num_preemptions counter\n"
        'vllm:num_preemptions_total{engine="0"} 2.0\n'
        'vllm:num_preemptions_total{engine="1"} 3.0\n'
        'vllm:num_preemptions_created{engine="0"} 1.7e9\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        "vllm:kv_cache_usage_perc 0.25\n"
        "# TYPE vllm:e2e histogram\n"
        'vllm:e2e_bucket{le="1.0"} 4.0\n'
        "vllm:e2e_sum 3.5\n"
        "vllm:e2e_count 4.0\n"
    )
    assert parse(text) == {
        "vllm:num_preemptions": 5.0,
        "vllm:kv_cache_usage_perc": 0.25,
        "vllm:e2e_sum": 3.5,
        "vllm:e2e_count": 4.0,
    }


def test_bench_check_against_a_server_that_refuses_the_gate(
    study_with_reference, served, tmp_path
) -> None:
    """The gate's own requests answered with 500: one failure line (the server could not be
    verified, so it is not measured), exit 1, and the JSON says why; it was a traceback."""
    spec_path, _spec = study_with_reference
    refusing = served("--fault", "http_500")
    out = tmp_path / "refused.json"
    result = _bench(
        "--spec",
        str(spec_path),
        "--url",
        refusing.url,
        "--api-key",
        KEY,
        "--check",
        "--json",
        str(out),
    )
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    failed = [line for line in result.output.splitlines() if "failed:" in line]
    assert len(failed) == 1 and "rejected a verification request with 500" in failed[0]
    data = json.loads(out.read_text())
    assert data["passed"] is False and data["failure"].startswith("request_errors")
    assert "output_tokens_per_s" not in data


def test_bench_fails_one_stream_past_max_tokens_as_a_trial_would(tmp_path, served, monkeypatch):
    """One runaway stream in 60 requests is under the failed-request threshold, and `bench`
    passed it where a trial fails the config (study/outcome.py): the server does not do what it
    is asked. The JSON then carries no figures at top level, only what was measured, apart."""
    from autotune.bench import remote
    from autotune.bench.phase import BenchResult

    async def one_runaway(*_args, **_kwargs) -> BenchResult:
        return BenchResult(
            metrics={"output_tokens_per_s": 300.0, "requests_per_s": 0.0},
            spread={},
            repeats=(),
            total_requests=60,
            failed_requests=1,
            errors=("protocol violation: 25 tokens streamed for max_tokens=16 (more than 24)",),
        )

    monkeypatch.setattr(remote, "run_benchmark", one_runaway)
    spec = write_fake_spec(tmp_path, SPACE, name="runaway")
    out = tmp_path / "bench.json"
    server = served()
    result = _bench("--spec", str(spec), "--url", server.url, "--api-key", KEY, "--json", str(out))
    assert result.exit_code == 1, (result.output, result.exception)
    data = json.loads(out.read_text())
    assert data["passed"] is False
    assert data["failure"].startswith("protocol_violation: 1 of 60 requests: protocol violation")
    assert "output_tokens_per_s" not in data and "requests_per_s" not in data
    # measured before it failed, kept apart; a rate never measured (0.0) is absent
    assert data["unscored_metrics"] == {"output_tokens_per_s": 300.0}
    assert "no figures" in result.output and "│ output_tokens_per_s" not in result.output
