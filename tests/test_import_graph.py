"""The package's shape, checked from its source (AST, nothing imported): the "done when" of the
layout issue (#11) as tests.

* **No import cycle** in ``autotune/``, counting imports inside functions (they hide arrows
  that still run) and leaving out ``if TYPE_CHECKING:`` blocks (they never run). An import of
  ``a.b.c`` is an arrow to ``a.b.c``; ``from a.b import c`` is an arrow to ``a.b.c`` when that
  is a module, else to ``a.b``. The implicit import of a parent package's ``__init__`` is not an
  arrow (a package's ``__init__`` re-exporting its submodules is the usual Python idiom).
* **In-function imports only for optional or heavy dependencies** (:data:`LAZY_OK`): importing
  vLLM, torch or plotly costs seconds or is not installed everywhere, so it waits until a
  function needs it. Everything else, autotune's own modules included, is imported at the top.
* **vLLM's vocabulary lives under ``autotune/engines/vllm/``**: its request fields, env vars,
  flags and metric names appear in no other module's code (string literals; docstrings and
  comments may explain them).
* **No module over :data:`MAX_LINES` lines.**

Entries of the ``*_PENDING`` tables name modules another branch of issue #11 is reshaping
(h-11b: cli.py, objective.py, space.py, storage.py, study.py, spec.py); they are strict xfails,
so an entry that is no longer needed fails the test until it is removed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autotune"
MAX_LINES = 600

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

#: vLLM's request fields, env vars, flags, metric names and launch module
VLLM_VOCABULARY = re.compile(
    r"return_token_ids|ignore_eos|prompt_logprobs|VLLM_|--speculative-config|vllm:"
    r"|vllm\.entrypoints|\bvllm serve\b"
)
#: (module, word) pairs outside engines/vllm/ that may use a vLLM word, and why
VOCABULARY_ALLOWED = {
    # the stored name of the teacher-forced mode (studies already hold this value)
    ("autotune/engines/dialect.py", "prompt_logprobs"),
    # the workload hash's fixed sampling fields: renaming them changes every study's hash
    ("autotune/spec/workload.py", "ignore_eos"),
}
#: the test doubles (the ``testing`` extra) speak vLLM's dialect on purpose
VOCABULARY_EXEMPT_DIRS = ("autotune/engines/vllm/", "autotune/testing/")

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


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
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
            if _type_checking_only(node, parents):
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
        assert not unexpected, f"import cycles (in-function imports counted): {unexpected}"
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


def test_vllm_vocabulary_lives_under_engines_vllm() -> None:
    found = []
    for path in MODULES.values():
        rel = _rel(path)
        if rel.startswith(VOCABULARY_EXEMPT_DIRS):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) in docs:
                continue
            for match in VLLM_VOCABULARY.finditer(node.value):
                if (rel, match.group(0)) not in VOCABULARY_ALLOWED:
                    found.append(f"{rel}:{node.lineno}: {match.group(0)!r}")
    assert not found, "vLLM's vocabulary outside autotune/engines/vllm/: " + ", ".join(found)


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
