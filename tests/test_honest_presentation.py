"""Honest presentation (issue #31 item 12).

A confirmation whose gain interval includes zero is no winner: `show`, the report and `export`
say "no confirmed winner: the baseline stands", and export writes the baseline; asked for the
best measured config (``--allow-unconfirmed``) it writes that one, with a first line saying it
is not a confirmed gain. The "best so far" curve counts search launches only; the report's
hardware names the machine; a figure never measured is absent, never 0.0.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from autotune import names
from autotune.report.html import build_report
from autotune.spec.load import load_spec
from autotune.study.export import export_best
from autotune.study.results import NO_CONFIRMED_WINNER, ReportSource, baseline_reason, best_trials
from tests.builders import verified_trial, write_fake_spec

SPACE = """
parameters:
  decode_ms:
    type: categorical
    choices: [2, 20, 40]
    baseline: 40
    target: {flag: --decode-ms}
"""


def _trial(role: str, decode_ms: int, tps: float, **attrs) -> optuna.trial.FrozenTrial:
    return verified_trial(role, decode_ms, tps, [2, 20, 40], **attrs)


def _confirmation(low: float, high: float, gain: float = 0.3) -> dict:
    return {
        "metric": "decode_tokens_per_s",
        "repeats": 3,
        "winner": 1,
        "gain": gain,
        "gain_ci": [low, high],
        "candidates": [
            {"trial_number": None, "label": "baseline", "samples": [100.0, 90.0, 110.0],
             "failures": [], "median": 100.0},
            {"trial_number": 1, "label": "trial 1", "samples": [130.0, 80.0, 170.0],
             "failures": [], "median": 130.0},
        ],
    }  # fmt: skip


@pytest.fixture
def study_setup(tmp_path: Path):
    spec_path = write_fake_spec(tmp_path, SPACE, name="honest")
    spec = load_spec(spec_path)
    url = spec.default_storage()
    # not open_study: it enqueues a baseline of its own as trial 0
    study = optuna.create_study(storage=url, study_name="honest", direction="maximize")
    study.add_trial(_trial(names.BASELINE, 40, 100.0))
    study.add_trial(_trial(names.SEARCH, 2, 150.0))
    return spec, url, study


def _first_line(path: Path) -> str:
    return path.read_text().splitlines()[0]


def test_an_interval_that_includes_zero_leaves_the_baseline_standing(study_setup, tmp_path):
    spec, url, study = study_setup
    study.set_user_attr(names.CONFIRMATION, _confirmation(-0.1, 0.8))
    reason = baseline_reason(study)
    assert reason is not None and reason.startswith(NO_CONFIRMED_WINNER)
    assert "-10.0% .. +80.0%" in reason
    assert [t.number for t in best_trials(study)] == [0]

    out = tmp_path / "best.yaml"
    (result,) = export_best(spec, study, out)
    assert result.trial_number == 0 and result.baseline_reason == reason
    assert NO_CONFIRMED_WINNER in _first_line(out) and "BASELINE" in _first_line(out)
    assert yaml.safe_load(out.read_text())["decode-ms"] == 40

    page = build_report(study, ReportSource(url))
    assert "No confirmed winner: the baseline stands" in page


def test_asked_for_the_best_measured_config_export_says_it_is_not_a_confirmed_gain(
    study_setup, tmp_path
):
    spec, _, study = study_setup
    study.set_user_attr(names.CONFIRMATION, _confirmation(-0.1, 0.8))
    out = tmp_path / "best.yaml"
    (result,) = export_best(spec, study, out, require_confirmed=False)
    assert result.trial_number == 1 and result.baseline_reason is None
    first = _first_line(out)
    assert "NOT a confirmed gain" in first and "includes no change" in first
    assert result.not_confirmed and "-10.0% .. +80.0%" in result.not_confirmed
    assert yaml.safe_load(out.read_text())["decode-ms"] == 2


def test_an_unconfirmed_study_exported_anyway_says_so_in_its_first_line(study_setup, tmp_path):
    spec, _, study = study_setup
    out = tmp_path / "best.yaml"
    (result,) = export_best(spec, study, out, require_confirmed=False)
    assert result.trial_number == 1
    assert "NOT a confirmed gain" in _first_line(out) and "no confirmation ran" in _first_line(out)


def test_a_confirmed_gain_is_exported_as_the_winner(study_setup, tmp_path):
    spec, url, study = study_setup
    study.set_user_attr(names.CONFIRMATION, _confirmation(0.1, 0.8))
    assert baseline_reason(study) is None
    out = tmp_path / "best.yaml"
    (result,) = export_best(spec, study, out)
    assert result.trial_number == 1 and result.not_confirmed is None
    assert "NOT" not in _first_line(out) and NO_CONFIRMED_WINNER not in _first_line(out)
    assert NO_CONFIRMED_WINNER not in build_report(study, ReportSource(url)).lower()


def test_best_so_far_counts_search_launches_only(study_setup):
    """The confirmation's re-measurements of the same configs (one lucky 400 tok/s round) are
    noise, not progress: the line stays at the search's best, and the rounds are labelled."""
    from autotune.report.plots import best_so_far

    _, url, study = study_setup
    study.add_trial(_trial(names.CONFIRM, 2, 400.0))
    study.add_trial(_trial(names.SEARCH, 20, 120.0))
    study.add_trial(_trial(names.ABLATION, 40, 300.0))
    trials = study.get_trials()
    points = best_so_far(trials, list(range(len(trials))), 1.0)
    assert [trials[i].number for i, _ in points] == [0, 1, 3]
    assert [b for _, b in points] == [100.0, 150.0, 150.0]
    page = build_report(study, ReportSource(url))
    assert "confirmation round (re-measured, not progress)" in page
    assert "ablation round (not progress)" in page
    assert "best so far (search launches)" in page


def test_the_machine_is_described_by_its_hardware_not_its_hostname(tmp_path):
    from autotune.report.format import machine_text
    from autotune.study.hardware import cpu_model_from_cpuinfo, describe_machine, parse_gpus

    assert names.MACHINE == names.MACHINE == "machine"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel\t\t: 1\n"
        "model name\t: AMD EPYC 7763 64-Core Processor\nprocessor\t: 1\n"
    )
    assert cpu_model_from_cpuinfo(cpuinfo.read_text()) == "AMD EPYC 7763 64-Core Processor"
    smi = "NVIDIA H200, 143771\nNVIDIA H200, 143771\n"
    machine = describe_machine(cpuinfo=cpuinfo, smi=lambda: smi)
    assert machine["cpu_model"] == "AMD EPYC 7763 64-Core Processor"
    assert machine["logical_cores"] >= 1 and machine["memory_gib"] > 0
    assert machine["gpus"] == [{"name": "NVIDIA H200", "memory_mib": 143771}] * 2
    text = machine_text(machine)
    assert "AMD EPYC 7763" in text and "logical cores" in text and "GiB memory" in text
    assert "2 x NVIDIA H200 (143771 MiB)" in text
    # no nvidia-smi: no GPUs key (absent, not an empty list or a 0)
    assert "gpus" not in describe_machine(cpuinfo=cpuinfo, smi=lambda: None)
    # the units form, and a memory that is not a number (left out, not 0)
    assert parse_gpus("Tesla T4, 15360 MiB\nOdd GPU, [N/A]\n") == [
        {"name": "Tesla T4", "memory_mib": 15360},
        {"name": "Odd GPU"},
    ]


def test_the_report_names_the_recorded_machine_or_says_it_was_not_recorded(study_setup):
    _, url, study = study_setup
    page = build_report(study, ReportSource(url))
    assert "were not recorded in this study" in page
    study.set_user_attr(
        "machine",
        {"cpu_model": "Intel Xeon Platinum 8480+", "logical_cores": 224, "memory_gib": 2015.6,
         "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}] * 8},
    )  # fmt: skip
    page = build_report(study, ReportSource(url))
    assert "Intel Xeon Platinum 8480+, 224 logical cores, 2015.6 GiB memory" in page
    assert "8 x NVIDIA H100 80GB HBM3 (81559 MiB)" in page
    assert "were not recorded" not in page


def test_a_figure_never_measured_is_absent_from_the_report_not_zero(study_setup):
    """A trial whose answers arrived in bursts has no ITL percentiles (bench/phase.py leaves
    them out): the report says "bursty (not measurable)", never 0.0; a metric stored as None
    (never measured) is an empty cell, not 0.0 and not a crash."""
    import re

    _, url, study = study_setup
    study.add_trial(
        _trial(
            names.SEARCH,
            20,
            90.0,
            **{
                names.METRICS: {"decode_tokens_per_s": 90.0, "ttft_p95_ms": None},
                "stream_shape": {"itl": "bursty", "bursty": 8, "responses": 8},
            },
        )
    )
    page = build_report(study, ReportSource(url))
    trials_table = page[page.index("<section id='trials'>") :]
    row = re.search(r"<tr><td>2</td>.*?</tr>", trials_table).group(0)
    assert row.endswith("<td>90.0</td><td></td></tr>") and ">0.0<" not in row
    # the winner section of a bursty best: ITL said to be not measurable
    study.set_user_attr(names.CONFIRMATION, {**_confirmation(0.1, 0.5), "winner": 2})
    page = build_report(study, ReportSource(url))
    winner = page[page.index("<section id='winner'>") : page.index("<section id='progress'>")]
    assert "itl_p95_ms</td><td>bursty (not measurable)" in winner
    assert ">0.0<" not in winner


def test_the_export_header_says_when_the_figures_are_doubtful(tmp_path: Path) -> None:
    """A count the server and autotune disagree on, and a host other work kept busy, are in
    the exported file's header: a reader of the file alone sees them."""
    from autotune.study.export import export_trial

    spec = load_spec(write_fake_spec(tmp_path, SPACE, name="doubt"))
    suspect = {"autotune": 96, "usage": 384, "disagree": ["usage"]}
    host = {"noisy": True, "reasons": ["other processes took 80% of 2 CPUs (limit 25%)"]}
    trial = _trial(names.SEARCH, 2, 900.0, measurement_suspect=suspect, **{names.HOST: host})
    out = tmp_path / "best.yaml"
    export_trial(spec, trial, out)
    header = [line for line in out.read_text().splitlines() if line.startswith("#")]
    assert any("measurement suspect: autotune counted 96" in line for line in header)
    assert any("noisy host: other processes took 80%" in line for line in header)
    plain = tmp_path / "plain.yaml"
    export_trial(spec, _trial(names.SEARCH, 2, 900.0), plain)
    assert "suspect" not in plain.read_text() and "noisy" not in plain.read_text()


def test_the_report_says_when_the_winners_figures_are_doubtful(study_setup):
    """The winner section warns of a token count the server and autotune disagree on and of a
    host other work kept busy; a trial without either shows no warning."""
    _, url, study = study_setup
    suspect = {"autotune": 96, "usage": 384, "disagree": ["usage"]}
    host = {"noisy": True, "reasons": ["other processes took 80% of 2 CPUs (limit 25%)"]}
    study.add_trial(
        _trial(names.SEARCH, 20, 90.0, **{names.MEASUREMENT_SUSPECT: suspect, names.HOST: host})
    )
    number = study.trials[-1].number
    study.set_user_attr(names.CONFIRMATION, {**_confirmation(0.1, 0.5), "winner": number})
    page = build_report(study, ReportSource(url))
    winner = page[page.index("<section id='winner'>") : page.index("<section id='progress'>")]
    assert "doubtful figures" in winner
    assert "counted by autotune 96, usage 384" in winner
    assert "noisy host: other processes took 80%" in winner
    study.add_trial(_trial(names.SEARCH, 2, 95.0))
    study.set_user_attr(
        names.CONFIRMATION, {**_confirmation(0.1, 0.5), "winner": study.trials[-1].number}
    )
    page = build_report(study, ReportSource(url))
    winner = page[page.index("<section id='winner'>") : page.index("<section id='progress'>")]
    assert "doubtful figures" not in winner


def test_show_reads_a_study_by_name_and_storage_without_a_spec(study_setup, tmp_path, monkeypatch):
    """`show --study NAME --storage URL` needs no spec file, as `report` does: run from a folder
    with no studies/demo.yaml it shows the study and its verdict line from one snapshot."""
    from typer.testing import CliRunner

    from autotune.cli.app import app

    _, url, study = study_setup
    study.set_user_attr(names.CONFIRMATION, _confirmation(-0.1, 0.8))
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    monkeypatch.chdir(empty)
    result = CliRunner().invoke(app, ["show", "--study", "honest", "--storage", url])
    assert result.exit_code == 0, result.output
    assert "study honest" in result.output
    assert NO_CONFIRMED_WINNER in result.output


def _reference(capabilities: dict) -> dict:
    return {"prompts": 3, "tolerance": 0.01, "drift_observed": 0.0, "capabilities": capabilities}


def test_a_text_only_reference_shows_no_drift_nobody_measured():
    """Without logprobs (per token or teacher-forced) no drift was measured and no tolerance
    applies: the line says so instead of 'baseline drift 0.0000'."""
    from autotune.cli.render import reference_line
    from autotune.gate.reference import Capabilities

    text_only = Capabilities(
        token_ids=False, token_strings=False, token_logprobs=False, top_logprobs=False,
        teacher_forced=None,
    ).to_dict()  # fmt: skip
    line = reference_line(_reference(text_only))
    assert "drift" in line and "no drift measured" in line
    assert "0.0000" not in line and "0.0100" not in line
    assert "compared by text" in line

    with_logprobs = Capabilities().to_dict()
    line = reference_line(_reference(with_logprobs))
    assert "logprob tolerance 0.0100 (baseline drift 0.0000)" in line
    assert "compared by token ids" in line


def test_the_report_and_show_say_what_the_measurement_was_exposed_to(study_setup, monkeypatch):
    """The confirmation's host_noise (other work, not the configs, set its interval) is in the
    report, and a trial's flagged measurement traps are in `show`."""
    from rich.console import Console

    from autotune.cli import render

    _, url, study = study_setup
    noise = "host noise, not the configs, decides this interval: 3 of 4 rounds were noisy"
    study.set_user_attr(names.CONFIRMATION, {**_confirmation(-0.1, 0.8), "host_noise": noise})
    page = build_report(study, ReportSource(url))
    assert "id='host-noise'" in page and "3 of 4 rounds were noisy" in page

    trap = "prefix cache hit rate 82% (repeated prompts measured a warm cache)"
    flagged = verified_trial(names.SEARCH, 20, 120.0, [2, 20, 40])
    flagged.user_attrs[names.TRAPS] = {"prefix_cache": {"flagged": True}, "flagged": [trap]}
    study.add_trial(flagged)
    out = Console(width=250, record=True)
    monkeypatch.setattr(render, "console", out)
    render.print_report(url, "honest")
    assert f"trial 2: {trap}" in out.export_text()


def test_where_the_time_went_leaves_out_a_confirmation_that_never_ran(study_setup, monkeypatch):
    """With ``--confirm-top 0`` no confirmation ran: `show` said ``confirmation: 0.0 s (0%)``
    and the report a row of 0.0 s, figures nobody measured. Once a confirmation trial ran,
    its time is there."""
    from rich.console import Console

    from autotune.cli import render

    _, url, study = study_setup
    spent = {names.TIME_S: {"startup": 6.0, "gate": 2.0}}
    study.add_trial(_trial(names.SEARCH, 20, 120.0, **spent))

    def shown() -> tuple[str, str]:
        out = Console(width=250, record=True)
        monkeypatch.setattr(render, "console", out)
        render.print_report(url, "honest")
        page = build_report(study, ReportSource(url))
        time = page[page.index("<section id='time'>") :]
        return out.export_text(), time[: time.index("</section>")]

    text, time = shown()
    assert "where the time went:" in text and "startup: 6.0 s (75%)" in text
    assert "confirmation" not in text
    assert "<tr><td>startup</td>" in time and "confirmation" not in time
    study.add_trial(_trial(names.CONFIRM, 20, 121.0, **{names.TIME_S: {"measurement": 8.0}}))
    text, time = shown()
    assert "confirmation: 8.0 s (50%)" in text
    assert "<tr><td>confirmation</td><td>8.0</td><td>50%</td></tr>" in time
