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
# ASCII digits only: Python's \d and float() also take '٨' (Arabic-Indic eight), which no
# llama.cpp or sd-cli flag parser (strtoull/std::stoi) reads as a digit.
SIZE_TEXT = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)
# The largest size fitplan takes: llama.cpp and ggml hold sizes as size_t/int64_t, and a
# budget past 2^62 bytes (4 EiB) is a typo, not a device. Checked before converting, so that a
# 400-digit number is one clear line, not OverflowError.
MAX_SIZE_BYTES = 2**62


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
        raise BadInput(f"bad size {quote(text)}: expected a number with an optional binary unit, e.g. 24GiB, 512MiB, 6")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise BadInput(f"bad size {quote(text)}: unit {quote(m.group(2))} is not one of B, KiB, MiB, GiB, TiB")
    scale = _UNITS[unit] or default_unit
    if len(number.split(".")[0].lstrip("-")) > 24:   # 10^24 B is past any unit's limit below
        raise BadInput(f"bad size {quote(text)}: larger than {MAX_SIZE_BYTES} bytes (2^62)")
    n_bytes = int(round(float(number) * scale))
    if abs(n_bytes) > MAX_SIZE_BYTES:
        raise BadInput(f"bad size {quote(text)}: larger than {MAX_SIZE_BYTES} bytes (2^62)")
    return n_bytes


QUOTE_CHARS = 80


def quote(value: object, limit: int = QUOTE_CHARS) -> str:
    """`repr(value)` cut to `limit` characters: an error message quotes a bounded prefix of a hostile
    value (a 40 MB name, a 5,000-digit number), never the whole of it. Containers are summarised
    before they are formatted, so quoting never walks a huge structure."""
    if isinstance(value, (list, tuple, dict, set)):
        text = f"<a {type(value).__name__} of {len(value)} items>"
    elif isinstance(value, str) and len(value) > limit:
        text = repr(value[:limit])
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        text = f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
