"""What the installed package needs at run time: nothing from ``autotune/testing``.

``autotune/testing`` (the fake server, the toy model, the GGUF writer, the demo model's builder)
ships in the wheel, but its third-party dependencies are extras (``testing``, ``demo-model``),
so a core install (``pip install autotune``) must never reach it: not at import time, not from
inside a function. Two checks, because each misses what the other sees: importing every runtime
module in a fresh interpreter sees what actually gets loaded (including through a third module);
the AST scan sees imports hidden inside functions that no import-time check runs.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autotune"
TESTING = PACKAGE / "testing"


def _runtime_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if TESTING not in p.parents)


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """Every module an ``import``/``from`` statement anywhere in ``path`` names (absolute form)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from autotune import testing` names the package through its alias
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_no_runtime_module_imports_autotune_testing():
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in _runtime_files()
        for line, name in _imported_modules(path)
        if name == "autotune.testing" or name.startswith("autotune.testing.")
    ]
    assert offenders == []


def test_the_ast_scan_sees_an_import_inside_a_function(tmp_path):
    """The scan above would pass vacuously if it missed nested or relative imports."""
    pkg = tmp_path / "autotune" / "engines"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text(
        "def f():\n    from ..testing import fake_server\n    import autotune.testing.toy_model\n"
    )
    names = [name for _, name in _imported_modules(pkg / "x.py", root=tmp_path)]
    assert "autotune.testing" in names
    assert "autotune.testing.toy_model" in names


def test_importing_every_runtime_module_loads_nothing_from_testing():
    modules = sorted(
        _module_name(p) for p in _runtime_files() if p.name != "__main__.py"
    )  # __main__ runs the CLI
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "autotune.cli.app" in loaded  # the import ran
    assert [m for m in loaded if m == "autotune.testing" or m.startswith("autotune.testing.")] == []
    # the demo model's builder's heavy dependencies are not pulled in either
    assert [m for m in loaded if m.split(".")[0] in ("torch", "transformers", "starlette")] == []


def _requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for req in requirements:
        name = req.split(";")[0]
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        names.add(name.strip().lower().replace("_", "-"))
    return names


def _third_party_top_levels(paths: list[Path]) -> set[str]:
    tops = set()
    for path in paths:
        for _, name in _imported_modules(path):
            top = name.split(".")[0]
            if top and top != "autotune" and top not in sys.stdlib_module_names:
                tops.add(top)
    return tops


def test_testing_dependencies_are_declared_as_extras():
    """Every third-party module that autotune/testing imports comes from a distribution that the
    core dependencies or the ``testing``/``demo-model`` extras declare (``setproctitle`` is
    optional: the fake server falls back to prctl)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    declared = _requirement_names(
        project["dependencies"] + extras["testing"] + extras["demo-model"]
    )
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for top in _third_party_top_levels(sorted(TESTING.rglob("*.py"))) - {"setproctitle"}:
        dists = {d.lower().replace("_", "-") for d in providers.get(top, [top])}
        if not dists & declared:
            missing[top] = sorted(dists)
    assert missing == {}


def test_makefile_setup_installs_the_extras_the_tests_need():
    makefile = (ROOT / "Makefile").read_text()
    install = next(line for line in makefile.splitlines() if "pip install -q -e" in line)
    for extra in ("dev", "testing", "demo-model"):
        assert extra in install.split("[", 1)[1], install


def test_every_python_m_module_the_makefile_and_docs_name_exists():
    """``python -m X`` lines in the Makefile, README and docs name importable modules (the demo
    model's builder and the roofline CLI moved; a stale name would fail only when run)."""
    texts = [ROOT / "Makefile", ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    texts += [ROOT / "models" / "demo" / "README.md"]
    named = set()
    for path in texts:
        named |= set(re.findall(r"-m\s+(autotune(?:\.\w+)*)", path.read_text()))
    assert "autotune.testing.demo_model" in named
    missing = sorted(m for m in named if importlib.util.find_spec(m) is None)
    assert missing == []
