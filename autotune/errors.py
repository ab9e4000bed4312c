"""The exception tree of autotune.

Three branches never share an ``except``: the user's input is wrong, the candidate server
configuration is bad, or the infrastructure flaked. They lead to different outcomes: a spec
error stops the program with exit code 2 before anything is written, a candidate fault is
recorded against the configuration so the sampler learns from it, and an infrastructure fault
is retried and never counted against the configuration::

    AutotuneError
    ├── SpecError                 the user's input (spec, search space, CLI value) is invalid
    ├── PreflightError            the study cannot start (engine missing, baseline broken, ...)
    ├── CandidateError            the configuration is bad; carries a reason from REASONS
    └── InfrastructureError       not the configuration's fault (port taken, disk full, storage)
"""

from __future__ import annotations

#: Reasons a trial can fail, with what each means. The README's "When things go wrong"
#: section mirrors this table.
CANDIDATE_REASONS: dict[str, str] = {
    "invalid_config": "the engine rejected its arguments",
    "startup_failed": "the server exited before it was ready",
    "startup_timeout": "the server was not ready within the startup timeout",
    "oom": "the server ran out of GPU or CPU memory",
    "server_crashed": "the server died during verification or benchmark",
    "hang": "no token arrived within the request deadline",
    "request_errors": "too many requests failed during the benchmark",
    "incorrect_output": "the output diverged from the pinned reference",
    "unverifiable": "the server's answers carry nothing the gate can check (e.g. no text)",
    "patch_failed": "a selected patch could not be applied",
    "constraint_violated": "the sampled parameters violate a search-space constraint",
    "duplicate": "another worker is running the same parameters right now (not launched)",
    "slo_violated": "a measured value broke a service-level constraint",
    "pruned_early": "correct, but clearly slower than earlier trials after its first repeat",
}
INFRA_REASONS: dict[str, str] = {
    "port_taken": "the chosen port was taken by another process",
    "disk_full": "no space left on the device",
    "storage_unreachable": "the study storage could not be written",
    "orphan_process": "a process of an earlier server could not be stopped",
    "interrupted": "the run was killed or interrupted while this trial ran",
}


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose."""


class SpecError(AutotuneError):
    """The user's input is invalid. Names the file and the key (and line when YAML gives it)."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        line: int | None = None,
    ) -> None:
        self.file = file
        self.key = key
        self.line = line
        where = ""
        if file:
            where = str(file)
            if line is not None:
                where += f":{line}"
            where += ": "
        if key:
            where += f"{key}: "
        super().__init__(where + message)
        self.message = message


class PreflightError(AutotuneError):
    """The study cannot start; nothing is spent on trials."""


class TrialFailure(AutotuneError):
    """A trial ended without a correct measurement. ``reason`` is a key of the tables above."""

    def __init__(self, reason: str, detail: str = "", *, evidence: dict | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.evidence = dict(evidence or {})


class CandidateError(TrialFailure):
    """The configuration itself is bad."""

    def __init__(self, reason: str, detail: str = "", *, evidence: dict | None = None) -> None:
        if reason not in CANDIDATE_REASONS:
            raise ValueError(f"unknown candidate reason {reason!r}")
        super().__init__(reason, detail, evidence=evidence)


class InfrastructureError(TrialFailure):
    """Not the configuration's fault: retried, never counted against it."""

    def __init__(self, reason: str, detail: str = "", *, evidence: dict | None = None) -> None:
        if reason not in INFRA_REASONS:
            raise ValueError(f"unknown infrastructure reason {reason!r}")
        super().__init__(reason, detail, evidence=evidence)
