"""The package's shape, checked from its source (AST, nothing imported): the layout of
docs/design/architecture.md as tests.

* **No import cycle** in ``autotune/``, counting imports inside functions (they hide arrows
  that still run) and ``if TYPE_CHECKING:`` imports too (a type-only arrow is still a
  dependency a reader must follow). An import of ``a.b.c`` is an arrow to ``a.b.c``;
  ``from a.b import c`` is an arrow to ``a.b.c`` when that is a module, else to ``a.b``. The
  implicit import of a parent package's ``__init__`` is not an arrow (a package's ``__init__``
  re-exporting its submodules is the usual Python idiom).
* **Layers**: the subpackages in :data:`LAYERS` order, bottom to top; no module imports one of
  a higher layer (the root's ``__init__`` face and ``__main__`` excepted). So nothing imports
  ``cli/`` but ``cli/`` itself, and the engines never import the loop that drives them.
* **report/ reads results, never the loop**; analysis/ launches trials through one door
  (``analysis/remeasure.py``).
* **At most :data:`MAX_ROOT_FILES` modules at the package root**: new code goes in a folder.
* **In-function imports only for optional or heavy dependencies** (:data:`LAZY_OK`): importing
  vLLM, torch or plotly costs seconds or is not installed everywhere, so it waits until a
  function needs it. Everything else, autotune's own modules included, is imported at the top.
* **An engine's vocabulary lives in its own folder** (:data:`ENGINE_VOCABULARY`): vLLM's request
  fields, env vars, flags and metric names appear in no other module's code (string literals;
  docstrings and comments may explain them).
* **No module over :data:`MAX_LINES` lines.**
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autotune"
MAX_LINES = 600
MAX_ROOT_FILES = 12

#: the package's layers, bottom to top: a module may import its own layer and those below.
#: ``autotune.spec.model`` (the spec's dataclasses, types only) sits below the engines, the
#: spec's loader above them (it asks the engine registry which kinds exist).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("autotune",),  # the foundations at the root: errors, names, storage, patching, _helpers
    ("autotune.space", "autotune.model"),
    ("autotune.spec.model",),
    ("autotune.engines",),
    ("autotune.spec", "autotune.client"),
    ("autotune.server", "autotune.gate"),
    ("autotune.search", "autotune.bench"),
    ("autotune.study",),
    ("autotune.analysis",),
    ("autotune.report",),
    ("autotune.cli",),
    ("autotune.testing",),  # test doubles (tests/test_packaging.py keeps autotune off them)
)
#: modules allowed to import upwards, and why
UPWARD_OK = {
    "autotune": "the package's face re-exports the everyday names",
    "autotune.__main__": "python -m autotune runs the CLI",
}
#: what report/ may import from the study: its results, never the loop that made them
REPORT_MAY_READ = ("autotune.study.results",)
#: the loop's internals, and the one module of analysis/ that may drive them (it re-measures
#: configs through the same trial as the search, gate included)
LOOP_INTERNALS = ("autotune.study.trial", "autotune.study.record")
LOOP_DOOR = "autotune.analysis.remeasure"

#: third-party packages a function may import when it needs them: optional extras or heavy
#: imports (seconds), never needed just to load autotune
LAZY_OK = frozenset(
    {
        "vllm",
        "torch",
        "transformers",
        "tokenizers",
        "gguf",
        "plotly",
        "psycopg",
        "psycopg2",
        "pydantic",  # vLLM's config classes' errors, imported only with vLLM
        "packaging",  # optional in patching.py (stdlib-only inside vLLM processes)
        "starlette",
        "uvicorn",
        "numpy",
        "scipy",  # only for --sampler gp (Optuna's GPSampler)
        "prometheus_client",  # comes with vLLM; not a declared dependency of autotune
    }
)

#: each engine's words (request fields, env vars, flags, metric names, launch module) and the
#: folder they live in; a new engine adds its entry
ENGINE_VOCABULARY = {
    "autotune/engines/vllm/": re.compile(
        r"return_token_ids|ignore_eos|prompt_logprobs|VLLM_|--speculative-config|vllm:"
        r"|vllm\.entrypoints|\bvllm serve\b"
    ),
    "autotune/engines/llamacpp/": re.compile(r"LLAMA_ARG_|LLAMA_API_KEY|llamacpp:"),
}
VLLM_VOCABULARY = ENGINE_VOCABULARY["autotune/engines/vllm/"]
#: (module, word) pairs outside engines/vllm/ that may use a vLLM word, and why
VOCABULARY_ALLOWED = {
    # the stored name of the teacher-forced mode (studies already hold this value)
    ("autotune/engines/dialect.py", "prompt_logprobs"),
    # the workload hash's fixed sampling fields: renaming them changes every study's hash
    ("autotune/spec/workload.py", "ignore_eos"),
    # llama.cpp's server honours vLLM's fixed-length field under the same name
    ("autotune/engines/llamacpp/dialect.py", "ignore_eos"),
}
#: the test doubles (the ``testing`` extra) speak vLLM's dialect on purpose
VOCABULARY_EXEMPT_DIRS = ("autotune/testing/",)

#: modules other branches of #11 reshape: in-function imports still there (module -> reason)
IN_FUNCTION_PENDING: dict[str, str] = {}
#: import cycles still there, as the sorted module names of the cycle -> reason
CYCLES_PENDING: dict[tuple[str, ...], str] = {}
#: modules over MAX_LINES still there -> reason
SIZE_PENDING = {}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _inside(node: ast.AST, parents: dict[ast.AST, ast.AST], kinds: tuple[type, ...]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, kinds):
            return True
    return False


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The full dotted names an import statement loads (see the module docstring)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    out = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        out.append(candidate if candidate in MODULES else base)
    return out


def _imports() -> list[tuple[str, str, int, bool]]:
    """(importer, imported, line, inside a function) for every import in the package."""
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = _parents(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            lazy = _inside(node, parents, (ast.FunctionDef, ast.AsyncFunctionDef))
            for target in _targets(module, path, node):
                found.append((module, target, node.lineno, lazy))
    return found


IMPORTS = _imports()


def _cycles() -> list[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for importer, target, _line, _lazy in IMPORTS:
        if target in MODULES and target != importer:
            graph[importer].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_checker_sees_arrows_and_cycles() -> None:
    """The checker itself: a known arrow is found, with its in-function flag."""
    arrows = {(a, b) for a, b, _line, _lazy in IMPORTS}
    assert ("autotune.gate.run", "autotune.gate.judge") in arrows
    assert ("autotune.engines.vllm.engine", "autotune.engines.vllm.validate") in arrows
    lazy = {(a, b.split(".")[0]) for a, b, _line, is_lazy in IMPORTS if is_lazy}
    assert ("autotune.engines.vllm.validate", "vllm") in lazy
    # a type-only import is an arrow too (engines/base.py names the spec's types)
    assert ("autotune.engines.base", "autotune.spec.model") in arrows


CYCLES = _cycles()


@pytest.mark.parametrize(
    "cycle",
    [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=CYCLES_PENDING[c]))
        for c in sorted(CYCLES_PENDING)
    ]
    + ["none pending"],
)
def test_no_import_cycle(cycle: tuple[str, ...] | str) -> None:
    if cycle == "none pending":
        unexpected = [c for c in CYCLES if c not in CYCLES_PENDING]
        assert not unexpected, (
            f"import cycles (in-function and type-only imports counted): {unexpected}"
        )
    else:
        assert cycle not in CYCLES, f"still a cycle: {cycle}"


def _lazy_violations() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for importer, target, line, lazy in IMPORTS:
        if lazy and target.split(".")[0] not in LAZY_OK:
            path = _rel(MODULES[importer])
            found.setdefault(path, []).append(f"line {line}: {target}")
    return found


LAZY = _lazy_violations()


@pytest.mark.parametrize(
    "module",
    [
        pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=IN_FUNCTION_PENDING[m]))
        for m in sorted(IN_FUNCTION_PENDING)
    ]
    + ["others"],
)
def test_in_function_imports_only_for_optional_heavy_dependencies(module: str) -> None:
    if module == "others":
        unexpected = {m: v for m, v in LAZY.items() if m not in IN_FUNCTION_PENDING}
        assert not unexpected, f"import these at the top of the module: {unexpected}"
    else:
        assert module not in LAZY, f"{module}: {LAZY.get(module)}"


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


@pytest.mark.parametrize("home", sorted(ENGINE_VOCABULARY))
def test_an_engines_vocabulary_lives_in_its_folder(home: str) -> None:
    words = ENGINE_VOCABULARY[home]
    found = []
    for path in MODULES.values():
        rel = _rel(path)
        if rel.startswith((home, *VOCABULARY_EXEMPT_DIRS)):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) in docs:
                continue
            for match in words.finditer(node.value):
                if (rel, match.group(0)) not in VOCABULARY_ALLOWED:
                    found.append(f"{rel}:{node.lineno}: {match.group(0)!r}")
    assert not found, f"vocabulary of {home} outside it: " + ", ".join(found)


def test_the_vocabulary_check_sees_a_vllm_word() -> None:
    text = (PACKAGE / "engines" / "vllm" / "dialect.py").read_text(encoding="utf-8")
    assert VLLM_VOCABULARY.search(text) is not None


SIZES = {_rel(p): len(p.read_text(encoding="utf-8").splitlines()) for p in MODULES.values()}


@pytest.mark.parametrize(
    "module",
    [
        pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=SIZE_PENDING[m]))
        for m in sorted(SIZE_PENDING)
    ]
    + ["others"],
)
def test_no_module_over_max_lines(module: str) -> None:
    if module == "others":
        big = {m: n for m, n in SIZES.items() if n > MAX_LINES and m not in SIZE_PENDING}
        assert not big, f"modules over {MAX_LINES} lines: {big}"
    else:
        assert SIZES[module] <= MAX_LINES, f"{module}: {SIZES[module]} lines"


def _layer(module: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix naming ``module``."""
    best, length = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = index, len(prefix)
    return best


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _internal_arrows() -> list[tuple[str, str, int]]:
    return [(a, b, line) for a, b, line, _lazy in IMPORTS if b.split(".")[0] == "autotune"]


def test_every_module_has_a_layer() -> None:
    assert all(_layer(m) >= 0 for m in MODULES)
    assert _layer("autotune.spec.model") < _layer("autotune.engines") < _layer("autotune.spec.load")


def test_no_module_imports_a_higher_layer() -> None:
    """Nothing imports ``cli/`` but ``cli/``; the engines never import the loop; the gate never
    imports the benchmark; and so on up the table."""
    up = [
        f"{_rel(MODULES[a])}:{line} imports {b}"
        for a, b, line in _internal_arrows()
        if a not in UPWARD_OK and _layer(b) > _layer(a)
    ]
    assert not up, "imports that point up the layers: " + ", ".join(up)


def test_only_cli_and_main_import_cli() -> None:
    outside = [
        f"{_rel(MODULES[a])}:{line}"
        for a, b, line in _internal_arrows()
        if _in_package(b, "autotune.cli")
        and not _in_package(a, "autotune.cli")
        and a != "autotune.__main__"
    ]
    assert not outside, f"modules outside cli/ that import it: {outside}"


def test_report_reads_results_never_the_loop() -> None:
    bad = [
        f"{_rel(MODULES[a])}:{line} imports {b}"
        for a, b, line in _internal_arrows()
        if a.startswith("autotune.report")
        and b.startswith(("autotune.study", "autotune.bench", "autotune.server", "autotune.client"))
        and not b.startswith(REPORT_MAY_READ)
    ]
    assert not bad, "report/ reaches into the loop: " + ", ".join(bad)


def test_analysis_drives_trials_through_one_door() -> None:
    bad = [
        f"{_rel(MODULES[a])}:{line} imports {b}"
        for a, b, line in _internal_arrows()
        if a.startswith("autotune.analysis") and b.startswith(LOOP_INTERNALS) and a != LOOP_DOOR
    ]
    assert not bad, f"analysis/ modules other than {LOOP_DOOR} reach into the trial: {bad}"


def test_the_package_root_stays_small() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_FILES, f"{len(root)} modules at autotune/'s root: {root}"
