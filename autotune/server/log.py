"""Reading a server's log file in bounded memory, whatever its size.

A server may log gigabytes (a red team's logged 1.5 GB, and autotune reading it whole at every
trial's end took 3.3 GB of memory): every read here takes a bounded part of the file, and the
rewrite that redacts secrets streams it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: how much of the log's start, and of its end, :func:`bounded` reads at most
LOG_TEXT_PART_BYTES = 8 * 1024 * 1024


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def bounded(path: Path, part_bytes: int = LOG_TEXT_PART_BYTES) -> str:
    """The whole log if it is at most twice ``part_bytes``, else its first and last
    ``part_bytes`` (whole lines) with a line between them that says how much was left out:
    the start's parts are logged first, the latest statistics last."""
    try:
        with open(path, "rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            handle.seek(0)
            if end <= 2 * part_bytes:
                raw = handle.read()
            else:
                head = handle.read(part_bytes).rpartition(b"\n")[0]
                handle.seek(end - part_bytes)
                tail = handle.read().partition(b"\n")[2]
                left_out = end - len(head) - len(tail)
                raw = head + f"\n[... {left_out} bytes of the log left out ...]\n".encode() + tail
    except OSError:
        return ""
    return raw.decode("utf-8", "replace")


def last_bytes(path: Path, max_bytes: int, *, whole_lines: bool = False) -> str:
    """The log's last ``max_bytes`` (from its first whole line, with ``whole_lines``)."""
    try:
        with open(path, "rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, end - max_bytes))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    if whole_lines and end > max_bytes:
        text = text.partition("\n")[2]  # the first line is cut
    return text


def since(path: Path, offset: int, max_bytes: int) -> str:
    """What was written after ``offset`` (its last ``max_bytes`` at most)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(offset, size(path) - max_bytes))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def redact_file(path: Path, secrets: list[bytes]) -> None:
    """Rewrite ``path`` with every secret replaced by ``***``, streamed a MiB at a time (a
    secret that straddles two reads is caught: the last bytes of each read wait for the
    next)."""
    secrets = [s for s in secrets if s]
    if not secrets:
        return
    keep = max(len(s) for s in secrets) - 1
    temp = path.with_name(path.name + ".redacting")
    try:
        with open(path, "rb") as src, open(temp, "wb") as dst:
            pending = b""
            while True:
                chunk = src.read(1 << 20)
                data = pending + chunk
                for secret in secrets:
                    data = data.replace(secret, b"***")
                if not chunk:
                    dst.write(data)
                    break
                cut = max(0, len(data) - keep)
                dst.write(data[:cut])
                pending = data[cut:]
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink()
