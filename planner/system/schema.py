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
from planner.core.units import parse_size, quote
from planner.system.files import read_bounded


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


# A document nested deeper than this is hostile, not an inventory (PyYAML's composer recurses per level).
MAX_YAML_DEPTH = 64
# The most nodes a document may hold once its aliases are expanded: a billion-laughs document (aliases
# of aliases) is a few hundred bytes that expand to 10^9 nodes, and whatever walks or prints the value
# walks them all. fitplan's documents hold hundreds; PyYAML's own dumper writes aliases for shared
# values, so aliases are taken and only the expansion is bounded.
MAX_YAML_NODES = 100_000


class PlainLoader(yaml.SafeLoader):
    """SafeLoader nested at most MAX_YAML_DEPTH deep, whose documents expand (aliases followed) to at
    most MAX_YAML_NODES nodes and hold no cycle."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            self._depth += 1
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep",
                                                  event.start_mark)  # type: ignore[arg-type]
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None and _expanded_size(node, {}, set()) > MAX_YAML_NODES:
            raise yaml.composer.ComposerError(None, None, f"more than {MAX_YAML_NODES} values once its aliases are "
                                              f"expanded (a billion-laughs or self-referencing document)",
                                              node.start_mark)
        return node


def _expanded_size(node: Any, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """Nodes under `node` with every alias followed, memoised per node (each is counted once per use,
    computed once); a cycle (`&a [*a]`) counts as too many."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        return MAX_YAML_NODES + 1
    open_nodes.add(key)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            total += _expanded_size(child, sizes, open_nodes)
            if total > MAX_YAML_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            total += _expanded_size(k, sizes, open_nodes) + _expanded_size(v, sizes, open_nodes)
            if total > MAX_YAML_NODES:
                break
    open_nodes.discard(key)
    sizes[key] = total
    return total


def load_yaml(text: str | bytes, where: Where) -> Any:
    """Parse YAML text with PlainLoader; any failure is bad input naming the line."""
    try:
        return yaml.load(text, Loader=PlainLoader)  # noqa: S506 - PlainLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise where.error(f"not valid YAML{line} ({problem}); expected a YAML mapping") from None
    except (ValueError, RecursionError) as exc:   # an integer past Python's 4,300-digit limit
        raise where.error(f"not a usable YAML document ({quote(str(exc))})") from None


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file safely: a regular file of bounded size (files.read_bounded), no aliases; a
    missing file, a special file or a syntax error is bad input."""
    where = Where(str(path))
    try:
        data = read_bounded(path)
    except BadInput as exc:
        raise InventoryError(str(exc)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise where.error(f"not UTF-8 text (byte {exc.start}); expected a YAML mapping") from None
    return load_yaml(text, where)


def mapping(value: Any, where: Where, allowed: dict[str, str], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check that `value` is a mapping whose keys are all in `allowed` (key -> what it holds)."""
    if not isinstance(value, dict):
        raise where.error(f"expected a mapping with keys {', '.join(allowed)}; got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            close = difflib.get_close_matches(str(key)[:40], list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise where.key(quote(key) if not isinstance(key, str) or len(key) > 40 else key).error(
                f"unknown key{hint}; expected one of: {_listed(list(allowed))}")
    for key in required:
        if key not in value:
            raise where.key(key).error(f"missing; expected {allowed[key]}")
    return value


def _listed(keys: list[str], limit: int = 100) -> str:
    """Keys for a message, cut after `limit` characters: with a long schema the line stays readable."""
    text = ", ".join(keys)
    if len(text) <= limit:
        return text
    return text[:text.rfind(", ", 0, limit)] + f", ... ({len(keys)} keys)"


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
        raise where.error(f"expected {what}; got {quote(value)}")
    return value.strip()


def size(value: Any, where: Where) -> int:
    """A memory size: '24GiB', '512MiB' or a bare number of GiB; never negative."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise where.error(f"expected a size such as 24GiB or 512MiB; got {quote(value)}")
    try:
        n_bytes = parse_size(str(value))
    except BadInput:
        raise where.error(f"expected a size such as 24GiB or 512MiB; got {quote(value)}") from None
    if n_bytes < 0:
        raise where.error(f"expected a size of at least 0; got {quote(value)}")
    return n_bytes


# The largest plain number a document may state: rates in GB/s or TFLOPS and counts are far
# below it, and .inf, .nan or 1e308 would overflow when scaled to bytes/s or FLOP/s.
MAX_NUMBER = 1e9


def number(value: Any, where: Where, what: str) -> float:
    """A non-negative, finite plain number up to MAX_NUMBER (GB/s, TFLOPS, a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_NUMBER:
        raise where.error(f"expected {what} (a number from 0 to {MAX_NUMBER:g}); got {quote(value)}")
    return float(value)


def flag(value: Any, where: Where) -> bool:
    if not isinstance(value, bool):
        raise where.error(f"expected true or false; got {quote(value)}")
    return value


def choice(value: Any, where: Where, options: dict[str, Any]) -> Any:
    """Pick from `options` by case-insensitive name."""
    by_lower = {k.lower(): v for k, v in options.items()}
    if isinstance(value, str) and value.lower() in by_lower:
        return by_lower[value.lower()]
    raise where.error(f"expected one of {', '.join(options)}; got {quote(value)}")
