"""The README and docs/ against the code: the generated reference pages are current, the spec
reference covers every key, every failure reason has its guide entry, the README stays a short
newcomer's page, and no relative link is broken (``mkdocs build --strict`` too, where mkdocs is
installed: it comes with the ``docs`` extra)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import names
from tests.helpers import missing

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


# --- generated pages ---------------------------------------------------------------------------


def test_the_generated_reference_pages_are_what_the_generator_writes() -> None:
    stale = [
        path.relative_to(ROOT).as_posix()
        for path, text in gen.render_all().items()
        if not path.is_file() or path.read_text() != text
    ]
    assert stale == [], f"stale (run .venv/bin/python docs/gen_reference.py): {stale}"


def test_the_spec_reference_covers_every_field_and_every_key_the_loader_accepts() -> None:
    assert gen.spec_problems() == []


def test_every_spec_dataclass_field_appears_in_spec_md() -> None:
    text = (DOCS / "reference" / "spec.md").read_text()
    missing = [name for name in gen.spec_fields() if f"`{name}`" not in text]
    assert missing == []


def test_a_field_without_its_line_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new spec key added to the dataclasses alone runs into."""
    fields = gen.spec_fields()
    monkeypatch.setattr(gen, "spec_fields", lambda: [*fields, "WorkloadSpec.new_knob"])
    problems = gen.spec_problems()
    assert any("WorkloadSpec.new_knob" in p for p in problems), problems


def test_check_names_the_stale_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gen, "REFERENCE", tmp_path)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    monkeypatch.setattr(gen, "PAGES", {"a.md": lambda: "a\n", "b.md": lambda: "b\n"})
    assert gen.main([]) == 0
    assert gen.main(["--check"]) == 0
    (tmp_path / "b.md").write_text("edited by hand\n")
    capsys.readouterr()
    assert gen.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "b.md" in out and "a.md" not in out


# --- the guide against names.py ----------------------------------------------------------------


def test_every_failure_reason_has_a_row_in_the_failures_guide() -> None:
    text = (DOCS / "guide" / "failures.md").read_text()
    reasons = [*names.CANDIDATE_REASONS, *names.INFRA_REASONS]
    missing = [r for r in reasons if not re.search(rf"^\| `{re.escape(r)}` \|", text, re.M)]
    assert missing == []


# --- the README --------------------------------------------------------------------------------

_COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
_ISSUE = re.compile(r"(?<![\w/])#\d+\b")
_MONTHS = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
_DATE = re.compile(
    rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b"
    rf"|\b(?:{_MONTHS})[a-z]*\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b"
    rf"|\b\d{{1,2}} (?:{_MONTHS})[a-z]* \d{{4}}\b",
    re.I,
)


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 200


@pytest.mark.parametrize(
    ("what", "pattern"),
    [
        ("a commit hash", _COMMIT),
        ("an issue number", _ISSUE),
        ("a date", _DATE),
        ("a load average", re.compile(r"load average|\bload \d", re.I)),
    ],
)
def test_the_readme_has_no_run_narrative(what: str, pattern: re.Pattern[str]) -> None:
    found = pattern.findall(README.read_text())
    assert found == [], f"the README holds {what}: {found}"


def test_the_narrative_patterns_see_what_they_forbid() -> None:
    assert _COMMIT.search("commit 2f85943")
    assert not _COMMIT.search("a decade of 1234567 tokens")
    assert _ISSUE.search("a known gap (#13)") and not _ISSUE.search("[x](a.md#part-2)")
    assert _DATE.search("on 2026-12-01") and _DATE.search("Dec 1, 2026")


def test_the_readme_leads_to_the_outputs_reference() -> None:
    assert "(docs/reference/outputs.md)" in README.read_text()


# --- links -------------------------------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _prose(text: str) -> str:
    return _CODE.sub("", _FENCE.sub("", text))


def _anchors(path: Path) -> set[str]:
    """Heading ids as GitHub and as MkDocs (Python-Markdown's toc) make them: an anchor must
    work on both, so it must be in both sets."""
    github, mkdocs = set(), set()
    for line in _FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        title = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1)).strip()
        github.add(re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-"))
        mkdocs.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", title).strip().lower()))
    return github & mkdocs


def _links(path: Path) -> list[str]:
    return [m.group(1) for m in _LINK.finditer(_prose(path.read_text()))]


def test_every_relative_link_points_at_an_existing_file() -> None:
    broken = []
    for page in _pages():
        for link in _links(page):
            if re.match(r"[a-z][a-z0-9+.-]*:", link) or link.startswith("/"):
                continue  # a URL, not a file of this repository
            target, _, anchor = link.partition("#")
            dest = (page.parent / target).resolve() if target else page
            where = f"{page.relative_to(ROOT)}: {link}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif page.is_relative_to(DOCS) and not dest.is_relative_to(DOCS):
                broken.append(f"{where} (outside docs/: the site cannot link it)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where} (no such heading)")
    assert broken == []


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("[a](missing.md) `[b](in-code.md)`\n\n```\n[c](in-fence.md)\n```\n")
    assert _links(page) == ["missing.md"]
    page.write_text("# What `autotune run` does\n\n## SQLite: one worker, at a time\n")
    assert _anchors(page) == {"what-autotune-run-does", "sqlite-one-worker-at-a-time"}


def test_the_site_builds_with_no_broken_link(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        missing("mkdocs is not installed (the docs extra: make setup installs it)")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
