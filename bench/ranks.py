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


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} values against {len(b)}")
    ra, rb = ranks(a) - (len(a) + 1) / 2, ranks(b) - (len(b) + 1) / 2
    norm = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / norm) if norm else float("nan")
