"""Patch metadata, discovery and application: patches as a tunable search dimension.

A *patch* is a small Python module that changes one behaviour of the inference engine in its own
process (monkeypatching). Treating patches as search parameters lets autotune answer the question
that the motivating GLM-5 story got wrong by hand: which of the patches applied together is
actually needed (the GGUF shard-ordering fix) and which one is not (the MLA direct-call bypass),
and which one silently breaks the output (the correctness gate must reject it).

The module contract (see ``patches/README.md``) is::

    PATCH = PatchInfo(name=..., kind=..., engine="vllm", versions=">=0.32", targets=(...),
                      rationale=..., choices=(...), default=...)

    def apply(value) -> None: ...

This module is deliberately stdlib-only and cheap to import: the vLLM general plugin
(``autotune.engines.vllm.plugin``) imports it in every vLLM process, and a failed *import* of a
vLLM plugin is only logged by vLLM (the server would then run unpatched), so nothing here may
pull in heavy or optional dependencies at import time. ``packaging`` is used when importable.

Failures are loud by design. Every applied patch prints
``AUTOTUNE_PATCH_APPLIED name=<n> value=<v> pid=<pid>`` to stderr, and every refusal prints
``AUTOTUNE_PATCH_FAILED name=<n> reason=<text>`` and raises :class:`PatchError`, so a trial can
never measure an unpatched server while believing it is patched.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "KINDS",
    "RISKY_KINDS",
    "SAFE_KINDS",
    "LoadedPatch",
    "PatchError",
    "PatchInfo",
    "apply_patches",
    "applied_patches",
    "discover_patches",
    "format_value",
    "pin_attribute",
    "resolve_target",
    "version_matches",
]

KINDS: tuple[str, ...] = ("fix", "optimization", "experimental", "fault")
"""Why a patch exists. ``fault`` patches break things on purpose (to prove the gate works)."""

SAFE_KINDS: tuple[str, ...] = ("fix", "optimization")
"""Kinds whose patches the guide may try early (a fix or an optimization is meant to be right)."""

RISKY_KINDS: tuple[str, ...] = ("experimental", "fault")
"""Kinds whose non-default choices the strategy treats as risky (unproven, or broken on
purpose): kept out of its first design and started with a prior penalty. Every kind is one
or the other."""

ENGINES: tuple[str, ...] = ("vllm",)

APPLIED_MARKER = "AUTOTUNE_PATCH_APPLIED"
FAILED_MARKER = "AUTOTUNE_PATCH_FAILED"

#: env vars that select patches inside every engine process: a JSON object name -> value, and
#: the ``os.pathsep``-separated directories to find them in (set by ``Engine.patch_env``, read by
#: the engine's plugin, e.g. ``engines/vllm/plugin.py``)
PATCHES_ENV = "AUTOTUNE_PATCHES"
PATCH_DIRS_ENV = "AUTOTUNE_PATCH_DIRS"

#: a patch's name (``PatchInfo.name``, a space's ``patch`` target), matched whole
PATCH_NAME = re.compile(r"[a-z][a-z0-9_]*")


class PatchError(RuntimeError):
    """A patch could not be discovered, validated or applied.

    ``name`` is the patch name (``"*"`` when the failure is not about one patch).
    """

    def __init__(self, message: str, name: str = "*") -> None:
        super().__init__(message)
        self.name = name


@dataclass(frozen=True)
class PatchInfo:
    """Declarative facts about one patch, checked before anything is applied.

    ``targets`` are the dotted paths of the symbols the patch replaces or relies on
    (``package.module.Class.attr``). They are resolved *before* applying, so a patch written for
    another engine version fails with the missing symbol's name instead of half-applying.
    ``versions`` is a PEP 440 specifier set (``">=0.32"``, ``"<0.24"``; empty means any).
    ``choices`` are the values the search space may give; ``default`` is the value that means
    "leave the engine as it is" and applies nothing.
    """

    name: str
    kind: str
    engine: str
    versions: str
    targets: tuple[str, ...]
    rationale: str
    choices: tuple[Any, ...]
    default: Any

    def __post_init__(self) -> None:
        if not PATCH_NAME.fullmatch(self.name):
            raise PatchError(f"patch name {self.name!r} must match {PATCH_NAME.pattern}", "*")
        if self.kind not in KINDS:
            raise PatchError(f"kind {self.kind!r} is not one of {KINDS}", self.name)
        if self.engine not in ENGINES:
            raise PatchError(f"engine {self.engine!r} is not one of {ENGINES}", self.name)
        if not isinstance(self.targets, tuple) or not all(
            isinstance(t, str) and "." in t for t in self.targets
        ):
            raise PatchError("targets must be a tuple of dotted paths", self.name)
        if not isinstance(self.choices, tuple) or len(self.choices) < 2:
            raise PatchError("choices must be a tuple of at least two values", self.name)
        if not _in_choices(self.default, self.choices):
            raise PatchError(f"default {self.default!r} is not in choices", self.name)
        if "\n" in self.rationale:
            raise PatchError("rationale must be one line", self.name)
        _parse_specifier(self.versions, self.name)  # fail early on a malformed specifier


@dataclass(frozen=True)
class LoadedPatch:
    """A discovered patch module: its metadata, its ``apply`` function and where it came from."""

    info: PatchInfo
    apply: Callable[[Any], None]
    path: Path
    module_name: str


# --------------------------------------------------------------------------- values and versions


def _in_choices(value: Any, choices: Iterable[Any]) -> bool:
    """Strict membership: ``True`` is not ``1`` and ``"1"`` is not ``1``.

    Python's ``True == 1`` would otherwise let a JSON ``1`` select a boolean patch.
    """
    return any(type(c) is type(value) and c == value for c in choices)


def format_value(value: Any) -> str:
    """The value as it appears in markers: JSON (``true``, ``"direct_call"`` -> ``direct_call``)."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _parse_specifier(spec: str, name: str) -> Any:
    """Parse a PEP 440 specifier set with ``packaging`` when available, else a minimal parser."""
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
    except ImportError:  # pragma: no cover - packaging is installed alongside pip/vLLM
        return _MiniSpecifierSet(spec, name)
    try:
        return SpecifierSet(spec)
    except InvalidSpecifier as exc:
        raise PatchError(f"invalid versions specifier {spec!r}: {exc}", name) from exc


class _MiniSpecifierSet:
    """Fallback for ``>=``, ``>``, ``<=``, ``<``, ``==``, ``!=`` on numeric release versions."""

    _OPS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
        ">=": lambda a, b: a >= b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        "<": lambda a, b: a < b,
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
    }

    def __init__(self, spec: str, name: str) -> None:
        self.clauses: list[tuple[str, tuple[int, ...]]] = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            m = re.match(r"^(>=|<=|==|!=|>|<)\s*([0-9][0-9.]*)$", part)
            if not m:
                raise PatchError(f"invalid versions specifier {spec!r}", name)
            self.clauses.append((m.group(1), _release(m.group(2))))

    def contains(self, version: str, prereleases: bool = True) -> bool:
        del prereleases
        v = _release(version)
        width = max([len(v)] + [len(c[1]) for c in self.clauses])
        pad = lambda t: t + (0,) * (width - len(t))  # noqa: E731
        return all(self._OPS[op](pad(v), pad(ref)) for op, ref in self.clauses)


def _release(version: str) -> tuple[int, ...]:
    m = re.match(r"^\s*v?([0-9]+(?:\.[0-9]+)*)", version)
    if not m:
        raise PatchError(f"cannot read version {version!r}")
    return tuple(int(x) for x in m.group(1).split("."))


def version_matches(spec: str, version: str) -> bool:
    """True when ``version`` (e.g. ``"0.32.0"`` or ``"0.32.0+cpu"``) satisfies ``spec``.

    Pre-releases and dev builds count: people patch exactly those engines.
    """
    if not spec.strip():
        return True
    return bool(_parse_specifier(spec, "*").contains(version, prereleases=True))


# --------------------------------------------------------------------------- target resolution


def resolve_target(dotted: str) -> tuple[Any, str, Any]:
    """Resolve ``package.module.Class.attr`` to ``(owner, attr, value)``.

    The longest importable module prefix is imported, then the rest is walked with ``getattr``.
    A module that exists but fails to import for another reason (a missing dependency) is
    reported as such, not as a missing symbol, because the fix differs.
    Raises :class:`PatchError` naming ``dotted`` when anything is missing.
    """
    parts = dotted.split(".")
    if len(parts) < 2 or not all(parts):
        raise PatchError(f"target {dotted!r} is not a dotted path to an attribute")
    module: Any = None
    split = 0
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing and module_name != missing and not module_name.startswith(missing + "."):
                raise PatchError(
                    f"target {dotted} could not be checked: importing {module_name} needs "
                    f"missing module {missing}"
                ) from exc
            continue
        except Exception as exc:
            raise PatchError(
                f"target {dotted} could not be checked: importing {module_name} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        split = i
        break
    if module is None:
        raise PatchError(f"missing target {dotted}: module {parts[0]} is not importable")
    owner: Any = module
    walked = ".".join(parts[:split])
    for attr in parts[split:-1]:
        if not hasattr(owner, attr):
            raise PatchError(f"missing target {dotted}: {walked} has no attribute {attr}")
        owner = getattr(owner, attr)
        walked = f"{walked}.{attr}"
    attr = parts[-1]
    # Class attributes are looked up in the class __dict__ chain so that a descriptor (property,
    # staticmethod) is returned as such instead of being invoked.
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                return owner, attr, vars(klass)[attr]
    if not hasattr(owner, attr):
        raise PatchError(f"missing target {dotted}: {walked} has no attribute {attr}")
    return owner, attr, getattr(owner, attr)


def pin_attribute(cls: type, attr: str, value: Any) -> None:
    """Make ``instance.attr`` read ``value`` for every instance of ``cls``, whatever ``__init__``
    assigns.

    Engines often decide a code path once in ``__init__`` (``self.use_direct_call = ...``).
    Replacing the whole ``__init__`` would copy hundreds of version-specific lines; a class-level
    property wins over instance assignments (data descriptors take precedence over the instance
    ``__dict__``), so the decision is overridden without touching ``__init__``. What the engine
    wanted to assign is kept in ``instance.__dict__["_autotune_upstream_<attr>"]`` for debugging.
    The property only returns a constant, which ``torch.compile`` traces like a literal.
    """
    upstream_key = f"_autotune_upstream_{attr}"

    def _get(self: Any) -> Any:
        return value

    def _set(self: Any, new: Any) -> None:
        self.__dict__[upstream_key] = new

    prop = property(_get, _set, doc=f"pinned to {value!r} by autotune")
    setattr(cls, attr, prop)


# --------------------------------------------------------------------------- discovery


def _module_name_for(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return f"autotune_patch_{path.stem}_{digest}"


def _load_module(path: Path) -> Any:
    module_name = _module_name_for(path)
    cached = sys.modules.get(module_name)
    if cached is not None:
        return cached
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PatchError(f"cannot import patch module {path}")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec so that dataclasses, pickling and relative lookups inside the patch
    # see a real module, and so a second discovery in the same process reuses it (patch modules
    # may keep state such as the original function they wrapped).
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise PatchError(
            f"importing patch module {path} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def discover_patches(dirs: Iterable[str | os.PathLike[str]]) -> dict[str, LoadedPatch]:
    """Import every ``*.py`` (not starting with ``_``) in ``dirs`` and collect their ``PATCH``.

    Only the given directories are searched: which code may be injected into the engine is the
    user's explicit choice, never an accident of ``sys.path``. Modules are imported by file path,
    so the directories need not be packages. A module without ``PATCH``/``apply``, or two modules
    declaring the same name, is an error (silently picking one would make results depend on
    directory order).
    """
    found: dict[str, LoadedPatch] = {}
    for d in dirs:
        directory = Path(d).expanduser().resolve()
        if not directory.is_dir():
            raise PatchError(f"patch directory {directory} does not exist")
        for path in sorted(directory.glob("*.py")):
            if path.name.startswith("_"):
                continue
            module = _load_module(path)
            info = getattr(module, "PATCH", None)
            apply_fn = getattr(module, "apply", None)
            if not isinstance(info, PatchInfo):
                raise PatchError(f"patch module {path} defines no PATCH = PatchInfo(...)")
            if not callable(apply_fn):
                raise PatchError(f"patch module {path} defines no apply(value)", info.name)
            if info.name in found:
                raise PatchError(
                    f"patch name {info.name} is declared by both {found[info.name].path} "
                    f"and {path}",
                    info.name,
                )
            found[info.name] = LoadedPatch(info, apply_fn, path, module.__name__)
    return found


# --------------------------------------------------------------------------- application

_LOCK = threading.RLock()
# name -> (value, module path) of what this process has applied; shared by forked children, which
# inherit the patched classes too, so re-applying there would wrap twice.
_APPLIED: dict[str, tuple[Any, Path]] = {}


def applied_patches() -> dict[str, Any]:
    """What this process has applied so far (name -> value)."""
    with _LOCK:
        return {name: value for name, (value, _) in _APPLIED.items()}


def _marker(line: str) -> None:
    # stderr is unbuffered-ish but may be a pipe: flush so the marker reaches the server log even
    # when the process dies right after.
    print(line, file=sys.stderr, flush=True)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(name: str, reason: str, cause: BaseException | None = None) -> PatchError:
    reason = _one_line(reason)
    _marker(f"{FAILED_MARKER} name={name} reason={reason}")
    err = PatchError(reason, name)
    if cause is not None:
        err.__cause__ = cause
    return err


def _check_one(
    loaded: LoadedPatch | None, name: str, value: Any, engine: str, version: str
) -> None:
    if loaded is None:
        raise _fail(name, f"unknown patch {name}")
    info = loaded.info
    if not _in_choices(value, info.choices):
        choices = ", ".join(format_value(c) for c in info.choices)
        raise _fail(name, f"value {format_value(value)} is not one of ({choices})")
    if info.engine != engine:
        raise _fail(name, f"patch is for engine {info.engine}, not {engine}")
    if _in_choices(value, (info.default,)):
        return
    missing: list[str] = []
    for target in info.targets:
        try:
            resolve_target(target)
        except PatchError as exc:
            missing.append(str(exc))
    if not version_matches(info.versions, version):
        detail = f"; {'; '.join(missing)}" if missing else ""
        raise _fail(name, f"{engine} {version} does not satisfy versions {info.versions!r}{detail}")
    if missing:
        raise _fail(name, "; ".join(missing))


def apply_patches(
    selection: Mapping[str, Any],
    dirs: Iterable[str | os.PathLike[str]],
    engine_version: str,
    engine: str = "vllm",
) -> list[str]:
    """Validate and apply the selected patches; return the names applied in this call.

    All selected patches are checked first (known name, value in choices, engine, version
    specifier, every declared target resolvable) and only then applied, so a bad selection
    leaves the process untouched. A value equal to the patch's default applies nothing.
    Applying the same name and value twice in one process is a no-op (vLLM may call plugins
    more than once, and forked children inherit what the parent applied); a different value for
    an already applied patch cannot be undone and is an error.
    """
    with _LOCK:
        try:
            patches = discover_patches(dirs)
        except PatchError as exc:
            raise _fail(exc.name, str(exc), exc) from exc
        for name in sorted(selection):
            _check_one(patches.get(name), name, selection[name], engine, engine_version)
        applied: list[str] = []
        for name in sorted(selection):
            value = selection[name]
            loaded = patches[name]
            if _in_choices(value, (loaded.info.default,)):
                continue
            previous = _APPLIED.get(name)
            if previous is not None:
                if _in_choices(value, (previous[0],)) and previous[1] == loaded.path:
                    continue
                raise _fail(
                    name,
                    f"already applied with value {format_value(previous[0])} from {previous[1]}"
                    f" in this process; cannot switch to {format_value(value)}",
                )
            try:
                loaded.apply(value)
            except Exception as exc:
                raise _fail(name, f"apply failed: {type(exc).__name__}: {exc}", exc) from exc
            _APPLIED[name] = (value, loaded.path)
            _marker(f"{APPLIED_MARKER} name={name} value={format_value(value)} pid={os.getpid()}")
            applied.append(name)
        return applied


def _forget_applied_for_tests() -> None:
    """Clear the record of applied patches (tests undo the patched symbols themselves)."""
    with _LOCK:
        _APPLIED.clear()
