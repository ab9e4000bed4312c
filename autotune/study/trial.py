"""One trial's life, top to bottom: suggest, launch, gate, bench, verdict.

Read :meth:`TrialRunner.__call__` then :meth:`TrialRunner._run_server_trial` to follow a trial:
the space suggests values (``space/``), they resolve to ``ServerSettings``, the engine builds
the launch, ``server/process.py`` starts it and proves it ready, the gate (``gate/``) compares
its answers with the pinned reference, ``bench/`` measures, and ``record.py`` writes the verdict
(COMPLETE, PRUNED for a configuration fault, FAIL for an infrastructure fault). Waiting for a
trial another worker holds (the baseline's reference, a duplicate's parameters) checks the
holder's liveness through ``cleanup.py`` on every poll.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import optuna

from autotune import _proc, names
from autotune._proc import free_port
from autotune.bench.host import HostSampler, visible_gpus
from autotune.bench.limits import request_bound_s
from autotune.bench.loadcurve import record_curve, run_benchmark
from autotune.bench.phase import BenchResult, bench_summary
from autotune.bench.tokens import TokenCounter, uncountable_detail
from autotune.bench.traps import trial_traps
from autotune.client.bounds import PROTOCOL_VIOLATION
from autotune.client.http import build_client, connections_for, transport_retries
from autotune.client.stream import NoTokenWithin, StreamError
from autotune.engines.base import Engine, LaunchConfig
from autotune.errors import CandidateError, InfrastructureError, TrialFailure, excerpt
from autotune.gate import (
    CheckResult,
    Reference,
    collect_outputs,
    compare,
    judge_under_load,
    record_reference,
    sanity_problem,
)
from autotune.server.metrics import ServerMetricsRecorder
from autotune.server.process import ServerProcess
from autotune.space.model import SearchSpace
from autotune.space.settings import ServerSettings
from autotune.spec.model import StudySpec
from autotune.spec.reference_prompts import reference_requests, single_length_prompts
from autotune.study.cleanup import reclaim, trial_dead_reason, worker_record
from autotune.study.outcome import bench_failure
from autotune.study.phase_clock import GATE, MEASUREMENT, STARTUP, TEARDOWN, PhaseClock
from autotune.study.record import (
    TrialOutcome,
    record_duplicate,
    record_failure,
    record_measured,
    record_screened,
    running_duplicate,
    trim,
    upload_trial_files,
)
from autotune.study.results import verified_baseline
from autotune.study.screen import Screen, ScreenResult, screen_for
from autotune.study.termination import interrupted_detail

HOST = "127.0.0.1"
#: seconds between two looks at a trial this worker waits for (the baseline, a duplicate)
HOLDER_POLL_S = 1.0


@dataclass
class TrialContext:
    """What every trial of one ``autotune run`` shares."""

    spec: StudySpec
    engine: Engine
    log_dir: Path
    artifacts: Any  # optuna ArtifactStore
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    on_phase: Callable[[int, str], None] = lambda _number, _phase: None
    #: extra settings merged into every trial (device plans of parallel workers)
    extra_env: dict[str, str] = field(default_factory=dict)
    #: the study being run; the baseline stores the reference in its attributes
    study: optuna.Study | None = None
    #: short screens (study/screen.py): off when re-measuring chosen configs
    allow_pruning: bool = True
    #: the study's shared compile cache (the engine's ``compile_cache_env``), None: none
    compile_cache: Path | None = None

    @functools.cached_property
    def token_counter(self) -> TokenCounter:
        """The model's tokenizer, loaded once per run: autotune counts the tokens of streams
        that carry no ids itself, never by the server's word (``bench/tokens.py``)."""
        return TokenCounter.for_model(self.spec.model.path, self.spec.model.tokenizer)


class Screened(Exception):
    """Raised after a benchmark its screen stopped: correct, clearly worse than the leader."""

    def __init__(self, metrics: dict[str, float], screen: ScreenResult) -> None:
        super().__init__(names.SCREENED)
        self.metrics, self.screen = dict(metrics), screen


class TrialRunner:
    """The Optuna objective. Holds the last outcome for the loop in ``study/loop.py``."""

    def __init__(self, ctx: TrialContext) -> None:
        self.ctx = ctx
        self.last: TrialOutcome | None = None
        #: one line per dead trial reclaimed while a trial waited (printed by the caller)
        self.notes: list[str] = []

    def __call__(self, trial: optuna.Trial) -> float | list[float]:
        role = trial.user_attrs.get(names.ROLE, names.SEARCH)
        try:
            return self._run(trial, role)
        except (KeyboardInterrupt, asyncio.CancelledError) as exc:
            # Wherever Ctrl-C or a signal lands, the trial keeps a reason that names which.
            self.last = record_failure(
                trial, role, InfrastructureError("interrupted", interrupted_detail(exc))
            )
            raise

    def _run(self, trial: optuna.Trial, role: str) -> float | list[float]:
        spec = self.ctx.spec
        # Before anything else: who runs this trial, so that its death is known at once on
        # this machine (cleanup.dead_reason), not only when its heartbeat goes stale.
        trial.set_user_attr(names.WORKER, worker_record())
        values = suggest_values(spec.space, trial, role)
        trial.set_user_attr(names.PARAMS_RESOLVED, values)
        trial.set_user_attr(names.ROLE, role)
        holder = running_duplicate(trial, values)
        if holder is not None:
            role = self._settle_duplicate(trial, role, holder)
        violated = spec.space.violated(values)
        if violated:
            self.last = record_failure(
                trial, role, CandidateError("constraint_violated", "; ".join(violated))
            )
            raise optuna.TrialPruned(f"constraint_violated: {violated[0]}")
        settings = self._with_worker_settings(spec.space.resolve(values))
        try:
            if role != names.BASELINE:
                self._await_reference(trial)
            metrics = asyncio.run(self._run_server_trial(trial, role, settings))
        except CandidateError as exc:
            self.last = record_failure(trial, role, exc)
            raise optuna.TrialPruned(f"{exc.reason}: {exc.detail}") from None
        except Screened as stop:
            self.last = record_screened(trial, role, stop.metrics, stop.screen)
            raise optuna.TrialPruned(f"{names.SCREENED}: {stop.screen.detail()}") from None
        except InfrastructureError as exc:
            self.last = record_failure(trial, role, exc)
            raise
        self.last = record_measured(trial, role, spec.objective, metrics)
        if self.last.values is None:
            raise optuna.TrialPruned(self.last.verdict)
        values = self.last.values
        return values[0] if len(values) == 1 else list(values)

    def _await_reference(self, trial: optuna.Trial) -> None:
        """Another worker is running the baseline: wait for its reference before a server is
        spent (a worker that sampled a trial while another took the queued baseline).

        Every poll checks that the baseline's worker lives. When it is dead the baseline is
        reclaimed (leftover server stopped, queued again as the baseline, so it runs next) and
        this trial ends ``interrupted`` (FAIL, its parameters queued again by the loop): its
        parameters are not the baseline's, and no reference will come from the dead worker.
        """
        study = self.ctx.study
        if study is None:
            return
        while study.user_attrs.get(names.REFERENCE) is None:
            holders = [
                t
                for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                if t.number != trial.number and t.user_attrs.get(names.ROLE) == names.BASELINE
            ]
            if not holders:
                return
            for holder in holders:
                why = trial_dead_reason(study, holder)
                if why is not None:
                    self.notes += reclaim(study, holder, why)[1]
                    raise InfrastructureError(
                        "interrupted",
                        f"the baseline (trial {holder.number}) this trial waited for was left "
                        f"by a dead run ({why}); it is queued again and runs first",
                    )
            self._phase(trial, "waiting for the baseline")
            time.sleep(HOLDER_POLL_S)

    def _settle_duplicate(
        self, trial: optuna.Trial, role: str, holder: optuna.trial.FrozenTrial
    ) -> str:
        """The sampler proposed exactly the parameters of ``holder``, a RUNNING trial. Two
        servers must not be spent on one config, and a proposal must not leave a junk record
        per ask (a small space would write dozens in seconds). So:

        * holder dead (its worker gone on this machine, or its heartbeat stale elsewhere):
          reclaim it (leftover server and recorded descendants stopped, marked
          ``interrupted``) and take it over: this trial runs the parameters, ``retry_of`` the
          holder (as the baseline if the holder was). Nothing is queued, so they run once.
        * holder alive: wait, re-checking its liveness every poll, and when it ends take its
          outcome: this trial is PRUNED ``duplicate`` with ``duplicate_of``, the holder's verdict
          and correctness constraint (never a made-up penalty). That is one record per holder
          written after it finished, not one per proposal; the loop does not count it and asks
          again, with the holder's result now in the sampler's view.

        A baseline, ablation or confirmation trial (enqueued, it must measure for itself) only
        waits: it runs once the holder is over (a dead holder is reclaimed and queued again).

        Returns the role this trial runs under (takeover); raises ``TrialPruned`` otherwise.
        """
        study = trial.study
        storage = study._storage  # noqa: SLF001
        takes_over = role in (names.SEARCH, names.RETRY)
        trial.set_user_attr(names.DUPLICATE_OF, holder.number)  # a waiter, never a holder
        while True:
            current = storage.get_trial(holder._trial_id)  # noqa: SLF001
            if current.state != optuna.trial.TrialState.RUNNING:
                if takes_over:
                    self.last, why = record_duplicate(trial, role, current)
                    raise optuna.TrialPruned(why)
                trial.set_user_attr(names.DUPLICATE_OF, None)
                return role  # a baseline/ablation/confirmation trial measures for itself
            why = trial_dead_reason(study, current)
            if (
                why is None
                and current.user_attrs.get(names.DUPLICATE_OF) == trial.number
                and trial.number < current.number
            ):
                # Two workers checked at the same moment and each found the other: both would
                # wait forever. The lower trial number runs; the other keeps waiting on it.
                trial.set_user_attr(names.DUPLICATE_OF, None)
                return role
            if why is None:
                self._phase(trial, f"waiting for trial {current.number} (same parameters)")
                time.sleep(HOLDER_POLL_S)
                continue
            marked, lines = reclaim(
                study, current, why, taken_over_by=trial.number if takes_over else None
            )
            self.notes += lines
            if not marked:
                continue  # another worker reclaimed it first: its state is final now
            trial.set_user_attr(names.DUPLICATE_OF, None)
            if not takes_over:
                return role
            role = (
                names.BASELINE
                if current.user_attrs.get(names.ROLE) == names.BASELINE
                else names.RETRY
            )
            trial.set_user_attr(names.ROLE, role)
            trial.set_user_attr(names.RETRY_OF, current.number)
            return role

    # --- the server part of a trial ---------------------------------------------------------

    async def _run_server_trial(
        self, trial: optuna.Trial, role: str, settings: ServerSettings
    ) -> dict[str, float]:
        ctx, spec = self.ctx, self.ctx.spec
        launch = ctx.engine.build_launch(
            settings, host=HOST, port=free_port(HOST), api_key=_api_key()
        )
        server_attrs: dict[str, Any] = {
            "argv": launch.redacted_argv(),
            "env": launch.redacted_env(),
            "engine_version": ctx.engine.version(),
            "host": HOST,
            "port": launch.port,
            "worker": ctx.worker,
            "hostname": socket.gethostname(),
        }
        if ctx.extra_env:  # a parallel worker's device set (CUDA_VISIBLE_DEVICES, core binding)
            server_attrs["devices"] = dict(ctx.extra_env)
        trial.set_user_attr(names.SERVER, server_attrs)
        log_path = ctx.log_dir / f"trial-{trial.number:05d}.log"
        clock = PhaseClock()  # where the trial's time goes (names.TIME_S)

        def on_spawn(pid: int, pgid: int) -> None:
            # Recorded at once: if autotune itself is killed, the next run finds this server.
            server_attrs.update(
                pid=pid, pgid=pgid, create_time=_proc.create_time(pid), machine=_proc.machine_id()
            )
            server_attrs["descendants"] = []  # the key exists before the tracking thread runs
            trial.set_user_attr(names.SERVER, server_attrs)

        def on_record(record: dict[str, Any]) -> None:
            # Descendants as they appear (tracking thread), then the teardown record: a later
            # run stops them too if autotune is killed (cleanup._stop_leftovers).
            server_attrs.update(record)
            trial.set_user_attr(names.SERVER, dict(server_attrs))

        server = ServerProcess(
            launch,
            log_path,
            startup_timeout_s=spec.startup_timeout_s,
            classify=ctx.engine.classify_failure,
            root_cause=ctx.engine.root_cause,
            on_spawn=on_spawn,
            on_record=on_record,
        )
        try:
            self._phase(trial, "launching")
            clock.start(STARTUP)
            server.start()
            async with build_client(
                launch,
                max_connections=connections_for(spec.workload.concurrency),
                timeout_s=spec.workload.request_timeout_s,
                reuses_connections=ctx.engine.reuses_connections,
            ) as client:
                started = await server.wait_ready(client)
                server_attrs["startup_s"] = round(started.startup_s, 3)
                trial.set_user_attr(names.SERVER, server_attrs)
                problem = ctx.engine.verify_started(settings, server.log_text())
                if problem:
                    raise CandidateError(
                        "patch_failed", problem, evidence={"log_tail": server.log_tail()}
                    )

                self._phase(trial, "verifying")
                clock.start(GATE)
                reference = await self._reference(client, launch.served_model, role, server)
                check = await self._verify(client, launch.served_model, reference, server)
                # with the gate's requests sent again on a new connection (client/send.py)
                retried = {"transport_retries": transport_retries(client)}
                trial.set_user_attr(names.CHECK, trim({**check.to_dict(), **retried}))
                if not check.passed:
                    evidence = {"first_divergence": asdict(check.first_divergence)}
                    evidence.update(await self._engine_evidence(client, trial, settings))
                    raise CandidateError("incorrect_output", check.problems[0], evidence=evidence)

                self._phase(trial, "benchmarking")
                clock.start(MEASUREMENT)
                screen = screen_for(ctx.study if ctx.allow_pruning else None, spec.objective, role)
                bench = await self._benchmark(client, launch, server, trial, screen)
                await self._engine_evidence(client, trial, settings)
                self._check_under_load(trial, reference, bench)
                if not server.alive():
                    raise server.failure("server_crashed", "server died during the benchmark")
                if screen is not None and screen.result is not None:
                    trial.set_user_attr(names.SCREEN, screen.result.to_dict())
                    if bench.stopped_by == names.SCREENED:  # correct, and clearly worse
                        raise Screened(bench.metrics, screen.result)
                return bench.metrics
        except TrialFailure as exc:
            # e.g. incorrect_output: the server's log and state are evidence too
            exc.evidence.setdefault("log_tail", server.log_tail())
            exc.evidence.setdefault("exit_code", server.exit_code())
            raise
        except NoTokenWithin as exc:
            # The first request that went silent ends the trial: one deadline, not one per
            # request still queued behind it.
            if not server.alive():
                raise server.failure("server_crashed", f"server died: {exc}") from None
            raise CandidateError("hang", str(exc)) from None  # the config's, never a retry
        except StreamError as exc:
            if not server.alive():
                raise server.failure("server_crashed", f"server died: {exc}") from None
            if str(exc).startswith(PROTOCOL_VIOLATION):  # streamed past max_tokens
                raise CandidateError("protocol_violation", f"verification: {exc}") from None
            raise server.failure("request_errors", f"verification: {exc}") from None
        except (httpx.TransportError, httpx.HTTPStatusError) as exc:
            if not server.alive():
                raise server.failure("server_crashed", f"server died: {exc}") from None
            if isinstance(exc, httpx.TimeoutException):
                # Not a deadline of ours (those are NoTokenWithin): httpx-aiohttp reports a
                # dropped connection as ConnectTimeout. The server is alive but unreachable.
                raise server.failure(
                    "request_errors", f"verification request failed: {type(exc).__name__}: {exc}"
                ) from None
            if isinstance(exc, httpx.HTTPStatusError):
                # Alive, but it refuses the gate's own requests: this config cannot be verified,
                # so it can never be scored.
                body = excerpt(exc.response.text, 300)
                raise server.failure(
                    "request_errors",
                    f"the server rejected a verification request with "
                    f"{exc.response.status_code}: {body}",
                ) from None
            raise server.failure("server_crashed", f"request failed: {exc}") from None
        finally:
            self._phase(trial, "stopping")
            clock.start(TEARDOWN)
            try:
                server.stop()
            finally:
                server_attrs["stopped_cleanly"] = server.stopped_cleanly
                # the start's parts as the engine's log states them (weights, compile, ...)
                log_lines = server.log_text().splitlines()
                server_attrs["startup_parts"] = ctx.engine.startup_parts(log_lines)
                # did the start read its compiled graphs back from the study's cache?
                cache = ctx.engine.compile_cache_state(log_lines)
                if cache is not None:
                    server_attrs["compile_cache"] = cache.state
                    if cache.load_failure:
                        server_attrs["compile_cache_failure"] = cache.load_failure
                trial.set_user_attr(names.SERVER, server_attrs)
                upload_trial_files(self.ctx.artifacts, trial, log_path, launch.redact)
                clock.stop()
                trial.set_user_attr(names.TIME_S, clock.seconds())

    async def _engine_evidence(
        self, client: Any, trial: optuna.Trial, settings: ServerSettings
    ) -> dict[str, Any]:
        """The engine's own evidence from the running server (its ``evidence`` hook), stored
        on the trial; returned so that a failure's evidence can carry it too."""
        found = await self.ctx.engine.evidence(client, settings)
        for key, value in found.items():
            trial.set_user_attr(key, value)
        return found

    async def _reference(
        self, client: httpx.AsyncClient, model: str, role: str, server: ServerProcess
    ) -> Reference:
        study = self.ctx.study
        stored = study.user_attrs.get(names.REFERENCE) if study is not None else None
        if role == names.BASELINE and stored is None:
            spec = self.ctx.spec
            reference = await record_reference(
                client,
                model,
                spec.check,
                list(reference_requests(spec.workload)),
                reference_requests(spec.workload),
                dialect=self.ctx.engine.dialect,
                engine_version=self.ctx.engine.version(),
                deadline_s=spec.workload.request_timeout_s,
            )
            unverifiable = reference.capabilities.problem()
            if unverifiable:
                # Verify or refuse: a study whose gate could check nothing must not start.
                raise CandidateError("unverifiable", unverifiable)
            counter = self.ctx.token_counter
            if not reference.capabilities.token_ids and not counter.available:
                # Count or refuse: every speed would be the server's own word (its usage).
                raise CandidateError("uncountable", uncountable_detail(counter.unavailable))
            for prompt, entry in reference.entries.items():
                problem = sanity_problem(entry.completion.text, entry.completion.token_ids)
                if problem and prompt in spec.check.prompts:
                    raise CandidateError(
                        "incorrect_output",
                        f"baseline output fails sanity for {prompt!r}: {problem}",
                    )
            if study is not None:
                study.set_user_attr(names.REFERENCE, reference.to_dict())
            return reference
        if stored is None:
            raise InfrastructureError("interrupted", "no reference recorded yet for this study")
        return Reference.from_dict(stored)

    async def _verify(
        self, client: httpx.AsyncClient, model: str, reference: Reference, server: ServerProcess
    ) -> CheckResult:
        prompts = [p for p in self.ctx.spec.check.prompts if p in reference.entries]
        completions, teacher = await collect_outputs(
            client,
            model,
            reference,
            prompts,
            dialect=self.ctx.engine.dialect,
            deadline_s=self.ctx.spec.workload.request_timeout_s,
        )
        return compare(reference, completions, teacher, self.ctx.spec.check)

    async def _benchmark(
        self,
        client: httpx.AsyncClient,
        launch: LaunchConfig,
        server: ServerProcess,
        trial: optuna.Trial,
        screen: Screen | None = None,
    ) -> BenchResult:
        single = len(self.ctx.spec.objective.metrics) == 1

        def on_repeat(index: int, metrics: dict[str, float]) -> None:
            # each round's objective as an intermediate value: the dashboard's curve, and how
            # a sampler ranks a screened (PRUNED) trial among the others
            value = metrics.get(self.ctx.spec.objective.metrics[0])
            if value is not None and single:
                trial.report(value, index)

        evidence = ServerMetricsRecorder(client, self.ctx.engine.server_metrics_map())
        await evidence.start()
        # what else used the machine meanwhile (bench/host.py): the server's tree is left out
        gpus = visible_gpus({**os.environ, **self.ctx.extra_env})
        host = HostSampler(lambda: {server.pid}, gpus=gpus)
        host.start()
        try:
            bench = await run_benchmark(
                client,
                launch.served_model,
                self.ctx.spec.workload,
                dialect=self.ctx.engine.dialect,
                on_repeat=on_repeat,
                stop_rule=screen,  # one round, then on only if it may be the best (screen.py)
                focus=self.ctx.spec.objective.metrics,
                phase_hook=evidence.phase,
                counter=self.ctx.token_counter,
                request_bound_s=request_bound_s(
                    self.ctx.study and verified_baseline(self.ctx.study),
                    self.ctx.spec.workload.request_timeout_s,
                ),
                speculates=self.ctx.engine.speculates(launch),
            )
        finally:  # stored whatever the benchmark's outcome; never fails the trial
            server_metrics = await evidence.stop()
            trial.set_user_attr(names.SERVER_METRICS, server_metrics)
            traps = trial_traps(server_metrics=server_metrics, server_log=server.log_text())
            # prefix-cache hits, eager batches (bench/traps.py)
            trial.set_user_attr(names.TRAPS, traps)
            trial.set_user_attr(names.HOST, (await asyncio.to_thread(host.stop)).to_dict())
        trial.set_user_attr(names.BENCH, bench_summary(bench))
        record_curve(trial, bench)
        failure = bench_failure(bench, server, self.ctx.token_counter)
        if failure is not None:
            raise failure
        return bench

    def _check_under_load(
        self, trial: optuna.Trial, reference: Reference, bench: BenchResult
    ) -> None:
        """Benchmark responses, at the batch shapes where batching bugs live, vs the reference.

        Each response is compared by token ids where it and the reference have them, else by
        its text. The stored count is of responses actually compared, never of responses seen.
        """
        judged = judge_under_load(
            reference,
            bench.samples,
            single_length_prompts(self.ctx.spec.workload),
            self.ctx.spec.check.under_load_sample,
            rounds=len(bench.repeats),
        )
        check = dict(trial.user_attrs.get(names.CHECK) or {})
        check["under_load_checked"] = judged.checked
        check["under_load_compared_by"] = judged.compared_by
        check["under_load_tie_flips_by"] = judged.tie_flips_by
        check["under_load_divergent"] = len(judged.divergences)
        check["under_load_answers"] = judged.answers
        check["under_load_unreferenced"] = judged.unreferenced
        if not judged.checked:
            check["under_load_skipped"] = (
                "no benchmark response used a reference prompt at its recorded length"
            )
        trial.set_user_attr(names.CHECK, check)
        if judged.divergences:
            first = judged.divergences[0]
            phase = f", in {first.phase}" if first.phase else ""
            raise CandidateError(
                "incorrect_output",
                f"{len(judged.divergences)} of {judged.checked} benchmark responses diverged "
                f"under load (first at {first.kind} {first.position}{phase})",
                evidence={"first_divergence": asdict(first)},
            )

    def _phase(self, trial: optuna.Trial, phase: str) -> None:
        self.ctx.on_phase(trial.number, phase)

    def _with_worker_settings(self, settings: ServerSettings) -> ServerSettings:
        """The worker's own env (a parallel worker's devices) and the study's compile cache
        (unless the trial's settings choose their own) merged into the trial's settings."""
        cache = self.ctx.compile_cache
        shared = self.ctx.engine.compile_cache_env(cache) if cache is not None else {}
        if not self.ctx.extra_env and not (shared.keys() - settings.env.keys()):
            return settings
        env = {**shared, **settings.env, **self.ctx.extra_env}
        return ServerSettings(
            flags=settings.flags, json_flags=settings.json_flags, env=env, patches=settings.patches
        )


def suggest_values(space: SearchSpace, trial: optuna.Trial, role: str) -> dict[str, Any]:
    """The trial's parameter values: a pinned variant (ablation, confirmation, an early
    neighbour) gets exactly its values, the baseline its ``baseline:`` values, and every other
    trial what the sampler proposes; whatever is left out runs at the engine's default."""
    pinned = trial.user_attrs.get(names.PINNED)
    if pinned is not None:
        return space.suggest(trial, only=pinned)
    if role == names.BASELINE:
        return space.suggest(trial, only=space.baseline_names())
    return space.suggest(trial)


def _api_key() -> str:
    """A per-trial key. Hex, never token_urlsafe: a key starting with '-' is parsed as an
    option by the server's argparse ('--api-key: expected one argument')."""
    return secrets.token_hex(24)
