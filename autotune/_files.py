"""Files the user asked for (``export -o``, ``report -o``), written whole or not at all.

A path that cannot be written (a read-only or virtual file system, a file where a folder should
be, no permission) is the user's input, not a crash: one error naming the option, exit code 2,
and nothing half-written left behind (the text goes to ``NAME.tmp`` beside it and is renamed
over ``NAME`` only once complete).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from autotune.errors import SpecError

#: The largest study spec or search-space file read (a YAML file a person writes is a few KiB).
MAX_YAML_BYTES = 1 << 20
#: The largest workload (prompt) file read: 64 MiB of JSONL, far more prompts than a study sends.
MAX_WORKLOAD_BYTES = 64 << 20


def read_bounded(path: Path, *, what: str, limit: int, key: str | None = None) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes, or one SpecError.

    Devices (``/dev/zero``), FIFOs, sockets and folders are refused without reading: the file
    is opened non-blocking (a FIFO with no writer would otherwise block the open for ever) and
    its kind checked on the open descriptor; a file growing past ``limit`` while it is read is
    refused as well (only ``limit + 1`` bytes are ever read).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        # the kind first, by name (a socket cannot even be opened), then again on the open
        # descriptor (the name may have been swapped for a FIFO in between)
        _check_regular(os.stat(path).st_mode, path, what, key)
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise SpecError(f"{what} file not found", file=str(path), key=key) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SpecError(f"cannot read {what} file: {reason}", file=str(path), key=key) from None
    try:
        _check_regular(os.fstat(fd).st_mode, path, what, key)
        if os.fstat(fd).st_size > limit:
            raise SpecError(
                f"{what} file is larger than the {_size(limit)} limit", file=str(path), key=key
            )
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise SpecError(
                f"{what} file is larger than the {_size(limit)} limit", file=str(path), key=key
            )
        return b"".join(chunks)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise SpecError(f"cannot read {what} file: {reason}", file=str(path), key=key) from None
    finally:
        os.close(fd)


def _check_regular(mode: int, path: Path, what: str, key: str | None) -> None:
    if stat.S_ISREG(mode):
        return
    raise SpecError(
        f"{what} file must be a regular file, this is {file_kind(mode)}", file=str(path), key=key
    )


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in the words of an error message."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same resolved path (links followed), or, where
    both exist, the same inode (a hard link)."""
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):  # a symlink loop
        if a.absolute() == b.absolute():
            return True
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_output_target(out: Path, *, option: str) -> None:
    """Refuse (SpecError naming ``option``) an output that exists and is not a regular file.

    The write renames a new file over the name, so ``-o /dev/null`` run as root replaced the
    system's ``/dev/null`` with a regular file (and a FIFO or a socket the same way). Links are
    followed: a symlink to a regular file is replaced as before (the link, not its target), a
    symlink to a device is refused like the device. A name that does not exist (a dangling link
    included) is written. Callers that write after long work (``ablate -o``, ``bench --json``)
    call this first as well, so the refusal comes before the work.
    """
    try:
        mode = os.stat(out).st_mode
    except OSError:  # not there; or a parent that is a file, no permission: the write says why
        return
    if not stat.S_ISREG(mode):
        raise SpecError(
            f"{out} is {file_kind(mode)}, not a regular file: writing would replace it "
            "(choose a file)",
            key=option,
        )


def write_text_atomically(out: Path, text: str, *, option: str) -> Path:
    """Write ``text`` to ``out`` (parents created), or raise SpecError naming ``option``."""
    write_files_atomically({out: text}, option=option)
    return out


def write_files_atomically(files: Mapping[Path, str], *, option: str) -> None:
    """Write files that belong together (an exported config and the ``.env`` beside it).

    Every text is written to its ``.tmp`` first; only when all are complete are they renamed
    into place. A failure on any of them leaves none of the new ones, and no old one beside a
    new one it does not belong to (what writing them one by one did when the second failed).
    Every target is checked (:func:`check_output_target`) before the first is written, and again
    just before the renames.
    """
    for out in files:
        check_output_target(out, option=option)
    tmps = {out: out.with_name(out.name + ".tmp") for out in files}
    current: Path | None = None
    try:
        for out, text in files.items():
            current = out
            out.parent.mkdir(parents=True, exist_ok=True)
            _write_new(tmps[out], text)
        for out in files:
            check_output_target(out, option=option)
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
    except SpecError:
        for tmp in tmps.values():
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise


def _write_new(tmp: Path, text: str) -> None:
    """Write ``text`` to a new regular file ``tmp``.

    A ``NAME.tmp`` left by an earlier run is removed first (the name, never what a link points
    to), and the file is created exclusively without following links: a FIFO there would block
    the open, a symlink there would send the text into its target, and a device node there
    would be renamed over the output.
    """
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o666)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
