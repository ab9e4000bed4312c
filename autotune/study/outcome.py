"""What a finished benchmark says about the config that served it.

A trial's benchmark returns figures and failures; before any figure is scored, this decides
whether the run itself condemns the config: a speed autotune could not count itself, a request
that went silent, a server that died, a stream past ``max_tokens``, too many failed requests,
or answers replayed from a cache. Each is the config's failure (:class:`CandidateError`),
except what the server's own log names as something else (``ServerProcess.failure``).
"""

from __future__ import annotations

from autotune.bench.limits import MAX_FAILED_FRACTION
from autotune.bench.phase import BenchResult
from autotune.bench.tokens import TokenCounter, not_own_counts, uncountable_detail
from autotune.client.bounds import PROTOCOL_VIOLATION
from autotune.errors import CandidateError, TrialFailure
from autotune.server.process import ServerProcess


def bench_failure(
    bench: BenchResult, server: ServerProcess, counter: TokenCounter
) -> TrialFailure | None:
    """The failure to record for ``bench`` (None: its figures may be scored)."""
    not_own = not_own_counts(bench.counts)
    if not_own:
        # a speed from the server's usage (or its events) is never scored: the objective is
        # autotune's own count or nothing
        return CandidateError(
            "uncountable",
            f"{sum(not_own.values())} answers counted by {sorted(not_own)}: "
            + uncountable_detail(counter.unavailable),
        )
    if bench.hang:
        if not server.alive():
            return server.failure("server_crashed", f"server died: {bench.hang}")
        # alive and silent: the config's fault, never re-read from the log as infrastructure
        return CandidateError("hang", bench.hang, evidence={"log_tail": server.log_tail()})
    if not bench.failed_requests:
        return _replayed(bench)
    if not server.alive():
        return server.failure(
            "server_crashed",
            f"server died during the benchmark ({bench.failed_requests} requests failed)",
        )
    # one stream past max_tokens is the config's fault whatever the fraction: the server does
    # not do what it was asked, and its figures count tokens never asked for
    broken = [e for e in bench.errors if (e or "").startswith(PROTOCOL_VIOLATION)]
    if broken:
        return CandidateError(
            "protocol_violation",
            f"{len(broken)} of {bench.total_requests} requests: {broken[0]}",
            evidence={"log_tail": server.log_tail(), "errors": broken[:5]},
        )
    if bench.failed_requests / max(1, bench.total_requests) > MAX_FAILED_FRACTION:
        hung = all((e or "").startswith("hang") for e in bench.errors)
        return server.failure(
            "hang" if hung else "request_errors",
            f"{bench.failed_requests} of {bench.total_requests} requests failed: {bench.errors[0]}",
        )
    return _replayed(bench)


def _replayed(bench: BenchResult) -> TrialFailure | None:
    """Answers to repeated prompts far faster than to a fresh one: served from a cache, so
    the figures are the cache's, never the config's (``bench/replay.py``)."""
    replay = bench.replay or {}
    if not replay.get("refused"):  # a speculating launch's ratio is a trap, not a refusal
        return None
    return CandidateError("replayed_answers", replay["reason"], evidence={"replay_check": replay})
