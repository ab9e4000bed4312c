"""Open a report in Debian's headless Chromium through Playwright (no browser download: the
executable is /usr/bin/chromium, installed by .ci/run and `make test`'s setup)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
#: the network is closed and nothing may be fetched: no first-run, sync or component traffic
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class PageVisit:
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    #: plot name -> number of drawn SVG/canvas elements with a non-zero size in its div
    drawn: dict[str, int] = field(default_factory=dict)
    sections: list[str] = field(default_factory=list)
    evidence_hidden_before: bool | None = None
    evidence_visible_after: bool | None = None
    evidence_text: str = ""

    @property
    def outside_requests(self) -> list[str]:
        return [u for u in self.requests if not u.startswith(("file://", "data:", "blob:"))]


def visit(page_path: Path, user_data_dir: Path, screenshot: Path | None = None) -> PageVisit:
    """Load ``page_path`` from disk, record what it asked for and logged, check each plot
    drew, open the first failure's <details>, and optionally take a full-page screenshot."""
    from playwright.sync_api import sync_playwright

    result = PageVisit()
    user_data_dir.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(user_data_dir),
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.new_page()
            page.on(
                "console",
                lambda m: result.console_errors.append(m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: result.page_errors.append(str(e)))
            page.on("request", lambda r: result.requests.append(r.url))
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            page.wait_for_function(
                "() => [...document.querySelectorAll('.plot .js-plotly-plot')]"
                ".every(d => d.querySelector('.main-svg'))",
                timeout=30_000,
            )
            result.sections = page.eval_on_selector_all("section", "els => els.map(e => e.id)")
            result.drawn = page.evaluate(
                """() => Object.fromEntries([...document.querySelectorAll('.plot')].map(d => [
                    d.dataset.plot,
                    [...d.querySelectorAll('svg.main-svg, canvas')].filter(e => {
                        const r = e.getBoundingClientRect();
                        return r.width > 0 && r.height > 0 &&
                            (e.tagName === 'canvas' || e.querySelector('path, text, rect'));
                    }).length,
                ]))"""
            )
            # every trace layer has drawn something: points, lines, bars or a gauge
            result.drawn = {
                name: count
                if page.evaluate(
                    "(n) => { const d = document.querySelector(`.plot[data-plot='${n}']`);"
                    " return d.querySelectorAll('.scatterlayer .point, .scatterlayer path.js-line,"
                    " .barlayer path, .waterfalllayer path, .indicatorlayer path,"
                    " .indicatorlayer text').length; }",
                    name,
                )
                > 0
                else 0
                for name, count in result.drawn.items()
            }
            details = page.locator("details.failure").first
            if details.count():
                evidence = details.locator(".evidence")
                result.evidence_hidden_before = not evidence.is_visible()
                details.locator("summary").click()
                result.evidence_visible_after = evidence.is_visible()
                result.evidence_text = evidence.inner_text()
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            context.close()
    return result
