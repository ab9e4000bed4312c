"""Shared test helpers: a copy of the demo study in a temporary folder, process checks."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = ROOT / "models" / "demo"


def write_demo_spec(
    directory: Path,
    space: str,
    *,
    name: str = "e2e",
    workload: dict | None = None,
    extra_args: tuple[str, ...] = ("--enforce-eager",),
) -> Path:
    """A demo spec in ``directory`` with absolute paths, a small workload and ``space``.

    ``--enforce-eager`` by default: it saves about 15 s of torch.compile per server start.
    """
    spec = yaml.safe_load((ROOT / "studies" / "demo.yaml").read_text())
    spec["study"] = name
    spec["model"]["path"] = str(DEMO_MODEL)
    spec["engine"]["patch_dirs"] = [str(ROOT / "patches")]
    spec["engine"]["args"] = list(spec["engine"]["args"]) + list(extra_args)
    spec["search_space"] = "space.yaml"
    spec["workload"].update(
        {
            "num_requests": 8,
            "concurrency": 4,
            "single_requests": 1,
            "warmup_requests": 1,
            "repeats": 1,
            "max_tokens": 32,
            "target_precision": 0,  # exactly `repeats` rounds: these tests check other things
        }
    )
    spec["workload"].update(workload or {})
    spec["check"]["under_load_sample"] = 8
    (directory / "space.yaml").write_text(textwrap.dedent(space))
    path = directory / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def processes_matching(text: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(text in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def autotune_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", *args]


#: the command-engine template that starts the fault-injecting test double (it reads the API
#: key from AUTOTUNE_API_KEY: never on argv, where ``ps`` would show it)
FAKE_SERVER_COMMAND = (
    sys.executable,
    "-m",
    "autotune.testing.fake_server",
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--model",
    "{served_name}",
)


def write_fake_spec(
    directory: Path,
    space: str,
    *,
    name: str = "fake",
    args: tuple = (),
    workload: dict | None = None,
    objective: dict | None = None,
) -> Path:
    """A spec driving the fault-injecting test double (autotune.testing.fake_server) through
    the command-template engine: fast starts, for tests of the loop itself."""
    (directory / "model").mkdir(exist_ok=True)
    (directory / "space.yaml").write_text(textwrap.dedent(space))
    spec = {
        "study": name,
        "engine": {
            "kind": "command",
            "command": list(FAKE_SERVER_COMMAND),
            "args": list(args),
        },
        "model": {"path": "model", "served_name": f"fake-{name}"},
        "search_space": "space.yaml",
        "check": {"prompts": ["one two three", "17 18 19", "d e f"], "max_tokens": 8},
        "workload": {
            "prompts": ["1 2 3", "a b c", "40 41 42"],
            "max_tokens": 16,
            "concurrency": 4,
            "num_requests": 8,
            "single_requests": 1,
            "warmup_requests": 1,
            "repeats": 1,
            "request_timeout_s": 10,
            "target_precision": 0,  # exactly `repeats` rounds unless a test asks for precision
            **(workload or {}),
        },
        "objective": objective or {"metric": "decode_tokens_per_s"},
        "timeouts": {"startup_s": 20},
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
