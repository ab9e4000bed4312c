"""``autotune inspect``: model facts and the decode roofline."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from autotune.cli import render
from autotune.cli.common import fail
from autotune.engines.vllm.gguf import model_problem
from autotune.errors import AutotuneError, SpecError
from autotune.model.reader import facts_as_rows, inspect_model
from autotune.model.roofline import roofline_rows_for


def _finite_positive(option: str):
    """A number option that must be finite and above zero, refused at parsing (exit 2): an
    infinite bandwidth divided by zero, a NaN one printed "nan tok/s" with exit 0, and a
    negative measured rate raised a ValueError traceback."""

    def check(value: float | list[float] | None):
        for number in value if isinstance(value, list) else [value]:
            if number is not None and not (math.isfinite(number) and number > 0):
                render.print_error(
                    SpecError(f"must be a finite number above 0, got {number}", key=option)
                )
                raise typer.Exit(code=2)
        return value

    return check


def inspect_cmd(
    model: Annotated[
        Path,
        typer.Argument(
            help="A GGUF file (any part of a split model) or a Hugging Face model folder."
        ),
    ],
    device: Annotated[
        str | None, typer.Option("--device", help="Device for the decode roofline, e.g. h200.")
    ] = None,
    bandwidth_gbs: Annotated[
        float | None,
        typer.Option(
            "--bandwidth-gbs",
            help="Per-device memory bandwidth (overrides --device).",
            callback=_finite_positive("--bandwidth-gbs"),
        ),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel degree.")] = 1,
    context: Annotated[int, typer.Option("--context", min=0, help="Tokens in the KV cache.")] = 0,
    measured: Annotated[
        list[float] | None,
        typer.Option(
            "--measured",
            help="Measured decode tok/s to compare (repeatable).",
            callback=_finite_positive("--measured"),
        ),
    ] = None,
) -> None:
    """Model facts (architecture, attention, experts, quantization, fused projections) and,
    with --device or --bandwidth-gbs, the single-request decode roofline."""
    try:
        facts = inspect_model(model)
        problem = model_problem(str(model)) if facts.format == "gguf" else None
        rows = facts_as_rows(facts, load_problem=problem)
        if device or bandwidth_gbs is not None:
            rows += [("", "")] + roofline_rows_for(
                facts,
                device=device,
                bandwidth_gbs=bandwidth_gbs,
                tp=tp,
                context_tokens=context,
                measured=measured or [],
            )
    except AutotuneError as exc:
        raise fail(exc) from None
    render.print_key_values(rows)
