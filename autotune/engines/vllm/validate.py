"""``autotune validate`` for vLLM: check a search space against the *installed* vLLM.

A trial that dies because a flag is misspelled, a JSON key does not exist or an env var is
ignored costs minutes of server start-up (on the GLM-5 case, many minutes of weight loading) and
teaches the sampler nothing. Worse, a misspelled env var (``NCCL_PROTOCOL``) is *silently
ignored*, so a whole dimension of the study would measure noise. Every parameter is therefore
checked before the first trial, with the engine's own machinery, never with a copy of its rules:

* **flag** targets: vLLM's own CLI parser, built exactly as the OpenAI server builds it
  (``vllm.entrypoints.launchers.cli_args.make_arg_parser(FlexibleArgumentParser())``). The flag
  must exist (unknown ones get a close-match suggestion); every domain value is turned into the
  argv autotune would really pass (``SearchSpace.resolve`` + ``ServerSettings.flag_argv``) and
  must parse. A value the parser accepts is then checked against the config class the flag's
  argument group belongs to (``--gpu-memory-utilization`` -> ``CacheConfig``,
  ``--attention-backend`` -> ``AttentionConfig.backend``), because those field validators only
  run at engine start. Parsing never touches a GPU, so GPU-only flags validate on the CPU build.
* **json** targets (a key inside ``--compilation-config`` etc.): the flag must exist, the
  (dotted) key must be a field of the config class the flag maps to (found from the type of the
  ``EngineArgs`` / ``VllmConfig`` field of the same name; nested dataclasses are walked), and
  each value must construct that class (pydantic field validators run; their message is shown).
* **env** targets: ``vllm.envs.environment_variables`` (each value is also read through vLLM's
  own getter, which rejects values outside ``env_with_choices``), a documented list of NCCL
  variables with value checks for the enumerated ones, and a short list of runtime variables.
* **patch** targets: the patch exists in ``patch_dirs`` (``autotune.patching``), the parameter's
  values are among the patch's choices, the installed vLLM is within the patch's ``versions``,
  and every target symbol resolves in the installed vLLM.

Importing vLLM takes seconds, so it happens lazily and once per process (:func:`_context`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import io
import json
import logging
import os
import sys
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from autotune.engines.base import ValidationIssue
from autotune.engines.vllm.env_vars import (
    NCCL_ENV,
    OTHER_ENV,
    OTHER_ENV_PREFIXES,
    RENAMED_ENV,
)
from autotune.engines.vllm.version import installed_vllm_version
from autotune.patching import discover_patches, resolve_target, version_matches
from autotune.space.model import Parameter, SearchSpace
from autotune.space.settings import merge_json_key

#: placeholder model for parsing; parsing never opens it
_MODEL_ARGV = ("--model", "autotune-validate-placeholder")
#: errors reported per parameter before the rest are summarised
_MAX_ERRORS_PER_PARAM = 3
#: argument groups whose config classes must not be constructed in-process: ``ModelConfig``
#: resolves its (default) model from the Hugging Face hub in ``__post_init__``, ``VllmConfig``
#: builds everything; their flags are checked by the parser only.
_UNCONSTRUCTIBLE = frozenset({"ModelConfig", "VllmConfig"})

# --- the lazily imported vLLM ---------------------------------------------------------------


class _ParseError(Exception):
    """Raised instead of argparse's print-and-exit, so validation can collect the message."""


@dataclass
class _VllmContext:
    """Everything taken from vLLM, built once: the server's parser and the lookup tables."""

    parser: argparse.ArgumentParser
    actions: dict[str, argparse.Action]
    group_of: dict[str, str]
    envs: dict[str, Callable[[], Any]]
    version: str | None
    engine_args: type
    vllm_config: type
    config_module: Any
    validation_error: type[Exception]
    baseline_errors: dict[type, type | None] = field(default_factory=dict)


@cache
def _context() -> _VllmContext:
    """Import vLLM and build its server parser (seconds; cached for the process)."""
    with _quiet():
        import pydantic
        import vllm.config as config_module
        import vllm.envs as vllm_envs
        from vllm.engine.arg_utils import EngineArgs
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = make_arg_parser(FlexibleArgumentParser(description="autotune validate"))

    def _raise(message: str) -> typing.NoReturn:
        raise _ParseError(message)

    parser.error = _raise  # type: ignore[method-assign]
    actions = {opt: action for action in parser._actions for opt in action.option_strings}
    group_of = {
        action.dest: group.title or ""
        for group in parser._action_groups
        for action in group._group_actions
    }
    return _VllmContext(
        parser=parser,
        actions=actions,
        group_of=group_of,
        envs=dict(vllm_envs.environment_variables),
        version=installed_vllm_version(),
        engine_args=EngineArgs,
        vllm_config=config_module.VllmConfig,
        config_module=config_module,
        validation_error=pydantic.ValidationError,
    )


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence vLLM's logging and stray prints while it is imported or asked questions."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        logging.disable(previous)


# --- entry point ------------------------------------------------------------------------------


def validate_space(
    space: SearchSpace, patch_dirs: Iterable[str | os.PathLike[str]] = ()
) -> list[ValidationIssue]:
    """One :class:`ValidationIssue` per parameter, in declaration order; ``error`` None = OK."""
    try:
        ctx = _context()
    except Exception as exc:  # vLLM missing or broken: every parameter is unverifiable
        reason = f"cannot load vLLM to validate against: {type(exc).__name__}: {exc}"
        return [ValidationIssue(p.name, p.target.describe(), reason) for p in space.parameters]
    patches = _PatchCatalog(list(patch_dirs), ctx.version)
    issues = []
    for param in space.parameters:
        kind = param.target.kind
        try:
            if kind == "flag":
                errors = _check_flag(ctx, space, param)
            elif kind == "json":
                errors = _check_json(ctx, space, param)
            elif kind == "env":
                errors = _check_env(ctx, space, param)
            else:
                errors = patches.check(param)
        except Exception as exc:  # a bug or an odd vLLM must not hide the other parameters
            errors = [f"could not be checked: {type(exc).__name__}: {_one_line(exc)}"]
        issues.append(ValidationIssue(param.name, param.target.describe(), _summary(errors)))
    return issues


def _summary(errors: list[str]) -> str | None:
    unique = list(dict.fromkeys(errors))
    if not unique:
        return None
    text = "; ".join(unique[:_MAX_ERRORS_PER_PARAM])
    if len(unique) > _MAX_ERRORS_PER_PARAM:
        text += f"; (+{len(unique) - _MAX_ERRORS_PER_PARAM} more)"
    return text


def domain_values(param: Parameter) -> list[Any]:
    """The values that stand for the whole domain: every choice, both bounds, both booleans.

    Checking ``low`` and ``high`` is enough for the parser's type and range rules, which are
    intervals; categorical domains are checked exhaustively.
    """
    if param.type == "bool":
        return [True, False]
    if param.type == "int":
        return [int(param.low), int(param.high)]  # type: ignore[arg-type]
    if param.type == "float":
        return [float(param.low), float(param.high)]  # type: ignore[arg-type]
    if param.type == "int_list":
        return [list(c) for c in param.choices]
    return list(param.choices)


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _one_line(text: object, limit: int = 400) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# --- flags ------------------------------------------------------------------------------------


def _flag_action(ctx: _VllmContext, flag: str) -> argparse.Action | None:
    """The parser action for ``flag``, with vLLM's underscore/dash equivalence."""
    return ctx.actions.get("--" + flag[2:].replace("_", "-")) or ctx.actions.get(flag)


def _unknown_flag(ctx: _VllmContext, flag: str) -> str:
    options = [o for o in ctx.actions if o.startswith("--")]
    close = difflib.get_close_matches(flag.replace("_", "-"), options, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{flag} is not a flag of vLLM {ctx.version}{hint}"


def _parse(ctx: _VllmContext, argv: Sequence[str]) -> tuple[argparse.Namespace | None, str | None]:
    """Parse ``argv`` with vLLM's server parser: the namespace, or the parser's message."""
    try:
        with _quiet():
            return ctx.parser.parse_args([*_MODEL_ARGV, *argv]), None
    except _ParseError as exc:
        return None, _one_line(exc)
    except SystemExit as exc:  # a parser path that bypasses .error()
        return None, f"the parser exited ({exc.code})"
    except Exception as exc:  # a type function raising KeyError etc.
        return None, f"{type(exc).__name__}: {_one_line(exc)}"


def _check_flag(ctx: _VllmContext, space: SearchSpace, param: Parameter) -> list[str]:
    target = param.target
    if "." in target.name:  # --compilation-config.mode style: a JSON key spelled as a flag
        flag, key = target.name.split(".", 1)
        return _check_json_key(ctx, space, param, flag, key)
    action = _flag_action(ctx, target.name)
    if action is None:
        return [_unknown_flag(ctx, target.name)]
    errors: list[str] = []
    if target.false_flag and _flag_action(ctx, target.false_flag) is None:
        errors.append(_unknown_flag(ctx, target.false_flag))
    field_check = _config_field_for(ctx, action.dest)
    for value in domain_values(param):
        argv = space.resolve({param.name: value}).flag_argv()
        if not argv:
            continue  # None / False without false_flag: the flag is left out
        namespace, error = _parse(ctx, argv)
        if error:
            if param.type == "int_list" and action.nargs in ("+", "*"):
                error += (
                    " (autotune passes an int_list as one comma-separated value; this "
                    "flag takes space-separated values: target the JSON key instead)"
                )
            errors.append(f"{_show(value)}: {error}")
            continue
        if field_check is not None and namespace is not None:
            cls, field_name = field_check
            parsed = getattr(namespace, action.dest, None)
            if parsed is None or isinstance(parsed, bool):
                continue  # left at its default, or a switch: nothing for a validator
            problem = _construct_error(ctx, cls, {field_name: parsed})
            if problem:
                errors.append(f"{_show(value)}: {problem}")
    return errors


def _config_field_for(ctx: _VllmContext, dest: str) -> tuple[type, str] | None:
    """The config class and field behind a flag, from the parser's argument-group title.

    vLLM's ``EngineArgs.add_cli_args`` files each flag under a group named after its config
    class; the field is the flag's dest or its tail (``attention_backend`` -> ``backend``).
    """
    title = ctx.group_of.get(dest, "")
    if title in _UNCONSTRUCTIBLE:
        return None
    cls = getattr(ctx.config_module, title, None)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    if dest in names:
        return cls, dest
    tails = [n for n in names if dest.endswith("_" + n)]
    return (cls, max(tails, key=len)) if tails else None


# --- config classes ---------------------------------------------------------------------------


def _construct_error(ctx: _VllmContext, cls: type, kwargs: dict[str, Any]) -> str | None:
    """What ``cls(**kwargs)`` says about *these* keys, or None.

    Only errors located at the given keys count: a class that also needs other fields
    (``SchedulerConfig`` needs ``max_model_len``) reports those as ``missing``, which says
    nothing about the value under test. An exception that is not a pydantic error (a
    ``KeyError`` from an enum lookup in a ``before`` validator) counts unless the class
    raises the same kind of exception when built with no arguments at all.
    """
    try:
        with _quiet():
            cls(**kwargs)
    except ctx.validation_error as exc:
        messages = []
        for err in exc.errors():  # type: ignore[attr-defined]
            loc = err.get("loc") or ()
            if err.get("type") == "missing" or not loc or loc[0] not in kwargs:
                continue
            where = ".".join(str(part) for part in loc)
            messages.append(f"{cls.__name__}.{where}: {_one_line(err.get('msg', ''))}")
        return "; ".join(messages) or None
    except Exception as exc:
        if _baseline_error(ctx, cls) is type(exc):
            return None
        detail = f"unknown name {exc}" if isinstance(exc, KeyError) else _one_line(exc)
        hint = _enum_hint(cls, kwargs)
        return f"{cls.__name__} rejects it: {type(exc).__name__}: {detail}{hint}"
    return None


def _baseline_error(ctx: _VllmContext, cls: type) -> type | None:
    if cls not in ctx.baseline_errors:
        try:
            with _quiet():
                cls()
            ctx.baseline_errors[cls] = None
        except Exception as exc:
            ctx.baseline_errors[cls] = type(exc)
    return ctx.baseline_errors[cls]


def _enum_hint(cls: type, kwargs: dict[str, Any]) -> str:
    """For an enum-typed field, the valid names (``CUDAGraphMode``'s members, ...)."""
    if len(kwargs) != 1:
        return ""
    (name,) = kwargs
    for hint in _field_types(cls, name):
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return f" (valid: {', '.join(hint.__members__)})"
    return ""


def _field_types(cls: type, name: str) -> list[Any]:
    """The types a dataclass field may hold, unions and ``Optional`` flattened."""
    for f in dataclasses.fields(cls):
        if f.name != name:
            continue
        hint: Any = f.type
        if isinstance(hint, str):
            module = sys.modules.get(cls.__module__)
            try:
                hint = eval(hint, vars(module) if module else {})  # noqa: S307 - vLLM's own
            except Exception:
                return []
        return _flatten(hint)
    return []


def _flatten(hint: Any) -> list[Any]:
    origin = typing.get_origin(hint)
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        return [t for arg in typing.get_args(hint) for t in _flatten(arg)]
    if origin is typing.Annotated:
        return _flatten(typing.get_args(hint)[0])
    return [hint]


def _dataclass_in(types: Iterable[Any]) -> type | None:
    for t in types:
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            return t
    return None


def _config_class_for_flag(ctx: _VllmContext, dest: str) -> type | None:
    """The config class a JSON flag maps to: the ``EngineArgs`` field's type when that is a
    dataclass (``compilation_config: CompilationConfig``), else the ``VllmConfig`` field's
    (``speculative_config`` is a plain dict in ``EngineArgs`` but ``SpeculativeConfig`` there).
    """
    for owner in (ctx.engine_args, ctx.vllm_config):
        cls = _dataclass_in(_field_types(owner, dest))
        if cls is not None:
            return cls
    return None


# --- json keys --------------------------------------------------------------------------------


def _check_json(ctx: _VllmContext, space: SearchSpace, param: Parameter) -> list[str]:
    assert param.target.key is not None
    return _check_json_key(ctx, space, param, param.target.name, param.target.key)


def _check_json_key(
    ctx: _VllmContext, space: SearchSpace, param: Parameter, flag: str, key: str
) -> list[str]:
    action = _flag_action(ctx, flag)
    if action is None:
        return [_unknown_flag(ctx, flag)]
    cls = _config_class_for_flag(ctx, action.dest)
    if cls is not None:
        problem = _walk_key(cls, key)
        if problem:
            return [problem]
    errors: list[str] = []
    for value in domain_values(param):
        if value is None:
            continue
        obj: dict[str, Any] = {}
        merge_json_key(obj, key, value)
        if cls is not None:
            problem = _construct_error(ctx, cls, obj)
            if problem:
                errors.append(f"{_show(value)}: {problem}")
                continue
        if param.target.kind == "json":
            argv = space.resolve({param.name: value}).flag_argv()
        else:
            argv = [f"{flag}.{key}", _show(value)]
        _, error = _parse(ctx, argv)
        if error:
            errors.append(f"{_show(value)}: {error}")
    return errors


def _walk_key(cls: type, dotted: str) -> str | None:
    """None when ``a.b.c`` names a field path of ``cls``; a dict-typed level ends the walk."""
    owner: type | None = cls
    walked = cls.__name__
    for part in dotted.split("."):
        if owner is None:
            return None  # below a dict / Any field: free-form keys
        names = [f.name for f in dataclasses.fields(owner)]
        if part not in names:
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"{walked} has no field {part!r}{hint}"
        owner = _dataclass_in(_field_types(owner, part))
        walked = f"{walked}.{part}"
    return None


# --- env --------------------------------------------------------------------------------------


def _check_env(ctx: _VllmContext, space: SearchSpace, param: Parameter) -> list[str]:
    name = param.target.name
    texts = [space.resolve({param.name: v}).env.get(name) for v in domain_values(param)]
    values = [t for t in texts if t is not None]
    if name in ctx.envs:
        return [e for t in values if (e := _vllm_env_error(ctx, name, t))]
    for table in (NCCL_ENV, OTHER_ENV):
        if name in table:
            check = table[name]
            if check is None:
                return []
            return [f"{t}: {e}" for t in values if (e := check(t))]
    if name.startswith(OTHER_ENV_PREFIXES):
        return []
    if name in RENAMED_ENV:
        return [f"{name} is not read by vLLM {ctx.version}; use {RENAMED_ENV[name]}"]
    known = [*ctx.envs, *NCCL_ENV, *OTHER_ENV, *RENAMED_ENV]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if close:
        hint = f" (did you mean {close[0]}?"
        if close[0] in RENAMED_ENV:
            hint += f" It is gone too; use {RENAMED_ENV[close[0]]}"
        hint += ")"
    else:
        hint = ""
    return [
        f"{name} is not an environment variable known to vLLM {ctx.version}, NCCL or the "
        f"CUDA/PyTorch runtime; it would be silently ignored{hint}"
    ]


def _vllm_env_error(ctx: _VllmContext, name: str, text: str) -> str | None:
    """Read ``text`` through vLLM's own getter (``env_with_choices`` rejects bad values)."""
    saved = os.environ.get(name)
    os.environ[name] = text
    try:
        with _quiet():
            ctx.envs[name]()
    except Exception as exc:
        return f"{text}: vLLM rejects it: {_one_line(exc)}"
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
    return None


# --- patches ----------------------------------------------------------------------------------


class _PatchCatalog:
    """The patches found in ``patch_dirs``, discovered on first use (importing them runs code)."""

    def __init__(self, dirs: list[str | os.PathLike[str]], version: str | None) -> None:
        self.dirs = dirs
        self.version = version
        self._found: dict[str, Any] | None = None
        self._error: str | None = None

    def _load(self) -> None:
        if self._found is not None or self._error is not None:
            return
        if not self.dirs:
            self._error = "no patch directories configured (engine.patch_dirs)"
            return
        try:
            self._found = dict(discover_patches(self.dirs))
        except Exception as exc:
            self._error = f"patch discovery failed: {_one_line(exc)}"

    def check(self, param: Parameter) -> list[str]:
        self._load()
        if self._error is not None:
            return [self._error]
        assert self._found is not None

        name = param.target.name
        loaded = self._found.get(name)
        if loaded is None:
            where = ", ".join(str(Path(d)) for d in self.dirs)
            close = difflib.get_close_matches(name, list(self._found), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            available = ", ".join(sorted(self._found)) or "none"
            return [f"no patch named {name!r} in {where}{hint}; available: {available}"]
        info = loaded.info
        errors = []
        offered = ", ".join(_show(c) for c in info.choices)
        for value in domain_values(param):
            if not any(type(c) is type(value) and c == value for c in info.choices):
                errors.append(f"{_show(value)} is not offered by patch {name} (choices: {offered})")
        if info.engine != "vllm":
            errors.append(f"patch {name} is for engine {info.engine}, not vllm")
        if self.version is None:
            errors.append("vLLM's version is unknown; the patch's versions cannot be checked")
        elif not version_matches(info.versions, self.version):
            errors.append(
                f"patch {name} is for vLLM {info.versions!r}; the installed vLLM is {self.version}"
            )
            return errors
        for target in info.targets:
            try:
                with _quiet():
                    resolve_target(target)
            except Exception as exc:
                errors.append(f"patch {name}: {_one_line(exc)}")
        return errors
