"""Calibration and behaviour of the GLM-5 8-GPU SIMULATION (a cost model, not a measurement)."""

from __future__ import annotations

import pytest

from autotune.testing import glm5_sim
from autotune.testing.glm5_sim import (
    EAGER_BASELINE,
    FAST_BUT_WRONG,
    GRAPHS_DEFAULT,
    TUNED,
    Glm5Config,
    Glm5Sim,
    decode_tok_s,
    is_correct,
    startup_failure,
    step_time_ms,
)


def test_eager_calibration() -> None:
    eager = Glm5Config(enforce_eager=True)
    assert step_time_ms(eager) == pytest.approx(50.5, rel=0.01)
    comm_ms = (
        glm5_sim.N_ALLREDUCE
        * (glm5_sim.allreduce_us(eager) + glm5_sim.EAGER_ALLREDUCE_HOST_US)
        / 1000
    )
    assert glm5_sim.N_ALLREDUCE == 157
    assert comm_ms / glm5_sim.N_ALLREDUCE == pytest.approx(0.135, rel=0.01)
    assert comm_ms / step_time_ms(eager) == pytest.approx(0.42, abs=0.01)
    assert decode_tok_s(EAGER_BASELINE) == pytest.approx(20, rel=0.03)


def test_graphs_and_tuned_calibration() -> None:
    assert decode_tok_s(GRAPHS_DEFAULT) == pytest.approx(43, rel=0.02)
    assert decode_tok_s(TUNED) == pytest.approx(57, rel=0.02)
    assert is_correct(GRAPHS_DEFAULT) and is_correct(TUNED) and is_correct(EAGER_BASELINE)


def test_tuned_is_the_best_correct_single_stream_config() -> None:
    best = 0.0
    for eager in (False, True):
        for mode in glm5_sim.CUDAGRAPH_MODES:
            for proto in (*glm5_sim.NCCL_PROTOS, None):
                for algo in (*glm5_sim.NCCL_ALGOS, None):
                    for channels in (None, 1, 2, 4, 8, 16, 32):
                        for mla in glm5_sim.MLA_PATHS:
                            config = Glm5Config(
                                enforce_eager=eager,
                                cudagraph_mode=mode,
                                NCCL_PROTO=proto,
                                NCCL_ALGO=algo,
                                NCCL_MIN_NCHANNELS=channels,
                                mla_path=mla,
                            )
                            if is_correct(config):
                                best = max(best, decode_tok_s(config))
    assert best == pytest.approx(decode_tok_s(TUNED))


def test_fast_but_wrong_region() -> None:
    assert not is_correct(FAST_BUT_WRONG)
    assert decode_tok_s(FAST_BUT_WRONG) > decode_tok_s(GRAPHS_DEFAULT)  # the trap looks faster
    for mode in ("PIECEWISE", "FULL", "FULL_AND_PIECEWISE"):
        assert not is_correct(Glm5Config(cudagraph_mode=mode, mla_path="direct_call"))
    # Without graph capture the direct call is fine (that is how it got credited).
    assert is_correct(Glm5Config(enforce_eager=True, mla_path="direct_call"))
    assert is_correct(Glm5Config(cudagraph_mode="NONE", mla_path="direct_call"))
    assert is_correct(Glm5Config(cudagraph_capture_sizes=(), mla_path="direct_call"))


def test_red_herring_and_interactions() -> None:
    assert step_time_ms(Glm5Config(disable_custom_all_reduce=True)) == step_time_ms(GRAPHS_DEFAULT)
    assert decode_tok_s(Glm5Config(cudagraph_mode="PIECEWISE")) < decode_tok_s(GRAPHS_DEFAULT)
    # A batch beyond every capture size cannot replay a graph.
    small = Glm5Config(cudagraph_capture_sizes=(1, 2, 4), max_num_seqs=64)
    big = Glm5Config(max_num_seqs=64)
    assert decode_tok_s(small, 32) < decode_tok_s(big, 32)
    # LL wins at batch 1, loses its lead at large batches.
    ll = Glm5Config(NCCL_PROTO="LL", max_num_seqs=256)
    simple = Glm5Config(NCCL_PROTO="Simple", max_num_seqs=256)
    assert decode_tok_s(ll) > decode_tok_s(simple)
    assert decode_tok_s(ll, 256) < decode_tok_s(simple, 256)
    assert decode_tok_s(Glm5Config(max_num_seqs=4), 16) == decode_tok_s(Glm5Config(), 4)


def test_startup_failures() -> None:
    assert startup_failure(GRAPHS_DEFAULT) is None
    oom = startup_failure(Glm5Config(gpu_memory_utilization=0.97))
    assert oom is not None and oom.kind == "oom" and "CUDA out of memory" in oom.message
    assert startup_failure(Glm5Config(gpu_memory_utilization=0.95)) is None
    low = startup_failure(Glm5Config(gpu_memory_utilization=0.55))
    assert low is not None and low.kind == "insufficient_kv"
    bad = startup_failure(Glm5Config(max_num_seqs=512, max_num_batched_tokens=256))
    assert bad is not None and bad.kind == "invalid"


def test_config_validation_and_mapping() -> None:
    config = Glm5Config.from_mapping(
        {"channels": 4, "cudagraph_capture_sizes": [1, 2], "NCCL_PROTO": "LL"}
    )
    assert config.NCCL_MIN_NCHANNELS == 4 and config.cudagraph_capture_sizes == (1, 2)
    with pytest.raises(KeyError):
        Glm5Config.from_mapping({"nope": 1})
    with pytest.raises(ValueError):
        Glm5Config(NCCL_PROTO="Fast")


def test_noise_is_seeded_and_about_five_percent() -> None:
    a = [Glm5Sim(seed=7).measure_tok_s(TUNED) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    sim = Glm5Sim(seed=1)
    samples = [sim.measure_step_ms(TUNED) / step_time_ms(TUNED) for _ in range(2000)]
    mean = sum(samples) / len(samples)
    std = (sum((s - mean) ** 2 for s in samples) / len(samples)) ** 0.5
    assert mean == pytest.approx(1.0, abs=0.01)
    assert std == pytest.approx(0.05, abs=0.01)
    assert Glm5Sim(noise=0.0).measure_tok_s(TUNED) == decode_tok_s(TUNED)
