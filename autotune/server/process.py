"""The server lifecycle: start one server, prove it answers, stop it, prove it is gone.

``ServerProcess`` is a context manager. On entry it starts the engine's argv (never a shell
string) in a new session, so the whole process tree (vLLM's API server, engine core, workers)
shares one process group, bound to 127.0.0.1, its output captured to a per-trial log file. On
exit it sends SIGTERM to the group, SIGKILL after a grace period, and confirms that no process
of the group, nor any descendant seen while it ran, survives.

"Seen while it ran" is literal: a background thread samples the server's descendants every
``_proc.TRACK_INTERVAL_S`` (and again at readiness and at stop), and autotune is the child
subreaper of what it starts, so a helper that calls ``setsid`` and double-forks (leaving the
process group and, re-parented, the server's tree) is still remembered as ``pid -> create
time`` and killed at stop. ``on_record`` hands each new sighting to the caller, so the trial
stores them at once and a later run can stop them after a ``kill -9`` of autotune itself.
cgroups are not used: they are not writable in most containers this runs in, and the record
says which method stopped the server (``kill_method``).

Each launch also gets a temp folder of its own (``TMPDIR``, under autotune's temp dir), removed
once the tree is proved gone: servers leave files there that nothing removes when they are
stopped (vLLM's ZMQ IPC sockets and ``vllm_dist_*`` folders, a few per start), and a study of
hundreds of launches otherwise leaves hundreds of them in ``/tmp``. A spec whose env sets
``TMPDIR`` keeps its own, untouched.

Ready means more than ``/health``: a server can report healthy and fail its first request (vLLM's
CPU attention rejects some head sizes only then), so readiness also requires a one-token
completion to succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from autotune import _proc
from autotune.client.send import get_whole
from autotune.client.stream import NotJsonObject, parse_json_object
from autotune.engines.base import LaunchConfig, find_root_cause
from autotune.errors import CandidateError, InfrastructureError, excerpt
from autotune.server import log as server_log
from autotune.server import oom
from autotune.server.log import LOG_TEXT_PART_BYTES

#: how often /health is polled while waiting; readiness is detected within this much time
HEALTH_POLL_S = 0.05
#: seconds between SIGTERM and SIGKILL when a server is stopped; env AUTOTUNE_STOP_GRACE_S
STOP_GRACE_S = 10.0
#: (llama-server says only that it could not bind; on the loopback address autotune gives it, on
#: a port just found free, another process took the port)
_PORT_TAKEN = ("address already in use", "errno 98", "couldn't bind http server socket")
_DISK_FULL = ("no space left on device",)
#: how much of the end of a server log is searched for the reason and the root cause: enough
#: to reach past what a dying engine prints after its error (vLLM: three processes' tracebacks,
#: then over a hundred lines of Triton's leak report at exit)
FAILURE_LOG_BYTES = 128 * 1024
#: how a launch's own temp folder is named (``autotune cleanup`` removes only folders named so)
TMPDIR_PREFIX = "autotune-srv-"


@dataclass(frozen=True)
class ServerStart:
    """What the lifecycle learned while starting: kept in the trial record."""

    pid: int
    pgid: int
    startup_s: float
    log_path: str


class ServerProcess:
    """One engine server, alive for the ``with`` block.

    Args:
        launch: argv, env additions and address, from the engine module.
        log_path: where the server's stdout and stderr go.
        startup_timeout_s: deadline for readiness.
        classify: maps a log tail to a failure reason (the engine's knowledge).
        root_cause: finds the engine's own error line in the log (``Engine.root_cause``);
            by default the engine's whose ``classify_failure`` was given, else the generic one.
        on_spawn: called with (pid, pgid) right after the process starts, so a crash of
            autotune itself can later find and stop this server (see study.cleanup).
        on_record: called with ``{"descendants": [[pid, create_time], ...]}`` whenever a new
            descendant is seen (from the tracking thread), and at stop with the teardown record
            (``descendants``, ``survivors``, ``kill_method``, ``stopped_cleanly``).
    """

    def __init__(
        self,
        launch: LaunchConfig,
        log_path: Path,
        *,
        startup_timeout_s: float,
        classify: Callable[[str], str | None] | None = None,
        on_spawn: Callable[[int, int], None] | None = None,
        stop_grace_s: float | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
        root_cause: Callable[[str], str | None] | None = None,
    ) -> None:
        self.launch = launch
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.classify = classify or (lambda _tail: None)
        self.root_cause = root_cause or _engine_root_cause(classify)
        self._memory: oom.MemoryWatch | None = None
        self._oom_start: oom.OomBaseline | None = None
        self.on_spawn = on_spawn
        self.stop_grace_s = stop_grace_s if stop_grace_s is not None else _stop_grace_s()
        self._popen: subprocess.Popen[bytes] | None = None
        self.on_record = on_record
        self._tracker: _proc.DescendantTracker | None = None
        #: this launch's value of ``_proc.MARKER_ENV`` (set at start)
        self.marker: str | None = None
        #: this launch's own temp folder (None: the spec set ``TMPDIR``, or not started)
        self.tmpdir: str | None = None
        self._started_at = 0.0
        #: what the loopback-only check at readiness found, or why it could not run
        self.listen_check: str | None = None
        #: the log's size when the server first answered (None: not ready yet)
        self._ready_log_at: int | None = None
        self.stopped_cleanly: bool | None = None
        #: what teardown found: descendants seen, survivors, how they were stopped
        self.stop_record: dict[str, Any] = {}

    # --- context manager -------------------------------------------------------------------

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- start -----------------------------------------------------------------------------

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.launch.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # inherited by everything the server ever starts: found even after escaping its tree
        self.marker = f"{os.getpid()}-{uuid.uuid4().hex}"
        env[_proc.MARKER_ENV] = self.marker
        try:
            log = open(self.log_path, "wb")  # noqa: SIM115 - the child owns it until it exits
        except OSError as exc:
            raise InfrastructureError(
                "disk_full" if exc.errno == 28 else "storage_unreachable",
                f"cannot write server log {self.log_path}: {exc}",
            ) from exc
        if "TMPDIR" not in self.launch.env:
            try:
                self.tmpdir = tempfile.mkdtemp(prefix=TMPDIR_PREFIX)
            except OSError as exc:
                log.close()
                raise InfrastructureError(
                    "disk_full" if exc.errno == 28 else "storage_unreachable",
                    f"cannot make the server's temp folder in {tempfile.gettempdir()}: {exc}",
                ) from exc
            env["TMPDIR"] = self.tmpdir
        _proc.become_subreaper()
        try:
            self._popen = subprocess.Popen(
                list(self.launch.argv),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError as exc:
            self._remove_tmpdir()
            raise CandidateError(
                "startup_failed", f"engine command not found: {self.launch.argv[0]}"
            ) from exc
        except BaseException:
            self._remove_tmpdir()
            raise
        finally:
            log.close()
        self._started_at = time.monotonic()
        self._oom_start = oom.baseline()  # the OOM rule's evidence needs a "before"
        self._memory = oom.MemoryWatch(self._popen.pid).start()
        if self.on_spawn is not None:
            self.on_spawn(self._popen.pid, self.pgid)
        if self.on_record is not None:
            with contextlib.suppress(Exception):  # recorded for `autotune cleanup`
                self.on_record(
                    {"env_marker": self.marker, "tmpdir": self.tmpdir, "descendants": []}
                )
        self._tracker = _proc.DescendantTracker(self._popen.pid, on_new=self._record_descendants)
        self._tracker.start()

    @property
    def pid(self) -> int:
        assert self._popen is not None, "server not started"
        return self._popen.pid

    @property
    def pgid(self) -> int:
        # start_new_session makes the child the leader of its own group: pgid == pid.
        return self.pid

    def exit_code(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def alive(self) -> bool:
        return self.exit_code() is None

    def log_text(self, part_bytes: int = LOG_TEXT_PART_BYTES) -> str:
        """The log (secrets redacted) for what reads it whole: the start's parts, patches
        verified, the CUDA-graph stats; its first and last ``part_bytes`` at most."""
        return self.launch.redact(server_log.bounded(self.log_path, part_bytes))

    def log_tail(self, lines: int = 60) -> str:
        text = self.launch.redact(server_log.last_bytes(self.log_path, 64 * 1024))
        return "\n".join(text.splitlines()[-lines:])

    def log_window(self, max_bytes: int = FAILURE_LOG_BYTES) -> str:
        """The end of the log (whole lines, API key redacted): where a failure explains itself."""
        return self.launch.redact(server_log.last_bytes(self.log_path, max_bytes, whole_lines=True))

    def redact_log(self) -> None:
        """Rewrite the log file with the launch's secrets (the per-trial API key, secret env
        values) replaced by ``***``: the file is stored and uploaded as the trial's artifact,
        and a server may print its key. Called at stop, when nothing writes to it any more."""
        server_log.redact_file(self.log_path, [s.encode() for s in self.launch.secret_values()])

    def _remember_children(self) -> None:
        if self._tracker is not None:
            self._tracker.sample()

    def descendants_seen(self) -> dict[int, float | None]:
        """Every process seen below the server so far, ``pid -> create_time``."""
        return self._tracker.snapshot() if self._tracker is not None else {}

    def _record_descendants(self, seen: dict[int, float | None]) -> None:
        if self.on_record is not None:
            self.on_record({"descendants": _pairs(seen)})

    def failure(self, default_reason: str, detail: str) -> CandidateError | InfrastructureError:
        """Turn 'the server is gone or broken' into the most specific recorded reason.

        The detail gets the engine's root-cause line from the log, and ``evidence.root_cause``
        keeps it. ``oom`` is named only with positive evidence: an out-of-memory error message
        or exception of the engine in the log (never an INFO or WARNING line that happens to say
        "out of memory": ``engines.base.is_error_message``), or (see :mod:`autotune.server.oom`)
        the kernel's OOM record, the memory cgroup's OOM-kill count, or memory near the limit.
        A signal exit (SIGKILL, SIGSEGV, ...) without any of them keeps ``default_reason``
        (``server_crashed`` during a trial), and the detail names the signal.
        """
        tail = self.log_tail()
        lowered = tail.lower()
        window = self.log_window()
        code = self.exit_code()
        evidence: dict = {"log_tail": tail, "exit_code": code}
        if code is not None and code < 0:
            evidence["signal"] = -code
            evidence["signal_name"] = _signal_name(-code)
        cause = _safely(self.root_cause, window)
        if cause:
            evidence["root_cause"] = cause
        # a server that answered on its port lost no race for it, whatever a startup warning
        # said: a crash after readiness blamed on the machine was retried, never recorded
        if self._ready_log_at is None and any(m in lowered for m in _PORT_TAKEN):
            return InfrastructureError("port_taken", _join(detail, cause), evidence=evidence)
        since_ready = lowered if self._ready_log_at is None else self._log_since_ready().lower()
        if any(m in since_ready for m in _DISK_FULL):
            return InfrastructureError("disk_full", _join(detail, cause), evidence=evidence)
        reason = self.classify(window)
        notes: list[str] = []
        if reason == "oom":
            evidence["oom_evidence"] = {"log": cause or "an out-of-memory message in the log"}
        elif reason is None and code is not None and default_reason != "startup_timeout":
            self._remember_children()
            pids = set(self.descendants_seen()) | {self.pid}
            if self._memory is not None:
                pids |= self._memory.pids
            found = oom.gather(pids, self._oom_start, self._memory, sigkill=code == -9)
            if found:
                reason = "oom"
                evidence["oom_evidence"] = found
                killed = "killed by SIGKILL" if code == -9 else f"exited with code {code}"
                notes.append(f"{killed}; out of memory: {oom.describe(found)}")
            elif code < 0:
                notes.append(f"killed by {_signal_name(-code)} (no evidence of OOM)")
        if cause:
            notes.append(cause)
        return CandidateError(reason or default_reason, _join(detail, *notes), evidence=evidence)

    async def wait_ready(self, client: httpx.AsyncClient) -> ServerStart:
        """Poll ``/health`` until 200, then require a one-token completion to succeed."""
        deadline = self._started_at + self.startup_timeout_s
        healthy = False
        last_error = ""
        while time.monotonic() < deadline:
            self._remember_children()
            if not self.alive():
                raise self.failure(
                    "startup_failed", f"server exited with code {self.exit_code()} before ready"
                )
            try:
                if not healthy:
                    response = await get_whole(client, self.launch.health_path, total_s=5.0)
                    healthy = response.status_code == 200
                    last_error = f"/health answered {response.status_code}"
                if healthy:
                    await self._first_completion(client)
                    # one more look now that it answers: a helper forked between this poll's
                    # first look and readiness is recorded at readiness, not a tick later
                    self._remember_children()
                    self._check_loopback_only()
                    self._ready_log_at = server_log.size(self.log_path)
                    return ServerStart(
                        pid=self.pid,
                        pgid=self.pgid,
                        startup_s=time.monotonic() - self._started_at,
                        log_path=str(self.log_path),
                    )
            except (httpx.TransportError, TimeoutError, ValueError) as exc:
                last_error = f"{type(exc).__name__}"
            await asyncio.sleep(HEALTH_POLL_S)
        if not self.alive():
            raise self.failure("startup_failed", f"server exited with code {self.exit_code()}")
        raise self.failure(
            "startup_timeout",
            f"not ready within {self.startup_timeout_s:.0f} s (last: {last_error or 'no answer'})",
        )

    def _check_loopback_only(self) -> None:
        """The server answers on its port: on 127.0.0.1 alone, or it is refused. A server may
        ignore the address it was given (a command template's program that binds every
        interface whatever ``--host`` says) and would serve the network while it is tuned."""
        addresses = _proc.listening_addresses(self.launch.port)
        exposed = [a for a in addresses or () if not _loopback(a)]
        said = (
            "not run: the socket table could not be read"
            if addresses is None
            else f"listens on {', '.join(addresses) or 'no address seen'}"
        )
        self.listen_check = said  # a check that could not run says so, in the trial's record
        if self.on_record is not None:
            self.on_record({"listen_check": said})
        if exposed:
            raise self.failure(
                "startup_failed",
                f"the server listens on {', '.join(exposed)} port {self.launch.port}, not only "
                f"on {self.launch.host}: autotune's servers listen on 127.0.0.1 alone (does "
                "the program take the address autotune gives it, {host}?)",
            )

    def _log_since_ready(self, max_bytes: int = 64 * 1024) -> str:
        """The log written after readiness (its last ``max_bytes`` at most)."""
        return server_log.since(self.log_path, self._ready_log_at or 0, max_bytes)

    async def _first_completion(self, client: httpx.AsyncClient) -> None:
        body = {
            "model": self.launch.served_model,
            "prompt": "a",
            "max_tokens": 1,
            "temperature": 0.0,
        }
        # The client's own timeout is the workload's request deadline: a server that accepts
        # the request and never answers is a hang after that long, not after a fixed minute.
        # bounded in all too: an answer that trickles a byte within each read's timeout
        # would never end it
        total_s = max(self._started_at + self.startup_timeout_s - time.monotonic(), 1.0)
        try:
            async with asyncio.timeout(total_s):
                response = await client.post("/v1/completions", json=body)
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise self.failure(
                "hang",
                f"healthy, but the first one-token completion got no "
                f"answer within {_read_timeout(client)}",
            ) from exc
        if response.status_code != 200:
            if not self.alive():
                raise self.failure("startup_failed", "server died on its first completion")
            hint = ""
            if response.status_code in (404, 405):
                hint = (
                    " (no POST /v1/completions here: autotune's gate and client use the "
                    "OpenAI completions API)"
                )
            elif response.status_code in (401, 403):
                hint = (
                    " (the server refused autotune's per-trial API key: the command engine "
                    'hands it over as AUTOTUNE_API_KEY, or as engine.env: {VAR: "{api_key}"})'
                )
            raise self.failure(
                "startup_failed",
                f"healthy, but the first completion failed with "
                f"{response.status_code}: {excerpt(response.text, 300)}{hint}",
            )
        try:
            answer = parse_json_object(
                response.content,
                "healthy, but the first completion is not an OpenAI completions answer",
            )
        except NotJsonObject as exc:
            raise self.failure("startup_failed", str(exc)) from None
        choices = answer.get("choices") or []
        if not choices:
            # the body is the evidence: a 200 that carries {"error": ...} says why
            raise self.failure(
                "startup_failed",
                f"the first completion returned no choices: {excerpt(response.text, 300)}",
            )

    # --- stop ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the whole group and prove it gone; a survivor is an infrastructure fault.
        Ctrl-C and SIGTERM wait until it is done (``_proc.signals_held``): one that cut the
        grace period short left the server running, its trial recorded as ended."""
        if self._popen is None:
            return
        with _proc.signals_held():
            self._stop()

    def _stop(self) -> None:
        assert self._popen is not None
        tracker = self._tracker
        if tracker is not None:
            tracker.stop()  # no more background samples: stop_group asks for each look

        def discover() -> dict[int, float | None]:
            # still looking while the server stops: a helper may fork during the grace period
            # (never the server itself: its exit status is Popen's, which a reap would steal)
            marked = _proc.marked_processes(self.marker)
            marked.pop(self.pid, None)
            if tracker is None:
                return marked
            tracker.sample()
            tracker.add(marked)
            return tracker.snapshot()

        killed: list[dict[str, Any]] = []
        survivors = _proc.stop_group(
            self.pgid,
            tracked=discover(),
            grace_s=self.stop_grace_s,
            discover=discover,
            killed=killed,
        )
        try:
            self._popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            survivors.append(self._popen.pid)
        # the proof: nothing of the group, of what was ever seen, or carrying the marker lives
        seen = discover()
        survivors = sorted(set(survivors) | set(_proc.group_members(None, tracked=seen)))
        self.stopped_cleanly = not survivors
        if self.stopped_cleanly:  # a survivor may still use it: `autotune cleanup` removes it
            self._remove_tmpdir()
        self.redact_log()
        self.stop_record = {
            "descendants": _pairs(seen),
            "survivors": survivors,
            "killed": killed,
            "kill_method": "process_group+tracked_pids",
            "stopped_cleanly": self.stopped_cleanly,
        }
        if self.on_record is not None:
            with contextlib.suppress(Exception):  # the record must not hide a survivor
                self.on_record(dict(self.stop_record))
        if survivors:
            raise InfrastructureError(
                "orphan_process",
                f"processes {survivors} survived SIGKILL",
                evidence={"pids": survivors},
            )

    def _remove_tmpdir(self) -> None:
        if self.tmpdir is not None:
            remove_tmpdir(self.tmpdir)


def remove_tmpdir(path: str) -> bool:
    """Remove a launch's temp folder; only one that autotune made (named ``TMPDIR_PREFIX...``),
    so a damaged record can never point this at anything else. True if it is gone."""
    folder = Path(path)
    if not folder.name.startswith(TMPDIR_PREFIX) or folder.is_symlink():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


def _loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _pairs(seen: dict[int, float | None]) -> list[list[float | int | None]]:
    return [[pid, started] for pid, started in sorted(seen.items())]


def _engine_root_cause(
    classify: Callable[[str], str | None] | None,
) -> Callable[[str], str | None]:
    """The root-cause finder of the engine whose bound ``classify_failure`` was handed over
    (the study loop passes only that), else the engine-neutral one."""
    method = getattr(getattr(classify, "__self__", None), "root_cause", None)
    return method if callable(method) else find_root_cause


def _safely(find: Callable[[str], str | None], text: str) -> str | None:
    """A root cause, never an exception: a failure must be recorded whatever the log holds."""
    try:
        return find(text)
    except Exception:  # noqa: BLE001 - the failure being recorded matters more
        return None


def _join(detail: str, *notes: str | None) -> str:
    """``detail: note; note``, skipping notes the detail already says."""
    extra = [n for n in notes if n and n not in detail]
    return f"{detail}: {'; '.join(extra)}" if extra else detail


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _stop_grace_s() -> float:
    try:
        return float(os.environ.get("AUTOTUNE_STOP_GRACE_S", STOP_GRACE_S))
    except ValueError:
        return STOP_GRACE_S


def _read_timeout(client: httpx.AsyncClient) -> str:
    read = client.timeout.read
    return "no deadline" if read is None else f"{read:g} s"
