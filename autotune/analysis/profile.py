"""``autotune profile``: where the step time of a config goes, baseline and winner side by side.

For each trial asked for (default: the verified baseline and the best correct trial), the config
is launched again with the engine's profiler enabled (``Engine.profiler``), warmed up, and then:

1. one greedy request of ``tokens`` output tokens is streamed *unprofiled*: the client's time per
   output token (request sent to last token, over the tokens), the figure a user would see;
2. the same request is streamed between the profiler's start and stop: the client's time per token
   again (the profiler's overhead is the ratio of the two, shown rather than hidden);
3. each worker's trace is partitioned (``autotune.analysis.trace``) into categories whose sum is
   the decode window; divided by the decode tokens it gives ms per output token by category.

The partition adds up by construction, so it proves nothing by itself; the independent check is
``coverage``: the engine steps' span in the trace (prefill to last step) over the time the client
waited for the same request (1.0 when the engine's steps account for all of it; the rest is HTTP,
tokenisation and streaming). Outside 0.9-1.1 the table says so. The client's figure is taken
from the request's start, not from its first streamed token: a busy API server may deliver many
tokens in one chunk (seen here: all 128 at once), which makes first-to-last token time
meaningless. The CPU time each server process used during the profiled request (from the OS, not the
trace) is kept beside it: on a CPU the scheduler and the API server compete with the model for
cores.

Results are stored in the study (user attribute ``profiles``, keyed by trial number) so ``show``
and the report can put baseline and winner side by side, and the trace files stay in the
artifact directory for a viewer (Perfetto, chrome://tracing).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import optuna
import psutil

from autotune import names
from autotune._proc import free_port
from autotune.analysis.trace import Breakdown, breakdown, has_steps, load_trace
from autotune.client.http import build_client
from autotune.client.send import open_stream
from autotune.client.stream import NoTokenWithin, StreamError, read_chunk, sse_payloads
from autotune.engines import build_engine
from autotune.errors import AutotuneError, PreflightError, SpecError
from autotune.server.process import ServerProcess
from autotune.spec.model import StudySpec
from autotune.study.results import best_trials, verified_baseline

HOST = "127.0.0.1"
DEFAULT_TOKENS = 128
DEFAULT_PROMPT = "1 2 3"
#: coverage outside this band means the trace does not explain what the client waited for
COVERAGE_BAND = (0.9, 1.1)


@dataclass(frozen=True)
class ProfileResult:
    """One config's step time by category, as stored in the study."""

    trial: int
    role: str
    tokens: int
    unprofiled_ms_per_token: float
    profiled_ms_per_token: float
    per_token_ms: dict[str, float]
    coverage: float
    breakdown: dict[str, Any]
    collective_calls_per_token: float
    cpu_s_by_process: dict[str, float]
    trace_files: list[str]
    engine_version: str
    when: str
    notes: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        low, high = COVERAGE_BAND
        return low <= self.coverage <= high

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "role": self.role,
            "tokens": self.tokens,
            "unprofiled_ms_per_token": round(self.unprofiled_ms_per_token, 4),
            "profiled_ms_per_token": round(self.profiled_ms_per_token, 4),
            "per_token_ms": {k: round(v, 4) for k, v in self.per_token_ms.items()},
            "coverage": round(self.coverage, 4),
            "consistent": self.consistent,
            "breakdown": self.breakdown,
            "collective_calls_per_token": round(self.collective_calls_per_token, 3),
            "cpu_s_by_process": {k: round(v, 3) for k, v in self.cpu_s_by_process.items()},
            "trace_files": self.trace_files,
            "engine_version": self.engine_version,
            "when": self.when,
            "notes": self.notes,
        }


def default_trials(study: optuna.Study) -> list[tuple[int, str]]:
    """(trial number, role) of the verified baseline and the best correct trial."""
    chosen: list[tuple[int, str]] = []
    baseline = verified_baseline(study)
    if baseline is not None:
        chosen.append((baseline.number, names.BASELINE))
    best = best_trials(study)
    if best and (baseline is None or best[0].number != baseline.number):
        chosen.append((best[0].number, "best"))
    if not chosen:
        raise PreflightError("the study has no verified baseline and no correct trial to profile")
    return chosen


def run_profiles(
    spec: StudySpec,
    study: optuna.Study,
    artifact_dir: Path,
    *,
    trials: Sequence[int] = (),
    tokens: int = DEFAULT_TOKENS,
    on_phase: Callable[[int, str], None] = lambda n, p: None,
) -> list[ProfileResult]:
    """Profile each chosen trial's config and store the results in the study."""
    if tokens < 8:
        raise SpecError("--tokens must be at least 8 (a decode window needs several steps)")
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    if trials:
        missing = [n for n in trials if n not in by_number]
        if missing:
            raise SpecError(f"no trial {missing[0]} in study {study.study_name!r}", key="--trial")
        chosen = [(n, by_number[n].user_attrs.get(names.ROLE) or "trial") for n in trials]
    else:
        chosen = default_trials(study)
    engine = build_engine(spec)
    if engine.profiler(artifact_dir) is None:  # asked before any folder is made
        raise PreflightError(f"engine {engine.name!r} has no profiler autotune can drive")
    results = []
    for number, role in chosen:
        trial = by_number[number]
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
        trace_dir = artifact_dir / "profiles" / f"trial-{number:05d}-{stamp}"
        trace_dir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(
            _profile_one(spec, engine, trial, role, trace_dir, tokens=tokens, on_phase=on_phase)
        )
        _store(study, result)
        results.append(result)
    return results


async def _profile_one(
    spec: StudySpec,
    engine: Any,
    trial: optuna.trial.FrozenTrial,
    role: str,
    trace_dir: Path,
    *,
    tokens: int,
    on_phase: Callable[[int, str], None],
) -> ProfileResult:
    profiler = engine.profiler(trace_dir)
    settings = spec.space.resolve(dict(trial.params))
    flag, config = profiler.json_flag()
    settings = replace(
        settings,
        json_flags={**settings.json_flags, flag: {**settings.json_flags.get(flag, {}), **config}},
    )
    launch = engine.build_launch(
        settings, host=HOST, port=free_port(HOST), api_key=secrets.token_urlsafe(24)
    )
    server = ServerProcess(
        launch,
        trace_dir / "server.log",
        startup_timeout_s=spec.startup_timeout_s,
        classify=engine.classify_failure,
        root_cause=engine.root_cause,
    )
    deadline_s = spec.workload.request_timeout_s
    body = profiler.decode_body(launch.served_model, _prompt(spec), tokens)
    on_phase(trial.number, "launching with the profiler enabled")
    try:
        with server:
            async with build_client(
                launch,
                max_connections=4,
                timeout_s=deadline_s,
                reuses_connections=engine.reuses_connections,
            ) as client:
                await server.wait_ready(client)
                on_phase(trial.number, "warming up")
                await _decode(client, body, deadline_s)
                unprofiled, _ = await _decode(client, body, deadline_s)
                on_phase(trial.number, f"profiling {tokens} decode tokens")
                await profiler.start(client)
                before = _cpu_times(server)
                profiled, produced = await _decode(client, body, deadline_s)
                cpu = _cpu_delta(before, _cpu_times(server))
                traces = await profiler.stop(client, timeout_s=max(60.0, deadline_s))
        return result_from_traces(
            trial.number,
            role,
            profiler.recipe,
            traces,
            produced,
            unprofiled,
            profiled,
            cpu,
            engine.version(),
        )
    except (httpx.HTTPError, NoTokenWithin, StreamError, TimeoutError, ValueError) as exc:
        # The config was verified when it ran as a trial; here it is only diagnosed, so a
        # failure is reported with the server's own last lines, not recorded as a verdict.
        tail = "\n".join(server.log_tail().splitlines()[-5:])
        raise AutotuneError(
            f"profiling trial {trial.number} failed: {type(exc).__name__}: {exc}\n"
            f"server log {server.log_path}:\n{tail}"
        ) from None


def result_from_traces(
    number: int,
    role: str,
    recipe: Any,
    traces: Sequence[Path],
    produced: int,
    unprofiled: float,
    profiled: float,
    cpu: dict[str, float],
    version: str,
) -> ProfileResult:
    workers: list[Breakdown] = []
    for path in traces:
        trace = load_trace(path)
        if has_steps(trace, recipe):
            workers.append(breakdown(trace, recipe, source=path.name))
    if not workers:
        raise PreflightError(
            f"no worker trace with engine steps among {[p.name for p in traces]}: the engine's "
            "profiler did not record the decode window"
        )
    shown = workers[0]  # rank 0; the others are listed in notes
    decode_tokens = max(1, produced - 1)  # the prefill step produced the first token
    per_token = shown.per_token_ms(decode_tokens)
    notes = [f"{len(workers)} worker trace(s); rank 0 shown"] if len(workers) > 1 else []
    coverage = shown.span_ms / (profiled * produced) if profiled > 0 else 0.0
    return ProfileResult(
        trial=number,
        role=role,
        tokens=produced,
        unprofiled_ms_per_token=unprofiled,
        profiled_ms_per_token=profiled,
        per_token_ms=per_token,
        coverage=coverage,
        breakdown=shown.to_dict(),
        collective_calls_per_token=shown.collective_calls / decode_tokens,
        cpu_s_by_process=cpu,
        trace_files=[str(p) for p in traces],
        engine_version=version,
        when=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        notes=notes,
    )


async def _decode(client: Any, body: dict[str, Any], deadline_s: float) -> tuple[float, int]:
    """Stream one request: (client ms per output token from sending to the last token, tokens
    produced)."""
    start = time.perf_counter()
    last = None
    produced = 0
    async with open_stream(client, "/v1/completions", body, deadline_s=deadline_s) as response:
        response.raise_for_status()
        async for payload, at in sse_payloads(response, start, token_deadline_s=deadline_s):
            if payload == b"[DONE]":
                break
            chunk = read_chunk(payload)  # an error the server reports, in its words
            if chunk.get("usage"):
                produced = int(chunk["usage"].get("completion_tokens") or produced)
            if any(c.get("text") for c in chunk.get("choices") or ()):
                last = at
    if last is None or produced < 3:
        raise PreflightError(f"the profiling request produced {produced} tokens; need several")
    return last * 1000 / produced, produced


def _prompt(spec: StudySpec) -> str:
    prompts = getattr(spec.check, "prompts", None) or ()
    return prompts[0] if prompts else DEFAULT_PROMPT


def _cpu_times(server: ServerProcess) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) so far of the server and each of its descendants."""
    times: dict[int, tuple[str, float]] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(server.pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                cpu = proc.cpu_times()
                times[proc.pid] = (proc.name(), cpu.user + cpu.system)
    return times


def _cpu_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds used per process name between two snapshots (names summed)."""
    used: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        if pid in before:
            used[name] = used.get(name, 0.0) + seconds - before[pid][1]
    return used


def _store(study: optuna.Study, result: ProfileResult) -> None:
    profiles = dict(study.user_attrs.get(names.PROFILES) or {})
    profiles[str(result.trial)] = result.to_dict()
    study.set_user_attr(names.PROFILES, profiles)


def sort_profiles(stored: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A study's stored profiles (its ``profiles`` attribute), baseline first, then by trial."""
    return sorted(
        stored.values(), key=lambda p: (p.get("role") != names.BASELINE, p.get("trial", 0))
    )


def table_rows(profiles: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): ms per output token by category, one column per profiled trial."""
    header = ["ms / output token"] + [f"trial {p['trial']} ({p['role']})" for p in profiles]
    categories: list[str] = []
    for p in profiles:
        categories += [c for c in p["per_token_ms"] if c not in categories]
    rows = [[c] + [_ms(p["per_token_ms"].get(c)) for p in profiles] for c in categories]
    rows.append(["sum (trace)"] + [_ms(sum(p["per_token_ms"].values())) for p in profiles])
    rows.append(
        ["client per token, profiled"] + [_ms(p["profiled_ms_per_token"]) for p in profiles]
    )
    rows.append(
        ["client per token, unprofiled"] + [_ms(p["unprofiled_ms_per_token"]) for p in profiles]
    )
    rows.append(
        ["coverage (trace / measured)"]
        + [f"{p['coverage']:.2f}" + ("" if p["consistent"] else " !") for p in profiles]
    )
    if any(p["breakdown"].get("device") == "gpu" for p in profiles):
        rows.append(
            ["collective calls / token"]
            + [f"{p['collective_calls_per_token']:.1f}" for p in profiles]
        )
    # CPU the OS charged each server process during the profiled request, per output token:
    # on a CPU the scheduler and the API server compete with the model for the same cores
    processes: list[str] = []
    for p in profiles:
        processes += [n for n in p.get("cpu_s_by_process") or {} if n not in processes]
    for name in processes:
        rows.append(
            [f"CPU ms / token, {name}"]
            + [
                _ms(1000 * p["cpu_s_by_process"][name] / p["tokens"])
                if name in (p.get("cpu_s_by_process") or {}) and p.get("tokens")
                else "-"
                for p in profiles
            ]
        )
    return header, rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
