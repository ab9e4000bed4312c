"""Reading a search space: ``search_spaces/*.yaml`` into a validated :class:`SearchSpace`.

Every problem is one :class:`~autotune.errors.SpecError` naming the file and the key (and the
line), raised before anything runs: unknown keys, empty domains, a ``when`` on a later
parameter, a constraint that cannot be evaluated on some values or that nothing satisfies. The
format is documented in ``docs/guide/search-space.md``.
"""

from __future__ import annotations

import itertools
import keyword
import math
import random
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from autotune._yaml import YamlDoc, check_keys, check_text, finite, load_yaml
from autotune.patching import PATCH_NAME
from autotune.space.addresses import value_address_problem
from autotune.space.constraints import FUNCTIONS, ConstraintSyntaxError, compile_constraint
from autotune.space.model import ENV_NAME, TYPES, Parameter, SearchSpace, Target, is_one_line

_PARAM_KEYS = {
    "type",
    "low",
    "high",
    "log",
    "step",
    "choices",
    "target",
    "when",
    "baseline",
    "help",
}
#: how many random configurations are drawn to prove the constraints can be satisfied
_FEASIBILITY_DRAWS = 5000
#: at most this many value combinations are tried per constraint to find a type error at load
_TYPE_CHECK_COMBINATIONS = 20_000
#: a parameter name: also a name in constraints, so ASCII (Python reads the ligature ``ﬁ`` as
#: ``fi``, another parameter) and neither a keyword (``None``, ``if``) nor a constraint function
_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: a command-line flag: ``--`` and a name, no ``=`` (``--a=3`` with a value after it gave
#: ``--a=3 5``) and no space (one argv word, never split by a shell)
_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.-]*")
#: Linux's limit on one argv word or one ``NAME=value`` environment string (MAX_ARG_STRLEN,
#: with its NUL): a longer value fails every launch with "Argument list too long"
MAX_ARG_BYTES = 131_072
#: environment variables no parameter may set, and why
_RESERVED_ENV = {
    "PATH": "PATH decides which program starts: set it where autotune runs, not per trial",
}
#: flags no parameter (and no fixed ``engine.args`` word) may set, whatever the engine, and why:
#: a tuned ``--port`` made the server listen where autotune never looked, and the startup
#: timeout was blamed on the configuration; a fixed ``--host 0.0.0.0`` came after autotune's
#: ``--host 127.0.0.1`` and opened the server to the network (a parser takes the last one)
RESERVED_FLAGS = {
    "--host": "autotune gives each server its address (127.0.0.1)",
    "--port": "autotune gives each server its address",
    "--uds": "autotune reaches each server at the address it gives it (127.0.0.1 and a port); "
    "a Unix socket replaces that address",
}


def flag_name(word: str) -> str | None:
    """The flag a command-line word sets, as vLLM's and llama.cpp's parsers read it: ``--a_b``
    and ``--a-b=3`` both set ``--a-b``; None for a word that is no ``--`` flag."""
    if not word.startswith("--") or word == "--":
        return None
    return "--" + word[2:].split("=", 1)[0].replace("_", "-")


def owning_flag(name: str, owned: Mapping[str, str]) -> str | None:
    """The flag of ``owned`` (normalised names, :func:`flag_name`) that the flag ``name`` sets:
    itself, or one it is a prefix of (vLLM's parser, argparse, reads an unambiguous prefix such
    as ``--hos`` as ``--host``; ``--ho`` and shorter are too short to count)."""
    if name in owned:
        return name
    if len(name) > 3:
        return next((flag for flag in owned if flag.startswith(name)), None)
    return None


#: The most parameters a search space may hold (a real one has a dozen; each is checked against
#: every other, so ten thousand took minutes to refuse).
MAX_PARAMETERS = 256


def load_space(
    path: str | Path,
    *,
    reserved_env: Mapping[str, str] | None = None,
    reserved_flags: Mapping[str, str] | None = None,
) -> SearchSpace:
    """Read and validate a search-space YAML file; any problem is one SpecError.

    ``reserved_env`` and ``reserved_flags``: environment variables and flags the launch sets
    itself (the engine's API key, the flags of the spec's command template), name -> why,
    refused as targets (the spec passes its engine's)."""
    doc = load_yaml(path, what="search space")
    check_keys(doc, doc.data, "", {"parameters", "constraints", "description"}, {"parameters"})
    check_text(doc, "description", doc.data.get("description"))
    raw_params = doc.data["parameters"]
    if not isinstance(raw_params, dict) or not raw_params:
        raise doc.error("parameters", "must be a non-empty mapping of parameter names")
    if len(raw_params) > MAX_PARAMETERS:
        raise doc.error(
            "parameters",
            f"has {len(raw_params)} parameters; a search space holds at most {MAX_PARAMETERS}",
        )
    params: list[Parameter] = []
    for name, raw in raw_params.items():
        params.append(
            _parse_parameter(doc, doc.name("parameters", name, "parameter name"), raw, params)
        )
    reserved = {**_RESERVED_ENV, **(reserved_env or {})}
    flags = {
        flag_name(flag) or flag: why
        for flag, why in {**RESERVED_FLAGS, **(reserved_flags or {})}.items()
    }
    for param in params:
        _check_env_target(doc, param, reserved)
        _check_flag_target(doc, param, flags)
        _check_reachable(doc, param, {p.name: p for p in params})
    names = {p.name for p in params}
    constraints = []
    # absent or null: none; ``{}``, ``""`` or ``0`` is refused (``or []`` read them as none)
    raw_constraints = doc.data.get("constraints")
    raw_constraints = [] if raw_constraints is None else raw_constraints
    if not isinstance(raw_constraints, list):
        raise doc.error("constraints", "must be a list of expressions")
    for index, expr in enumerate(raw_constraints):
        key = f"constraints[{index}]"
        try:
            constraints.append(compile_constraint(expr, names, key=key, file=str(doc.path)))
        except ConstraintSyntaxError as exc:
            raise doc.error(key, str(exc)) from None
    space = SearchSpace(path=Path(path), parameters=tuple(params), constraints=tuple(constraints))
    _check_targets_unique(doc, space)
    _check_constraints_evaluate(doc, space)
    broken = space.violated(space.baseline_values())
    if broken:
        raise doc.error("constraints", f"the baseline values violate {broken[0]!r}")
    _check_satisfiable(doc, space)
    return space


def _parse_parameter(doc: YamlDoc, name: str, raw: Any, earlier: list[Parameter]) -> Parameter:
    key = f"parameters.{name}"
    if not _PARAM_NAME.fullmatch(name):
        raise doc.error(key, "parameter names must be identifiers (ASCII letters, digits, _)")
    if keyword.iskeyword(name) or name in FUNCTIONS:
        what = "a Python keyword" if keyword.iskeyword(name) else "a function"
        raise doc.error(key, f"{name!r} cannot name a parameter: constraints read it as {what}")
    check_keys(doc, raw, key, _PARAM_KEYS, {"type", "target"})
    check_text(doc, f"{key}.help", raw.get("help"))
    ptype = raw["type"]
    if ptype not in TYPES:
        raise doc.error(f"{key}.type", f"unknown type {ptype!r} (one of {', '.join(TYPES)})")
    target = _parse_target(doc, f"{key}.target", raw["target"])
    if target.kind == "patch" and ptype not in ("categorical", "bool"):
        raise doc.error(f"{key}.type", "a patch parameter must be categorical or bool")
    if target.false_flag and ptype != "bool":
        raise doc.error(f"{key}.target.false_flag", "only bool parameters take false_flag")
    fields: dict[str, Any] = {"name": name, "type": ptype, "target": target}
    if ptype in ("int", "float"):
        for bound in ("low", "high"):
            if bound not in raw:
                raise doc.error(key, f"missing required key {bound!r} for type {ptype}")
            value = raw[bound]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise doc.error(f"{key}.{bound}", f"must be a number, got {value!r}")
            if not finite(value):
                raise doc.error(f"{key}.{bound}", f"must be a finite number, got {value!r}")
            if ptype == "int" and not float(value).is_integer():
                raise doc.error(f"{key}.{bound}", f"must be an integer, got {value!r}")
            fields[bound] = int(value) if ptype == "int" else value
        if fields["low"] > fields["high"]:
            raise doc.error(key, f"empty domain: low {fields['low']} > high {fields['high']}")
        if not math.isfinite(float(fields["high"]) - float(fields["low"])):
            # -1e308 .. 1e308: Optuna's samplers raised OverflowError mid-study
            raise doc.error(key, "the range high - low is too wide for a float")
        fields["log"] = bool(raw.get("log", False))
        if not isinstance(raw.get("log", False), bool):
            raise doc.error(f"{key}.log", "must be true or false")
        if fields["log"] and fields["low"] <= 0:
            raise doc.error(f"{key}.low", "a log domain needs low > 0")
        if "step" in raw:
            step = raw["step"]
            if (
                isinstance(step, bool)
                or not isinstance(step, int | float)
                or not 0 < step < math.inf
            ):
                raise doc.error(f"{key}.step", f"must be a positive number, got {step!r}")
            if fields["log"]:
                raise doc.error(f"{key}.step", "step cannot be combined with log")
            if ptype == "int" and not (isinstance(step, int) or step.is_integer()):
                # int(0.5) is 0, which Optuna refused mid-study; int(1.5) silently became 1
                raise doc.error(f"{key}.step", f"must be a whole number for type int, got {step!r}")
            fields["step"] = int(step) if ptype == "int" else step
            _check_step_divides(doc, key, fields["low"], fields["high"], fields["step"])
    else:
        for unwanted in ("low", "high", "log", "step"):
            if unwanted in raw:
                raise doc.error(f"{key}.{unwanted}", f"not allowed for type {ptype}")
    if ptype in ("categorical", "int_list"):
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise doc.error(f"{key}.choices", "must be a non-empty list")
        for index, choice in enumerate(choices):
            if ptype == "int_list":
                if (
                    not isinstance(choice, list)
                    or not choice
                    or not all(
                        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in choice
                    )
                ):
                    raise doc.error(
                        f"{key}.choices[{index}]", "must be a non-empty list of positive integers"
                    )
            elif not (choice is None or isinstance(choice, str | int | float | bool)):
                raise doc.error(
                    f"{key}.choices[{index}]", "choices must be strings, numbers, booleans or null"
                )
            elif isinstance(choice, float) and not math.isfinite(choice):
                raise doc.error(f"{key}.choices[{index}]", f"must be finite, got {choice!r}")
            elif isinstance(choice, str) and (problem := _unlaunchable(choice, target.kind)):
                raise doc.error(f"{key}.choices[{index}]", problem)
            else:
                doc.refuse_yaml11_bool(f"{key}.choices[{index}]", choice)
        _check_distinct(doc, f"{key}.choices", choices)
        fields["choices"] = tuple(tuple(c) if ptype == "int_list" else c for c in choices)
    elif "choices" in raw:
        raise doc.error(f"{key}.choices", f"not allowed for type {ptype}")
    when = {} if raw.get("when") is None else raw["when"]
    if not isinstance(when, dict):  # ``when: false`` or ``''`` read as no condition at all
        raise doc.error(f"{key}.when", "must be a mapping of earlier parameter -> value")
    earlier_names = {p.name: p for p in earlier}
    for raw_other, expected in when.items():
        other = doc.name(f"{key}.when", raw_other, "parameter name")
        if other not in earlier_names:
            raise doc.error(
                f"{key}.when.{other}", "must name a parameter declared earlier in the file"
            )
        values = expected["in"] if isinstance(expected, dict) and "in" in expected else [expected]
        if isinstance(expected, dict) and set(expected) != {"in"}:
            raise doc.error(f"{key}.when.{other}", "use a value or {in: [values]}")
        if not isinstance(values, list) or not values:
            raise doc.error(f"{key}.when.{other}.in", "must be a non-empty list of values")
        for index, v in enumerate(values):
            if earlier_names[other].type == "categorical":
                in_list = isinstance(expected, dict)
                doc.refuse_yaml11_bool(
                    f"{key}.when.{other}" + (f".in[{index}]" if in_list else ""), v
                )
            if not earlier_names[other].contains(v):
                raise doc.error(f"{key}.when.{other}", f"{v!r} is not in the domain of {other}")
    fields["when"] = dict(when)
    param = Parameter(**fields)
    if "baseline" in raw:
        base = raw["baseline"]
        if ptype == "categorical":
            doc.refuse_yaml11_bool(f"{key}.baseline", base)
        if not param.contains(base):
            raise doc.error(f"{key}.baseline", f"{base!r} is outside the parameter's domain")
        if ptype == "int_list":
            base = list(base)
        elif ptype == "int":
            base = int(base)  # 2.0 went to the engine as "--flag 2.0", which an int flag refuses
        param = Parameter(**fields, baseline=base)
    address = value_address_problem(param)
    if address is not None:
        raise doc.error(f"{key}.{address[0]}", address[1])
    return param


def _check_distinct(doc: YamlDoc, key: str, choices: list[Any]) -> None:
    """Choices must be distinct, and distinct as written is not enough: Optuna stores a choice
    by its index, found by == (true == 1, 16 == 16.0, so `1` was recorded and launched as
    `true`), and a command line or env var carries 16 and "16" as the same text. One pass with
    two dicts (by value, hashed as == compares; by text): comparing each pair took 33 s for
    20,000 choices."""
    if len({repr(c) for c in choices}) != len(choices):
        raise doc.error(key, "choices must be distinct")
    by_value: dict[Any, int] = {}
    by_text: dict[str, int] = {}
    for index, choice in enumerate(choices):
        value = tuple(choice) if isinstance(choice, list) else choice  # int_list: hashable
        text = None if choice is None else str(choice)
        earlier = [i for i in (by_value.get(value), by_text.get(text)) if i is not None]
        if earlier:
            raise doc.error(
                key,
                f"choices {choices[min(earlier)]!r} and {choice!r} are the same value to the "
                "engine; keep one",
            )
        by_value[value] = index
        if text is not None:
            by_text[text] = index


def _unlaunchable(text: str, kind: str) -> str | None:
    """Why a string value cannot reach the server as ``kind`` (a NUL character anywhere is
    refused when the YAML is read: ``_yaml.load_yaml``)."""
    if kind == "env" and not is_one_line(text):
        return (
            "an environment value with a line break or a control character breaks the exported "
            f".env file: {text!r}"
        )
    if kind in ("flag", "json", "env") and len(text.encode()) >= MAX_ARG_BYTES:
        return (
            f"{len(text.encode()):,} bytes: longer than one command-line argument or environment "
            f"variable can be ({MAX_ARG_BYTES - 1:,} bytes)"
        )
    return None


def _decimal_text(value: Decimal) -> str:
    return format(value.normalize(), "f")


def _check_step_divides(doc: YamlDoc, key: str, low: float, high: float, step: float) -> None:
    """``step`` must divide ``high - low``: Optuna otherwise lowers ``high`` to the last step
    with a warning mid-study (``low: 1, high: 8, step: 3`` never tries 8). Integers are
    divided exactly; floats as Optuna divides them, in decimals of 28 digits, which cannot
    count more steps than that (``step: 1.0e-30``: InvalidOperation, a traceback)."""
    if isinstance(low, int) and isinstance(high, int) and isinstance(step, int):
        if (high - low) % step == 0:
            return
        last = low + (high - low) // step * step
        texts = [str(v) for v in (step, high - low, last, last + step)]
    else:
        d_low, d_step = Decimal(str(low)), Decimal(str(step))
        span = Decimal(str(high)) - d_low
        try:
            if span % d_step == 0:
                return
            last = d_low + (span // d_step) * d_step
        except InvalidOperation:
            raise doc.error(
                f"{key}.step",
                f"step {step!r} is too fine for high - low = {_decimal_text(span)}: more steps "
                "than Optuna can count (a number of 28 digits); use a larger step, or none",
            ) from None
        texts = [_decimal_text(v) for v in (d_step, span, last, last + d_step)]
    step_text, span_text, last_text, next_text = texts
    raise doc.error(
        f"{key}.step",
        f"step {step_text} does not divide high - low = {span_text}: the last value would be "
        f"{last_text}; make high {last_text} or {next_text}",
    )


def _check_env_target(doc: YamlDoc, param: Parameter, reserved: Mapping[str, str]) -> None:
    """An ``env`` target the launch sets itself (the engine's API key, autotune's patch
    selection: the tuned value was overwritten without a word) or that decides which program
    starts (PATH: a bad value failed as the configuration's fault)."""
    name = param.target.name
    if param.target.kind != "env":
        return
    why = reserved.get(name)
    if why is None and name.startswith("AUTOTUNE_"):
        why = "autotune sets its AUTOTUNE_ variables itself (the API key, the patch selection)"
    if why is not None:
        raise doc.error(f"parameters.{param.name}.target.env", f"{name} cannot be tuned: {why}")


def _check_flag_target(doc: YamlDoc, param: Parameter, reserved: Mapping[str, str]) -> None:
    """A flag (or false_flag) that sets one autotune sets itself, whatever the spelling: the
    flag (``--served_model_name`` too) or a prefix of it (``--hos`` with ``0.0.0.0`` opened the
    server to the network), as ``engine.args`` are refused (``spec.checks``)."""
    target = param.target
    if target.kind not in ("flag", "json"):
        return
    for flag, what in ((target.name, target.kind), (target.false_flag, "false_flag")):
        owned = owning_flag(flag_name(flag) or "", reserved) if flag else None
        if owned is None:
            continue
        key = f"parameters.{param.name}.target.{what}"
        if owned != flag_name(flag):
            raise doc.error(
                key,
                f"{flag} is read as {owned} (a prefix of it), which cannot be tuned: "
                f"{reserved[owned]}",
            )
        raise doc.error(key, f"{flag} cannot be tuned: {reserved[owned]}")


def _check_reachable(doc: YamlDoc, param: Parameter, by_name: Mapping[str, Parameter]) -> None:
    """A parameter whose ``when`` conditions (with those of the parameters they name, and so
    on) allow no value of some parameter is never active: never tuned, silently."""
    allowed: dict[str, list[Any]] = {}
    todo, done = [param], set()
    while todo:
        current = todo.pop()
        if current.name in done:
            continue
        done.add(current.name)
        for other, expected in current.when.items():
            values = expected["in"] if isinstance(expected, dict) else [expected]
            before = allowed.get(other)
            now = list(values) if before is None else [v for v in before if v in values]
            if not now:
                raise doc.error(
                    f"parameters.{param.name}.when",
                    f"the parameter is never active: the conditions on {other!r} (its own "
                    "and those of the parameters it depends on) leave no value",
                )
            allowed[other] = now
            todo.append(by_name[other])


def _parse_target(doc: YamlDoc, key: str, raw: Any) -> Target:
    if isinstance(raw, str):
        raise doc.error(key, "must be a mapping such as {flag: --max-num-seqs}")
    check_keys(doc, raw, key, {"flag", "env", "json", "key", "patch", "false_flag"})
    kinds = [k for k in ("flag", "env", "json", "patch") if k in raw]
    if len(kinds) != 1:
        raise doc.error(key, "needs exactly one of flag, env, json, patch")
    kind = kinds[0]
    name = raw[kind]
    if not isinstance(name, str) or not name:
        raise doc.error(f"{key}.{kind}", "must be a non-empty string")
    if kind in ("flag", "json"):
        _check_flag(doc, f"{key}.{kind}", name)
    if kind == "env" and not ENV_NAME.fullmatch(name):
        raise doc.error(f"{key}.env", f"not a valid environment variable name: {name!r}")
    if kind == "patch" and not PATCH_NAME.fullmatch(name):
        raise doc.error(
            f"{key}.patch", f"a patch name is lowercase letters, digits and _, got {name!r}"
        )
    json_key = raw.get("key")
    if kind == "json" and not (isinstance(json_key, str) and json_key):
        raise doc.error(f"{key}.key", "a json target needs the key inside the JSON object")
    if kind == "json" and "" in json_key.split("."):
        # "a..b" set the key "" inside "a"; ".a" and "a." made an empty key the engine refuses
        raise doc.error(f"{key}.key", f"a dotted key path with an empty part: {json_key!r}")
    if kind != "json" and json_key is not None:
        raise doc.error(f"{key}.key", "only json targets take a key")
    false_flag = raw.get("false_flag")
    if false_flag is not None:
        if kind != "flag" or not isinstance(false_flag, str) or not false_flag.startswith("--"):
            raise doc.error(
                f"{key}.false_flag", "must be a flag starting with '--' on a flag target"
            )
        _check_flag(doc, f"{key}.false_flag", false_flag)
        if flag_name(false_flag) == flag_name(name):  # false launched as the flag: true
            raise doc.error(f"{key}.false_flag", f"must differ from the flag {name}")
    return Target(kind=kind, name=name, key=json_key, false_flag=false_flag)


def _check_flag(doc: YamlDoc, key: str, flag: str) -> None:
    if not flag.startswith("--"):
        raise doc.error(key, f"a flag starts with '--', got {flag!r}")
    if not _FLAG.fullmatch(flag):
        raise doc.error(
            key,
            "a flag is '--' and a name of letters, digits, '-', '_' or '.' (no '=', no "
            f"spaces; the value comes from the parameter), got {flag!r}",
        )


def _check_targets_unique(doc: YamlDoc, space: SearchSpace) -> None:
    """No two parameters set one thing: the same target, one command-line flag (a flag, a
    false_flag, a JSON flag: the launch had it twice, or one value replaced the other), or
    nested keys of one JSON flag (``a`` and ``a.b``: setting ``a.b`` inside a number raised).
    Flags as the engine reads them (:func:`flag_name`): ``--max_num_seqs`` is
    ``--max-num-seqs``, and one JSON flag spelled two ways went on the command line twice."""
    seen: dict[tuple, str] = {}
    # flag -> (parameter, its JSON key or None, the flag as written)
    flags: dict[str, tuple[str, str | None, str]] = {}
    for param in space.parameters:
        target = param.target
        key = f"parameters.{param.name}.target"
        flagged = target.kind in ("flag", "json")
        ident = (target.kind, flag_name(target.name) if flagged else target.name, target.key)
        if ident in seen:
            raise doc.error(key, f"same target as parameter {seen[ident]!r}")
        seen[ident] = param.name
        if not flagged:
            continue
        for flag in filter(None, (target.name, target.false_flag)):
            other = flags.get(flag_name(flag) or flag)
            if other is None:
                flags[flag_name(flag) or flag] = (param.name, target.key, flag)
                continue
            spelled = "" if other[2] == flag else f" (as {other[2]})"
            if other[1] is None or target.kind != "json":
                raise doc.error(key, f"{flag} is also set by parameter {other[0]!r}{spelled}")
            if spelled:  # two keys of one JSON flag, which went on the command line twice
                raise doc.error(
                    key, f"{flag} is also set by parameter {other[0]!r}{spelled}: spell it one way"
                )
        if target.kind == "json":
            for other in space.parameters:
                if other is param or other.target.kind != "json":
                    continue
                if flag_name(other.target.name) == flag_name(target.name) and (
                    target.key.startswith(f"{other.target.key}.")
                ):
                    raise doc.error(
                        key,
                        f"{target.name} key {target.key} is inside key {other.target.key}, "
                        f"which parameter {other.name!r} sets",
                    )


def _probe_values(param: Parameter) -> list[Any]:
    """Values that stand for the parameter's whole domain: every choice, or the ends and the
    middle of a numeric range (numbers share one type, so their errors do not hide between)."""
    if param.type == "categorical":
        return list(param.choices)
    if param.type == "int_list":
        return [list(c) for c in param.choices]
    if param.type == "bool":
        return [False, True]
    if param.type == "int":
        low, step = int(param.low), int(param.step or 1)
        count = (int(param.high) - low) // step
        return sorted({low, low + step * (count // 2), low + step * count})
    low, high = float(param.low), float(param.high)
    return sorted({low, (low + high) / 2, high})


def _check_constraints_evaluate(doc: YamlDoc, space: SearchSpace) -> None:
    """Evaluate each constraint on the values of the parameters it names (all combinations, or
    a fixed random sample of them when there are too many): a type error such as ``mode > 3``
    on string choices or ``len(n)`` on an int is refused now, naming the constraint."""
    rng = random.Random(0)
    for constraint in space.constraints:
        params = [space.parameter(n) for n in sorted(constraint.names)]
        domains = [_probe_values(p) for p in params]
        total = math.prod(len(d) for d in domains)
        if total <= _TYPE_CHECK_COMBINATIONS:
            combos: Any = itertools.product(*domains)
        else:
            combos = (
                tuple(rng.choice(d) for d in domains) for _ in range(_TYPE_CHECK_COMBINATIONS)
            )
        for combo in combos:
            values = {p.name: v for p, v in zip(params, combo, strict=True)}
            if not _consistent(params, values):
                continue
            problem = constraint.problem(values)
            if problem is not None:
                raise doc.error(constraint.key, problem)


def _consistent(params: list[Parameter], values: Mapping[str, Any]) -> bool:
    """False when the combination cannot occur: a parameter is active only under another
    value of a parameter in the same combination (``when``)."""
    for param in params:
        for other, expected in param.when.items():
            if other not in values:
                continue
            allowed = expected["in"] if isinstance(expected, dict) else [expected]
            if values[other] not in allowed:
                return False
    return True


def _check_satisfiable(doc: YamlDoc, space: SearchSpace) -> None:
    """A space whose constraints no configuration meets would burn every trial: refuse it."""
    if not space.constraints:
        return
    rng = random.Random(0)
    for _ in range(_FEASIBILITY_DRAWS):
        if not space.violated(space.draw(rng)):
            return
    raise doc.error(
        "constraints",
        f"no configuration satisfies the constraints ({_FEASIBILITY_DRAWS} random draws tried)",
    )
