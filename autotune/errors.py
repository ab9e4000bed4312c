"""The exception tree of autotune.

Three branches never share an ``except``: the user's input is wrong, the candidate server
configuration is bad, or the infrastructure flaked. They lead to different outcomes: a spec
error stops the program with exit code 2 before anything is written, a candidate fault is
recorded against the configuration so the sampler learns from it, and an infrastructure fault
is retried and never counted against the configuration::

    AutotuneError
    ├── SpecError                 the user's input (spec, search space, CLI value) is invalid
    ├── PreflightError            the study cannot start (engine missing, baseline broken, ...)
    ├── CandidateError            the configuration is bad; carries a reason (names.py)
    └── InfrastructureError       not the configuration's fault (port taken, disk full, storage)
"""

from __future__ import annotations

import re

from autotune.names import CANDIDATE_REASONS, INFRA_REASONS


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
        super().__init__(one_line(where + message))
        self.message = message


def one_line(text: str) -> str:
    """``text`` with each character that is not printable written as a repr writes it
    (``\\n``, ``\\x1b``, ``\\x00``, ``\\u2028``): an error is one line, and a key or a path
    from the input cannot start another line on the terminal (``fake: line``) or color it
    (an ANSI escape). The key, file and message attributes stay as given."""
    return visible(text)


def visible(text: str, keep: str = "") -> str:
    """``text`` with each character that is not printable, but those in ``keep``, written as
    :func:`one_line` writes it: the one escaping of any text from outside (a server's log line,
    a parameter value, a stored detail) shown on the terminal or the report's page. Raw, an ESC
    from a server's log retitles, clears, colours or links the reader's terminal, and a bidi
    control (``\\u202e``) reverses the text around it. ``keep="\\n"`` keeps a log tail's
    lines."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


class PreflightError(AutotuneError):
    """The study cannot start; nothing is spent on trials."""


class TrialFailure(AutotuneError):
    """A trial ended without a correct measurement. ``reason`` is a key of
    :data:`autotune.names.CANDIDATE_REASONS` or :data:`~autotune.names.INFRA_REASONS`."""

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


def excerpt(body: str, limit: int = 200) -> str:
    """A server's answer as evidence: one line of at most ``limit`` characters, an HTML page's
    text without its markup. A server that is not what the spec says answers with a whole HTML
    page, which read as a dozen lines of markup in ``show``, ``bench`` and the run's status."""
    if body.lstrip()[:1] == "<":
        body = re.sub(r"<[^<>]*>", " ", body)
    return " ".join(body.split())[:limit]
