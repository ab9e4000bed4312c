"""The demo's first trials show the loop working: after the baseline, the first proposals are
one-change neighbours from safe parameters (never the fault patch, never a lossy KV cache), on
any seed and whether or not the machine can run fp8. No server is launched: the objective's
choice of values (pinned / baseline / sampled) is replayed against the real sampler."""

from __future__ import annotations

import optuna
import pytest

from autotune import names
from autotune.engines import build_engine
from autotune.engines.base import DroppedChoice
from autotune.search.guide import early_neighbours, record_plan, risky_for
from autotune.spec.load import load_spec
from autotune.study.loop import open_study
from autotune.study.trial import suggest_values
from tests.builders import ROOT

FP8_DROPPED = [DroppedChoice("kv_cache_dtype", "fp8", "no AVX-512")]


def first_trials(tmp_path, seed: int, dropped, n: int = 3) -> list[dict]:
    spec = load_spec(ROOT / "studies" / "demo.yaml")
    engine = build_engine(spec)
    neighbours = early_neighbours(spec.space, engine, dropped)
    url = f"sqlite:///{tmp_path}/order-{seed}.db"
    study, created = open_study(
        spec,
        url,
        seed=seed,
        dropped=dropped,
        neighbours=neighbours,
        risky=risky_for(spec.space, engine),  # as run_study passes it
    )
    assert created
    record_plan(study, dropped, neighbours)
    out = []
    for _ in range(n):
        trial = study.ask()
        role = trial.user_attrs.get(names.ROLE, names.SEARCH)
        values = suggest_values(spec.space, trial, role)  # what TrialRunner._run does
        out.append({"role": trial.user_attrs.get(names.ROLE, "search"), "values": values})
        study.tell(trial, 100.0)
    return out, study, spec


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 42])
@pytest.mark.parametrize("dropped", [[], FP8_DROPPED], ids=["avx512", "no-avx512"])
def test_first_three_trials_never_include_the_fault_and_change_something_safe(
    tmp_path, seed, dropped
):
    trials, study, spec = first_trials(tmp_path, seed, dropped)
    assert trials[0]["role"] == "baseline"
    baseline = spec.space.baseline_values()
    for trial in trials:
        assert trial["values"].get("qkv_shard_swap") in (None, False), trial
        assert trial["values"].get("kv_cache_dtype") in (None, "auto"), trial
    changed = [
        {k: v for k, v in t["values"].items() if baseline.get(k, object()) != v} for t in trials[1:]
    ]
    # each early trial is one change from the baseline, and they differ from each other
    assert all(len(c) == 1 for c in changed), changed
    assert changed[0] != changed[1]
    # recorded: the plan in the study, the label in each neighbour trial
    labels = study.user_attrs[names.EARLY_PROPOSALS]
    assert [t.user_attrs.get(names.EARLY_PROPOSAL) for t in study.trials[1:3]] == labels


def test_a_patch_of_kind_fault_or_experimental_is_never_a_neighbour():
    spec = load_spec(ROOT / "studies" / "demo.yaml")
    neighbours = early_neighbours(spec.space, build_engine(spec), [], count=50)
    names = {n.parameter for n in neighbours}
    assert "qkv_shard_swap" not in names  # kind fault
    assert "kv_cache_dtype" not in names  # the engine calls fp8 lossy
    # parameters in constraints depend on engine defaults a neighbour cannot see
    assert not names & {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"}
    assert neighbours[0].parameter == "attention_path"  # an optimization patch comes first


def test_after_the_neighbours_the_sampler_takes_over(tmp_path):
    trials, study, _ = first_trials(tmp_path, 0, [], n=5)
    assert [t.user_attrs.get(names.EARLY_PROPOSAL) is not None for t in study.trials] == [
        False,
        True,
        True,
        False,
        False,
    ]
    assert all(names.PINNED not in t.user_attrs for t in study.trials[3:])
    # a whole config: every parameter that is active given the others' values (a conditional
    # one, e.g. num_speculative_tokens without a speculative method, is left out)
    space = load_spec(ROOT / "studies" / "demo.yaml").space
    values = trials[3]["values"]
    assert set(values) == {p.name for p in space.parameters if space.is_active(p, values)}


def test_resume_does_not_repeat_a_neighbour(tmp_path):
    spec = load_spec(ROOT / "studies" / "demo.yaml")
    neighbours = early_neighbours(spec.space, build_engine(spec), [])
    url = f"sqlite:///{tmp_path}/resume.db"
    labels = []
    for _ in range(3):  # three runs of one trial each, each with a fresh sampler
        study, _ = open_study(spec, url, seed=1, neighbours=neighbours)
        trial = study.ask()
        labels.append(trial.user_attrs.get(names.EARLY_PROPOSAL))
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    assert labels == [None, neighbours[0].label, neighbours[1].label]


def test_the_strategy_keeps_its_whole_design_after_the_early_neighbours(tmp_path):
    """The guide pins its neighbours on trials the strategy had already planned: those must not
    use up the strategy's design, or ``autotune run`` runs a shorter design than the one the
    search benchmark measured (seen on the demo: 3 design points instead of 5, and a fault
    patch at trial 7)."""
    from autotune.search.strategy import N_DESIGN, AutoSampler

    trials, study, _spec = first_trials(tmp_path, 3, [], n=3 + N_DESIGN + 1)
    auto = study.sampler._base  # noqa: SLF001 - the GuidedSampler's strategy
    assert isinstance(auto, AutoSampler)
    design = list(range(3, 3 + N_DESIGN))
    assert [auto.phase_of.get(n) for n in design] == ["design"] * N_DESIGN
    assert auto.phase_of.get(3 + N_DESIGN) != "design"
    for trial in trials[3 : 3 + N_DESIGN]:
        assert trial["values"].get("qkv_shard_swap") in (None, False), trial
        assert trial["values"].get("kv_cache_dtype") in (None, "auto"), trial
