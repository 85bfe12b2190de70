"""Weights kept in their GGUF types, dequantized on use: a bounded cache of float32 copies and the
row bands a product reads when its weight is not in the cache.

Before this, every block-quantized weight was dequantized once to float32 and kept for the life of
its buffer: a Llama-3.1-8B-class Q4_K_M file (4.6 GiB) grew past 24 GiB RSS in `fitplan validate`
(issue #22). Now a weight's f32 copy is kept only while the cache has room for it (first come,
never evicted: a decode step reads every weight once, in the same order, so an LRU cache smaller
than the model would miss on every read); the others are dequantized a band of rows at a time,
each band multiplied and dropped. Dequantization works per block, so a band's values are the whole
matrix's rows; a product over row bands that start on threads.ROW_ALIGN gives the same bits as the
whole product (runtime/ggml/threads.py says why; tests/runtime/ggml/test_dequant_bands.py checks).

The cache's size: set_capacity, else `FITPLAN_DEQUANT_CACHE` (a size such as `2GiB` or `512MiB`; a
bare number is GiB), else a quarter of the memory this process can still allocate (MemAvailable, through psutil, or
less under an address-space limit).
"""
from __future__ import annotations

import os
import resource
import weakref

import numpy as np
import psutil

from planner.core.units import parse_size

ENV_CACHE = "FITPLAN_DEQUANT_CACHE"
DEFAULT_CACHE_FRACTION = 0.25     # of MemAvailable (issue #22: the cache's default is <= 25 % of available RAM)
BAND_BYTES = 32 << 20             # f32 bytes of one band of dequantized rows
# gguf-py's dequantize holds a few float32 temporaries of its input's size (scales, mins, codes)
# beside the result: what one band costs at its peak
BAND_PEAK_FACTOR = 4


def mem_available() -> int | None:
    """This machine's available RAM in bytes, as planner/hardware/detect.py reads it (psutil: the
    kernel's MemAvailable on Linux)."""
    return int(psutil.virtual_memory().available)


def address_space_left() -> int | None:
    """What this process may still map under its address-space limit (RLIMIT_AS, `ulimit -v`): the soft
    limit less VmSize; None when there is no limit (or no /proc to read VmSize from)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return max(0, soft - int(line.split()[1]) * 1024)
    except OSError:
        return None
    return None


def memory_left() -> int | None:
    """The smaller of MemAvailable and the address space left: what this process can still allocate."""
    known = [n for n in (mem_available(), address_space_left()) if n is not None]
    return min(known) if known else None


def default_capacity() -> int:
    """The cache size a run gets unless told: FITPLAN_DEQUANT_CACHE, else 25 % of what this process can
    still allocate (MemAvailable, or less under an address-space limit)."""
    text = os.environ.get(ENV_CACHE)
    if text:
        return parse_size(text)
    left = memory_left()
    return int(left * DEFAULT_CACHE_FRACTION) if left is not None else 1 << 30


def working_set_bytes() -> int:
    """What one banded product holds beside the cache at its peak."""
    return BAND_BYTES * BAND_PEAK_FACTOR


class DequantCache:
    """float32 copies of weights, by buffer and (offset, type, shape), up to `capacity` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._entries: weakref.WeakKeyDictionary[object, dict[tuple[object, ...], np.ndarray]] = (
            weakref.WeakKeyDictionary())

    def get(self, buffer: object, key: tuple[object, ...]) -> np.ndarray | None:
        per_buffer = self._entries.get(buffer)
        return None if per_buffer is None else per_buffer.get(key)

    def fits(self, n_bytes: int) -> bool:
        return self.used + n_bytes <= self.capacity

    def put(self, buffer: object, key: tuple[object, ...], values: np.ndarray) -> None:
        per_buffer = self._entries.get(buffer)
        if per_buffer is None:
            per_buffer = self._entries[buffer] = {}
            weakref.finalize(buffer, self._forget, per_buffer)
        per_buffer[key] = values
        self.used += values.nbytes

    def _forget(self, per_buffer: dict[tuple[object, ...], np.ndarray]) -> None:
        self.used -= sum(v.nbytes for v in per_buffer.values())

    def clear(self) -> None:
        self._entries = weakref.WeakKeyDictionary()
        self.used = 0


_cache: list[DequantCache] = []


def cache() -> DequantCache:
    """The process's cache (weights of every runner share it, as they share this machine's RAM)."""
    if not _cache:
        _cache.append(DequantCache(default_capacity()))
    return _cache[0]


def set_capacity(n_bytes: int | None) -> None:
    """Resize the cache (None: the default); copies already kept stay until their buffers go."""
    cache().capacity = default_capacity() if n_bytes is None else max(0, int(n_bytes))


# Bands are at least this many rows (fewer, larger BLAS calls), a short last one joins the band before
# it. A band's product does not have the whole product's bits in general (OpenBLAS's sgemm sums by its
# shape, per CPU: on this project's first machine bands agreed from 256 rows, on an AMD EPYC one not at
# 256), so a weight the cache holds whole is multiplied in these same bands (kernels._product_in_bands).
MIN_BAND_ROWS = 256


def row_bands(n_rows: int, row_bytes: int, align: int) -> list[tuple[int, int]]:
    """[r0, r1) bands of about BAND_BYTES f32 bytes (at least MIN_BAND_ROWS rows), each starting on
    a multiple of `align` rows."""
    per_band = max(align, MIN_BAND_ROWS, (BAND_BYTES // max(1, row_bytes)) // align * align)
    starts = list(range(0, n_rows, per_band))
    if len(starts) > 1 and n_rows - starts[-1] < MIN_BAND_ROWS:
        starts.pop()
    return [(r0, starts[i + 1] if i + 1 < len(starts) else n_rows) for i, r0 in enumerate(starts)]
