"""More answers from one launch, each with its interval: load curve, precision stop, goodput.

A trial is a server launch, and a launch is the expensive part (90% of a demo trial is startup;
minutes at GLM-5 scale). So after one warm-up, one launch answers:

* **a load curve**: every level of ``workload.concurrency`` (a number or a list) is measured in
  each round, its metrics stored as ``<metric>@<level>`` (``output_tokens_per_s@16``); the
  unsuffixed names are those of the largest level, and the single-request decode rate is
  measured once per round for all levels.
* **a fresh-prompt control** each round, beside the single-request phase: one prompt no earlier
  request carried, timed and never judged, so a server that replays stored answers for the
  workload's repeated prompts is seen (``bench/replay.py``; ``BenchResult.replay``).
* **as many rounds as the figure needs**: rounds go on until the 95% t interval of the mean of
  every ``focus`` metric (the objective's) is within ``workload.target_precision`` of its mean
  (half-width / mean), never fewer than ``workload.repeats``, and never past
  ``workload.max_repeats`` rounds or ``workload.max_measure_s`` seconds. A noisy server is
  measured longer, a quiet one shorter; ``target_precision: 0`` gives exactly ``repeats``
  rounds. The point value stays the median over rounds (robust to one bad round); ``ci`` holds
  each metric's interval.
* **goodput**, when ``workload.slo`` lists SLOs (``ttft_p95_ms <= 500``): the highest
  concurrency at which every SLO holds, found by doubling (1, 2, 4, ...) up to the first level
  that is not claimed, then bisection between the last claimed level and it. A level is claimed
  only when each SLO metric's interval lies wholly on the good side of its bound; a level whose
  interval straddles a bound is not claimed (measuring it longer, up to the precision target or
  the caps, is how a close call gets decided). The search assumes latency grows with load.
  Each level gets ``max(num_requests, 2 * level)`` requests so that the level is really reached;
  request errors at a level make it unclaimed (an overloaded server failing requests is an SLO
  miss there, not a broken config), and a hang ends the benchmark as anywhere else.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from autotune import names
from autotune._stats import Interval, positive_interval
from autotune.bench.phase import (
    BenchResult,
    PhaseResult,
    RequestRecord,
    combine,
    phase_counts,
    run_phase,
    summarize,
)
from autotune.bench.replay import control_prompt, replay_check
from autotune.bench.shape import stream_shape
from autotune.bench.tokens import (
    NO_TOKENIZER,
    TokenCounter,
    cross_check,
    off_length,
    retokenized,
)
from autotune.bench.traps import ClientMeter
from autotune.engines.dialect import RequestDialect
from autotune.names import at_level, split_level
from autotune.spec.model import SloSpec, WorkloadSpec

#: phase names (the server_metrics recorder keys its per-phase deltas by them)
SINGLE_PHASE = "single-request"
LOAD_PHASE = "load at"
WARM_UP = "warm-up"
#: one fresh prompt a round, timed and never judged (bench/replay.py)
CONTROL_PHASE = "control"

#: a level is "claimed" (its SLOs hold beyond doubt), "fail" (an SLO is missed beyond doubt),
#: "straddle" (an interval contains a bound: not claimed) or "errors" (requests failed)
CLAIMED = "pass"


@dataclass(frozen=True)
class Probe:
    """One concurrency level of the goodput search."""

    concurrency: int
    verdict: str
    rounds: int
    #: SLO metric -> [median, low, high] of that level's rounds
    values: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class GoodputResult:
    value: int  # the highest claimed concurrency (0: not even one request at a time)
    slos: tuple[str, ...]
    probes: tuple[Probe, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def slo_verdict(slos: Sequence[SloSpec], intervals: dict[str, Interval]) -> str:
    """Claimed only when every SLO holds over the whole interval (see the module docstring)."""
    verdicts = []
    for slo in slos:
        iv = intervals.get(slo.metric)
        if iv is None:
            return "errors"
        good_edge, bad_edge = (iv.high, iv.low) if slo.op == "<=" else (iv.low, iv.high)
        if slo.holds(good_edge):
            verdicts.append(CLAIMED)
        elif not slo.holds(bad_edge):
            verdicts.append("fail")
        else:
            verdicts.append("straddle")
    if "fail" in verdicts:
        return "fail"
    return "straddle" if "straddle" in verdicts else CLAIMED


async def search_goodput(
    probe: Callable[[int], Awaitable[Probe]], max_level: int
) -> tuple[int, list[Probe]]:
    """Doubling from 1 up to the first unclaimed level (or ``max_level``), then bisection.

    Returns the highest claimed level and every probe in the order measured. ``probe`` may
    raise to end the search (a hang).
    """
    probes: list[Probe] = []

    async def claimed(level: int) -> bool:
        result = await probe(level)
        probes.append(result)
        return result.verdict == CLAIMED

    good, bad = 0, None
    level = 1
    while bad is None and good < max_level:
        level = min(level, max_level)
        if await claimed(level):
            good = level
            level *= 2
        else:
            bad = level
    if bad is None:
        return good, probes
    while bad - good > 1:
        middle = (good + bad) // 2
        if await claimed(middle):
            good = middle
        else:
            bad = middle
    return good, probes


def intervals_of(rounds: Sequence[dict[str, float]], names: Sequence[str]) -> dict[str, Interval]:
    out = {}
    for name in names:
        values = [r[name] for r in rounds if name in r]
        if values:
            out[name] = positive_interval(values)  # every metric is >= 0: never below 0
    return out


def precise_enough(rounds: Sequence[dict[str, float]], names: Sequence[str], target: float) -> bool:
    """Every name measured in every round, with a relative half-width within ``target``."""
    if not names or len(rounds) < 2:
        return False
    found = intervals_of(rounds, names)
    return all(
        name in found and found[name].n == len(rounds) and found[name].relative_half_width <= target
        for name in names
    )


def _stop_reason(
    workload: WorkloadSpec, rounds: Sequence[dict[str, float]], names: Sequence[str], start: float
) -> str | None:
    n = len(rounds)
    if n < workload.repeats:
        return None
    if workload.target_precision <= 0:
        return "repeats"
    if precise_enough(rounds, names, workload.target_precision):
        return "precision"
    if n >= max(workload.max_repeats, workload.repeats):
        return "max_repeats"
    if time.perf_counter() - start >= workload.max_measure_s:
        return "max_measure_s"
    return None


class _Hung(Exception):
    def __init__(self, hang: str) -> None:
        super().__init__(hang)
        self.hang = hang


async def run_benchmark(
    client: httpx.AsyncClient,
    model: str,
    workload: WorkloadSpec,
    *,
    dialect: RequestDialect,
    on_repeat: Callable[[int, dict[str, float]], None] | None = None,
    hang_timeout_s: float | None = None,
    focus: Sequence[str] = ("output_tokens_per_s",),
    phase_hook: Callable[[str, str], Awaitable[None]] | None = None,
    counter: TokenCounter = NO_TOKENIZER,
    request_bound_s: float | None = None,
    stop_rule: Callable[[int, Sequence[dict[str, float]]], str | None] | None = None,
    speculates: bool = False,
) -> BenchResult:
    """Warm up once, then rounds of (single-request decode, load at every level) until
    ``focus``'s interval is precise enough (see the module docstring), then the goodput search.

    ``stop_rule(index, rounds)`` is asked after each round the precision rule would go on
    from; a reason it returns ends the measurement there (``stopped_by`` is that reason, and
    no goodput search follows): the trial's screen (``study/screen.py``) stops a config whose
    first round is clearly worse than the leader's.

    A hung request ends the benchmark at once (``BenchResult.hang``): a trial whose server went
    silent costs one ``request_timeout_s``, not one per phase and wave. ``request_bound_s``
    bounds each request's whole time as well (a stream that trickles a token just inside
    every deadline still ends). ``speculates``: the server decodes speculatively, so repeated
    prompts may be faster than the fresh-prompt controls without a cache (``bench/replay.py``).
    """
    read_timeout = hang_timeout_s or workload.request_timeout_s
    prompts = list(workload.prompts)
    levels = workload.concurrency_levels
    main = workload.concurrency
    names = [f for f in focus if f != "goodput"] or ["output_tokens_per_s"]
    all_records: list[RequestRecord] = []
    single_records: list[RequestRecord] = []
    load_records: list[RequestRecord] = []
    phase_counts_: dict[str, dict[str, Any]] = {}
    rounds: list[dict[str, float]] = []
    samples: list[RequestRecord] = []
    controls: list[RequestRecord] = []
    load_controls: list[RequestRecord] = []
    lengths = workload.output_tokens or workload.max_tokens

    async def phase(
        requests: int,
        concurrency: int,
        name: str,
        *,
        keep: bool = True,
        asked: tuple[Sequence[str], int | Sequence[int]] | None = None,
        with_control: bool = False,
    ):
        phase_prompts, phase_lengths = asked or (prompts, lengths)
        control = None
        if with_control:  # one request, at a random place, is a fresh prompt (bench/replay.py)
            phase_prompts, phase_lengths, control = _with_control(
                phase_prompts, phase_lengths, requests
            )
        if phase_hook is not None:  # server-side evidence around each phase (server/metrics.py)
            await phase_hook(name, "start")
        result = await run_phase(
            client,
            model,
            phase_prompts,
            requests,
            concurrency,
            phase_lengths,
            dialect=dialect,
            read_timeout_s=read_timeout,
            phase=name,
            counter=counter,
            total_timeout_s=request_bound_s,
        )
        if phase_hook is not None:
            await phase_hook(name, "end")
        if control is not None:
            result = _split_control(result, control, load_controls)
        counted = phase_counts(result.records)
        if counted is not None:
            phase_counts_[name] = counted
        if name.startswith(CONTROL_PHASE):  # timed only: no reference holds its answer
            controls.extend(result.records)
        elif name != WARM_UP:  # every answer whose numbers are reported is judged (samples)
            samples.extend(r for r in result.records if r.ok and r.prompt != control)
        if keep:
            all_records.extend(result.records)
            if name.startswith(SINGLE_PHASE):
                single_records.extend(result.records)
            elif name.startswith(LOAD_PHASE):
                load_records.extend(result.records)
        if result.hang:
            raise _Hung(result.hang)
        return result

    hang, stopped_by, goodput = None, None, None
    cut_short = False  # stopped by ``stop_rule``
    meter = ClientMeter()
    try:
        # the client's own CPU and event-loop lag: a client that cannot keep up measures itself
        async with meter:
            if workload.warmup_requests:
                warm_concurrency = min(main, workload.warmup_requests)
                await phase(workload.warmup_requests, warm_concurrency, WARM_UP)
            start = time.perf_counter()
            while stopped_by is None:
                index = len(rounds)
                single = await phase(
                    workload.single_requests, 1, f"{SINGLE_PHASE} (round {index + 1})"
                )
                # one fresh prompt beside them: a cache replaying repeated prompts shows. Not a
                # benchmark request: its failure (a prompt made too long by its nonce line) is
                # the replay check's "not run", never the config's request error
                which = index % len(prompts)
                await phase(
                    1,
                    1,
                    f"{CONTROL_PHASE} (round {index + 1})",
                    keep=False,
                    asked=(
                        [control_prompt(prompts[which])],
                        lengths if isinstance(lengths, int) else lengths[which],
                    ),
                )
                loads: dict[int, PhaseResult] = {}
                for level in levels:
                    loads[level] = await phase(
                        workload.num_requests,
                        level,
                        f"{LOAD_PHASE} {level} (round {index + 1})",
                        with_control=workload.num_requests > 1,
                    )
                metrics = _round_metrics(single, loads, main)
                rounds.append(metrics)
                if on_repeat is not None:
                    on_repeat(index, metrics)
                if any(not r.ok for p in (single, *loads.values()) for r in p.records):
                    stopped_by = "request_errors"  # the caller decides what failures mean
                    break
                stopped_by = _stop_reason(workload, rounds, names, start)
                if stopped_by is None and stop_rule is not None:
                    ruled = stop_rule(index, rounds)
                    if ruled is not None:
                        stopped_by, cut_short = ruled, True
            if workload.slos and stopped_by != "request_errors" and not cut_short:

                async def probe(level: int) -> Probe:
                    return await _probe(phase, workload, level)

                value, probes = await search_goodput(probe, workload.goodput_max_concurrency)
                goodput = GoodputResult(
                    value=value,
                    slos=tuple(f"{s.metric} {s.op} {s.bound:g}" for s in workload.slos),
                    probes=tuple(probes),
                )
    except _Hung as exc:
        hang = exc.hang
    medians, spread = combine(rounds) if rounds else ({}, {})
    if goodput is not None:
        medians["goodput"] = float(goodput.value)
    failed = [r for r in all_records if not r.ok]
    counted_by = Counter(r.count_source or "given" for r in all_records if r.ok)
    return BenchResult(
        metrics=medians,
        spread=spread,
        repeats=tuple(rounds),
        total_requests=len(all_records),
        failed_requests=len(failed),
        # in the order they happened: the first is the one a reader is shown
        errors=tuple(dict.fromkeys(r.error or "" for r in failed))[:10],
        samples=tuple(samples),
        hang=hang,
        ci={k: iv.to_list() for k, iv in intervals_of(rounds, list(medians)).items() if iv.n > 1},
        stopped_by=stopped_by,
        load_curve={
            str(level): {
                base: v
                for k, v in medians.items()
                for base, at in [split_level(k)]
                if at == str(level)
            }
            for level in levels
        },
        goodput=None if goodput is None else goodput.to_dict(),
        client=meter.report(sum(r.output_tokens or 0 for r in all_records if r.ok)),
        counts={
            "phases": phase_counts_,
            "counted_by": dict(sorted(counted_by.items())),
            "tokenizer": counter.describe(),
            **({"lengths": lengths} if (lengths := off_length(all_records)) else {}),
            **({"retokenized": ids} if (ids := retokenized(all_records, counter)) else {}),
        },
        shape=stream_shape(single_records, load_records),
        transport_retries=sum(r.transport_retries for r in all_records),
        replay=replay_check(
            single_records,
            controls,
            speculates=speculates,
            load_repeated=[r for r in load_records if r.prompt in prompts],
            load_controls=load_controls,
        )
        if rounds
        else None,
    )


def _with_control(
    prompts: Sequence[str], lengths: int | Sequence[int], requests: int
) -> tuple[list[str], int | list[int], str]:
    """The phase's prompts and lengths request by request, one of them (drawn at random, never
    a fixed place a server could pass by) a fresh-prompt control of the same length."""
    asked = [prompts[i % len(prompts)] for i in range(requests)]
    sized = (
        lengths
        if isinstance(lengths, int)
        else [lengths[i % len(prompts)] for i in range(requests)]
    )
    at = secrets.randbelow(requests)
    asked[at] = control_prompt(asked[at])
    return asked, sized, asked[at]


def _split_control(result: PhaseResult, control: str, into: list[RequestRecord]) -> PhaseResult:
    """The load phase's control answer goes to ``into`` (timed, never judged: no reference
    holds it). Answered, it stays among the phase's answers (it did the same work as the others
    beside it, so the figures are the same). Refused as a bad request (a 4xx: a prompt near the
    context limit made too long by its nonce line), it is no request error of the config; any
    other failure (a 5xx, a broken stream, a hang) is the server's, as any request's."""
    mine = [r for r in result.records if r.prompt == control]
    into.extend(mine)
    refused = {id(r) for r in mine if not r.ok and (r.error or "").startswith("http 4")}
    if not refused:
        return result
    kept = tuple(r for r in result.records if id(r) not in refused)
    return dataclasses.replace(result, records=kept)


def _round_metrics(
    single: PhaseResult, loads: dict[int, PhaseResult], main: int
) -> dict[str, float]:
    """One round: every level's load metrics as ``name@level``, the main level's unsuffixed."""
    metrics: dict[str, float] = {}
    for level, load in loads.items():
        summary = summarize(single, load)
        if level == main:
            metrics.update(summary)
        metrics.update(
            {
                at_level(k, level): v
                for k, v in summary.items()
                if k not in names.SINGLE_REQUEST_METRICS
            }
        )
    return metrics


async def _probe(
    phase: Callable[..., Awaitable[PhaseResult]], workload: WorkloadSpec, level: int
) -> Probe:
    """Measure one level until its SLO verdict is beyond doubt, precise, or out of budget."""
    slo_names = sorted({s.metric for s in workload.slos})
    rounds: list[dict[str, float]] = []
    requests = max(workload.num_requests, 2 * level)
    start = time.perf_counter()
    verdict = "errors"
    minimum = max(2, workload.repeats)
    while True:
        load = await phase(
            requests, level, f"goodput at {level} (round {len(rounds) + 1})", keep=False
        )
        if any(not r.ok for r in load.records):
            verdict = "errors"
            break
        rounds.append(summarize(PhaseResult((), 0.0), load))
        if len(rounds) < minimum:
            continue
        verdict = slo_verdict(workload.slos, intervals_of(rounds, slo_names))
        if verdict in (CLAIMED, "fail"):
            break
        if workload.target_precision <= 0 or precise_enough(
            rounds, slo_names, workload.target_precision
        ):
            break
        if len(rounds) >= max(workload.max_repeats, minimum):
            break
        if time.perf_counter() - start >= workload.max_measure_s:
            break
    found = intervals_of(rounds, slo_names) if rounds else {}
    medians = combine(rounds)[0] if rounds else {}
    return Probe(
        concurrency=level,
        verdict=verdict,
        rounds=len(rounds),
        values={
            name: [round(medians[name], 4), round(iv.low, 4), round(iv.high, 4)]
            for name, iv in found.items()
        },
    )


def record_curve(trial: Any, bench: BenchResult) -> None:
    """Store a trial's intervals, load curve, goodput search, stream shape, replay check and
    count cross-check (``optuna.Trial``; the cross-check reads its ``server_metrics``, so call this
    after that is stored)."""
    if bench.shape:
        trial.set_user_attr(names.STREAM_SHAPE, bench.shape)
    if bench.replay is not None:  # the fresh-prompt control, beside the gate's checks
        check = dict((getattr(trial, "user_attrs", None) or {}).get(names.CHECK) or {})
        check["replay"] = bench.replay
        trial.set_user_attr(names.CHECK, check)
    if bench.counts:
        server_metrics = (getattr(trial, "user_attrs", None) or {}).get(names.SERVER_METRICS)
        suspect = cross_check(bench.counts, server_metrics)
        if suspect is not None:
            trial.set_user_attr(names.MEASUREMENT_SUSPECT, suspect)
    # repeated prompts far faster than fresh ones on a speculating launch: said, not refused
    speculated = (bench.replay or {}).get("flagged") and not bench.replay.get("refused")
    if bench.client is not None or speculated:  # the client's own traps beside the server's
        traps = dict((getattr(trial, "user_attrs", None) or {}).get(names.TRAPS) or {})
        if bench.client is not None:
            traps["client"] = bench.client
        if speculated:
            traps["repeated_prompts"] = bench.replay
        traps["flagged"] = [
            v["reason"] for v in traps.values() if isinstance(v, dict) and v.get("flagged")
        ]
        trial.set_user_attr(names.TRAPS, traps)
    if bench.ci:
        trial.set_user_attr(names.METRICS_CI, bench.ci)
    if len(bench.load_curve) > 1:
        curve = {
            level: {k: round(v, 4) for k, v in metrics.items()}
            for level, metrics in bench.load_curve.items()
        }
        trial.set_user_attr(names.LOAD_CURVE, curve)
    if bench.goodput is not None:
        trial.set_user_attr(names.GOODPUT, bench.goodput)
