"""Search spaces: the declarative YAML in ``search_spaces/`` and the only caller of ``suggest_*``.

A space is data: each parameter has a type, a domain and a target (a CLI flag, an environment
variable, a key inside a JSON-valued flag such as ``--compilation-config``, or a patch).
Parameters can be conditional (``when``) and constraints relate them. The format is documented
in the README and in ``docs/ARCHITECTURE.md``.
"""

from __future__ import annotations

import ast
import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from autotune._yaml import YamlDoc, check_keys, load_yaml
from autotune.errors import SpecError
from autotune.settings import ServerSettings, merge_json_key

TYPES = ("int", "float", "categorical", "bool", "int_list")
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
_MISSING = object()
#: how many random configurations are drawn to prove the constraints can be satisfied
_FEASIBILITY_DRAWS = 5000
#: at most this many value combinations are tried per constraint to find a type error at load
_TYPE_CHECK_COMBINATIONS = 20_000
#: longest constraint expression accepted (bounds parsing, recursion and every value it builds)
MAX_CONSTRAINT_CHARS = 1000


@dataclass(frozen=True)
class Target:
    """Where a parameter's value goes: ``flag``, ``env``, ``json`` (flag + key) or ``patch``."""

    kind: str
    name: str
    key: str | None = None
    false_flag: str | None = None

    def describe(self) -> str:
        if self.kind == "json":
            return f"{self.name} {self.key}"
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class Parameter:
    """One dimension of the search space."""

    name: str
    type: str
    target: Target
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    when: Mapping[str, Any] = field(default_factory=dict)
    baseline: Any = _MISSING

    @property
    def has_baseline(self) -> bool:
        return self.baseline is not _MISSING

    def suggest(self, trial: optuna.Trial) -> Any:
        """Ask Optuna for a value. ``int_list`` choices travel as strings such as ``"1,2,4"``."""
        if self.type == "int":
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        if self.type == "float":
            return trial.suggest_float(
                self.name, float(self.low), float(self.high), log=self.log, step=self.step
            )
        if self.type == "bool":
            return trial.suggest_categorical(self.name, [False, True])
        if self.type == "int_list":
            label = trial.suggest_categorical(self.name, [_list_label(c) for c in self.choices])
            return _parse_list_label(label)
        return trial.suggest_categorical(self.name, list(self.choices))

    def draw(self, rng: random.Random) -> Any:
        """A uniformly random value, for feasibility checks without a study."""
        if self.type == "int":
            step = int(self.step or 1)
            return int(self.low) + step * rng.randint(0, (int(self.high) - int(self.low)) // step)
        if self.type == "float":
            return rng.uniform(float(self.low), float(self.high))
        if self.type == "bool":
            return rng.random() < 0.5
        return (
            list(rng.choice(self.choices)) if self.type == "int_list" else rng.choice(self.choices)
        )

    def contains(self, value: Any) -> bool:
        if self.type == "bool":
            return isinstance(value, bool)
        if self.type in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                return False
            if self.type == "int" and not float(value).is_integer():
                return False
            return float(self.low) <= float(value) <= float(self.high)
        if self.type == "int_list":
            return list(value) in [list(c) for c in self.choices]
        return value in self.choices

    def from_optuna(self, value: Any) -> Any:
        """Turn a stored Optuna value back into the parameter's own value."""
        if self.type == "int_list" and isinstance(value, str):
            return _parse_list_label(value)
        return value


@dataclass(frozen=True)
class Constraint:
    """A boolean expression over parameter names, e.g. ``max_num_batched_tokens >= max_num_seqs``.

    Evaluated by a small AST interpreter (comparisons, arithmetic, and/or/not), never ``eval``.
    A constraint that names an inactive parameter holds: it says nothing about that config.
    Evaluation never raises a raw Python error: a type error (``mode > 3`` on strings) is a
    :class:`SpecError` naming the constraint; :func:`load_space` tries the values of every
    parameter a constraint names, so that happens when the space is loaded, not mid-study.
    """

    expr: str
    names: frozenset[str]
    tree: ast.Expression = field(compare=False, repr=False)
    key: str = field(default="constraints", compare=False)
    file: str | None = field(default=None, compare=False)

    def holds(self, values: Mapping[str, Any]) -> bool:
        if not self.names <= set(values):
            return True
        try:
            return bool(_evaluate(self.tree.body, values))
        except _EVAL_ERRORS as exc:
            raise SpecError(self._why(values, exc), file=self.file, key=self.key) from None

    def problem(self, values: Mapping[str, Any]) -> str | None:
        """Why the expression cannot be evaluated for ``values``, or None if it can."""
        try:
            bool(_evaluate(self.tree.body, values))
        except _EVAL_ERRORS as exc:
            return self._why(values, exc)
        return None

    def _why(self, values: Mapping[str, Any], exc: BaseException) -> str:
        shown = ", ".join(f"{n}={values[n]!r}" for n in sorted(self.names))
        reason = str(exc) or type(exc).__name__
        return f"{self.expr!r} cannot be evaluated for {shown}: {reason}"


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space, loaded from ``path``."""

    path: Path
    parameters: tuple[Parameter, ...]
    constraints: tuple[Constraint, ...] = ()

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parameters]

    def parameter(self, name: str) -> Parameter:
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(name)

    def is_active(self, param: Parameter, values: Mapping[str, Any]) -> bool:
        for other, expected in param.when.items():
            if other not in values:
                return False
            actual = values[other]
            if isinstance(expected, dict) and "in" in expected:
                if actual not in expected["in"]:
                    return False
            elif actual != expected:
                return False
        return True

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Values of the active parameters, asked of Optuna in declaration order."""
        values: dict[str, Any] = {}
        for param in self.parameters:
            if self.is_active(param, values):
                values[param.name] = param.suggest(trial)
        return values

    def suggest_baseline(self, trial: optuna.Trial) -> dict[str, Any]:
        """The baseline trial: only parameters with a ``baseline`` value are set (the trial was
        enqueued with them, so Optuna returns exactly those); every other one is left out, so
        the engine runs with its own defaults."""
        values: dict[str, Any] = {}
        for param in self.parameters:
            if param.has_baseline and self.is_active(param, values):
                values[param.name] = param.suggest(trial)
        return values

    def suggest_pinned(self, trial: optuna.Trial, pinned: Mapping[str, Any]) -> dict[str, Any]:
        """Only the parameters named in ``pinned`` (the trial was enqueued with their values,
        so Optuna returns exactly those); the others are left to the engine's defaults."""
        values: dict[str, Any] = {}
        for param in self.parameters:
            if param.name in pinned and self.is_active(param, values):
                values[param.name] = param.suggest(trial)
        return values

    def to_optuna_params(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Values as Optuna stores them (``int_list`` as its string label)."""
        return {
            name: _list_label(value) if self.parameter(name).type == "int_list" else value
            for name, value in values.items()
        }

    def baseline_values(self) -> dict[str, Any]:
        """The baseline: each parameter's ``baseline`` value where given, engine default else."""
        values: dict[str, Any] = {}
        for param in self.parameters:
            if param.has_baseline and self.is_active(param, values):
                values[param.name] = param.baseline
        return values

    def baseline_optuna_params(self) -> dict[str, Any]:
        """Baseline values as Optuna stores them (for ``enqueue_trial``)."""
        out = {}
        for name, value in self.baseline_values().items():
            param = self.parameter(name)
            out[name] = _list_label(value) if param.type == "int_list" else value
        return out

    def violated(self, values: Mapping[str, Any]) -> list[str]:
        return [c.expr for c in self.constraints if not c.holds(values)]

    def draw(self, rng: random.Random) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for param in self.parameters:
            if self.is_active(param, values):
                values[param.name] = param.draw(rng)
        return values

    def resolve(self, values: Mapping[str, Any]) -> ServerSettings:
        """Route each value to its target. Pure: builds the settings, starts nothing."""
        flags: dict[str, Any] = {}
        json_flags: dict[str, dict[str, Any]] = {}
        env: dict[str, str] = {}
        patches: dict[str, Any] = {}
        for param in self.parameters:
            if param.name not in values:
                continue
            value = values[param.name]
            target = param.target
            if target.kind == "flag":
                if param.type == "bool" and value is False and target.false_flag:
                    flags[target.false_flag] = True
                elif param.type == "int_list":
                    flags[target.name] = [int(v) for v in value]
                else:
                    flags[target.name] = value
            elif target.kind == "env":
                if value is not None:
                    env[target.name] = _env_text(value)
            elif target.kind == "json":
                # null leaves the key unset; a JSON flag with no key set is not passed at all
                # (``speculative_method: null`` = no --speculative-config, no speculation)
                if value is not None:
                    merge_json_key(json_flags.setdefault(target.name, {}), target.key, value)
            else:
                patches[target.name] = value
        return ServerSettings(flags=flags, json_flags=json_flags, env=env, patches=patches)


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _list_label(value: Any) -> str:
    return ",".join(str(int(v)) for v in value)


def _parse_list_label(label: str) -> list[int]:
    return [int(v) for v in label.split(",") if v != ""]


# --- loading -------------------------------------------------------------------------------


def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space YAML file; any problem is one SpecError."""
    doc = load_yaml(path, what="search space")
    check_keys(doc, doc.data, "", {"parameters", "constraints", "description"}, {"parameters"})
    raw_params = doc.data["parameters"]
    if not isinstance(raw_params, dict) or not raw_params:
        raise doc.error("parameters", "must be a non-empty mapping of parameter names")
    params: list[Parameter] = []
    for name, raw in raw_params.items():
        params.append(_parse_parameter(doc, str(name), raw, params))
    names = {p.name for p in params}
    constraints = []
    raw_constraints = doc.data.get("constraints") or []
    if not isinstance(raw_constraints, list):
        raise doc.error("constraints", "must be a list of expressions")
    for index, expr in enumerate(raw_constraints):
        constraints.append(_parse_constraint(doc, f"constraints[{index}]", expr, names))
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
            if isinstance(step, bool) or not isinstance(step, int | float) or step <= 0:
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
            else:
                doc.refuse_yaml11_bool(f"{key}.choices[{index}]", choice)
        labels = [repr(c) for c in choices]
        if len(set(labels)) != len(labels):
            raise doc.error(f"{key}.choices", "choices must be distinct")
        fields["choices"] = tuple(tuple(c) if ptype == "int_list" else c for c in choices)
    elif "choices" in raw:
        raise doc.error(f"{key}.choices", f"not allowed for type {ptype}")
    when = raw.get("when") or {}
    if not isinstance(when, dict):
        raise doc.error(f"{key}.when", "must be a mapping of earlier parameter -> value")
    earlier_names = {p.name: p for p in earlier}
    for other, expected in when.items():
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
    if kind == "env" and not name.replace("_", "a").isalnum():
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


# --- constraint expressions ----------------------------------------------------------------

_ALLOWED = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.UAdd,
    ast.Compare,
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.In,
    ast.NotIn,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.FloorDiv,
    ast.Mod,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.List,
    ast.Tuple,
    ast.Call,
)
_FUNCS = {"len": len, "max": max, "min": min}
_ORDER = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}


#: constants a constraint may contain (no bytes, complex numbers or ``...``)
_CONSTANT_TYPES = (bool, int, float, str, type(None))
_NUMBER_ONLY = {
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
}


class _EvalError(Exception):
    """An operation the interpreter refuses (it would build a huge object, or means nothing)."""


_EVAL_ERRORS = (
    _EvalError,
    TypeError,
    ValueError,
    ArithmeticError,
    RecursionError,
    MemoryError,
)


def _parse_constraint(doc: YamlDoc, key: str, expr: Any, names: set[str]) -> Constraint:
    if not isinstance(expr, str) or not expr.strip():
        raise doc.error(key, "must be an expression string")
    if len(expr) > MAX_CONSTRAINT_CHARS:
        raise doc.error(
            key, f"expression too long ({len(expr)} characters, at most {MAX_CONSTRAINT_CHARS})"
        )
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise doc.error(key, f"invalid expression {expr!r}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise doc.error(key, f"invalid expression {expr!r}: {exc or type(exc).__name__}") from None
    used: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise doc.error(key, f"{type(node).__name__} is not allowed in {expr!r}")
        if isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords
        ):
            raise doc.error(key, f"only {', '.join(_FUNCS)} may be called in {expr!r}")
        if isinstance(node, ast.Constant) and not isinstance(node.value, _CONSTANT_TYPES):
            raise doc.error(key, f"constant {node.value!r} is not allowed in {expr!r}")
        if isinstance(node, ast.BinOp) and type(node.op) in _NUMBER_ONLY:
            for side in (node.left, node.right):
                if isinstance(side, ast.List | ast.Tuple) or (
                    isinstance(side, ast.Constant) and isinstance(side.value, str)
                ):
                    raise doc.error(
                        key,
                        f"{_NUMBER_ONLY[type(node.op)]} applies to numbers only in {expr!r}"
                        " (repeating or formatting a string or list is not allowed)",
                    )
        if isinstance(node, ast.Name) and node.id not in _FUNCS:
            used.add(node.id)
    unknown = used - names
    if unknown:
        raise doc.error(key, f"unknown parameter {sorted(unknown)[0]!r} in {expr!r}")
    return Constraint(expr=expr, names=frozenset(used), tree=tree, key=key, file=str(doc.path))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)  # bool is an int: True + 1 == 2, as in Python


def _evaluate(node: ast.AST, values: Mapping[str, Any]) -> Any:
    """Interpret an expression checked by :func:`_parse_constraint`. ``*``, ``-``, ``/``,
    ``//`` and ``%`` take numbers only, so no operand can make it build a huge string or list
    (``'a' * n``) or format one (``'%999999999d' % n``); anything else that Python refuses
    raises one of ``_EVAL_ERRORS``, turned into a SpecError by :meth:`Constraint.problem`."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_evaluate(e, values) for e in node.elts]
    if isinstance(node, ast.BoolOp):
        results = (_evaluate(v, values) for v in node.values)
        return all(results) if isinstance(node.op, ast.And) else any(results)
    if isinstance(node, ast.UnaryOp):
        operand = _evaluate(node.operand, values)
        if isinstance(node.op, ast.Not):
            return not operand
        if not _is_number(operand):
            raise _EvalError(f"unary minus or plus needs a number, got {operand!r}")
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.Call):
        return _FUNCS[node.func.id](*[_evaluate(a, values) for a in node.args])
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, values), _evaluate(node.right, values)
        symbol = _NUMBER_ONLY.get(type(node.op))
        if symbol is not None and not (_is_number(left) and _is_number(right)):
            raise _EvalError(f"{symbol} applies to numbers only, got {left!r} {symbol} {right!r}")
        ops = {
            ast.Add: lambda a, b: a + b,
            ast.Sub: lambda a, b: a - b,
            ast.Mult: lambda a, b: a * b,
            ast.Div: lambda a, b: a / b if b else math.inf,
            ast.FloorDiv: lambda a, b: a // b if b else math.inf,
            ast.Mod: lambda a, b: a % b if b else math.nan,
        }
        return ops[type(node.op)](left, right)
    if isinstance(node, ast.Compare):
        left = _evaluate(node.left, values)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _evaluate(comparator, values)
            if isinstance(op, ast.In | ast.NotIn) and not isinstance(right, list):
                raise _EvalError(f"'in' needs a list on its right, got {right!r}")
            ok = {
                ast.Eq: lambda a, b: a == b,
                ast.NotEq: lambda a, b: a != b,
                ast.In: lambda a, b: a in b,
                ast.NotIn: lambda a, b: a not in b,
                **_ORDER,
            }[type(op)](left, right)
            if not ok:
                return False
            left = right
        return True
    raise _EvalError(f"unsupported expression node {type(node).__name__}")
