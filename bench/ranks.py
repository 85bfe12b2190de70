"""Spearman's rank correlation for the benches, in numpy: ranks with ties given their average rank, then
Pearson's correlation of the ranks (NaN when either side has no spread)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks; equal values share the mean of the ranks they span."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="stable")
    out = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        out[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    """Pearson's correlation; NaN when either side has no spread."""
    if len(a) != len(b):
        raise ValueError(f"correlation: {len(a)} values against {len(b)}")
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    x, y = x - x.mean(), y - y.mean()
    norm = float(np.sqrt((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / norm) if norm else float("nan")


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} values against {len(b)}")
    return pearson(ranks(a), ranks(b))
