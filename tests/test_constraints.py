"""constraints.py: the safe interpreter on its own, without a YAML file around it."""

from __future__ import annotations

import pytest

from autotune.errors import SpecError
from autotune.space.constraints import (
    MAX_CONSTRAINT_CHARS,
    ConstraintSyntaxError,
    compile_constraint,
)


def test_an_expression_is_compiled_and_evaluated() -> None:
    c = compile_constraint("a >= b * 2 and mode in ['x', 'y']", {"a", "b", "mode"})
    assert c.names == frozenset({"a", "b", "mode"})
    assert c.holds({"a": 4, "b": 2, "mode": "x"})
    assert not c.holds({"a": 3, "b": 2, "mode": "x"})
    assert not c.holds({"a": 4, "b": 2, "mode": "z"})


def test_a_constraint_on_an_inactive_parameter_holds() -> None:
    c = compile_constraint("a > b", {"a", "b"})
    assert c.holds({"a": 0})  # b inactive: says nothing about this config


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("__import__('os')", "only len, max, min may be called"),
        ("a.real > 0", "Attribute is not allowed"),
        ("'x' * a > ''", "applies to numbers only"),
        ("c > 1", "unknown parameter 'c'"),
        ("a >", "invalid expression"),
        ("", "must be an expression string"),
        ("a" * (MAX_CONSTRAINT_CHARS + 1), "expression too long"),
    ],
)
def test_refused_expressions(expr: str, message: str) -> None:
    with pytest.raises(ConstraintSyntaxError, match=message):
        compile_constraint(expr, {"a", "b"})


def test_a_type_error_is_a_spec_error_naming_the_constraint() -> None:
    c = compile_constraint("mode > 3", {"mode"}, key="constraints[0]", file="space.yaml")
    assert c.problem({"mode": "x"}) is not None
    with pytest.raises(SpecError) as caught:
        c.holds({"mode": "x"})
    assert caught.value.key == "constraints[0]" and "mode='x'" in str(caught.value)


def test_division_by_zero_does_not_raise() -> None:
    assert compile_constraint("a / b > 1", {"a", "b"}).holds({"a": 1, "b": 0})
