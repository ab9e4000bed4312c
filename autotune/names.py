"""The names autotune writes into a study, in one table: attribute keys, roles, failure reasons,
metric names and their directions, and how an ``int_list`` value travels through Optuna.

Why one module: these strings are the study's on-disk format. ``optuna-dashboard``, plain
``optuna.load_study`` and every earlier study read them back, so a key spelled twice drifts
apart silently. Nothing here imports from autotune (every other module may import this one).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

# --- trial attribute keys (user_attrs) ---------------------------------------------------------
CORRECT = "correct"  # True, False, or None when never verified
FAIL_REASON = "fail_reason"
FAIL_DETAIL = "fail_detail"
EVIDENCE = "evidence"  # log tail, exit code, signal, first divergence ...
METRICS = "metrics"
BENCH = "bench"  # spread, repeats, request counts
HOST = "host"  # what else used the machine while it was measured (bench/host.py): noisy, reasons
MEASUREMENT_SUSPECT = "measurement_suspect"  # autotune's token count vs usage and /metrics
STREAM_SHAPE = "stream_shape"  # how the answers streamed: TTFT, TPOT, tokens per chunk, bursts
TRAPS = "traps"  # measurement traps: prefix-cache hits, eager batches, a client that lagged
MACHINE = "machine"  # study: the machine it ran on (CPU model, cores, memory, GPUs)
#: argv, env (redacted), startup_s, engine_version, pid/pgid, host, worker, startup_parts,
#: compile_cache (warm / cold / partly warm / load failed, when the engine's log says) and
#: compile_cache_failure (the engine's reason when it could not read its cache back)
SERVER = "server"
CHECK = "check"
PARAMS_RESOLVED = "params_resolved"  # values as the engine got them (int_list as lists)
PINNED = "pinned_params"  # exact values of an ablation/confirmation variant
VARIANT = "variant"  # label of an ablation/confirmation variant
ROLE = "role"  # one of ROLES
RETRY_OF = "retry_of"
WORKER = "worker"  # the autotune process running the trial: machine, hostname, pid, create_time
DUPLICATE_OF = "duplicate_of"  # set while a trial waits for a running trial with its parameters
SPECULATIVE = "speculative"  # spec-decode acceptance from /metrics (autotune.speculative)
METRICS_CI = "metrics_ci"  # 95% t interval per metric: name -> [low, high, n]
LOAD_CURVE = "load_curve"  # concurrency level -> that level's metrics
GOODPUT = "goodput"  # the goodput search: value, SLOs, every level probed
SERVER_METRICS = "server_metrics"  # the server's own /metrics over the benchmark
EARLY_PROPOSAL = "early_proposal"  # label of the one-change neighbour this trial runs (guide.py)
ROUND = "round"  # which interleaved round of a re-measurement a variant's trial belongs to
#: the one-round screen (study/screen.py): this trial's interval, the leader's, the decision
SCREEN = "screen"
#: seconds of each phase of the trial (study/phase_clock.py): startup, gate, measurement, ...
TIME_S = "time_s"
#: the verdict of a correct trial whose first round lay clearly below the leader's interval
SCREENED = "screened"
# --- study attribute keys ----------------------------------------------------------------------
REFERENCE = "reference"
SPEC_PATH = "spec_path"
ENGINE_VERSION = "engine_version"
ROOFLINE = "roofline"
ABLATION_REPORT = "ablation"
CONFIRMATION = "confirmation"
#: why `autotune run` planned no confirmation (its --trials held none): `export` then writes the
#: baseline, the run's verdict
CONFIRMATION_SKIPPED = "confirmation_skipped"
RECHECK = "recheck"
WORKLOAD = "workload"  # the pinned workload: its hash and what it is made of (workload.py)
WORKLOAD_CHANGES = "workload_changes"  # each accepted workload change on resume
MACHINE_LIMITS = "machine_limits"  # choices this machine cannot run, and why (guide.py)
EARLY_PROPOSALS = "early_proposals"  # the one-change neighbours planned first (guide.py)
RECHECK_OF = "recheck_of"  # the exported file a recheck study checks
PROFILES = "profiles"  # step-time breakdowns by trial (``autotune profile``, profile.py)
#: trials ran in parallel, so their numbers compare with each other only roughly
PARALLEL_CONTENTION = "parallel_contention_warning"

#: the constraint key that marks a trial whose configuration is bad (not measured, never best)
CORRECTNESS_CONSTRAINT = "correct"
#: prefix of a constraint per service-level objective: ``slo:<metric>``
SLO_CONSTRAINT_PREFIX = "slo:"


def slo_constraint(metric: str) -> str:
    return f"{SLO_CONSTRAINT_PREFIX}{metric}"


def constraint_attr(name: str) -> str:
    """The system attribute under which Optuna keeps constraint ``name`` of a trial."""
    return f"constraints:{name}"


# --- trial roles -------------------------------------------------------------------------------
Role = Literal["baseline", "search", "retry", "ablation", "confirm", "compare"]
BASELINE: Role = "baseline"  # the engine's defaults (plus the space's ``baseline:`` values)
SEARCH: Role = "search"  # proposed by the sampler
RETRY: Role = "retry"  # an infrastructure failure's parameters, run once more
ABLATION: Role = "ablation"  # one change of the best config reverted
CONFIRM: Role = "confirm"  # a top config re-measured against the baseline
COMPARE: Role = "compare"  # a config measured for ``autotune compare``
ROLES: tuple[Role, ...] = (BASELINE, SEARCH, RETRY, ABLATION, CONFIRM, COMPARE)
#: the roles whose trials come from the search itself (candidates for "best")
SEARCH_ROLES: tuple[Role, ...] = (SEARCH, RETRY, BASELINE)

# --- verdicts and failure reasons --------------------------------------------------------------
#: the verdict of a trial that was verified correct and measured
CORRECT_VERDICT = "correct"

#: Reasons a trial can fail, with what each means. docs/guide/failures.md explains each one
#: (tests/test_docs.py checks that every reason has its row).
CANDIDATE_REASONS: dict[str, str] = {
    "invalid_config": "the engine rejected its arguments",
    "startup_failed": "the server exited before it was ready",
    "startup_timeout": "the server was not ready within the startup timeout",
    "oom": "the server ran out of GPU or CPU memory",
    "server_crashed": "the server died during verification or benchmark",
    "hang": "no token arrived within the request deadline",
    "request_errors": "too many requests failed during the benchmark",
    "protocol_violation": "the stream broke the protocol (more tokens than max_tokens allows)",
    "incorrect_output": "the output diverged from the pinned reference",
    "unverifiable": "the server's answers carry nothing the gate can check (e.g. no text)",
    "uncountable": "autotune cannot count the output tokens itself (no token ids, no tokenizer)",
    "replayed_answers": "repeated prompts were answered far faster than a fresh one (a cache)",
    "patch_failed": "a selected patch could not be applied",
    "constraint_violated": "the sampled parameters violate a search-space constraint",
    "duplicate": "another worker is running the same parameters right now (not launched)",
    "pruned_early": "correct, but clearly slower than earlier trials after its first repeat",
    SCREENED: "correct, but its first round's interval lies below the leader's: not measured on",
}
INFRA_REASONS: dict[str, str] = {
    "port_taken": "the chosen port was taken by another process",
    "disk_full": "no space left on the device",
    "storage_unreachable": "the study storage could not be written",
    "orphan_process": "a process of an earlier server could not be stopped",
    "interrupted": "the run was killed or interrupted while this trial ran",
}

# --- metrics -----------------------------------------------------------------------------------
Direction = Literal["maximize", "minimize"]
#: latency percentiles the benchmark reports, each as ``<kind>_p<q>_ms``
LATENCY_KINDS = ("ttft", "itl", "e2e")
PERCENTILES = (50, 95, 99)


def latency_metric(kind: str, q: int) -> str:
    return f"{kind}_p{q}_ms"


#: the single-request headline: a user's tok/s, output tokens over end-to-end time of
#: fixed-length greedy requests one after another (no shape of stream can inflate it)
SINGLE_TOKENS_PER_S = "single_tokens_per_s"
#: decoding alone, 1 / TPOT (tokens over end-to-end time for a bursty response), beside it
DECODE_TOKENS_PER_S = "decode_tokens_per_s"
#: metrics of the single-request phase: one figure per round, not one per load level
SINGLE_REQUEST_METRICS = (SINGLE_TOKENS_PER_S, DECODE_TOKENS_PER_S)
#: what a study optimises when its spec names no objective
DEFAULT_OBJECTIVE = SINGLE_TOKENS_PER_S

#: every metric the benchmark reports and a study can optimise, with the direction that is better
METRIC_DIRECTIONS: dict[str, Direction] = {
    SINGLE_TOKENS_PER_S: "maximize",
    DECODE_TOKENS_PER_S: "maximize",
    "output_tokens_per_s": "maximize",
    "requests_per_s": "maximize",
    **{latency_metric(k, q): "minimize" for k in LATENCY_KINDS for q in PERCENTILES},
    # the highest concurrency whose workload.slo holds (see loadcurve.py)
    "goodput": "maximize",
}


def at_level(metric: str, level: int | str) -> str:
    """A metric measured at one concurrency level of the load curve: ``output_tokens_per_s@16``.
    The one spelling of that name (the spec's objective, the stored metrics, the report)."""
    return f"{metric}@{level}"


def split_level(name: str) -> tuple[str, str | None]:
    """``"output_tokens_per_s@16"`` -> ``("output_tokens_per_s", "16")``; a plain metric's level
    is None."""
    base, sep, level = name.partition("@")
    return (base, level) if sep else (base, None)


def direction(metric: str, default: Direction | None = None) -> Direction:
    """Whether more of ``metric`` is better (``maximize``) or less (``minimize``); a level's
    metric (``output_tokens_per_s@16``) has its base metric's direction. An unknown metric is
    a KeyError unless a ``default`` is given (a study read back may name anything)."""
    base = split_level(metric)[0]
    if default is not None and base not in METRIC_DIRECTIONS:
        return default
    return METRIC_DIRECTIONS[base]


def sign(metric: str, default: Direction | None = None) -> float:
    """+1 where more is better, -1 where less is: ``sign * value`` always grows with quality."""
    return 1.0 if direction(metric, default) == "maximize" else -1.0


# --- int_list values ---------------------------------------------------------------------------
# Optuna's categorical choices must be scalars, so a list of ints travels as "1,2,4".


def int_list_label(value: Iterable[Any]) -> str:
    """``[1, 2, 4]`` -> ``"1,2,4"``, the form Optuna stores."""
    return ",".join(str(int(v)) for v in value)


def parse_int_list(label: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``."""
    return [int(v) for v in label.split(",") if v != ""]
