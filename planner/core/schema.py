"""Checks for hand-written YAML documents (device inventories, the hardware catalog).

Every error names the file, the path inside the document (`devices[1].memory`) and what
was expected, so a user can fix a typo without reading our source.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from planner.core.errors import BadInput, InventoryError
from planner.core.units import parse_size


@dataclass(frozen=True)
class Where:
    """A place in a document: the file and a dotted/indexed path inside it."""

    file: str
    path: str = ""

    def key(self, name: str) -> Where:
        return Where(self.file, f"{self.path}.{name}" if self.path else name)

    def index(self, i: int) -> Where:
        return Where(self.file, f"{self.path}[{i}]")

    def error(self, expected: str) -> InventoryError:
        place = f"{self.file}: {self.path}" if self.path else self.file
        return InventoryError(f"{place}: {expected}")


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file safely; a missing file or a syntax error is bad input."""
    where = Where(str(path))
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise where.error(f"cannot read the file ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise where.error(f"not valid YAML{line} ({problem}); expected a YAML mapping") from None


def mapping(value: Any, where: Where, allowed: dict[str, str], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check that `value` is a mapping whose keys are all in `allowed` (key -> what it holds)."""
    if not isinstance(value, dict):
        raise where.error(f"expected a mapping with keys {', '.join(allowed)}; got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise where.key(str(key)).error(f"unknown key{hint}; expected one of: {', '.join(allowed)}")
    for key in required:
        if key not in value:
            raise where.key(key).error(f"missing; expected {allowed[key]}")
    return value


def table(value: Any, where: Where, what: str) -> dict[str, Any]:
    """A mapping from free-form ids (catalog ids) to entries."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise where.error(f"expected a mapping from ids to {what}; got {type(value).__name__}")
    return value


def sequence(value: Any, where: Where, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise where.error(f"expected a list of {what}; got {type(value).__name__}")
    return value


def text(value: Any, where: Where, what: str = "a string") -> str:
    if not isinstance(value, str) or not value.strip():
        raise where.error(f"expected {what}; got {value!r}")
    return value.strip()


def size(value: Any, where: Where) -> int:
    """A memory size: '24GiB', '512MiB' or a bare number of GiB; never negative."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise where.error(f"expected a size such as 24GiB or 512MiB; got {value!r}")
    try:
        n_bytes = parse_size(str(value))
    except BadInput:
        raise where.error(f"expected a size such as 24GiB or 512MiB; got {value!r}") from None
    if n_bytes < 0:
        raise where.error(f"expected a size of at least 0; got {value!r}")
    return n_bytes


def number(value: Any, where: Where, what: str) -> float:
    """A non-negative plain number (GB/s, TFLOPS, a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise where.error(f"expected {what} (a number >= 0); got {value!r}")
    return float(value)


def flag(value: Any, where: Where) -> bool:
    if not isinstance(value, bool):
        raise where.error(f"expected true or false; got {value!r}")
    return value


def choice(value: Any, where: Where, options: dict[str, Any]) -> Any:
    """Pick from `options` by case-insensitive name."""
    by_lower = {k.lower(): v for k, v in options.items()}
    if isinstance(value, str) and value.lower() in by_lower:
        return by_lower[value.lower()]
    raise where.error(f"expected one of {', '.join(options)}; got {value!r}")
