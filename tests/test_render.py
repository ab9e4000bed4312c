"""What the terminal says about a confirmation: "winner" only for a gain whose 95% interval
excludes no change (the 12-trial demo's +33% with -57% .. +314% is not a confirmed gain); and
text from outside (a server's log line, a parameter value) printed as it is: never read as rich
markup, its terminal escapes written out."""

from __future__ import annotations

import io

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


# --- text from outside (a server's log, a parameter value) printed as it is -------------------

#: what a server's log line or a stored value may hold: rich markup (a lone closing tag, a
#: link, a style name), terminal escapes (a window title, a hyperlink, a colour, a clear, a
#: C1 CSI) and an emoji code
HOSTILE_DETAIL = (
    "\x1b]0;owned\x07[rank0]: x[/] unbalanced \x1b]8;;https://evil.example\x1b\\L\x1b]8;;\x1b\\"
    " \x1b[31mred\x1b[0m \x1b[2J [dim]dimmed[/dim] \x9b1m :x:"
)
HOSTILE_VALUE = "[link=https://evil.example]L[/link]"
BIDI_VALUE = "\u202eRTL\u2066x\u2069"


def hostile_study(url: str) -> None:
    """A study whose values and failure detail carry markup, escapes and bidi controls, built
    in Optuna directly (nothing launched): a verified baseline, a faster search trial whose
    parameter values are markup and bidi controls, and a failed start whose detail (the
    root-cause line of a server's log) and log tail carry both."""
    import optuna

    from autotune import names
    from tests.builders import verified_trial

    study = optuna.create_study(storage=url, study_name="hostile", direction="maximize")
    study.add_trial(verified_trial(names.BASELINE, 40, 100.0, [2, 20, 40]))
    params = {"decode_ms": 2, "tag": HOSTILE_VALUE, "bidi": BIDI_VALUE}
    study.add_trial(
        verified_trial(names.SEARCH, 2, 150.0, [2, 20, 40], **{names.PARAMS_RESOLVED: params})
    )
    study.add_trial(
        optuna.trial.create_trial(
            params={"decode_ms": 20},
            distributions={"decode_ms": optuna.distributions.CategoricalDistribution([2, 20, 40])},
            state=optuna.trial.TrialState.PRUNED,
            user_attrs={
                names.ROLE: names.SEARCH,
                names.PARAMS_RESOLVED: {"decode_ms": 20, "tag": "[/]"},
                names.FAIL_REASON: "startup_failed",
                names.FAIL_DETAIL: HOSTILE_DETAIL,
                names.EVIDENCE: {"root_cause": HOSTILE_DETAIL, "log_tail": f"a\n{HOSTILE_DETAIL}"},
            },
            system_attrs={f"constraints:{names.CORRECTNESS_CONSTRAINT}": 1.0},
        )
    )


def _printed(monkeypatch) -> io.StringIO:
    """What render prints, as the terminal would receive it (wide: no cell folded)."""
    out = io.StringIO()
    monkeypatch.setattr(render, "console", Console(file=out, width=400))
    return out


def _no_escapes(text: str) -> None:
    assert not any(c in text for c in "\x1b\x07\x9b\u202e\u2066\u2069"), repr(text)


def test_show_prints_markup_and_escapes_from_a_study_as_text(tmp_path) -> None:
    """`autotune show` of a study whose failure detail holds ``x[/] unbalanced`` exited 1 on a
    MarkupError; ``[rank0]:`` and ``[dim]`` vanished from the reason, a parameter value
    ``[link=...]`` became a hyperlink, and the log's ESC sequences reached the terminal raw."""
    from typer.testing import CliRunner

    from autotune.cli.app import app

    url = f"sqlite:///{tmp_path / 'hostile.db'}"
    hostile_study(url)
    result = CliRunner().invoke(app, ["show", "--study", "hostile", "--storage", url])
    assert result.exit_code == 0, result.output
    _no_escapes(result.output)
    assert "trial 2 startup_failed: \\x1b]0;owned\\x07[rank0]: x[/] unbalanced" in result.output
    assert "[dim]dimmed[/dim] \\x9b1m :x:" in result.output  # the failure details, whole


def test_the_table_cells_keep_brackets_and_escape_controls(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'hostile.db'}"
    hostile_study(url)
    out = _printed(monkeypatch)
    render.print_report(url, "hostile")
    text = out.getvalue()
    _no_escapes(text)
    table = text[: text.index("failures by reason")]
    assert "\\x1b]0;owned\\x07[rank0]: x[/] unbalanced" in table  # the reason cell
    assert f"tag={HOSTILE_VALUE}" in table and "tag=[/]" in table
    assert "bidi=\\u202eRTL\\u2066x\\u2069" in table


def test_ablation_confirmation_and_run_summary_print_values_as_text(monkeypatch) -> None:
    """`autotune ablate` crashed on a choice value ``[/]`` in its table and its "minimal
    config" line; a confirmation label, the run's cleanup lines and its study name are text
    too."""
    from types import SimpleNamespace

    out = _printed(monkeypatch)
    contribution = {
        "parameter": "tag", "best_value": "[/]", "reverted_to": "[bold]x", "delta": 5.0,
        "delta_low": 1.0, "delta_high": 9.0, "verdict": "helps", "detail": "\x1b[2J[/]",
    }  # fmt: skip
    render.print_ablation(
        {"trial_number": 3, "metric": "m[/]", "best_median": 100.0, "noise_band": 2.0,
         "repeats": 2, "contributions": [contribution], "minimal_values": {"tag": "[/]"},
         "minimal_keeps_gain": None}
    )  # fmt: skip
    data = _confirmation(0.33, 0.05, 0.60)
    data["candidates"][1]["label"] = "trial 10 [/]"
    data["candidates"][1]["failures"] = ["[red]oom\x1b[0m"]
    render.print_confirmation(data)
    render.print_run_summary(
        SimpleNamespace(
            cleaned=["stopped [/] pid 7"], stopped_because=None, study_name="s[/]",
            storage_url="sqlite:///x[bold].db",
        )
    )  # fmt: skip
    text = out.getvalue()
    _no_escapes(text)
    assert "ablation of trial 3: m[/]" in text and "helps (\\x1b[2J[/])" in text
    assert "[bold]x" in text and "minimal config: tag=[/]" in text
    assert "trial 10 [/]" in text and "[red]oom\\x1b[0m" in text
    assert "cleanup: stopped [/] pid 7" in text and "Study s[/] in sqlite:///x[bold].db" in text
