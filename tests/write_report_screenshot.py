"""Rewrite docs/assets/report-screenshot.png (a tool, not a test; pytest does not collect it).

    .venv/bin/python -m tests.write_report_screenshot [NAME@URL]

With NAME@URL (the demo's study) the page is that study's report; without, a fake-server study
(tests/report_studies.py). The page is opened in headless Chromium (tests/browser.py) and must
load with no console error and no request beyond its own file.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PIL import Image
from typer.testing import CliRunner

from autotune.cli.app import app
from tests.browser import visit
from tests.report_studies import build_rich_study

ROOT = Path(__file__).resolve().parents[1]


def main(source: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if source:
            name, _, url = source.partition("@")
            args = ["--study", name, "--storage", url]
        else:
            args = ["--spec", str(build_rich_study(tmp / "demo"))]
        page = tmp / "report.html"
        result = CliRunner().invoke(app, ["report", *args, "-o", str(page)])
        if result.exit_code != 0:
            raise SystemExit(result.output)
        full = tmp / "full.png"
        seen = visit(page, tmp / "profile", screenshot=full)
        if seen.console_errors or seen.outside_requests:
            raise SystemExit(f"page errors: {seen.console_errors} {seen.outside_requests}")
        with Image.open(full) as image:
            image.crop((0, 0, image.width, min(image.height, 2600))).save(
                ROOT / "docs" / "assets" / "report-screenshot.png", optimize=True
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
