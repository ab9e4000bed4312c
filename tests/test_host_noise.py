"""The host sampler: another process burning CPU makes a measurement noisy, quiet does not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from autotune.bench.host import (
    OTHERS_CPU_SHARE_LIMIT,
    HostReport,
    HostSampler,
    judge_interval_noise,
)

BURN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def _trial_like(sampler: HostSampler, seconds: float = 2.0) -> HostReport:
    with sampler.measure() as host:
        time.sleep(seconds)  # the "benchmark": the client waits on the server
    assert host.report is not None
    return host.report


def test_cpu_burners_outside_the_tree_make_it_noisy() -> None:
    burners = [
        subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(psutil.cpu_count() or 1)
    ]
    try:
        # the burners are our children: exclude nothing, so the sampler excludes only
        # its own process (the client), not its tree
        report = _trial_like(HostSampler(set()))
    finally:
        for p in burners:
            p.kill()
            p.wait()
    d = report.to_dict()
    assert d["noisy"] is True
    assert d["others_cpu_share"] > OTHERS_CPU_SHARE_LIMIT
    assert any("other processes took" in r for r in d["reasons"])
    assert d["cpus"] == psutil.cpu_count()
    assert d["samples"] >= 2


def test_burners_inside_the_excluded_tree_do_not_count() -> None:
    burners = [
        subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(psutil.cpu_count() or 1)
    ]
    try:
        pids = {p.pid for p in burners}
        excluded = _trial_like(HostSampler(lambda: pids | {os.getpid()}))
    finally:
        for p in burners:
            p.kill()
            p.wait()
    # the burners are the "server": their CPU is not others' (the rest of the machine may be busy)
    assert excluded.others_cpu_share is not None
    assert excluded.others_cpu_share < 0.9


@pytest.fixture
def machine_of_this_test_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine as if nothing but this test's own process tree ran on it: machine-wide
    busy time is the tree's CPU time, and there is no steal. Why: "quiet" cannot be checked
    on a shared machine (CI keeps other work on it), and a test that skipped whenever the
    machine was busy checked nothing there. What is left to check is the sampler's own
    accounting: every CPU second of the trial (the client in this process, the server in its
    tree) counts as the tree's, so others' share is about zero."""
    import autotune.bench.host as host

    def tree_busy():
        me = psutil.Process(os.getpid())
        total = 0.0
        for proc in [me, *me.children(recursive=True)]:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
            if proc.pid == me.pid:
                total += t.children_user + t.children_system  # reaped children
        return total

    class Busy:  # psutil.cpu_times()'s fields that _CpuCounter reads
        def __init__(self) -> None:
            self.user, self.nice, self.system = tree_busy(), 0.0, 0.0

    monkeypatch.setattr(host.psutil, "cpu_times", lambda: Busy())
    monkeypatch.setattr(host, "_read_steal", lambda: None)


def test_quiet_machine_is_not_noisy(machine_of_this_test_only) -> None:
    report = _trial_like(HostSampler(lambda: {os.getpid()}))
    d = report.to_dict()
    assert d["noisy"] is False and d["reasons"] == []
    assert d["others_cpu_share"] is not None
    assert d["others_cpu_share"] <= OTHERS_CPU_SHARE_LIMIT


def test_no_gpus_named_is_absent_and_said_so() -> None:
    d = _trial_like(HostSampler(set(), gpus=()), seconds=0.1).to_dict()
    assert d["gpu"] == {"available": False, "why": "no GPUs named for this trial"}


def test_gpu_without_nvidia_smi_is_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("autotune.bench.host.shutil.which", lambda _name: None)
    d = _trial_like(HostSampler(set(), gpus=(0,)), seconds=0.1).to_dict()
    assert d["gpu"]["available"] is False
    assert "nvidia-smi" in d["gpu"]["why"]


def test_judge_interval_noise() -> None:
    quiet = {"noisy": False, "reasons": []}
    loud = {"noisy": True, "reasons": ["other processes took 80% of 2 CPUs (limit 25%)"]}
    assert judge_interval_noise([]) is None
    assert judge_interval_noise([None, None]) is None
    assert judge_interval_noise([quiet, quiet, loud]) is None
    verdict = judge_interval_noise([loud, loud, quiet])
    assert verdict is not None and "2 of 3" in verdict and "80%" in verdict


def test_gpu_other_process_throttle_and_pcie_are_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_smi(args: list[str]) -> list[list[str]]:
        if args[0].startswith("--query-gpu"):
            return [
                ["0", "GPU-a", "1200", "1980", "0x0000000000000004", "3", "4", "8", "16"],
                ["1", "GPU-b", "1980", "1980", "0x0000000000000000", "4", "4", "16", "16"],
            ]
        return [["GPU-a", "4242"], ["GPU-a", "7"], ["GPU-b", "99"]]

    monkeypatch.setattr("autotune.bench.host._smi", fake_smi)
    d = _trial_like(HostSampler({7}, gpus=(0,)), seconds=0.1).to_dict()
    assert d["noisy"] is True
    dev = d["gpu"]["devices"]["0"]
    assert set(d["gpu"]["devices"]) == {"0"}
    assert dev["other_pids"] == [4242]
    assert dev["sm_clock_min"] == 1200 and dev["sm_clock_max"] == 1980
    assert any("other processes [4242]" in r for r in d["reasons"])
    assert any("throttle" in r for r in d["reasons"])
    assert any("PCIe x8 of x16" in r for r in d["reasons"])
    quiet = _trial_like(HostSampler({7}, gpus=(1,)), seconds=0.1).to_dict()
    assert quiet["gpu"]["devices"]["1"]["other_pids"] == [99]


def _baseline_host(tmp_path, name: str) -> dict:
    """Run a study's baseline on the fake server; its stored ``host`` record."""
    from autotune import names
    from autotune.spec.load import load_spec
    from autotune.storage import load_study
    from autotune.study.loop import RunOptions, run_study
    from tests.builders import write_fake_spec

    space = "parameters:\n  n:\n    type: categorical\n    choices: [2, 8]\n    baseline: 8\n"
    space += "    target: {flag: --max-num-seqs}\n"
    spec = load_spec(write_fake_spec(tmp_path, space, name=name, args=("--decode-ms", "20")))
    summary = run_study(spec, RunOptions(trials=1, seed=0))
    study = load_study(summary.storage_url, summary.study_name)
    (trial,) = study.get_trials(deepcopy=False)
    return trial.user_attrs[names.HOST]


def test_a_trial_measured_beside_cpu_burners_is_recorded_noisy(tmp_path) -> None:
    """The trial's own record says the host was busy, with the evidence; the burners are not
    the server's tree, so their CPU counts as others'."""
    burners = [
        subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(psutil.cpu_count() or 1)
    ]
    try:
        host = _baseline_host(tmp_path, "burned")
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert host["noisy"] is True
    assert host["others_cpu_share"] > OTHERS_CPU_SHARE_LIMIT
    assert any("other processes took" in r for r in host["reasons"])


def test_the_same_trial_on_a_quiet_machine_is_not_noisy(tmp_path, machine_of_this_test_only):
    """The trial's own client and its server count as the trial's tree, never as others'."""
    host = _baseline_host(tmp_path, "quiet")
    assert host["noisy"] is False, host
    assert host["reasons"] == [] and host["others_cpu_share"] <= OTHERS_CPU_SHARE_LIMIT


def test_every_gpu_is_sampled_when_the_trial_names_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain run on a GPU machine sets no CUDA_VISIBLE_DEVICES: the server may use every GPU,
    so every GPU is sampled (before, none was, and a busy GPU went unflagged). A UUID names
    its device as an index does; an empty value names none."""
    from autotune.bench.host import visible_gpus

    def fake_smi(args: list[str]) -> list[list[str]]:
        if args[0].startswith("--query-gpu"):
            return [
                ["0", "GPU-a", "1980", "1980", "0x0000000000000000", "4", "4", "16", "16"],
                ["1", "GPU-b", "1980", "1980", "0x0000000000000000", "4", "4", "16", "16"],
            ]
        return [["GPU-b", "4242"]]

    monkeypatch.setattr("autotune.bench.host._smi", fake_smi)
    assert visible_gpus({}) is None
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-b, 0"}) == ("GPU-b", "0")
    every = _trial_like(HostSampler({7}, gpus=visible_gpus({})), seconds=0.1).to_dict()
    assert set(every["gpu"]["devices"]) == {"0", "1"}
    assert every["noisy"] is True and any("GPU 1: other processes [4242]" in r
                                          for r in every["reasons"])  # fmt: skip
    by_uuid = _trial_like(HostSampler({7}, gpus=("GPU-b",)), seconds=0.1).to_dict()
    assert set(by_uuid["gpu"]["devices"]) == {"1"}
