"""Helpers of the tests' independent float64 forward passes (written from the models' definitions,
not from the runtime's code)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def float64_weights(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file, dequantized to float64, in numpy's (reversed ggml) axis order."""
    r = GGUFReader(str(path))
    return {t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape(tuple(reversed(t.shape.tolist())))
            for t in r.tensors}


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
