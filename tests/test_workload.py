"""Workloads (autotune/spec/workload.py): prompt files in three shapes, synthetic length
distributions with a shared prefix, bad files refused naming file and line, and a resumed study
whose workload changed refused (exit 2) unless --allow-workload-change."""

from __future__ import annotations

import json

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from autotune import names
from autotune.cli.app import app
from autotune.errors import SpecError
from autotune.spec.load import load_spec
from autotune.spec.reference_prompts import reference_requests
from autotune.spec.workload import check_workload, workload_hash
from autotune.study.loop import RunOptions, open_study
from tests.builders import write_fake_spec

SPACE = """
parameters:
  max_num_seqs:
    type: categorical
    choices: [2, 8]
    target: {flag: --max-num-seqs}
"""


def _spec_with(tmp_path, workload: dict, name: str = "wl"):
    """A fake spec with ``workload``, its model folder without a tokenizer (these tests are of
    what a workload does when it has none: lengths in words, said so)."""
    path = write_fake_spec(tmp_path, SPACE, name=name)
    (tmp_path / "model" / "tokenizer.json").unlink(missing_ok=True)
    raw = yaml.safe_load(path.read_text())
    raw["workload"].pop("prompts")
    raw["workload"].update(workload)
    path.write_text(yaml.safe_dump(raw))
    return path


def test_jsonl_prompt_chat_and_sharegpt_lines(tmp_path) -> None:
    lines = [
        {"prompt": "1 2 3", "max_tokens": 5},
        {"messages": [{"role": "user", "content": "a b c"}]},
        {"conversations": [{"from": "human", "value": "x y z"}, {"from": "gpt", "value": "w"}]},
        {"conversations": [{"from": "gpt", "value": "no human turn"}]},
    ]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    spec = load_spec(_spec_with(tmp_path, {"file": "p.jsonl", "max_tokens": 9}))
    w = spec.workload
    assert w.prompts == ("1 2 3", "user: a b c\nassistant:", "x y z")
    assert w.output_tokens == (5, 9, 9)  # a line's own max_tokens, else workload.max_tokens
    assert "1 records without a human turn skipped" in w.source
    assert "plain" in (w.chat_format or "")  # the fake model folder has no chat template
    # a ShareGPT-style JSON array is read too, and limit takes the first N
    (tmp_path / "s.json").write_text(json.dumps([lines[2], lines[0]]))
    spec = load_spec(_spec_with(tmp_path, {"file": "s.json", "limit": 1}))
    assert spec.workload.prompts == ("x y z",)


@pytest.mark.parametrize(
    "content, line, expect",
    [
        ('{"prompt": "ok"}\n{"prompt": "broken"\n', 2, "not JSON"),
        ('{"prompt": "ok"}\n\n{"text": "x"}\n', 3, 'expected "prompt", "messages"'),
        ('{"messages": "hi"}\n', 1, "messages must be"),
        ('{"prompt": "ok", "max_tokens": 0}\n', 1, "max_tokens must be a positive integer"),
        ("[1, 2]\n", None, "item 0"),
    ],
)
def test_bad_workload_file_names_file_and_line(tmp_path, content, line, expect) -> None:
    (tmp_path / "bad.jsonl").write_text(content)
    with pytest.raises(SpecError) as info:
        load_spec(_spec_with(tmp_path, {"file": "bad.jsonl"}))
    text = str(info.value)
    assert str(tmp_path / "bad.jsonl") + (f":{line}:" if line else ":") in text
    assert expect in text
    # and through the CLI: exit 2, one line, nothing written
    result = CliRunner().invoke(app, ["show", "--spec", str(tmp_path / "wl.yaml")])
    assert result.exit_code == 2 and "bad.jsonl" in result.output


def test_exactly_one_source_and_missing_file(tmp_path) -> None:
    with pytest.raises(SpecError, match="give exactly one of prompts"):
        load_spec(_spec_with(tmp_path, {}))
    with pytest.raises(SpecError, match=r"workload\.file: file not found"):
        load_spec(_spec_with(tmp_path, {"file": "missing.jsonl"}))


def test_synthetic_lengths_prefix_and_seed_in_words(tmp_path) -> None:
    synthetic = {
        "count": 20,
        "input_tokens": {"dist": "uniform", "min": 10, "max": 30},
        "output_tokens": {"dist": "normal", "mean": 12, "std": 3},
        "shared_prefix": 0.5,
        "seed": 7,
    }
    spec = load_spec(_spec_with(tmp_path, {"synthetic": synthetic}))
    w = spec.workload
    # the fake spec's model folder is empty: no tokenizer, so lengths are words, said so
    assert w.length_unit.startswith("words (no tokenizer")
    lengths = [len(p.split()) for p in w.prompts]
    assert len(w.prompts) == 20 and all(10 <= n <= 30 for n in lengths)
    assert len(set(lengths)) > 3  # really drawn, not fixed
    assert len(w.output_tokens) == 20 and all(n >= 1 for n in w.output_tokens)
    shortest = min(lengths)
    prefix = w.prompts[0].split()[: round(0.5 * shortest)]
    assert all(p.split()[: len(prefix)] == prefix for p in w.prompts)
    assert len(set(w.prompts)) == 20
    again = load_spec(_spec_with(tmp_path, {"synthetic": synthetic}))
    assert again.workload.prompts == w.prompts  # the seed pins them
    other = load_spec(_spec_with(tmp_path, {"synthetic": {**synthetic, "seed": 8}}))
    assert workload_hash(other.workload) != workload_hash(w)


def test_synthetic_fixed_lengths_in_tokens_with_the_demo_tokenizer(tmp_path) -> None:
    from transformers import AutoTokenizer

    from tests.builders import DEMO_MODEL

    path = _spec_with(tmp_path, {"synthetic": {"count": 5, "input_tokens": 40, "unit": "tokens"}})
    raw = yaml.safe_load(path.read_text())
    raw["model"]["path"] = str(DEMO_MODEL)
    path.write_text(yaml.safe_dump(raw))
    w = load_spec(path).workload
    assert w.length_unit.startswith("tokens (demo tokenizer")
    tok = AutoTokenizer.from_pretrained(str(DEMO_MODEL))
    counts = [len(tok.encode(p, add_special_tokens=False)) for p in w.prompts]
    assert all(abs(n - 40) <= 2 for n in counts), counts
    assert w.output_tokens == ()  # no output distribution: every prompt gets max_tokens


@pytest.mark.parametrize(
    "synthetic, key",
    [
        ({"input_tokens": {"dist": "poisson", "mean": 3}}, "input_tokens.dist"),
        ({"input_tokens": {"dist": "uniform", "min": 9, "max": 3}}, "input_tokens"),
        ({"input_tokens": 8, "shared_prefix": 1.0}, "shared_prefix"),
        ({"input_tokens": 8, "unit": "chars"}, "unit"),
        ({"input_tokens": 8, "unit": "tokens"}, "unit"),  # no tokenizer in the fake model
        ({"count": 3}, "input_tokens"),
        # each of these used to hang validation (hours of prompt generation) or raise a
        # ValueError traceback (NaN)
        ({"count": 10**8, "input_tokens": 10}, "count"),
        ({"input_tokens": 10**8}, "input_tokens"),
        ({"input_tokens": {"dist": "normal", "mean": 100, "std": 10**6}}, "input_tokens"),
        ({"input_tokens": {"dist": "normal", "mean": 10, "std": float("nan")}}, "input_tokens.std"),
        ({"count": 10_000, "input_tokens": 5_000}, ""),
        # in all by the mean length: uniform 1..4,000 is 2,000 on average, 20M for 10,000
        ({"count": 10_000, "input_tokens": {"dist": "uniform", "min": 1, "max": 4_100}}, ""),
    ],
)
def test_bad_synthetic_names_the_key(tmp_path, synthetic, key) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(_spec_with(tmp_path, {"synthetic": synthetic}))
    assert f"workload.synthetic{'.' if key else ''}{key}" in str(info.value)


def test_reference_prompts_are_capped_and_consistent(tmp_path) -> None:
    lines = [{"prompt": f"p{i}", "max_tokens": 4} for i in range(40)]
    lines += [{"prompt": "p0", "max_tokens": 7}]  # p0 asked with two lengths: no reference
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    w = load_spec(_spec_with(tmp_path, {"file": "p.jsonl"})).workload
    chosen = reference_requests(w)
    assert "p0" not in chosen and len(chosen) == 32 and set(chosen.values()) == {4}
    # not the first 32: a server wrong on every prompt past the 32nd passed unchecked
    assert any(int(p[1:]) >= 33 for p in chosen), chosen
    assert reference_requests(w) == chosen  # the same workload, the same reference (resume)
    order = [p for p in w.prompts if p in chosen]
    assert list(chosen) == list(dict.fromkeys(order))  # in workload order


def test_resumed_study_with_changed_workload_is_refused(tmp_path) -> None:
    path = write_fake_spec(tmp_path, SPACE, name="resume")
    spec = load_spec(path)
    study, _ = open_study(spec, spec.default_storage())
    assert check_workload(study, spec) is None
    stored = study.user_attrs[names.WORKLOAD]
    assert stored["hash"] == workload_hash(spec.workload) and stored["source"] == "inline"
    # measurement-only fields keep the hash; what is measured changes it
    raw = yaml.safe_load(path.read_text())
    raw["workload"]["repeats"] = 3
    path.write_text(yaml.safe_dump(raw))
    assert check_workload(study, load_spec(path)) is None
    raw["workload"]["prompts"] = ["something else"]
    path.write_text(yaml.safe_dump(raw))
    changed = load_spec(path)
    with pytest.raises(SpecError) as info:
        check_workload(study, changed)
    assert info.value.file == str(path) and info.value.key == "workload"
    assert "--allow-workload-change" in str(info.value)
    # the CLI: exit 2 naming the file and key, before any trial, and nothing written to the
    # study (another --sampler was recorded, and the machine, before the refusal)
    attrs = dict(study.user_attrs)
    result = CliRunner().invoke(
        app,
        ["run", "--spec", str(path), "--trials", "1", "--confirm-top", "0", "--sampler", "random"],
    )
    assert result.exit_code == 2, result.output
    assert f"{path}: workload:" in result.output.replace("\n", "")
    loaded = optuna.load_study(storage=spec.default_storage(), study_name="resume")
    assert all(t.state != optuna.trial.TrialState.COMPLETE for t in loaded.trials)
    assert loaded.user_attrs == attrs
    # allowed: accepted, recorded, the new hash stored
    note = check_workload(study, changed, allow_change=True)
    assert note and "workload changed after" in note
    assert study.user_attrs[names.WORKLOAD]["hash"] == workload_hash(changed.workload)
    assert len(study.user_attrs["workload_changes"]) == 1
    assert RunOptions(trials=1, allow_workload_change=True).allow_workload_change


def test_a_resumed_reference_of_other_prompts_still_judges_every_answer_it_covers(
    tmp_path,
) -> None:
    """A study recorded before the reference's prompts were drawn holds the first 32: the
    under-load check takes lengths for every prompt (``single_length_prompts``), so answers to
    those 32 stay judged, though today's draw would pick others."""
    from autotune.bench.phase import RequestRecord
    from autotune.gate.judge import judge_under_load
    from autotune.gate.reference import Completion, Reference, ReferenceEntry
    from autotune.spec.reference_prompts import single_length_prompts

    lines = [{"prompt": f"p{i}", "max_tokens": 4} for i in range(40)]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    w = load_spec(_spec_with(tmp_path, {"file": "p.jsonl"})).workload
    old = [f"p{i}" for i in range(32)]  # the old rule's reference
    assert set(old) != set(reference_requests(w))
    reference = Reference(
        entries={p: ReferenceEntry(Completion(prompt=p, text="x", token_ids=(1,))) for p in old},
        max_tokens=dict.fromkeys(old, 4),
        tolerance=0.0,
        drift_observed=0.0,
    )
    answers = [RequestRecord(prompt=f"p{i}", ok=True, token_ids=(1,), text="x") for i in range(40)]
    judged = judge_under_load(reference, answers, single_length_prompts(w), 8)
    assert judged.unreferenced == 8 and judged.checked == 32
