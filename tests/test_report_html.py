"""`autotune report`: the HTML page, checked as text and in a real browser (headless Chromium
from Debian's package, driven by Playwright; no browser is downloaded).

The studies come from the real loop on the fake server (tests/report_studies.py): failures with
evidence (an incorrect output with its divergence, a failed start and an OOM with log tails), a
confirmed winner and an ablation; a study whose baseline failed (0 correct trials); a
multi-objective study and one with a trial still running.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.storage import open_storage
from tests.browser import CHROMIUM
from tests.helpers import IN_CI, needs_pg
from tests.report_studies import add_synthetic_studies, build_broken_study, build_rich_study

ROOT = Path(__file__).resolve().parents[1]
# In CI (.ci/run installs Debian's chromium) a missing browser fails the test, never skips it.
NEEDS_BROWSER = pytest.mark.skipif(
    not CHROMIUM.exists() and not IN_CI,
    reason=f"{CHROMIUM} is absent (apt-get install chromium; .ci/run installs it)",
)


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    rich = build_rich_study(tmp / "rich")
    broken = build_broken_study(tmp / "broken")
    synthetic = f"sqlite:///{tmp / 'synthetic.db'}"
    add_synthetic_studies(synthetic)
    return {"rich": rich, "broken": broken, "synthetic": synthetic, "tmp": tmp}


def _report(args: list[str], out: Path) -> str:
    result = CliRunner().invoke(app, ["report", *args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8")


def test_report_is_self_contained_and_has_every_section(studies) -> None:
    page = _report(["--spec", str(studies["rich"])], studies["tmp"] / "rich.html")
    # plotly.js inlined exactly once; no script, style or link fetched from anywhere
    assert len(re.findall(r"plotly\.js v\d", page)) == 1  # the bundle, once for every figure
    assert page.count("class='plot'") >= 5
    assert len(re.findall(r"<script[^>]*\bsrc=", page)) == 0
    assert "<link" not in page
    for section in ("header", "winner", "progress", "importance", "failures", "load"):
        assert f"<section id='{section}'" in page
    assert "<section id='ablation'><h2>" in page and "noise band" in page
    assert "<section id='roofline'>" in page and "of the roofline" in page
    # where the step time goes: baseline and best side by side, with the measured figure
    assert "<section id='step-time'>" in page and "trial 0 (baseline)" in page
    assert "coverage (trace / measured)" in page and "model compute" in page
    # the winner: a diff from the baseline, the confirmed gain with its interval, the checks
    assert "max_num_seqs" in page and "&larr; changed" in page
    assert re.search(r"Confirmation of trial \d+: [+-][\d.]+%</b> over the baseline \(95% CI", page)
    assert "token ids (3 prompts)" in page
    assert "autotune export --spec" in page
    # failures by reason, each with its evidence
    assert "incorrect" in page and "oom" in page and "startup_failed" in page
    assert "first divergence" in page and "class='expected'" in page and "class='got'" in page
    assert "CUDA out of memory" in page and "class='log-tail'" in page
    # where the time went: the search's phases, then the confirmation's trials apart
    time = page[page.index("<section id='time'>") :]
    time = time[: time.index("</section>")]
    for phase in ("startup", "gate", "measurement", "teardown", "confirmation"):
        assert f"<tr><td>{phase}</td>" in time
    # one load level per launch here: said, not drawn
    assert "Not measured: this study's trials measured one load level" in page


def test_zero_correct_running_and_multi_objective(studies) -> None:
    tmp = studies["tmp"]
    broken = _report(["--spec", str(studies["broken"])], tmp / "broken.html")
    assert "No trial was verified correct" in broken and "0 correct of 1 finished" in broken
    assert "exited with code 3" in broken
    url = studies["synthetic"]
    running = _report(["--study", "running", "--storage", url], tmp / "running.html")
    assert "This study is still running (1 trial(s) running or waiting)" in running
    multi = _report(["--study", "multi", "--storage", url], tmp / "multi.html")
    assert "<section id='pareto'>" in multi and "Pareto front" in multi
    assert "form the Pareto front (trials 0, 1, 3)" in multi


def test_bad_input_is_one_error_and_writes_nothing(studies, tmp_path) -> None:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(
        app, ["report", "--study", "nope", "--storage", studies["synthetic"], "-o", str(out)]
    )
    assert result.exit_code == 2
    assert "no study named 'nope'" in result.output
    result = CliRunner().invoke(
        app, ["report", "--spec", str(tmp_path / "missing.yaml"), "-o", str(out)]
    )
    assert result.exit_code == 2
    assert not out.exists()


@needs_pg
def test_report_from_postgresql(studies, pg_url, tmp_path) -> None:
    pg = pg_url
    name = f"report-{tmp_path.name}"[:60]
    rich_db = f"sqlite:///{studies['rich'].parent / 'rich.db'}"
    optuna.copy_study(
        from_study_name="rich",
        from_storage=open_storage(rich_db, heartbeat=False),
        to_storage=open_storage(pg, heartbeat=False),
        to_study_name=name,
    )
    page = _report(["--study", name, "--storage", pg], tmp_path / "pg.html")
    assert "Confirmation of trial" in page and "first divergence" in page


@NEEDS_BROWSER
@pytest.mark.parametrize("which", ["rich", "broken", "multi"])
def test_report_renders_in_headless_chromium(studies, which, tmp_path) -> None:
    from tests.browser import visit

    tmp = studies["tmp"]
    if which == "multi":
        page = tmp / "multi-b.html"
        _report(["--study", "multi", "--storage", studies["synthetic"]], page)
    else:
        page = tmp / f"{which}-b.html"
        _report(["--spec", str(studies[which])], page)
    shot = tmp_path / f"{which}.png"
    seen = visit(page, tmp_path / "chromium-profile", screenshot=shot)
    assert seen.console_errors == [] and seen.page_errors == []
    assert seen.outside_requests == [], "the page must make no request beyond its own file"
    assert seen.requests and seen.requests[0].startswith("file://")
    assert seen.drawn, "no plot on the page"
    assert all(count > 0 for count in seen.drawn.values()), seen.drawn
    assert shot.stat().st_size > 10_000
    if which == "rich":
        assert {
            "best-so-far-launch",
            "best-so-far-wall-clock",
            "importance",
            "parallel-coordinates",
            "ablation",
            "roofline",
            "step-time",
        } <= set(seen.drawn)
        # the failure evidence is folded away until clicked, then shown
        assert seen.evidence_hidden_before is True and seen.evidence_visible_after is True
        assert "first divergence" in seen.evidence_text
        assert "expected (reference)" in seen.evidence_text
    if which == "multi":
        assert "pareto" in seen.drawn
    if which == "broken":
        assert seen.evidence_visible_after is True
        assert "server log (tail)" in seen.evidence_text
    keep = os.environ.get("AUTOTUNE_REPORT_ARTIFACTS")
    if keep:  # CI keeps the screenshots as artifacts
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
