"""What the terminal says about a confirmation: "winner" only for a gain whose 95% interval
excludes no change (the 12-trial demo's +33% with -57% .. +314% is not a confirmed gain)."""

from __future__ import annotations

import pytest
from rich.console import Console

from autotune.cli import render


def _confirmation(gain: float, low: float, high: float) -> dict:
    return {
        "metric": "output_tokens_per_s",
        "repeats": 4,
        "winner": 10,
        "gain": gain,
        "gain_ci": (low, high),
        "candidates": [
            {
                "trial_number": None,
                "label": "baseline",
                "samples": [900.0, 950.0],
                "median": 925.0,
                "failures": [],
            },
            {
                "trial_number": 10,
                "label": "trial 10",
                "samples": [1200.0, 1300.0],
                "median": 1250.0,
                "failures": [],
            },
        ],
    }


@pytest.mark.parametrize(
    ("gain", "low", "high", "said"),
    [
        (0.33, 0.05, 0.60, "winner (confirmed gain): trial 10, +33.0%"),
        (
            0.33,
            -0.573,
            3.137,
            "no confirmed gain (the interval includes none); best median: trial 10",
        ),
        (-0.05, -0.20, 0.10, "no real gain; best candidate: trial 10"),
    ],
)
def test_confirmation_line(monkeypatch, gain, low, high, said) -> None:
    console = Console(record=True, width=200)
    monkeypatch.setattr(render, "console", console)
    render.print_confirmation(_confirmation(gain, low, high))
    text = console.export_text()
    assert said in text
    assert ("winner (confirmed gain)" in text) == (low > 0)
