"""The one reader of Prometheus' text exposition format, for every ``/metrics`` autotune reads.

Both the server-side evidence (:mod:`autotune.server.metrics`, counters and gauges summed over
label sets) and an engine's own scrapes (vLLM's speculative-decoding counters, read per label)
go through :func:`samples`, so a format quirk is handled once. ``prometheus_client`` is not a
declared dependency of autotune (vLLM brings it), so it is imported where it is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sample:
    """One sample line: its family (``_total`` stripped for counters), its own name, its labels
    and its type as the family's ``# TYPE`` line says."""

    family: str
    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)
    kind: str = "unknown"


def samples(text: str) -> list[Sample]:
    """Every finite sample of ``text``. Raises ``ValueError`` on text that is not the format."""
    from prometheus_client.parser import text_string_to_metric_families

    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if not math.isfinite(value):
                continue
            found.append(Sample(family.name, sample.name, value, dict(sample.labels), family.type))
    return found


def totals(text: str) -> dict[str, float]:
    """{family name: value summed over label sets} for counters and gauges (histogram and
    summary buckets are left out; their ``_sum``/``_count`` are kept under the family name plus
    suffix). Raises ``ValueError`` on text that is not the format."""
    values: dict[str, float] = {}
    for sample in samples(text):
        name = sample.name
        if name.endswith("_created") or name.endswith("_bucket"):
            continue
        if sample.kind in ("counter", "gauge", "unknown"):
            # a counter's samples end in _total; the family may or may not (the parser keeps
            # the sample's name when the TYPE line names the bare family)
            key = sample.family.removesuffix("_total")
        elif name.endswith("_sum") or name.endswith("_count"):
            key = name
        else:
            continue
        values[key] = values.get(key, 0.0) + sample.value
    return values
