"""Byte units. Sizes are int bytes inside fitplan; these helpers are the only edges."""
from __future__ import annotations

import math
import re

from planner.core.errors import BadInput

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB

_UNITS = {"": None, "b": 1, "k": KiB, "kib": KiB, "m": MiB, "mib": MiB, "g": GiB, "gib": GiB, "t": TiB, "tib": TiB}
SIZE_TEXT = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def pad(n: int, multiple: int) -> int:
    """n rounded up to a multiple (GGML_PAD; buffer and tensor alignment)."""
    return -(-n // multiple) * multiple


def parse_size(text: str, default_unit: int = GiB) -> int:
    """Parse '24GiB', '512MiB', '1.5g', or a bare number in `default_unit`.

    Binary units only (DESIGN.md: a bare `6` means 6 GiB, as sd-cli's --max-vram). Decimal
    'GB' is refused rather than guessed.
    """
    m = SIZE_TEXT.match(str(text))
    if not m:
        raise BadInput(f"bad size {text!r}: expected a number with an optional binary unit, e.g. 24GiB, 512MiB, 6")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise BadInput(f"bad size {text!r}: unit {m.group(2)!r} is not one of B, KiB, MiB, GiB, TiB")
    scale = _UNITS[unit] or default_unit
    return int(round(float(number) * scale))


def mib(n_bytes: int) -> float:
    return n_bytes / MiB


def fmt_mib(n_bytes: int) -> str:
    """Whole MiB, rounded up as llama.cpp's memory breakdown rounds (a 1-byte buffer is not 0)."""
    return f"{math.ceil(n_bytes / MiB) if n_bytes > 0 else 0}"


def fmt_bytes(n_bytes: int) -> str:
    """Human-readable with a binary unit, for prose and tables."""
    size = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} TiB"
