"""Spec builders shared by the test files: one place for the fake-server and demo specs that
used to be copied between them. Each returns (or writes) a plain spec; a test overrides the
keys it is about and leaves the rest to these defaults."""

from __future__ import annotations

import functools
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO_MODEL = ROOT / "models" / "demo"

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

#: the fake spec's correctness check: three prompts the toy model continues exactly
FAKE_CHECK: dict[str, Any] = {"prompts": ["one two three", "17 18 19", "d e f"], "max_tokens": 8}

#: the fake spec's workload: small and fast, exactly ``repeats`` rounds
FAKE_WORKLOAD: dict[str, Any] = {
    "prompts": ["1 2 3", "a b c", "40 41 42"],
    "max_tokens": 16,
    "concurrency": 4,
    "num_requests": 8,
    "single_requests": 1,
    "warmup_requests": 1,
    "repeats": 1,
    "request_timeout_s": 10,
    "target_precision": 0,  # exactly `repeats` rounds unless a test asks for precision
}


def fake_spec(
    name: str = "fake",
    *,
    command: tuple[str, ...] | list[str] = FAKE_SERVER_COMMAND,
    args: tuple | list = (),
    served_name: str | None = None,
    check: dict[str, Any] | None = None,
    workload: dict[str, Any] | None = None,
    objective: dict[str, Any] | None = None,
    timeouts: dict[str, Any] | None = None,
    storage: str | None = None,
) -> dict[str, Any]:
    """A spec (as a dict) driving the fake server through the command-template engine, with the
    model folder ``model`` and the search space ``space.yaml`` next to it.

    ``check``, ``workload`` and ``timeouts`` replace the defaults whole (a test that changes the
    workload's shape says all of it); ``objective`` and ``storage`` are left out unless given,
    so the spec's own defaults apply.
    """
    engine: dict[str, Any] = {"kind": "command", "command": list(command)}
    if args:
        engine["args"] = list(args)
    spec: dict[str, Any] = {
        "study": name,
        "engine": engine,
        "model": {"path": "model", "served_name": served_name or f"fake-{name}"},
        "search_space": "space.yaml",
        "check": dict(FAKE_CHECK if check is None else check),
        "workload": dict(FAKE_WORKLOAD if workload is None else workload),
    }
    if objective is not None:
        spec["objective"] = objective
    spec["timeouts"] = dict({"startup_s": 20} if timeouts is None else timeouts)
    if storage is not None:
        spec["storage"] = storage
    return spec


def save_spec(directory: Path, spec: dict[str, Any], space: str | dict, *, file: str) -> Path:
    """Write ``spec`` as ``directory/file``, its search space as ``directory/space.yaml`` (YAML
    text is dedented; a dict is dumped) and a ``model`` folder holding the test double's
    tokenizer (so autotune counts its text-only streams itself); returns the spec's path."""
    (directory / "model").mkdir(exist_ok=True)
    (directory / "model" / "tokenizer.json").write_text(_toy_tokenizer_json())
    text = textwrap.dedent(space) if isinstance(space, str) else yaml.safe_dump(space)
    (directory / "space.yaml").write_text(text)
    path = directory / file
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


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
    the command-template engine: fast starts, for tests of the loop itself. ``workload`` keys
    are merged over :data:`FAKE_WORKLOAD`."""
    spec = fake_spec(
        name,
        workload={**FAKE_WORKLOAD, **(workload or {})},
        objective=objective or {"metric": "decode_tokens_per_s"},
    )
    spec["engine"]["args"] = list(args)  # always present, even empty
    return save_spec(directory, spec, space, file=f"{name}.yaml")


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


def sigint_as_a_terminal_would() -> None:
    """``preexec_fn`` for a child a test will Ctrl-C: SIGINT back to its default action.

    A shell without job control starts background commands (``make test &``) with SIGINT
    ignored, the child inherits that, and Python then leaves it ignored: the test's SIGINT
    would be lost and the run would finish with exit 0. A terminal's Ctrl-C always reaches a
    foreground ``autotune run``, which is what these tests stand for."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: the fake server's ``decode_ms`` space that :func:`verified_trial` builds trials of
DECODE_MS_SPACE = """
parameters:
  decode_ms:
    type: categorical
    choices: [2, 40]
    baseline: 40
    target: {flag: --decode-ms}
"""


def verified_trial(role: str, decode_ms: int, tps: float, choices: list[int], **attrs: Any) -> Any:
    """A COMPLETE trial as a correct, measured one of the fake server's ``decode_ms`` space is
    stored (verified, feasible, its metrics), for studies built without launching anything."""
    import optuna

    from autotune import names

    return optuna.trial.create_trial(
        params={"decode_ms": decode_ms},
        distributions={"decode_ms": optuna.distributions.CategoricalDistribution(choices)},
        value=tps,
        user_attrs={
            names.CORRECT: True,
            names.ROLE: role,
            names.PARAMS_RESOLVED: {"decode_ms": decode_ms},
            names.METRICS: {"decode_tokens_per_s": tps},
            names.CHECK: {"passed": True},
            **attrs,
        },
        system_attrs={f"constraints:{names.CORRECTNESS_CONSTRAINT}": 0.0},
    )


@functools.cache
def _toy_tokenizer_json() -> str:
    from autotune.testing.toy_model import ToyModel

    return ToyModel().tokenizer_json()
