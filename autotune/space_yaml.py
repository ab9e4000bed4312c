"""Reading a search space: ``search_spaces/*.yaml`` into a validated :class:`SearchSpace`.

Every problem is one :class:`~autotune.errors.SpecError` naming the file and the key (and the
line), raised before anything runs: unknown keys, empty domains, a ``when`` on a later
parameter, a constraint that cannot be evaluated on some values or that nothing satisfies. The
format is documented in the README and in ``docs/ARCHITECTURE.md``.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune._yaml import YamlDoc, check_keys, load_yaml
from autotune.constraints import ConstraintSyntaxError, compile_constraint
from autotune.space import ENV_NAME, TYPES, Parameter, SearchSpace, Target, is_one_line

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


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space YAML file; any problem is one SpecError."""
    doc = load_yaml(path, what="search space")
    check_keys(doc, doc.data, "", {"parameters", "constraints", "description"}, {"parameters"})
    raw_params = doc.data["parameters"]
    if not isinstance(raw_params, dict) or not raw_params:
        raise doc.error("parameters", "must be a non-empty mapping of parameter names")
    params: list[Parameter] = []
    for name, raw in raw_params.items():
        params.append(
            _parse_parameter(doc, doc.name("parameters", name, "parameter name"), raw, params)
        )
    names = {p.name for p in params}
    constraints = []
    raw_constraints = doc.data.get("constraints") or []
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
    if not name.isidentifier():
        raise doc.error(key, "parameter names must be identifiers (letters, digits, _)")
    check_keys(doc, raw, key, _PARAM_KEYS, {"type", "target"})
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
            if not math.isfinite(value):
                raise doc.error(f"{key}.{bound}", f"must be a finite number, got {value!r}")
            if ptype == "int" and not float(value).is_integer():
                raise doc.error(f"{key}.{bound}", f"must be an integer, got {value!r}")
            fields[bound] = value
        if fields["low"] > fields["high"]:
            raise doc.error(key, f"empty domain: low {fields['low']} > high {fields['high']}")
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
            fields["step"] = step
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
        labels = [repr(c) for c in choices]
        if len(set(labels)) != len(labels):
            raise doc.error(f"{key}.choices", "choices must be distinct")
        # distinct as written is not enough: Optuna stores a choice by its index, found by ==
        # (true == 1, 16 == 16.0, so `1` was recorded and launched as `true`), and a command
        # line or env var carries 16 and "16" as the same text
        for i, a in enumerate(choices):
            for b in choices[:i]:
                if a == b or (a is not None and b is not None and str(a) == str(b)):
                    raise doc.error(
                        f"{key}.choices",
                        f"choices {b!r} and {a!r} are the same value to the engine; keep one",
                    )
        fields["choices"] = tuple(tuple(c) if ptype == "int_list" else c for c in choices)
    elif "choices" in raw:
        raise doc.error(f"{key}.choices", f"not allowed for type {ptype}")
    when = raw.get("when") or {}
    if not isinstance(when, dict):
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
        if not isinstance(values, list):
            raise doc.error(f"{key}.when.{other}.in", "must be a list of values")
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
        param = Parameter(**fields, baseline=list(base) if ptype == "int_list" else base)
    return param


def _unlaunchable(text: str, kind: str) -> str | None:
    """Why a string value cannot reach the server as ``kind`` (a NUL character anywhere is
    refused when the YAML is read: ``_yaml.load_yaml``)."""
    if kind == "env" and not is_one_line(text):
        return f"an environment value with a line break breaks the exported .env file: {text!r}"
    return None


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
    if kind in ("flag", "json") and not name.startswith("--"):
        raise doc.error(f"{key}.{kind}", f"a flag starts with '--', got {name!r}")
    if kind == "env" and not ENV_NAME.fullmatch(name):
        raise doc.error(f"{key}.env", f"not a valid environment variable name: {name!r}")
    json_key = raw.get("key")
    if kind == "json" and not (isinstance(json_key, str) and json_key):
        raise doc.error(f"{key}.key", "a json target needs the key inside the JSON object")
    if kind != "json" and json_key is not None:
        raise doc.error(f"{key}.key", "only json targets take a key")
    false_flag = raw.get("false_flag")
    if false_flag is not None and (kind != "flag" or not str(false_flag).startswith("--")):
        raise doc.error(f"{key}.false_flag", "must be a flag starting with '--' on a flag target")
    return Target(kind=kind, name=name, key=json_key, false_flag=false_flag)


def _check_targets_unique(doc: YamlDoc, space: SearchSpace) -> None:
    seen: dict[tuple, str] = {}
    for param in space.parameters:
        ident = (param.target.kind, param.target.name, param.target.key)
        if ident in seen:
            raise doc.error(
                f"parameters.{param.name}.target", f"same target as parameter {seen[ident]!r}"
            )
        seen[ident] = param.name


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
