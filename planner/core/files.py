"""Writing output files so that a reader sees the old file or the whole new one, never half."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from planner.core.errors import BadInput


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into a temporary file beside `path`, then rename it over `path`; a failed
    write leaves nothing behind. A missing directory is bad input (exit 2)."""
    target = Path(path)
    if not target.parent.is_dir():
        raise BadInput(f"{path}: no such directory {str(target.parent)!r}")
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}{target.suffix}")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
