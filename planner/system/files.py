"""Writing output files so that a reader sees the old file or the whole new one, never half."""
from __future__ import annotations

import contextlib
import glob
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from planner.core.errors import BadInput

# What a hand-written document (an inventory, a catalog, a plan) may weigh: they are kilobytes, and a
# bound keeps /dev/zero or a 10 GB file from filling memory before a parser sees it.
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024

_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def check_regular_file(path: str | Path, what: str = "file") -> os.stat_result:
    """stat `path` and refuse anything but a regular file before it is opened: open() on a FIFO
    blocks until a writer comes, and /dev/zero or /dev/urandom never end."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the {what} ({exc.strerror})") from None
    for test, kind in _SPECIAL:
        if test(info.st_mode):
            raise BadInput(f"{path}: is {kind}; expected a regular file")
    return info


def read_bounded(path: str | Path, limit: int = MAX_DOCUMENT_BYTES, what: str = "file") -> bytes:
    """The bytes of a regular file of at most `limit` bytes; a special file or a larger one is bad input,
    refused before it is read. Reads at most limit + 1 bytes, whatever the file grows to meanwhile."""
    info = check_regular_file(path, what)
    if info.st_size > limit:
        raise BadInput(f"{path}: {info.st_size} bytes; expected a file of at most {limit} bytes")
    try:
        # O_NONBLOCK: should the path turn into a FIFO after the stat, open() still does not wait
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the {what} ({exc.strerror})") from None
    if len(data) > limit:
        raise BadInput(f"{path}: more than {limit} bytes; expected a file of at most {limit} bytes")
    return data


def check_output_path(path: str | Path, flag: str = "-o") -> Path:
    """Refuse an output path that cannot be a file we replace, before any work is done: an empty
    name, a directory ('/', '.', an existing one), a special file (a FIFO, /dev/null: a rename would
    replace the device node), a name past the file system's limit, or a missing directory."""
    text = str(path)
    if not text.strip():
        raise BadInput(f"{flag} {text!r}: empty; expected a file path")
    target = Path(text)
    shown = text if len(text) <= 120 else text[:117] + "..."
    if text.endswith(os.sep) or target.name in ("", ".", ".."):
        raise BadInput(f"{flag} {shown}: is a directory; expected a file path")
    try:
        if not target.parent.is_dir():
            raise BadInput(f"{flag} {shown}: no such directory {str(target.parent)[:120]!r}")
        try:
            name_max = os.pathconf(target.parent, "PC_NAME_MAX")
        except (OSError, ValueError):
            name_max = 255
        if len(os.fsencode(target.name)) > name_max:
            raise BadInput(f"{flag} {shown}: the file name is {len(os.fsencode(target.name))} bytes; "
                           f"this file system takes at most {name_max}")
        if target.is_dir():
            raise BadInput(f"{flag} {shown}: is a directory; expected a file path")
        if target.exists() and not target.is_file():
            raise BadInput(f"{flag} {shown}: is not a regular file; expected a file path fitplan may replace")
    except OSError as exc:      # a path too long as a whole, a loop of links, a directory we may not enter
        raise BadInput(f"{flag} {shown}: cannot write there ({exc.strerror or exc})") from None
    return target


def _partial_name(target: Path) -> Path:
    """A hidden temporary beside `target`, unique to this process and call (two writers of one path,
    in one process or two, never share one), short enough for any name the target may have."""
    return target.with_name(f".{target.stem[:40]}.partial-{os.getpid()}-{secrets.token_hex(4)}{target.suffix[:16]}")


def _remove_stale_partials(target: Path) -> None:
    """Temporaries of `target` left by writers that were killed (SIGKILL, power loss): their process
    is gone, so nobody will rename them. Those of live writers are theirs."""
    with contextlib.suppress(OSError):
        for partial in target.parent.glob(f".{glob.escape(target.stem[:40])}.partial-*"):
            pid = partial.name.rsplit(".partial-", 1)[1].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    partial.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:        # another user's process: alive
        return True
    return True


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` into a temporary file beside `path`, flush it to disk, then rename it over
    `path`: a reader (or a SIGKILL at any moment) sees the old file or the whole new one, and
    concurrent writers leave one complete file, the last renamed. A failed write leaves nothing
    behind; a path that cannot be written is bad input (exit 2), in one line."""
    target = check_output_path(path)
    _remove_stale_partials(target)
    tmp = _partial_name(target)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:      # the data on disk before the rename makes it visible
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_directory(target.parent)
    except OSError as exc:
        raise BadInput(f"{path}: cannot write the file ({exc.strerror or exc})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
