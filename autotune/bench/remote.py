"""``autotune bench --url``: the study's client and workload against a server autotune did not
start (a user's current deployment, another engine, a config someone else tuned).

The figures are the ones a trial records (same client, same workload, same metric names), so a
running deployment can be compared with a study's trials. ``--check`` first runs the
correctness gate against the study's pinned reference: the greedy answers to the check prompts,
their teacher-forced logprobs, sanity and known answers, and afterwards the benchmark's own
answers (correctness under load). A server that fails the gate gets no figures, as in a study.

The remote server may answer with less than the baseline did (no token ids, no teacher-forced
scoring): its capabilities are probed on its own answers and the gate runs with
what both have, saying which checks were skipped, never claiming one it could not run.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx

from autotune import names
from autotune.bench.host import HostSampler
from autotune.bench.limits import MAX_FAILED_FRACTION
from autotune.bench.loadcurve import run_benchmark
from autotune.bench.phase import BenchResult, bench_summary
from autotune.bench.tokens import (
    TokenCounter,
    cross_check,
    off_length_line,
    suspect_line,
)
from autotune.client.bounds import PROTOCOL_VIOLATION
from autotune.client.http import StreamingClient, connect, connections_for
from autotune.client.send import get_whole
from autotune.client.stream import NoTokenWithin, StreamError
from autotune.engines.dialect import RequestDialect
from autotune.engines.registry import engine_class
from autotune.errors import SpecError, excerpt
from autotune.gate import (
    Capabilities,
    CheckResult,
    Reference,
    TeacherRejected,
    TeacherUnsupported,
    compare,
    detect_teacher_mode,
    gather_completions,
    judge_under_load,
    teacher_forced_logprobs,
)
from autotune.server.metrics import MetricsMap, ServerMetricsRecorder
from autotune.spec.model import StudySpec, WorkloadSpec
from autotune.spec.reference_prompts import single_length_prompts
from autotune.spec.workload import describe
from autotune.storage import load_study


@dataclass
class RemoteResult:
    url: str
    model: str
    metrics: dict[str, float] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)
    server_metrics: dict[str, Any] = field(default_factory=dict)
    check: dict[str, Any] | None = None
    #: why the run failed (gate, hang, failed requests), or None
    failure: str | None = None
    notices: list[str] = field(default_factory=list)
    #: how the answers arrived (loadcurve.STREAM_SHAPE) and the count cross-check, as a trial
    stream_shape: dict[str, Any] = field(default_factory=dict)
    measurement_suspect: dict[str, Any] | None = None
    #: what else used this machine while it measured (bench/host.py); the server may be
    #: elsewhere, so nothing is left out of the count
    host: dict[str, Any] | None = None

    def to_json(self, spec: StudySpec) -> dict[str, Any]:
        """Metric names as top-level keys (``output_tokens_per_s``, ...), evidence beside. A
        failed benchmark has no figures there (the CLI prints none either): what it measured
        before it failed is kept apart, under ``unscored_metrics``, and a rate it never
        measured (no token arrived) is absent, never 0."""
        figures = {k: round(v, 4) for k, v in self.metrics.items()}
        return {
            **(figures if self.failure is None else {}),
            "url": self.url,
            "model": self.model,
            "workload": describe(spec.workload),
            "passed": self.failure is None,
            "failure": self.failure,
            **(
                {"unscored_metrics": {k: v for k, v in figures.items() if v}}
                if self.failure
                else {}
            ),
            "check": self.check,
            "bench": self.bench,
            "server_metrics": self.server_metrics,
            "notices": self.notices,
            names.STREAM_SHAPE: self.stream_shape,
            names.MEASUREMENT_SUSPECT: self.measurement_suspect,
            names.HOST: self.host,
        }


def check_url(url: str) -> str:
    """``--url`` as a base URL, or bad input (exit 2): a control character or a space (httpx
    raised InvalidURL mid-run, a traceback) or anything but http(s)://host."""
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise SpecError(f"a URL cannot hold spaces or control characters: {url!r}", key="--url")
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018 - parsed on access: a port outside 0-65535 raises here
    except ValueError as exc:  # "Invalid IPv6 URL" (an unclosed '['), "Port out of range"
        raise SpecError(f"not a valid URL ({exc}): {url!r}", key="--url") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise SpecError(f"expected http(s)://host:port, got {url!r}", key="--url")
    return url.rstrip("/")


def build_remote_client(
    url: str, api_key: str | None, connections: int, *, reuses_connections: bool = True
) -> StreamingClient:
    """The client for ``--url``; ``reuses_connections`` is the study's engine's word."""
    return connect(
        url,
        api_key,
        max_connections=connections,
        timeout_s=60.0,
        reuses_connections=reuses_connections,
    )


async def _served_model(client: httpx.AsyncClient, url: str, wanted: str) -> str:
    """The model to ask for: ``wanted`` if the server lists it, its only model otherwise."""
    try:
        response = await get_whole(client, "/v1/models", total_s=10.0)
    except (httpx.HTTPError, TimeoutError, ValueError) as exc:
        raise SpecError(f"cannot reach {url}: {type(exc).__name__}: {exc}", key="--url") from None
    if response.status_code in (401, 403):
        raise SpecError(
            f"{url} refused the key ({response.status_code}); give --api-key or AUTOTUNE_API_KEY",
            key="--api-key",
        )
    if response.status_code != 200:
        return wanted  # not every server lists models; ask for the spec's name
    try:
        names = [m.get("id") for m in response.json().get("data") or []]
    except (ValueError, AttributeError):
        return wanted
    if wanted in names or not names:
        return wanted
    if len(names) == 1:
        return str(names[0])
    raise SpecError(
        f"{url} serves {', '.join(map(str, names))}, not {wanted!r}; give --model", key="--model"
    )


async def run_gate(
    client: httpx.AsyncClient,
    model: str,
    reference: Reference,
    spec: StudySpec,
    *,
    dialect: RequestDialect,
) -> tuple[CheckResult, list[str]]:
    """The gate against ``reference`` with the checks both servers' answers allow."""
    prompts = [p for p in spec.check.prompts if p in reference.entries]
    deadline = spec.workload.request_timeout_s
    max_tokens = {p: reference.max_tokens[p] for p in prompts}
    answers = await gather_completions(
        client, model, prompts, max_tokens, dialect=dialect, concurrent=False, deadline_s=deadline
    )
    ref_caps = reference.capabilities
    teacher_mode = None
    if ref_caps.teacher_forced and answers and answers[0].text:
        teacher_mode = await detect_teacher_mode(
            client, model, answers[0], deadline, dialect=dialect
        )
    caps = Capabilities(
        text=any(a.text.strip() for a in answers),
        token_ids=ref_caps.token_ids and all(a.token_ids for a in answers),
        token_strings=ref_caps.token_strings and all(a.tokens for a in answers),
        token_logprobs=ref_caps.token_logprobs and all(a.logprobs for a in answers),
        top_logprobs=ref_caps.top_logprobs,  # the margins are the reference's own
        teacher_forced=teacher_mode if teacher_mode == ref_caps.teacher_forced else None,
    )
    notices = [f"this server: {n}" for n in caps.notices() if n not in ref_caps.notices()]
    problem = caps.problem()
    if problem:
        raise SpecError(problem, key="--url")
    teacher: dict[str, Any] = {}
    if caps.teacher_forced:
        for prompt in prompts:
            entry = reference.entries[prompt]
            if not entry.teacher_logprobs:
                continue
            try:
                teacher[prompt] = await teacher_forced_logprobs(
                    client,
                    model,
                    entry.completion,
                    dialect=dialect,
                    mode=caps.teacher_forced,
                    deadline_s=deadline,
                )
            except (httpx.HTTPStatusError, TeacherUnsupported) as exc:
                teacher[prompt] = TeacherRejected(str(exc)[:200])
    judged = dataclasses.replace(reference, capabilities=caps)
    completions = {a.prompt: a for a in answers}
    return compare(judged, completions, teacher, spec.check), notices


def under_load(
    reference: Reference, bench: BenchResult, workload: WorkloadSpec, sample: int
) -> dict[str, Any]:
    """Benchmark answers against the reference, as a trial's check does (``judge_under_load``)."""
    judged = judge_under_load(
        reference, bench.samples, single_length_prompts(workload), sample, rounds=len(bench.repeats)
    )
    return {
        "checked": judged.checked,
        "divergent": len(judged.divergences),
        "tie_flips_by": judged.tie_flips_by,
        "answers": judged.answers,
        "unreferenced": judged.unreferenced,
        "first_divergence": asdict(judged.divergences[0]) if judged.divergences else None,
    }


async def bench_remote(
    spec: StudySpec,
    url: str,
    *,
    api_key: str | None = None,
    model: str | None = None,
    reference: Reference | None = None,
    metrics_map: MetricsMap | None = None,
) -> RemoteResult:
    """Gate (when ``reference`` is given), then the spec's benchmark, against ``url``."""
    url = check_url(url)
    workload = spec.workload
    # The server is asked in the study's engine's dialect (the one its reference was taken in)
    # and connected to as that engine needs (llama-server's closed keep-alive connections).
    engine = engine_class(spec.engine.kind)
    dialect = engine.dialect
    async with build_remote_client(
        url,
        api_key,
        connections_for(workload.concurrency),
        reuses_connections=engine.reuses_connections,
    ) as client:
        served = await _served_model(client, url, model or spec.model.served_name)
        result = RemoteResult(url=url, model=served)
        if reference is not None:
            try:
                check, notices = await run_gate(client, served, reference, spec, dialect=dialect)
            except (NoTokenWithin, StreamError, httpx.HTTPError) as exc:
                result.failure = _gate_request_failure(exc)
                return result
            # with the gate's requests sent again on a new connection (client/send.py)
            result.check = {**check.to_dict(), "transport_retries": client.transport_retries}
            result.notices += notices
            if not check.passed:
                result.failure = f"incorrect_output: {check.problems[0]}"
                return result
        evidence = ServerMetricsRecorder(client, metrics_map)
        await evidence.start()
        host = HostSampler(set())
        host.start()
        try:
            bench = await run_benchmark(
                client,
                served,
                workload,
                dialect=dialect,
                phase_hook=evidence.phase,
                counter=TokenCounter.for_model(spec.model.path, spec.model.tokenizer),
            )
        finally:
            result.server_metrics = await evidence.stop()
            result.host = (await asyncio.to_thread(host.stop)).to_dict()
        result.metrics = dict(bench.metrics)
        result.bench = bench_summary(bench)
        result.stream_shape = bench.shape
        result.measurement_suspect = cross_check(bench.counts, result.server_metrics)
        if result.measurement_suspect is not None:
            result.notices.append(suspect_line(result.measurement_suspect))
        if bench.counts.get("lengths"):
            answers = bench.total_requests - bench.failed_requests
            result.notices.append(off_length_line(bench.counts["lengths"], answers))
        # as a trial's outcome (study/outcome.py): one stream past max_tokens is the server's
        # protocol failure whatever the fraction
        broken = [e for e in bench.errors if e.startswith(PROTOCOL_VIOLATION)]
        if bench.hang:
            result.failure = f"hang: {bench.hang}"
        elif broken:
            result.failure = (
                f"protocol_violation: {len(broken)} of {bench.total_requests} requests: {broken[0]}"
            )
        elif bench.failed_requests > MAX_FAILED_FRACTION * max(1, bench.total_requests):
            result.failure = (
                f"request_errors: {bench.failed_requests} of {bench.total_requests} requests "
                f"failed: {bench.errors[0] if bench.errors else ''}"
            )
        elif (bench.replay or {}).get("refused"):
            result.failure = f"replayed_answers: {bench.replay['reason']}"
        replay = bench.replay or {}
        if result.failure is None and replay and not replay.get("checked"):
            result.notices.append(replay["reason"])  # a check that could not run says so
        if reference is not None and result.check is not None:
            loaded = under_load(reference, bench, spec.workload, spec.check.under_load_sample)
            result.check["under_load"] = loaded
            if loaded["divergent"] and result.failure is None:
                first = loaded["first_divergence"]
                result.failure = (
                    f"incorrect_output: {loaded['divergent']} of {loaded['checked']} benchmark "
                    f"responses diverged under load (first at {first['kind']} "
                    f"{first['position']}" + (f", in {first['phase']})" if first["phase"] else ")")
                )
        return result


def _gate_request_failure(exc: Exception) -> str:
    """Why the gate's own requests failed, as a trial would record it (``trial.py``): the
    server could not be verified, so it is not measured. A failure line, not a traceback."""
    if isinstance(exc, NoTokenWithin):
        return f"hang: verification: {exc}"
    if isinstance(exc, httpx.HTTPStatusError):
        return (
            f"request_errors: the server rejected a verification request with "
            f"{exc.response.status_code}: {excerpt(exc.response.text, 300)}"
        )
    if isinstance(exc, httpx.HTTPError):
        return f"request_errors: verification request failed: {type(exc).__name__}: {exc}"
    return f"request_errors: verification: {exc}"


def study_reference(url: str, name: str) -> Reference:
    """The study's pinned reference (recorded by its baseline trial), or a SpecError."""

    study = load_study(url, name)
    stored = study.user_attrs.get(names.REFERENCE)
    if stored is None:
        raise SpecError(
            f"study {name!r} has no reference yet (its baseline trial never completed); "
            "run `autotune run` first, or leave out --check",
            key="--check",
        )
    return Reference.from_dict(stored)
