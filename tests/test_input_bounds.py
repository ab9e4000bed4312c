"""Every input file is bounded (issue #31 item 7).

``--spec``, the search space and the workload file must be regular files under a size limit;
devices, FIFOs, sockets and folders are refused at once, without reading: exit 2, one line
naming the file, nothing written. A space holds at most ``MAX_PARAMETERS`` parameters and a
workload file at most ``MAX_WORKLOAD_RECORDS`` records.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autotune._files import MAX_WORKLOAD_BYTES, MAX_YAML_BYTES, read_bounded
from autotune.errors import SpecError
from autotune.space.load import MAX_PARAMETERS
from autotune.spec import workload as workload_mod
from tests.test_bad_input import SPACE, SPEC, assert_bad_input, invoke, with_, write

# Generous: "it ended at all", not a timing margin. Before the bound, /dev/zero read until
# MemoryError and a FIFO blocked for ever.
ENDED_S = 120


@pytest.fixture(autouse=True)
def _work_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess (a hang is a failed test, not a hung suite)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli.app", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=ENDED_S,
    )


def _assert_refused(proc: subprocess.CompletedProcess[str], tmp_path: Path, *needles: str):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not list(tmp_path.rglob("*.db")), list(tmp_path.rglob("*"))
    assert not (tmp_path / "studies").exists()


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
@pytest.mark.parametrize("command", ["run", "validate"])
def test_dev_zero_as_spec_is_refused_without_reading(tmp_path: Path, command: str) -> None:
    args = ("--spec", "/dev/zero") if command == "run" else ("/dev/zero",)
    proc = _cli(tmp_path, command, *args)
    _assert_refused(proc, tmp_path, "/dev/zero", "regular file", "device")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_as_spec_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    proc = _cli(tmp_path, "run", "--spec", str(fifo))
    _assert_refused(proc, tmp_path, str(fifo), "FIFO")
    assert "interrupted" not in proc.stderr + proc.stdout


def test_socket_and_folder_as_spec_are_refused(tmp_path: Path) -> None:
    sock_path = tmp_path / "s.yaml"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(sock_path))
        result = invoke("run", "--spec", str(sock_path))
        line = assert_bad_input(result, tmp_path, str(sock_path))
        assert "regular file" in line
    folder = tmp_path / "d.yaml"
    folder.mkdir()
    line = assert_bad_input(invoke("run", "--spec", str(folder)), tmp_path, str(folder))
    assert "regular file" in line or "folder" in line or "directory" in line.lower()


def test_oversized_spec_is_refused_by_size(tmp_path: Path) -> None:
    path = write(tmp_path)
    # valid YAML (a long comment), one byte over the bound: refused for its size, not parsed
    body = path.read_text()
    path.write_text(body + "#" * (MAX_YAML_BYTES + 1 - len(body.encode())) + "\n")
    line = assert_bad_input(invoke("validate", str(path)), tmp_path, str(path))
    assert "1 MiB" in line


def test_spec_just_under_the_bound_is_read(tmp_path: Path) -> None:
    path = write(tmp_path)
    body = path.read_text()
    path.write_text(body + "#" * (MAX_YAML_BYTES - 2 - len(body.encode())) + "\n")
    assert len(path.read_bytes()) <= MAX_YAML_BYTES
    assert read_bounded(path, what="study spec", limit=MAX_YAML_BYTES) == path.read_bytes()


def test_oversized_space_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path)
    space = tmp_path / "space.yaml"
    text = space.read_text()
    space.write_text(text + "#" * MAX_YAML_BYTES + "\n")
    line = assert_bad_input(invoke("validate", str(path)), tmp_path, str(space))
    assert "larger than" in line


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_device_as_search_space_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, spec=with_(SPEC, "search_space", "/dev/zero"))
    proc = _cli(tmp_path, "validate", str(path))
    _assert_refused(proc, tmp_path, "/dev/zero", "device")


def test_too_many_parameters_are_refused(tmp_path: Path) -> None:
    params = dict(SPACE["parameters"])
    for i in range(MAX_PARAMETERS + 10):
        params[f"p{i}"] = {
            "type": "int",
            "low": 1,
            "high": 2,
            "target": {"env": f"AUTOTUNE_TEST_P{i}"},
        }
    path = write(tmp_path, space={"parameters": params})
    line = assert_bad_input(invoke("validate", str(path)), tmp_path, str(tmp_path / "space.yaml"))
    assert "parameters" in line and str(MAX_PARAMETERS) in line


def test_space_at_the_parameter_bound_is_not_refused_for_its_count(tmp_path: Path) -> None:
    params = {
        f"p{i}": {"type": "int", "low": 1, "high": 2, "target": {"env": f"AUTOTUNE_TEST_P{i}"}}
        for i in range(MAX_PARAMETERS)
    }
    path = write(tmp_path, space={"parameters": params})
    result = invoke("validate", str(path))
    assert "at most" not in result.output + (result.stderr or "")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_device_as_workload_file_is_refused(tmp_path: Path) -> None:
    workload = {"file": "/dev/zero", "max_tokens": 4, "num_requests": 2, "repeats": 1}
    path = write(tmp_path, spec=with_(SPEC, "workload", workload))
    proc = _cli(tmp_path, "validate", str(path))
    _assert_refused(proc, tmp_path, "/dev/zero", "device")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_as_workload_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    workload = {"file": str(fifo), "max_tokens": 4, "num_requests": 2, "repeats": 1}
    path = write(tmp_path, spec=with_(SPEC, "workload", workload))
    proc = _cli(tmp_path, "run", "--spec", str(path))
    _assert_refused(proc, tmp_path, str(fifo), "FIFO")


def test_oversized_workload_file_is_refused(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    with prompts.open("wb") as f:  # sparse: the bound is checked before reading
        f.truncate(MAX_WORKLOAD_BYTES + 1)
    with pytest.raises(SpecError) as err:
        workload_mod.read_prompt_file(prompts)
    assert str(prompts) in str(err.value) and "64 MiB" in str(err.value)


def test_workload_records_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload_mod, "MAX_WORKLOAD_RECORDS", 5)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"p {i}"}) + "\n" for i in range(6)))
    with pytest.raises(SpecError) as err:
        workload_mod.read_prompt_file(prompts)
    assert "more than 5 records" in str(err.value)
    assert err.value.line == 6
    prompts.write_text(json.dumps([{"prompt": f"p {i}"} for i in range(6)]))
    with pytest.raises(SpecError, match="more than 5 records"):
        workload_mod.read_prompt_file(prompts)
    prompts.write_text("".join(json.dumps({"prompt": f"p {i}"}) + "\n" for i in range(5)))
    assert len(workload_mod.read_prompt_file(prompts)[0]) == 5


def test_file_growing_past_the_bound_while_read_is_refused(tmp_path: Path) -> None:
    # the size at open is under the bound; what is read is never more than limit + 1 bytes
    path = tmp_path / "x.yaml"
    path.write_bytes(b"a" * 100)
    assert read_bounded(path, what="x", limit=100) == b"a" * 100
    with pytest.raises(SpecError, match="larger than"):
        read_bounded(path, what="x", limit=99)


def test_compare_refuses_an_oversized_argument_unparsed(tmp_path: Path) -> None:
    """`compare` reads its arguments (specs or exported configs) under the same bound."""
    path = write(tmp_path)
    body = path.read_text()
    path.write_text(body + "#" * (MAX_YAML_BYTES + 1 - len(body.encode())) + "\n")
    line = assert_bad_input(invoke("compare", str(path), str(path)), tmp_path, str(path))
    assert "1 MiB" in line
