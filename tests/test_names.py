"""names.py: the one table of names a study is written with."""

from __future__ import annotations

import pytest

from autotune import names
from autotune.bench.phase import PhaseResult, RequestRecord, summarize
from autotune.errors import CandidateError, InfrastructureError


def test_every_metric_the_benchmark_reports_has_a_direction() -> None:
    # one finished request is enough for every latency percentile to exist
    record = RequestRecord(
        prompt="p",
        ok=True,
        ttft_s=0.01,
        e2e_s=0.05,
        token_times_s=(0.01, 0.02, 0.04),
        output_tokens=3,
    )
    phase = PhaseResult(records=(record,), wall_s=1.0)
    reported = set(summarize(phase, phase))
    assert reported <= set(names.METRIC_DIRECTIONS), reported - set(names.METRIC_DIRECTIONS)
    # e2e_p50/p99 were once measured but not optimisable
    assert {"e2e_p50_ms", "e2e_p95_ms", "e2e_p99_ms"} <= reported


def test_direction_and_sign() -> None:
    assert names.direction("output_tokens_per_s") == "maximize"
    assert names.direction("ttft_p95_ms") == "minimize"
    # a level's metric has its base metric's direction
    assert names.direction("ttft_p95_ms@16") == "minimize"
    assert names.sign("decode_tokens_per_s") == 1.0
    assert names.sign("itl_p99_ms") == -1.0
    with pytest.raises(KeyError):
        names.direction("tokens_per_joule")
    assert names.sign("objective 1", default="maximize") == 1.0


@pytest.mark.parametrize("value", [[1], [1, 2, 4], (8, 16)])
def test_int_list_label_round_trips(value) -> None:
    label = names.int_list_label(value)
    assert "," in label or len(value) == 1
    assert names.parse_int_list(label) == [int(v) for v in value]


def test_int_list_label_is_optunas_scalar() -> None:
    assert names.int_list_label([1, 2, 4]) == "1,2,4"
    assert names.parse_int_list("") == []


def test_roles_are_distinct_and_search_roles_are_roles() -> None:
    assert len(set(names.ROLES)) == len(names.ROLES)
    assert set(names.SEARCH_ROLES) <= set(names.ROLES)


def test_reason_tables_guard_the_exceptions() -> None:
    assert not set(names.CANDIDATE_REASONS) & set(names.INFRA_REASONS)
    assert "slo_violated" not in names.CANDIDATE_REASONS  # never raised: an SLO is a constraint
    for reason in names.CANDIDATE_REASONS:
        assert CandidateError(reason).reason == reason
    for reason in names.INFRA_REASONS:
        assert InfrastructureError(reason).reason == reason
    with pytest.raises(ValueError):
        CandidateError("port_taken")
    with pytest.raises(ValueError):
        InfrastructureError("oom")


def test_constraint_names() -> None:
    assert names.slo_constraint("ttft_p95_ms") == "slo:ttft_p95_ms"
    assert names.constraint_attr(names.CORRECTNESS_CONSTRAINT) == "constraints:correct"


def test_attribute_keys_are_distinct() -> None:
    keys = {
        k: v
        for k, v in vars(names).items()
        if k.isupper() and isinstance(v, str) and not k.startswith("SLO_")
    }
    trial_keys = [keys[k] for k in ("CORRECT", "FAIL_REASON", "METRICS", "SERVER", "ROLE")]
    assert len(set(trial_keys)) == len(trial_keys)
