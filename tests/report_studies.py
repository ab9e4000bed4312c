"""Studies for the report and compare tests, built through the real study loop on the fake
server (a test double): a finished study with failures, a confirmed winner and an ablation; a
study whose baseline is broken (0 correct trials); and, built directly in Optuna because only
their shape matters, a multi-objective study and a study with a trial still running."""

from __future__ import annotations

from pathlib import Path

import optuna
import yaml

from autotune import names
from autotune.errors import PreflightError
from autotune.spec.load import load_spec
from autotune.storage import open_storage
from autotune.study.loop import RunOptions, open_study, run_study
from tests.builders import write_fake_spec

SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [1, 4, 8]
    baseline: 1
    target: {flag: --max-num-seqs}
  fault:
    type: categorical
    choices: [null, wrong_text, exit_at_start, oom]
    baseline: null
    target: {flag: --fault}
"""


def fake_spec(directory: Path, *, name: str, baseline_fault: str | None = None) -> Path:
    """A fake-server study whose speed depends on max_num_seqs (1 at the baseline)."""
    directory.mkdir(parents=True, exist_ok=True)
    space = SPACE.replace("baseline: null", f"baseline: {baseline_fault or 'null'}")
    path = write_fake_spec(
        directory,
        space,
        name=name,
        args=("--decode-ms", "4"),
        workload={"num_requests": 8, "concurrency": 8},
        objective={"metric": "output_tokens_per_s"},
    )
    raw = yaml.safe_load(path.read_text())
    raw["storage"] = f"sqlite:///{directory / (name + '.db')}"
    # 1e6 active params at 16 bits over 20 GB/s: a 10,000 tok/s decode ceiling
    raw["roofline"] = {"active_params": 1.0e6, "bits": 16, "bandwidth_gbs": 20}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def build_rich_study(directory: Path, *, ablate: bool = True) -> Path:
    """Baseline, an incorrect trial (divergence), a startup crash and an OOM (log tails), two
    healthy faster configs; then the confirmation (and an ablation) of the winner."""
    from autotune.analysis.ablation import run_ablation
    from autotune.analysis.confirm import run_confirmation

    path = fake_spec(directory, name="rich")
    spec = load_spec(path)
    url = spec.default_storage() if spec.storage is None else spec.storage
    study, _ = open_study(spec, url)
    for values in (
        {"max_num_seqs": 8, "fault": "wrong_text"},
        {"max_num_seqs": 8, "fault": "exit_at_start"},
        {"max_num_seqs": 4, "fault": "oom"},
        {"max_num_seqs": 8, "fault": None},
        {"max_num_seqs": 4, "fault": None},
    ):
        study.enqueue_trial(values, user_attrs={names.ROLE: "search"})
    run_study(spec, RunOptions(trials=6, validate=False))
    study = optuna.load_study(storage=open_storage(url), study_name=spec.name)
    run_confirmation(spec, study, url, top_k=1, rounds=2)
    if ablate:
        run_ablation(spec, study, url, repeats=2)
    _store_recorded_profiles(study)
    return path


def _store_recorded_profiles(study: optuna.Study) -> None:
    """The fake server has no profiler: store, for the baseline and the best trial, the
    breakdown of the real vLLM CPU trace fixture (labelled as such in its notes), so the
    report's step-time section is drawn and checked in the browser."""
    from autotune.analysis.profile import result_from_traces
    from autotune.engines.vllm.profile import RECIPE
    from autotune.study.results import best_trials

    fixture = Path(__file__).parent / "fixtures" / "vllm_cpu_profile_rank0.trace.json.gz"
    stored = {}
    best = best_trials(study)
    for number, role, measured in ((0, "baseline", 0.95), (best[0].number, "best", 0.8)):
        result = result_from_traces(
            number, role, RECIPE, [fixture], 10, measured * 0.9, measured, {}, "fixture"
        )
        stored[str(number)] = {
            **result.to_dict(),
            "notes": ["test double: breakdown of a recorded vLLM CPU trace, not this trial's"],
        }
    study.set_user_attr(names.PROFILES, stored)


def build_broken_study(directory: Path) -> Path:
    """The baseline itself fails to start: the study stops with 0 correct trials."""
    path = fake_spec(directory, name="broken", baseline_fault="exit_at_start")
    spec = load_spec(path)
    try:
        run_study(spec, RunOptions(trials=2, validate=False))
    except PreflightError:
        return path
    raise AssertionError("a broken baseline must stop the study")


def add_synthetic_studies(url: str) -> None:
    """A two-objective study with a front, and a study with one trial still running."""
    storage = open_storage(url, heartbeat=False)
    multi = optuna.create_study(
        storage=storage, study_name="multi", directions=["maximize", "minimize"]
    )
    multi.set_metric_names(["decode_tokens_per_s", "ttft_p95_ms"])
    points = [(100.0, 50.0, 1), (150.0, 80.0, 4), (120.0, 90.0, 2), (180.0, 120.0, 8)]
    for i, (tps, ttft, seqs) in enumerate(points):
        multi.add_trial(
            optuna.trial.create_trial(
                params={"max_num_seqs": seqs},
                distributions={
                    "max_num_seqs": optuna.distributions.CategoricalDistribution([1, 2, 4, 8])
                },
                values=[tps, ttft],
                user_attrs={
                    names.CORRECT: True,
                    names.ROLE: "baseline" if i == 0 else "search",
                    names.PARAMS_RESOLVED: {"max_num_seqs": seqs},
                    names.METRICS: {"decode_tokens_per_s": tps, "ttft_p95_ms": ttft},
                    names.CHECK: {"passed": True},
                },
                system_attrs={f"constraints:{names.CORRECTNESS_CONSTRAINT}": 0.0},
            )
        )
    running = optuna.create_study(storage=storage, study_name="running", direction="maximize")
    running.add_trial(
        optuna.trial.create_trial(
            params={"max_num_seqs": 1},
            distributions={
                "max_num_seqs": optuna.distributions.CategoricalDistribution([1, 2, 4, 8])
            },
            value=100.0,
            user_attrs={
                names.CORRECT: True,
                names.ROLE: "baseline",
                names.PARAMS_RESOLVED: {"max_num_seqs": 1},
                names.METRICS: {"decode_tokens_per_s": 100.0},
            },
            system_attrs={f"constraints:{names.CORRECTNESS_CONSTRAINT}": 0.0},
        )
    )
    running.ask({"max_num_seqs": optuna.distributions.CategoricalDistribution([1, 2, 4, 8])})
