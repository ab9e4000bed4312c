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


def test_values_and_log_lines_show_their_control_characters_escaped(tmp_path) -> None:
    """A bidi control (U+202E) in a parameter value reversed the text beside it in the trial
    table, and a server's log line kept its raw ESC sequences on the page: every text is
    shown with its control characters written as escapes (a log tail keeps its lines), its
    markup as text."""
    from autotune.report.html import build_report
    from autotune.study.results import ReportSource
    from tests.test_render import BIDI_VALUE, HOSTILE_VALUE, hostile_study

    url = f"sqlite:///{tmp_path / 'hostile.db'}"
    hostile_study(url)
    page = build_report(optuna.load_study(storage=url, study_name="hostile"), ReportSource(url))
    assert not any(c in page for c in "\x1b\x07\x9b\u202e\u2066\u2069")
    assert "bidi=\\u202eRTL\\u2066x\\u2069" in page  # the trial table and the winner's diff
    assert "<td>\\u202eRTL\\u2066x\\u2069 &larr; changed</td>" in page
    assert "tag=[link=https://evil.example]L[/link]" in page  # not markup in HTML either
    assert HOSTILE_VALUE in page and BIDI_VALUE not in page
    tail = re.search(r"<pre class='log-tail'>(.*?)</pre>", page, re.S).group(1)
    assert tail.startswith("a\n\\x1b]0;owned\\x07[rank0]: x[/] unbalanced")


#: study data that plotly would draw as markup: a link, bold text
LINK = "<a href='https://evil.example/x'>GET</a>"
BOLD = "<b>oom</b>"


def _markup_study(url: str) -> optuna.Study:
    """Every figure's text from the study holds markup: a parameter's name and value, the
    metric's name, a failure reason, a round's role, an ablated parameter."""
    from autotune import names

    study = optuna.create_study(storage=url, study_name="markup", direction="maximize")
    metric = "<i>tps</i>"
    study.set_metric_names([metric])
    dist = {
        "<b>seqs</b>": optuna.distributions.IntDistribution(1, 64),
        "mode": optuna.distributions.CategoricalDistribution(["plain", LINK]),
    }
    rows = [(names.BASELINE, 1, "plain", 100.0), (names.SEARCH, 8, LINK, 130.0)]
    rows += [(names.SEARCH, 16, "plain", 120.0), (names.SEARCH, 32, LINK, 150.0)]
    rows += [(LINK, 32, LINK, 149.0)]  # a re-measurement round of an unknown kind
    for role, seqs, mode, tps in rows:
        study.add_trial(
            optuna.trial.create_trial(
                params={"<b>seqs</b>": seqs, "mode": mode},
                distributions=dist,
                value=tps,
                user_attrs={
                    names.CORRECT: True,
                    names.ROLE: role,
                    names.CHECK: {"passed": True},
                    names.METRICS: {f"{metric}@1": tps / 2, f"{metric}@2": tps},
                },
                system_attrs={f"constraints:{names.CORRECTNESS_CONSTRAINT}": 0.0},
            )
        )
    study.add_trial(
        optuna.trial.create_trial(
            params={"<b>seqs</b>": 64, "mode": "plain"},
            distributions=dist,
            state=optuna.trial.TrialState.FAIL,
            user_attrs={names.ROLE: names.SEARCH, names.FAIL_REASON: BOLD},
        )
    )
    change = {"parameter": LINK, "best_value": 32, "reverted_to": 1, "delta": 50.0}
    study.set_user_attr(
        names.ABLATION_REPORT,
        {
            "trial_number": 3,
            "metric": metric,
            "repeats": 3,
            "direction": "maximize",
            "best_median": 150.0,
            "noise_band": 2.0,
            "contributions": [{**change, "verdict": "bought", "detail": ""}],
            "minimal_values": {LINK: 32},
            "minimal_keeps_gain": True,
            "minimal_median": 149.0,
        },
    )
    return study


def test_study_data_in_every_figure_is_text_not_markup(tmp_path, monkeypatch) -> None:
    """Plotly draws a few HTML tags in titles, tick labels, legend entries, annotations and
    hover texts: a failure reason ``<b>oom</b>`` came out bold, and a parameter's name, a
    metric's name or a round's role ``<a href=...>`` a live link showing another text. Each
    is escaped (``<``, ``>``, ``&``), so the value shows as it is; autotune's own ``<br>`` is
    the only tag left in any figure."""
    from autotune.report import html as report_html
    from autotune.report.html import build_report
    from autotune.report.plots import Figures
    from autotune.study.results import ReportSource

    drawn: dict[str, object] = {}

    class Kept(Figures):
        def html(self, fig, name, *, height=380):
            drawn[name] = fig
            return super().html(fig, name, height=height)

    monkeypatch.setattr(report_html, "Figures", Kept)
    url = f"sqlite:///{tmp_path / 'markup.db'}"
    page = build_report(_markup_study(url), ReportSource(url))
    assert {"best-so-far-launch", "importance", "parallel-coordinates", "ablation"} <= set(drawn)
    assert any(name.startswith("load-") for name in drawn), sorted(drawn)

    def texts(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for key, item in value.items():
                if key != "template":
                    yield from texts(item)
        elif isinstance(value, list | tuple):
            for item in value:
                yield from texts(item)

    for name, fig in drawn.items():
        found = list(texts(fig.to_plotly_json()))
        tags = [t for t in found if re.search(r"<(?!br>)", t)]
        assert tags == [], f"{name}: {tags}"
    every = "\n".join(t for fig in drawn.values() for t in texts(fig.to_plotly_json()))
    for shown in ("&lt;b&gt;oom&lt;/b&gt;", "&lt;i&gt;tps&lt;/i&gt;", "&lt;b&gt;seqs&lt;/b&gt;"):
        assert shown in every
    assert "&lt;a href='https://evil.example/x'&gt;GET&lt;/a&gt;" in every
    if not CHROMIUM.exists():
        return
    # drawn: no link (or bold text) anywhere in a figure, and the values read as they are
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM_ARGS

    out = tmp_path / "markup.html"
    out.write_text(page, encoding="utf-8")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
        )
        try:
            tab = context.new_page()
            tab.goto(out.resolve().as_uri(), wait_until="load")
            tab.wait_for_function(
                "() => [...document.querySelectorAll('.plot .js-plotly-plot')]"
                ".every(d => d.querySelector('.main-svg'))",
                timeout=30_000,
            )
            links = tab.evaluate("() => document.querySelectorAll('.plot svg a').length")
            bold = tab.evaluate(
                "() => [...document.querySelectorAll('.plot svg tspan')]"
                ".filter(t => t.style.fontWeight === 'bold').length"
            )
            svg_text = tab.evaluate(
                "() => [...document.querySelectorAll('.plot svg text')]"
                ".map(t => t.textContent).join('\\n')"
            )
        finally:
            context.close()
    assert links == 0 and bold == 0
    assert BOLD in svg_text and "<i>tps</i>" in svg_text and "<b>seqs</b>" in svg_text
