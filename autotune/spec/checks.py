"""The value checks of study specs (:mod:`autotune.spec.load`): numbers and their bounds, the words
a launch carries and their total, the storage scheme and the ``roofline`` section. Each failure
is one :class:`~autotune.errors.SpecError` naming the file and the key (``YamlDoc.error``)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import NoSuchModuleError

from autotune._yaml import YamlDoc, check_keys, number
from autotune.errors import SpecError
from autotune.model.roofline import get_device
from autotune.space.addresses import any_address
from autotune.space.load import MAX_ARG_BYTES, RESERVED_FLAGS, flag_name, owning_flag
from autotune.space.model import Parameter, SearchSpace

if TYPE_CHECKING:
    from autotune.engines.base import Engine
    from autotune.spec.model import EngineSpec


def launch_word(doc: YamlDoc, key: str, value: Any, prefix: str = "") -> None:
    """A command word or env value: text or a finite number, short enough for Linux to pass
    (one longer word failed every launch with "Argument list too long")."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise doc.error(key, f"must be a string, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise doc.error(key, f"must be a finite number, got {value!r}")
    if len((prefix + str(value)).encode()) >= MAX_ARG_BYTES:
        raise doc.error(
            key, f"longer than a command-line word can be ({MAX_ARG_BYTES - 1:,} bytes)"
        )


#: the flags a command template (an engine with no default command) places itself, and the
#: placeholder its value must come from
_PLACED = {"--host": "{host}", "--port": "{port}"}


def check_fixed_args(
    doc: YamlDoc, engine_cls: type[Engine], engine: EngineSpec, space: SearchSpace
) -> None:
    """``engine.command`` and ``engine.args`` leave to autotune what it sets per launch.

    ``engine.args`` come after autotune's own flags (and before the tuned ones), and a parser
    takes the last of a repeated flag: ``[--host, 0.0.0.0]`` opened vLLM's server to the
    network, and ``--port 80`` moved it where autotune never looked. Refused in
    ``engine.args``, whatever the spelling (``--host=...``, ``--served_model_name``, an
    unambiguous prefix such as ``--hos``, which vLLM's parser reads as ``--host``): the flags
    every launch owns (:data:`~autotune.space.load.RESERVED_FLAGS`), the engine's own
    (``own_flags``) and those the command template sets from a placeholder. A command template
    (the ``command`` engine) places the address itself: there ``--host``/``--port`` must take
    ``{host}``/``{port}``, in ``command`` or ``args``; and a word that names every interface
    (``0.0.0.0``, ``::``, ``0:8000``, or ``0`` after ``--bind``: :mod:`autotune.space.addresses`)
    is refused anywhere.

    A flag the search space tunes may stay in ``engine.args``: it is the value a launch runs
    with while its parameter is left out (null, or a ``when`` that does not hold), and a tuned
    value, placed after it, wins (the export says which place each flag comes from)."""
    template = engine_cls.default_command is None
    owned = {
        flag_name(flag) or flag: why
        for flag, why in {**RESERVED_FLAGS, **engine_cls.own_flags}.items()
    }
    command = engine.command
    for flag, word in zip(command, (*command[1:], ""), strict=True):
        name = flag_name(flag)
        filled = flag.split("=", 1)[1] if "=" in flag else word  # --model={served_name} too
        if name and name not in owned and re.search(r"\{[a-z_]+\}", filled):
            written = flag if "=" in flag else f"{flag} {word}"
            owned[name] = f"the spec's engine command sets it ({written})"
    for what, words in (("command", command), ("args", engine.args)):
        for index, word in enumerate(words):
            key = f"engine.{what}[{index}]"
            before = words[index - 1] if index else ""
            if any_address(word, before if before.startswith("-") else None):
                raise doc.error(
                    key,
                    f"{word!r} listens on every network interface: autotune's servers listen "
                    "on 127.0.0.1 only, the address it gives each launch",
                )
            name = flag_name(word) or _short_flag(word, engine_cls.short_flags)
            if name is None:
                continue
            value = word.split("=", 1)[1] if "=" in word else _next(words, index)
            if template and name in _PLACED:
                if _PLACED[name] not in value:
                    raise doc.error(
                        key,
                        f"{name} must take its value from {_PLACED[name]} (autotune gives each "
                        f"server its address, on 127.0.0.1), got {name} {value!r}",
                    )
                continue
            # the command comes before autotune's own flags (vLLM, llama.cpp), which replace its
            # copies; or it is the template that places them (the command engine)
            problem = _owned_problem(word, name, owned) if what == "args" else None
            if problem:
                raise doc.error(key, problem)


def _short_flag(word: str, short_flags: Mapping[str, str]) -> str | None:
    """The long flag a short spelling sets (``-m`` or ``-m=x`` for llama.cpp's ``--model``)."""
    return short_flags.get(word.split("=", 1)[0]) if word.startswith("-") else None


def _next(words: Sequence[str], index: int) -> str:
    return words[index + 1] if index + 1 < len(words) else ""


def _owned_problem(word: str, name: str, owned: Mapping[str, str]) -> str | None:
    flag = owning_flag(name, owned)
    if flag is None:
        return None
    if flag == name:
        return f"{word!r} sets {name}, which autotune sets itself: {owned[name]}"
    return f"{word!r} is read as {flag} (a prefix of it), which autotune sets itself: {owned[flag]}"


#: Linux's ceiling on one launch's argv and environment together, whatever the stack limit:
#: 3/4 of the default 8 MiB stack (fs/exec.c, ``_STK_LIM / 4 * 3``). glibc's
#: ``sysconf(_SC_ARG_MAX)`` is the stack limit / 4, unbounded with ``ulimit -s unlimited``
ARG_MAX_CAP = 6 * 1024 * 1024
#: bytes of every launch the worst case below does not see, kept free: the kernel's copy of
#: the program's path (PATH_MAX), a ``#!`` script's interpreter line and path (256 +
#: PATH_MAX), a parallel worker's device variables and a profiling run's config flag (4 KiB)
LAUNCH_SLACK = 4096 + 256 + 4096 + 4096
#: the longest text Python writes for a float (``-1.2345678901234567e-100``): what a float
#: parameter may put on the command line, whatever its bounds
_LONGEST_FLOAT = -1.2345678901234567e-100
#: an address and a key at least as long as any launch gets (``trial.py``: 127.0.0.1, 48 hex)
_WIDEST_ADDRESS = {"host": "255.255.255.255", "port": 65535, "api_key": "k" * 64}


def arg_max() -> int | None:
    """The kernel's limit on a launch's argv + environment (``getconf ARG_MAX``, at most
    :data:`ARG_MAX_CAP`), or None where the platform does not say."""
    try:
        limit = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        return None
    return min(limit, ARG_MAX_CAP) if limit > 0 else None


def exec_bytes(argv: Iterable[str], env: Mapping[str, str]) -> int:
    """What ``execve`` counts against ARG_MAX: each argv and ``NAME=value`` string with its
    NUL, and a pointer to each (fs/exec.c); the program's path is in :data:`LAUNCH_SLACK`."""
    strings = [*argv, *(f"{k}={v}" for k, v in env.items())]
    pointer = struct.calcsize("P")
    return sum(len(os.fsencode(text)) + 1 + pointer for text in strings)


def check_launch_size(doc: YamlDoc, space: SearchSpace, engine: Engine) -> None:
    """The longest launch the engine can make from ``space`` fits the kernel's ARG_MAX.

    Each word is checked on its own (``launch_word``, ``space.load._unlaunchable``), but the
    kernel limits their total: over it, every launch failed with E2BIG ("Argument list too
    long"), each trial recorded as a failed start and blamed on the configuration. The worst
    case is built by the engine itself (``build_launch``) from the longest value of every
    parameter, plus the environment autotune runs in, which the server inherits. It is an
    upper bound: ``when`` conditions and constraints may keep those values apart, and a float
    counts as the longest float text. What the engine's launch does not show (the program's
    path, a parallel worker's devices) is :data:`LAUNCH_SLACK`."""
    _check_words(doc, space, engine)
    limit = arg_max()
    if limit is None:
        return
    inherited = exec_bytes((), os.environ)
    fixed = _launch_bytes(engine, space.resolve({})) + inherited
    if fixed + LAUNCH_SLACK > limit:
        raise doc.error(
            "engine",
            f"a launch with no parameter set is {fixed:,} bytes of arguments and environment "
            f"({inherited:,} of them the environment autotune runs in), over the kernel's "
            f"limit of {limit - LAUNCH_SLACK:,} (ARG_MAX {limit:,} less {LAUNCH_SLACK:,} kept "
            'free): every launch would fail with "Argument list too long"',
        )
    widest = {p.name: _widest_value(engine, space, p) for p in space.parameters}
    worst = _launch_bytes(engine, space.resolve(widest)) + inherited
    if worst + LAUNCH_SLACK <= limit:
        return
    base = fixed - inherited
    shares = sorted(
        ((_launch_bytes(engine, space.resolve({n: v})) - base, n) for n, v in widest.items()),
        reverse=True,
    )
    largest = ", ".join(f"{name} {size:,}" for size, name in shares[:3])
    raise SpecError(
        f"the longest launch of this space is {worst:,} bytes of arguments and environment "
        f"(the longest value of every parameter together; {inherited:,} bytes are the "
        f"environment autotune runs in), over the kernel's limit of {limit - LAUNCH_SLACK:,} "
        f"(ARG_MAX {limit:,} less {LAUNCH_SLACK:,} kept free): such trials would fail to "
        f'start with "Argument list too long". The largest parameters, in bytes: {largest}',
        file=str(space.path),
        key="parameters",
    )


def _check_words(doc: YamlDoc, space: SearchSpace, engine: Engine) -> None:
    """Each word of the launch, and each ``NAME=value`` of its env, within Linux's limit on one
    (MAX_ARG_STRLEN): each key is checked on its own (``launch_word``), but a template fills
    ``{served_name}`` into a longer word, and a JSON flag joins several parameters' values."""
    model = engine.model_spec
    for values, file, fallback in (({}, doc.path, "engine"), (None, space.path, "parameters")):
        if values is None:
            values = {p.name: _widest_value(engine, space, p) for p in space.parameters}
        launch = engine.build_launch(space.resolve(values), **_WIDEST_ADDRESS)
        for word in (*launch.argv, *(f"{k}={v}" for k, v in launch.env.items())):
            size = len(os.fsencode(word))
            if size < MAX_ARG_BYTES:
                continue
            key = next(
                (
                    f"model.{name}"
                    for name, value in (
                        ("served_name", model.served_name),
                        ("path", model.path),
                        ("tokenizer", model.tokenizer),
                    )
                    if value and fallback == "engine" and value in word
                ),
                fallback,
            )
            where = "with no parameter set" if fallback == "engine" else "of this space"
            raise SpecError(
                f"a launch {where} has a word of {size:,} bytes ({word[:40]!r}...): longer than "
                f"one command-line argument or environment variable can be "
                f'({MAX_ARG_BYTES - 1:,} bytes); it would fail with "Argument list too long"',
                file=str(file),
                key=key,
                line=doc.line(key) if fallback == "engine" else None,
            )


def _launch_bytes(engine: Engine, settings: Any) -> int:
    """The launch's argv and the env it adds (the inherited environment is counted apart)."""
    launch = engine.build_launch(settings, **_WIDEST_ADDRESS)
    return exec_bytes(launch.argv, {"PYTHONUNBUFFERED": "1", **launch.env})


def _widest_value(engine: Engine, space: SearchSpace, param: Parameter) -> Any:
    """The value of ``param`` whose launch is longest. A number's text is longest at an end
    of its range (more digits, or a minus sign); a float's may be longer anywhere."""
    if param.type in ("categorical", "int_list"):
        values = [list(c) if param.type == "int_list" else c for c in param.choices]
    elif param.type == "bool":
        values = [False, True]
    else:
        values = [param.low, param.high] + ([_LONGEST_FLOAT] if param.type == "float" else [])
    return max(values, key=lambda v: _launch_bytes(engine, space.resolve({param.name: v})))


def unknown_scheme(url: str) -> str | None:
    """Why SQLAlchemy knows no database ``url`` names (``foo://``), or None."""
    try:
        make_url(url).get_dialect()
    except NoSuchModuleError:
        return f"unknown database scheme {url.split(':', 1)[0]!r} (sqlite, postgresql, mysql...)"
    except Exception:  # noqa: BLE001 - check_url judged the URL; the storage opens it later
        return None
    return None


_ROOFLINE_NUMBERS = {
    "bandwidth_gbs": (False, False),  # (integer, zero allowed)
    "tp": (True, False),
    "context": (True, True),
    "efficiency": (False, False),
    "active_params": (False, False),
    "bits": (False, False),
    "kv_bytes_per_token": (False, True),
    "kv_split_ways": (True, False),
}


def roofline_section(doc: YamlDoc, raw: Any) -> dict[str, Any]:
    """The ``roofline`` section, checked now: it was read only after the study was created
    (a list, a mistyped key or an unknown device failed there, or raised a TypeError). Its
    numbers as numbers: YAML 1.1 reads ``40.0e9`` (no sign after the e) as a string."""
    if raw is None:
        return {}
    out = dict(check_keys(doc, raw, "roofline", {"device", *_ROOFLINE_NUMBERS}))
    for name, (integer, zero) in _ROOFLINE_NUMBERS.items():
        if name not in out:
            continue
        value = out[name]
        if isinstance(value, str):
            with contextlib.suppress(ValueError):  # else refused below, as any non-number
                value = float(value)
        value = number(doc, f"roofline.{name}", value, positive=not zero, integer=integer)
        out[name] = int(value) if integer else float(value)
    if out.get("efficiency", 1) > 1:
        raise doc.error("roofline.efficiency", f"a fraction in (0, 1], got {out['efficiency']!r}")
    if "device" in out:
        if not isinstance(out["device"], str):
            raise doc.error("roofline.device", f"must be a device name, got {out['device']!r}")
        try:
            get_device(out["device"])
        except KeyError as exc:
            raise doc.error("roofline.device", str(exc.args[0])) from None
    elif "bandwidth_gbs" not in out:
        raise doc.error("roofline", "give device (e.g. h200) or bandwidth_gbs")
    if ("active_params" in out) != ("bits" in out):
        raise doc.error("roofline", "give both active_params and bits, or neither (model read)")
    return out
