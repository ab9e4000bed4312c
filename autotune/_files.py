"""Files the user asked for (``export -o``, ``report -o``), written whole or not at all.

A path that cannot be written (a read-only or virtual file system, a file where a folder should
be, no permission) is the user's input, not a crash: one error naming the option, exit code 2,
and nothing half-written left behind (the text goes to ``NAME.tmp`` beside it and is renamed
over ``NAME`` only once complete).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from autotune.errors import SpecError


def write_text_atomically(out: Path, text: str, *, option: str) -> Path:
    """Write ``text`` to ``out`` (parents created), or raise SpecError naming ``option``."""
    write_files_atomically({out: text}, option=option)
    return out


def write_files_atomically(files: Mapping[Path, str], *, option: str) -> None:
    """Write files that belong together (an exported config and the ``.env`` beside it).

    Every text is written to its ``.tmp`` first; only when all are complete are they renamed
    into place. A failure on any of them leaves none of the new ones, and no old one beside a
    new one it does not belong to (what writing them one by one did when the second failed).
    """
    tmps = {out: out.with_name(out.name + ".tmp") for out in files}
    current: Path | None = None
    try:
        for out, text in files.items():
            current = out
            out.parent.mkdir(parents=True, exist_ok=True)
            tmps[out].write_text(text, encoding="utf-8")
        for out, tmp in tmps.items():
            current = out
            os.replace(tmp, out)
    except OSError as exc:
        for tmp in tmps.values():
            with contextlib.suppress(OSError):
                tmp.unlink()
        if isinstance(exc, FileExistsError | NotADirectoryError):
            reason = "a file stands where its folder should be"
        else:
            reason = exc.strerror or type(exc).__name__
        raise SpecError(f"cannot write {current}: {reason}", key=option) from None
