"""Parallel trials on one machine: a device plan and K ``autotune run`` worker processes.

``autotune run --parallel K`` starts K workers on one study. Each worker is an ordinary
``autotune run`` process with its share of ``--trials`` and a disjoint device set, passed as
``--worker-env`` and merged into the env of every server it starts:

* GPUs: ``CUDA_VISIBLE_DEVICES`` (``--gpus 0-7 --gpus-per-trial 2`` gives 4 workers 2 GPUs
  each); without ``--gpus`` the GPUs in ``CUDA_VISIBLE_DEVICES`` or listed by ``nvidia-smi``.
* CPU engines (no GPU): a core set, in the engine's own env var (``Engine.cpu_binding_env``;
  vLLM's CPU worker binds its OpenMP threads to it); by default this process's allowed cores
  split evenly.

The workers coordinate only through the study's storage (the baseline, the reference,
heartbeats, the constant-liar TPE sampler and the duplicate-config guard of ``trial.py``),
exactly as workers on different machines do. That storage must serve concurrent writers
safely, which SQLite does not (see :func:`check_storage`): ``--parallel`` needs PostgreSQL or
MySQL.

Parallel trials share PCIe, memory bandwidth and the host CPU, so their numbers are not
comparable with solo runs; the study records a warning (``parallel_contention_warning``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from autotune import names
from autotune.engines import build_engine
from autotune.engines.base import Engine
from autotune.errors import SpecError
from autotune.spec.load import load_spec
from autotune.spec.model import StudySpec
from autotune.spec.workload import check_workload
from autotune.storage import artifact_dir_for, is_sqlite, password_off_argv, resolve_url
from autotune.study.loop import open_study, preflight, roofline_record, storage_url_for
from autotune.study.termination import terminated_by
from autotune.study.warm_start import warm_start_from

#: env var naming the GPUs a worker's servers see
GPU_ENV = "CUDA_VISIBLE_DEVICES"
#: study user attribute recording that trials ran in parallel (numbers not comparable)
CONTENTION_WARNING = (
    "parallel trials contend for shared resources (PCIe, memory bandwidth, host CPU, caches), "
    "so their measurements are comparable with each other only roughly and not with solo runs; "
    "re-measure the winners alone before trusting absolute numbers"
)
#: the most ids ``--gpus``/``--cpus`` may name: far more than any machine's CPUs or GPUs (a few
#: thousand at most), few enough that the list and its checks stay small
MAX_IDS = 65536
#: seconds the workers get to stop their trials cleanly after Ctrl-C before SIGTERM
INTERRUPT_GRACE_S = 120.0

_TABLE_CHARS = set("┏┓┗┛┃━┡┩┢┪│─└┘┌┐├┤┼╇╈╋╿┯┷┳┻╭╮╰╯")


@dataclass(frozen=True)
class DevicePlanSpec:
    """The device options of ``autotune run --parallel``."""

    gpus: str | None = None
    gpus_per_trial: int = 1
    cpus: str | None = None
    cpus_per_trial: int | None = None


@dataclass(frozen=True)
class WorkerDevices:
    """One worker's device set. ``env`` goes into every server the worker starts."""

    index: int
    gpus: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()
    #: the engine's env that binds its server to ``cpus`` (``Engine.cpu_binding_env``)
    cpu_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.gpus:
            env[GPU_ENV] = ",".join(self.gpus)
        env.update(self.cpu_env)
        return env

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env.items()) or "(no device binding)"


def parse_ids(text: str, *, option: str) -> list[int]:
    """``"0-7"``, ``"0,2,4,6"``, ``"0-3,8-11"`` -> sorted ids; duplicates are an error.

    At most :data:`MAX_IDS` ids: a range is counted before it is expanded, so ``0-999999999``
    is refused at once instead of growing the list until the machine runs out of memory.
    """
    ids: list[int] = []
    quoted = repr(text) if len(text) <= 80 else repr(text[:77] + "...")
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, high = _read_part(part, quoted, option)
        if len(ids) + (high - low + 1) > MAX_IDS:  # counted, not len(range): no overflow
            raise SpecError(
                f"{quoted} names more than {MAX_IDS} ids; a machine has at most a few thousand "
                "CPUs or GPUs",
                key=option,
            )
        ids.extend(range(low, high + 1))
    if not ids:
        raise SpecError(f"no ids in {quoted}", key=option)
    duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
    if duplicates:
        shown = duplicates[:10]
        more = f" and {len(duplicates) - len(shown)} more" if len(duplicates) > len(shown) else ""
        raise SpecError(f"{quoted} names {shown}{more} more than once", key=option)
    return sorted(ids)


def _read_part(part: str, quoted: str, option: str) -> tuple[int, int]:
    """One id (``"4"``) or range (``"0-7"``) of the option's value (``quoted``, as shown in an
    error): its lowest and highest id."""
    try:
        if "-" in part:
            low_text, high_text = part.split("-", 1)
            low, high = int(low_text), int(high_text)
        else:
            low = high = int(part)
        if low > high or low < 0:
            raise ValueError
    except ValueError:
        raise SpecError(
            f"cannot read {part[:40]!r} in {quoted}: expected ids and ranges such as "
            f"0-7, 0,2,4,6 or 0-3,8-11",
            key=option,
        ) from None
    return low, high


def check_device_options(
    parallel: int,
    gpus: str | None,
    gpus_per_trial: int,
    cpus: str | None,
    cpus_per_trial: int | None,
) -> None:
    """The device options are read before anything starts (a typo such as ``--gpus 0-x`` is
    bad input, not a surprise after the first trial), and only mean something with
    ``--parallel`` > 1: they share devices out between workers. A single run uses what its
    environment gives it (``CUDA_VISIBLE_DEVICES``, the process's CPU affinity); ignoring
    them silently would let a user believe the server was bound."""
    for option, text in (("--gpus", gpus), ("--cpus", cpus)):
        if text is not None:
            parse_ids(text, option=option)
    if parallel > 1:
        return
    given = [
        option
        for option, used in (
            ("--gpus", gpus is not None),
            ("--gpus-per-trial", gpus_per_trial != 1),
            ("--cpus", cpus is not None),
            ("--cpus-per-trial", cpus_per_trial is not None),
        )
        if used
    ]
    if given:
        raise SpecError(
            "shares devices out between workers and needs --parallel N > 1; a single run uses "
            "the devices its environment gives it (CUDA_VISIBLE_DEVICES, taskset)",
            key=given[0],
        )


def format_ids(ids: Sequence[int]) -> str:
    """Sorted ids as ranges: (0, 1, 2, 3, 8) -> ``"0-3,8"`` (the syntax vLLM parses)."""
    parts: list[str] = []
    ordered = sorted(ids)
    start = prev = ordered[0]
    for value in ordered[1:] + [None]:  # type: ignore[operator]
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


def detect_gpus() -> tuple[str, ...]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi -L``."""
    visible = os.environ.get(GPU_ENV)
    if visible is not None:
        return tuple(t.strip() for t in visible.split(",") if t.strip() and t.strip() != "-1")
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        listing = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=20, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(
        str(i)
        for i, line in enumerate(line for line in listing.splitlines() if line.startswith("GPU "))
    )


def build_plan(
    spec: DevicePlanSpec,
    workers: int,
    *,
    bind_cpus: Callable[[str], Mapping[str, str]],
    available_gpus: Sequence[str] | None = None,
    available_cpus: Sequence[int] | None = None,
) -> list[WorkerDevices]:
    """Give each of ``workers`` a disjoint device set, or raise SpecError (exit 2).

    GPUs come from ``--gpus`` (else ``available_gpus``, default :func:`detect_gpus`),
    ``--gpus-per-trial`` each. Without GPUs, or when ``--cpus``/``--cpus-per-trial`` is given,
    each worker also gets a disjoint core set, given to its servers in the env ``bind_cpus``
    (the engine's ``cpu_binding_env``) makes of a core list: ``--cpus`` (default: the cores
    this process may run on) split into ``--cpus-per-trial`` cores each (default: an even
    split; leftover cores stay unused).
    """
    if workers < 1:
        raise SpecError(f"must be at least 1, got {workers}", key="--parallel")
    if spec.gpus_per_trial < 1:
        raise SpecError(f"must be at least 1, got {spec.gpus_per_trial}", key="--gpus-per-trial")
    if spec.gpus is not None:
        gpus: tuple[str, ...] = tuple(str(i) for i in parse_ids(spec.gpus, option="--gpus"))
    else:
        gpus = tuple(detect_gpus() if available_gpus is None else available_gpus)
    gpu_sets: list[tuple[str, ...]] = [()] * workers
    if gpus:
        need = workers * spec.gpus_per_trial
        if need > len(gpus):
            raise SpecError(
                f"--parallel {workers} x --gpus-per-trial {spec.gpus_per_trial} needs {need} "
                f"GPUs but --gpus {'/'.join(gpus) if spec.gpus is None else spec.gpus} has "
                f"{len(gpus)}: workers cannot get disjoint GPU sets; lower --parallel or "
                f"--gpus-per-trial, or name more GPUs with --gpus",
                key="--parallel",
            )
        per = spec.gpus_per_trial
        gpu_sets = [gpus[i * per : (i + 1) * per] for i in range(workers)]
    elif spec.gpus is None and spec.gpus_per_trial > 1:
        raise SpecError(
            "no GPUs found (CUDA_VISIBLE_DEVICES, nvidia-smi); name them with --gpus",
            key="--gpus-per-trial",
        )

    cpu_sets: list[tuple[int, ...]] = [()] * workers
    if not gpus or spec.cpus is not None or spec.cpus_per_trial is not None:
        if spec.cpus is not None:
            cpus = parse_ids(spec.cpus, option="--cpus")
            allowed = set(_allowed_cpus() if available_cpus is None else available_cpus)
            outside = [c for c in cpus if c not in allowed]
            if outside:
                raise SpecError(
                    f"cores {format_ids(outside)} are not available to this "
                    f"process (allowed: {format_ids(sorted(allowed))})",
                    key="--cpus",
                )
        else:
            cpus = sorted(_allowed_cpus() if available_cpus is None else available_cpus)
        per = spec.cpus_per_trial or len(cpus) // workers
        if per < 1 or per * workers > len(cpus):
            raise SpecError(
                f"--parallel {workers} workers"
                + (f" x --cpus-per-trial {spec.cpus_per_trial}" if spec.cpus_per_trial else "")
                + f" cannot get disjoint core sets from {len(cpus)} cores "
                f"({format_ids(cpus)}); lower --parallel or --cpus-per-trial, or name more "
                f"cores with --cpus",
                key="--parallel",
            )
        cpu_sets = [tuple(cpus[i * per : (i + 1) * per]) for i in range(workers)]
    return [
        WorkerDevices(
            index=i,
            gpus=gpu_sets[i],
            cpus=cpu_sets[i],
            cpu_env=dict(bind_cpus(format_ids(cpu_sets[i]))) if cpu_sets[i] else {},
        )
        for i in range(workers)
    ]


def _allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def split_trials(total: int, workers: int) -> list[int]:
    """``total`` trials over ``workers``: the shares differ by at most one and sum to total."""
    return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


def check_storage(url: str) -> None:
    """Refuse storages that cannot serve several writers of one study safely.

    Optuna claims a queued trial (the baseline, a retry) with ``SELECT ... FOR UPDATE`` and then
    an UPDATE. PostgreSQL and MySQL lock the row, so exactly one worker gets it. SQLite ignores
    ``FOR UPDATE`` and Python's sqlite3 starts the write transaction only at the UPDATE, so two
    workers can both claim the same trial: measured with three processes popping one queued
    trial at once, 4 of 8 rounds handed it to two or three of them. The busy timeout prevents
    "database is locked" errors, not this race.
    """

    if is_sqlite(resolve_url(url)):
        raise SpecError(
            "--parallel needs a storage that serves concurrent writers safely, and SQLite does "
            "not (it ignores the row locks Optuna uses to hand a queued trial to one worker, "
            "so two workers can run the same trial). Use PostgreSQL, e.g. --storage "
            "postgresql+psycopg2://USER:PASSWORD@HOST/DB (see docs/guide/scale-out.md)",
            key="--storage",
        )


def worker_seed(seed: int | None, index: int) -> int | None:
    """Worker ``index``'s sampler seed: distinct per worker (the same seed would have every
    worker propose the same configs), and within the range ``--seed`` accepts (0 .. 2**32 - 1),
    so a run given the largest seed does not start workers that refuse theirs."""
    return None if seed is None else (seed + index) % 2**32


def worker_argv(
    spec_path: Path,
    *,
    trials: int,
    storage_url: str,
    study_name: str,
    env: dict[str, str],
    seed: int | None = None,
    artifact_dir: str | None = None,
) -> list[str]:
    """The argv of one worker: an ordinary ``autotune run`` (an argv list, never a shell)."""
    argv = [
        sys.executable,
        "-m",
        "autotune",
        "run",
        "--spec",
        str(spec_path),
        "--trials",
        str(trials),
        "--storage",
        storage_url,
        "--study",
        study_name,
        "--worker-env",
        json.dumps(env, sort_keys=True),
    ]
    if seed is not None:
        argv += ["--seed", str(seed)]
    if artifact_dir is not None:
        argv += ["--artifact-dir", artifact_dir]
    return argv


@dataclass
class _Worker:
    index: int
    devices: WorkerDevices
    trials: int
    proc: subprocess.Popen[str]
    log_path: Path
    thread: threading.Thread | None = None


#: how the run talks to its user: ``say(level, text)``, level one of "line" (a worker's own
#: output, shown as is), "info", "notice", "warning", "error"; the CLI renders it
Say = Callable[[str, str], None]


def print_plain(level: str, text: str) -> None:
    """The default ``say`` for callers without a terminal of their own: the text on stderr."""
    print(text, file=sys.stderr, flush=True)


def run_parallel(
    spec_path: Path, options: Any, *, workers: int, plan: DevicePlanSpec, say: Say = print_plain
) -> int:
    """Run ``options.trials`` trials of one study with ``workers`` worker processes.

    The trials are split exactly across the workers (each ``autotune run`` counts the trials it
    launched, the baseline included). The study is created here, before any worker starts, so
    exactly one baseline is queued. Worker output is handed to ``say`` prefixed ``[wN]`` (tables
    left out) and kept whole in ``<artifacts>/workers/worker-N.log``. Ctrl-C (or SIGTERM) sends
    SIGINT to every worker, which stops its trial cleanly, records it and exits 130.

    Returns 0 when every worker succeeded, 130 when interrupted, else a worker's exit code
    (2 or 3 when one had that, otherwise 1).
    """

    spec = load_spec(spec_path)
    engine = build_engine(spec)
    check_device_targets(spec, engine)
    url = storage_url_for(spec, options.storage_url)
    check_storage(url)
    # a worker's argv is visible to every user of the machine (ps): the storage URL goes there
    # without its password, which the worker's database client reads from its env instead (a
    # secret no env var carries is refused here, before the study is opened or anything made)
    worker_url, password_env = password_off_argv(url, who="a --parallel worker")
    count = min(workers, options.trials)
    devices = build_plan(plan, count, bind_cpus=engine.cpu_binding_env)
    shares = split_trials(options.trials, count)
    preflight(spec, engine, validate=getattr(options, "validate", True))
    roofline_record(spec)  # each worker stores it; a spec whose roofline fails stops here
    study, _created = open_study(
        spec,
        url,
        study_name=options.study_name,
        seed=options.seed,
        sampler_name=options.sampler,
        allow_workload_change=options.allow_workload_change,
    )
    changed = check_workload(study, spec, allow_change=options.allow_workload_change)
    if changed:
        say("notice", f"workload: {changed}")
    if options.warm_start:
        for line in warm_start_from(study, spec, url, options.warm_start):
            say("info", line)
    name = study.study_name
    study.set_user_attr(
        names.PARALLEL_CONTENTION,
        {
            "message": CONTENTION_WARNING,
            "workers": count,
            "devices": [d.env for d in devices],
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        },
    )
    say("warning", f"warning: {CONTENTION_WARNING}")
    if count < workers:
        say("notice", f"only {count} workers: --trials {options.trials} < --parallel {workers}")
    log_dir = artifact_dir_for(url, name, options.artifact_dir) / "workers"
    log_dir.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="160")
    child_env.update(password_env)

    running: list[_Worker] = []
    interrupted = False
    previous_term = _install_sigterm()
    try:
        try:
            for device, share in zip(devices, shares, strict=True):
                seed = worker_seed(options.seed, device.index)
                argv = worker_argv(
                    spec_path,
                    trials=share,
                    storage_url=worker_url,
                    study_name=name,
                    env=device.env,
                    seed=seed,
                    artifact_dir=options.artifact_dir,
                )
                say("line", f"[w{device.index}] {share} trials, {device.describe()}")
                log_path = log_dir / f"worker-{device.index}.log"
                # Own process group: a terminal's Ctrl-C reaches this process only, which
                # forwards exactly one SIGINT per worker.
                proc = subprocess.Popen(
                    argv,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    errors="replace",
                    env=child_env,
                    process_group=0,
                )
                worker = _Worker(device.index, device, share, proc, log_path)
                worker.thread = threading.Thread(target=_pump, args=(worker, say), daemon=True)
                worker.thread.start()
                running.append(worker)
            for worker in running:
                worker.proc.wait()
        except KeyboardInterrupt:
            interrupted = True
            say("notice", "interrupted: asking every worker to stop its trial cleanly (SIGINT)")
            _stop_workers(running, say)
    finally:
        _restore_sigterm(previous_term)
        for worker in running:
            if worker.proc.poll() is None:  # only after an error in this function
                _signal(worker.proc, signal.SIGKILL)
                worker.proc.wait()
            if worker.thread is not None:
                worker.thread.join(timeout=10)
    codes = {w.index: w.proc.returncode for w in running}
    for worker in running:
        say("line", f"[w{worker.index}] exit {worker.proc.returncode} (log: {worker.log_path})")
    if interrupted or 130 in codes.values():
        return 130
    failed = [c for c in codes.values() if c != 0]
    if not failed:
        return 0
    return next((c for c in failed if c in (2, 3)), 1)


def check_device_targets(spec: StudySpec, engine: Engine) -> None:
    """A space may not tune a variable a worker sets to its device set (``CUDA_VISIBLE_DEVICES``,
    the engine's CPU binding): the worker's value replaces the tuned one in every launch, so
    each trial would run on the worker's devices under the tuned label (it was a console
    warning, easily missed). Bad input whatever this machine has: the variables a worker may
    set are refused, not only those this machine's plan sets, so one spec gets one verdict."""
    worker_vars = {GPU_ENV, *engine.cpu_binding_env("0")}
    for param in spec.space.parameters:
        target = param.target
        if target.kind == "env" and target.name in worker_vars:
            raise SpecError(
                f"{target.name} cannot be tuned with --parallel: each worker sets it to its own "
                "devices, replacing the tuned value in every launch; tune it in a run without "
                "--parallel, or drop the parameter",
                file=str(spec.space.path),
                key=f"parameters.{param.name}.target.env",
            )


def _pump(worker: _Worker, say: Say) -> None:
    """Copy a worker's output to its log file, and all but the tables to ``say``."""
    assert worker.proc.stdout is not None
    with open(worker.log_path, "a", encoding="utf-8") as log:
        stream: IO[str] = worker.proc.stdout
        for line in stream:
            log.write(line)
            log.flush()
            text = line.rstrip("\n")
            stripped = text.strip()
            if not stripped or stripped[0] in _TABLE_CHARS:
                continue
            say("line", f"[w{worker.index}] {text}")


def _stop_workers(workers: list[_Worker], say: Say) -> None:
    for worker in workers:
        _signal(worker.proc, signal.SIGINT)
    deadline = time.monotonic() + INTERRUPT_GRACE_S
    while any(w.proc.poll() is None for w in workers):
        try:
            if time.monotonic() > deadline:
                say("error", f"workers still running after {INTERRUPT_GRACE_S:.0f} s: SIGTERM")
                for worker in workers:
                    _signal(worker.proc, signal.SIGTERM)
                for worker in workers:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        worker.proc.wait(timeout=15)
                for worker in workers:
                    _signal(worker.proc, signal.SIGKILL)
                break
            time.sleep(0.2)
        except KeyboardInterrupt:  # another Ctrl-C: forward it again
            for worker in workers:
                _signal(worker.proc, signal.SIGINT)
    for worker in workers:
        worker.proc.wait()


def _signal(proc: subprocess.Popen[str], sig: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)


def _install_sigterm() -> Any:
    """SIGTERM to the parent is handled like Ctrl-C (workers stop cleanly)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, _frame: Any) -> None:
        raise terminated_by(signum)  # as Ctrl-C, but the record names SIGTERM

    return signal.signal(signal.SIGTERM, handler)


def _restore_sigterm(previous: Any) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)
