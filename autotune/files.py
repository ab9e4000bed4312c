"""Files the user asked for (``export -o``, ``report -o``), written whole or not at all.

A path that cannot be written (a read-only or virtual file system, a file where a folder should
be, no permission) is the user's input, not a crash: one error naming the option, exit code 2,
and nothing half-written left behind (the text goes to ``NAME.tmp`` beside it and is renamed
over ``NAME`` only once complete).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from autotune.errors import SpecError


def write_text_atomically(out: Path, text: str, *, option: str) -> Path:
    """Write ``text`` to ``out`` (parents created), or raise SpecError naming ``option``."""
    tmp = out.with_name(out.name + ".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, FileExistsError | NotADirectoryError):
            reason = "a file stands where its folder should be"
        else:
            reason = exc.strerror or type(exc).__name__
        raise SpecError(f"cannot write {out}: {reason}", key=option) from None
    return out
