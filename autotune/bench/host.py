"""The host is part of the evidence: what else used the machine during a measurement.

``HostSampler`` samples, every ~0.5 s in a background thread, the CPU time taken by
processes OUTSIDE a given set of pids (the server's process tree and the client),
steal time from /proc/stat, the 1-minute load average, and (only where ``nvidia-smi``
exists) other processes on the trial's GPUs, SM clocks vs max, throttle reasons and the
PCIe link. ``HostReport.to_dict()`` is what a trial stores; a figure never measured is
absent (None), never 0.

Thresholds (why these):
- ``OTHERS_CPU_SHARE_LIMIT = 0.25``: others took more than 25 % of the machine's total
  CPU (all cores) during the measurement. On a 2-core machine that is half a core busy
  the whole time -- a background compile or test run, not a shell or an idle daemon
  (those stay well below 5 %). Expressed as a share of the machine, so it means the same
  fraction of capacity on 2 cores as on 64.
- ``STEAL_SHARE_LIMIT = 0.05``: the hypervisor took over 5 % of CPU time; healthy VMs
  show < 1 %.
- any other compute process or an active (non-idle) throttle reason on a trial GPU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

OTHERS_CPU_SHARE_LIMIT = 0.25
STEAL_SHARE_LIMIT = 0.05
NOISY_ROUNDS_SHARE = 0.5
SAMPLE_INTERVAL_S = 0.5


_IDLE_THROTTLE = {"0x0000000000000000", "0x0000000000000001"}  # none / GPU idle


@dataclass(frozen=True)
class HostReport:
    noisy: bool
    reasons: tuple[str, ...]
    load_avg: float | None
    cpus: int | None
    others_cpu_share: float | None
    steal_share: float | None
    gpu: dict[str, Any] = field(default_factory=dict)
    samples: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "noisy": self.noisy,
            "reasons": list(self.reasons),
            "cpus": self.cpus,
            "samples": self.samples,
            "gpu": self.gpu,
        }
        for key in ("load_avg", "others_cpu_share", "steal_share"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


def _read_steal() -> tuple[int, int] | None:
    """(steal, total) jiffies from /proc/stat's cpu line; None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            parts = f.readline().split()
    except OSError:
        return None
    if not parts or parts[0] != "cpu" or len(parts) < 9:
        return None
    values = [int(v) for v in parts[1:]]
    # guest/guest_nice (fields 9, 10) are already counted in user/nice
    return values[7], sum(values[:8])


def _tree(pids: set[int]) -> set[int]:
    out = set(pids)
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    return out


class _CpuCounter:
    """CPU seconds taken outside the excluded tree: machine busy time minus the tree's.

    Machine-wide busy time (psutil.cpu_times: user+nice+system+irq+softirq) also counts
    processes that started and ended between two samples, which a per-process walk misses.
    """

    def __init__(self, exclude: Callable[[], set[int]]) -> None:
        self._exclude = exclude
        self._last: dict[tuple[int, float], float] = {}
        self._busy0: float | None = None
        self._busy = 0.0
        self._tree_s = 0.0

    @property
    def others_s(self) -> float:
        return max(0.0, self._busy - self._tree_s)

    def sample(self) -> None:
        t = psutil.cpu_times()
        busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        seen: dict[tuple[int, float], float] = {}
        for pid in _tree(set(self._exclude())) | {os.getpid()}:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                times = proc.cpu_times()
                key = (pid, proc.create_time())
                used = times.user + times.system + times.children_user + times.children_system
                seen[key] = used
                if self._busy0 is not None:
                    self._tree_s += max(0.0, used - self._last.get(key, 0.0))
        if self._busy0 is None:
            self._busy0 = busy
        self._busy = busy - self._busy0
        self._last = seen


def _smi(args: list[str]) -> list[list[str]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, *args, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in res.stdout.splitlines() if line]


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


_GPU_FIELDS = (
    "index,uuid,clocks.sm,clocks.max.sm,clocks_throttle_reasons.active,"
    "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
)


def gpu_snapshot(gpus: Sequence[int | str] | None, exclude: set[int]) -> dict[str, Any]:
    """One look at the trial's GPUs (by index or UUID; None: every GPU of the machine);
    ``{"available": False, "why": ...}`` where none."""
    if gpus is not None and not gpus:
        return {"available": False, "why": "no GPUs named for this trial"}
    named = None if gpus is None else {str(g) for g in gpus}
    rows = _smi([f"--query-gpu={_GPU_FIELDS}"])
    if rows is None:
        return {"available": False, "why": "nvidia-smi not found or failed"}
    apps = _smi(["--query-compute-apps=gpu_uuid,pid"]) or []
    out: dict[str, Any] = {"available": True, "devices": {}}
    for row in rows:
        if len(row) < 9 or not row[0].isdigit():
            continue
        if named is not None and row[0] not in named and row[1] not in named:
            continue
        others = sorted(
            int(p)
            for u, p in (a[:2] for a in apps if len(a) >= 2)
            if u == row[1] and p.isdigit() and int(p) not in exclude
        )
        out["devices"][row[0]] = {
            "sm_clock": _num(row[2]),
            "sm_clock_max": _num(row[3]),
            "throttle": row[4],
            "pcie_gen": _num(row[5]),
            "pcie_gen_max": _num(row[6]),
            "pcie_width": _num(row[7]),
            "pcie_width_max": _num(row[8]),
            "other_pids": others,
        }
    return out


def _gpu_reasons(snaps: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    if not snaps or not snaps[-1].get("available"):
        return (snaps[-1] if snaps else {"available": False, "why": "not sampled"}), []
    reasons: list[str] = []
    merged: dict[str, Any] = {"available": True, "devices": {}}
    for snap in snaps:
        for idx, dev in snap.get("devices", {}).items():
            agg = merged["devices"].setdefault(
                idx, {"other_pids": set(), "throttle": set(), "sm_clock_min": None}
            )
            agg["other_pids"].update(dev["other_pids"])
            if dev["throttle"] not in _IDLE_THROTTLE:
                agg["throttle"].add(dev["throttle"])
            if dev["sm_clock"] is not None:
                low = agg["sm_clock_min"]
                agg["sm_clock_min"] = dev["sm_clock"] if low is None else min(low, dev["sm_clock"])
            for k in ("sm_clock_max", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"):
                agg[k] = dev[k]
    for idx, agg in merged["devices"].items():
        agg["other_pids"] = sorted(agg["other_pids"])
        agg["throttle"] = sorted(agg["throttle"])
        if agg["other_pids"]:
            reasons.append(f"GPU {idx}: other processes {agg['other_pids']}")
        if agg["throttle"]:
            reasons.append(f"GPU {idx}: throttle reasons {agg['throttle']}")
        if (
            agg["pcie_width"]
            and agg["pcie_width_max"]
            and agg["pcie_width"] < agg["pcie_width_max"]
        ):
            reasons.append(f"GPU {idx}: PCIe x{agg['pcie_width']:g} of x{agg['pcie_width_max']:g}")
    return merged, reasons


class HostSampler:
    """``with HostSampler(lambda: {server_pid}).measure() as host: ...; host.report``."""

    def __init__(
        self,
        exclude_pids: Callable[[], set[int]] | set[int] | frozenset[int],
        gpus: Sequence[int | str] | None = (),
        interval_s: float = SAMPLE_INTERVAL_S,
    ) -> None:
        if callable(exclude_pids):
            self._exclude: Callable[[], set[int]] = exclude_pids
        else:
            fixed = set(exclude_pids)
            self._exclude = lambda: fixed
        #: the trial's GPUs (indices or UUIDs); None: every GPU the machine has
        self._gpus = None if gpus is None else tuple(gpus)
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.report: HostReport | None = None

    def _run(self, cpu: _CpuCounter, snaps: list[dict[str, Any]], count: list[int]) -> None:
        while not self._stop.wait(self._interval):
            self._sample(cpu, snaps, count)

    def _sample(self, cpu: _CpuCounter, snaps: list[dict[str, Any]], count: list[int]) -> None:
        cpu.sample()
        if self._gpus is None or self._gpus:
            snaps.append(gpu_snapshot(self._gpus, _tree(set(self._exclude()))))
        count[0] += 1

    def start(self) -> None:
        self._cpu = _CpuCounter(self._exclude)
        self._snaps: list[dict[str, Any]] = []
        self._count = [0]
        self._steal0 = _read_steal()
        self._t0 = time.monotonic()
        self._cpu.sample()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(self._cpu, self._snaps, self._count), daemon=True
        )
        self._thread.start()

    def stop(self) -> HostReport:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample(self._cpu, self._snaps, self._count)
        elapsed = time.monotonic() - self._t0
        cpus = psutil.cpu_count() or None
        others = self._cpu.others_s / (elapsed * cpus) if cpus and elapsed > 0 else None
        steal = None
        steal1 = _read_steal()
        if self._steal0 and steal1 and steal1[1] > self._steal0[1]:
            steal = (steal1[0] - self._steal0[0]) / (steal1[1] - self._steal0[1])
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = None
        reasons: list[str] = []
        if others is not None and others > OTHERS_CPU_SHARE_LIMIT:
            reasons.append(
                f"other processes took {others:.0%} of {cpus} CPUs "
                f"(limit {OTHERS_CPU_SHARE_LIMIT:.0%})"
            )
        if steal is not None and steal > STEAL_SHARE_LIMIT:
            reasons.append(f"steal time {steal:.1%} (limit {STEAL_SHARE_LIMIT:.0%})")
        if self._gpus is None or self._gpus:
            gpu, gpu_reasons = _gpu_reasons(self._snaps)
            reasons += gpu_reasons
        else:
            gpu = {"available": False, "why": "no GPUs named for this trial"}
        self.report = HostReport(
            noisy=bool(reasons),
            reasons=tuple(reasons),
            load_avg=round(load, 2) if load is not None else None,
            cpus=cpus,
            others_cpu_share=round(others, 4) if others is not None else None,
            steal_share=round(steal, 4) if steal is not None else None,
            gpu=gpu,
            samples=self._count[0],
        )
        return self.report

    @contextlib.contextmanager
    def measure(self) -> Iterator[HostSampler]:
        """Yields the sampler; ``.report`` is set when the block ends (also on error)."""
        self.start()
        try:
            yield self
        finally:
            self.stop()


def judge_interval_noise(
    reports: Sequence[dict[str, Any] | HostReport | None], share: float = NOISY_ROUNDS_SHARE
) -> str | None:
    """A sentence when host noise, not the configs, decides an interval; else None.

    Noisy when more than ``share`` of the rounds that carry a host report were noisy.
    Rounds without a report are not counted either way; none at all gives None.
    """
    dicts = [r.to_dict() if isinstance(r, HostReport) else r for r in reports if r is not None]
    if not dicts:
        return None
    noisy = [d for d in dicts if d.get("noisy")]
    if len(noisy) / len(dicts) <= share:
        return None
    first = next((d["reasons"][0] for d in noisy if d.get("reasons")), "")
    return (
        f"host noise, not the configs, decides this interval: {len(noisy)} of "
        f"{len(dicts)} rounds were noisy ({first})"
    )


def visible_gpus(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """The GPUs a launch may use, from its ``CUDA_VISIBLE_DEVICES`` (a parallel worker's
    device set, or the user's), as indices or UUIDs; None when it is unset: the server may use
    every GPU the machine has, so every one is sampled (an empty value names none)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return tuple(p.strip() for p in value.split(",") if p.strip())
