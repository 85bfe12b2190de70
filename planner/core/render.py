"""One renderer for every command: a result object to table, JSON or YAML text."""
from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any, Protocol

import yaml


class Renderable(Protocol):
    def to_dict(self) -> dict[str, Any]: ...

    def to_table(self) -> str: ...


def layer_ranges(layers: Sequence[int], n_layer_all: int | None = None, output: bool = False) -> str:
    """'0-9,12,output': contiguous runs of layer ids; 'output' when asked or when the ids hold
    layer n_layer_all (the output layer's index)."""
    trunk = sorted(i for i in layers if n_layer_all is None or i < n_layer_all)
    parts = []
    for _, run in itertools.groupby(enumerate(trunk), lambda p: p[1] - p[0]):
        ids = [i for _, i in run]
        parts.append(str(ids[0]) if len(ids) == 1 else f"{ids[0]}-{ids[-1]}")
    return ",".join(parts + (["output"] if output or n_layer_all in layers else []))


def render(result: Renderable, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(result.to_dict(), indent=2)
    if fmt == "yaml":
        return yaml.safe_dump(result.to_dict(), sort_keys=False)
    return result.to_table()


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """Plain aligned text columns; `align` is one 'l'/'r' per column (default: first left, rest right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)
    out = []
    for n, row in enumerate(cells):
        # a row, the headers and `align` need not be the same length: the shortest decides
        cols = zip(row, widths, align, strict=False)
        out.append("  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in cols).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
