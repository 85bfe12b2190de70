"""Weight buffers that are the model file itself: a read-only memory map, never copied.

A MappedBuffer stands in for one weight tensor's bytes (the loader still allocates the device's
weights buffer, so sizes and budgets are what llama.cpp allocates; only its bytes are never
touched). Pages of the file are the kernel's to evict: after a weight has been dequantized they
are dropped from this process (madvise MADV_DONTNEED: they stay in the page cache, and a later read
faults them back), so mapped weights do not add up in the resident set.
"""
from __future__ import annotations

import mmap
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from planner.core.errors import BadInput
from runtime.ggml.backend import Buffer, BufferType
from runtime.ggml.graph import BufferUsage, Tensor

PAGE = mmap.PAGESIZE


class MappedBuffer(Buffer):
    """One tensor's bytes at `offset` in a read-only map of its file."""

    def __init__(self, buft: BufferType, data: mmap.mmap, offset: int, size: int) -> None:
        super().__init__(buft, size, BufferUsage.WEIGHTS)
        self._map = data
        self._file_offset = offset
        self._storage = np.frombuffer(data, dtype=np.uint8, count=size, offset=offset)

    def drop_pages(self, start: int = 0, n_bytes: int | None = None) -> None:
        """Let the kernel reclaim the pages of [start, start + n_bytes) of this tensor's bytes."""
        n = self.size - start if n_bytes is None else n_bytes
        lo = (self._file_offset + start) // PAGE * PAGE
        hi = self._file_offset + start + n
        if hi > lo and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def free(self) -> None:
        # the device's weights buffer holds the accounting; a map has nothing to give back
        self.freed = True


class TensorSource(Protocol):
    def mapping(self, name: str) -> tuple[mmap.mmap, int]: ...


def map_weights(weights: Mapping[str, Tensor], source: Mapping[str, str], data: TensorSource) -> None:
    """Point each allocated weight at its bytes in the file (`source`: the file tensor a weight
    reads, a duplicate's original) instead of copying them into its buffer. A GGUF tensor is stored
    contiguous, in the layout its TensorInfo gives, which is the weight's own."""
    for name, t in weights.items():
        if t.buffer is None or not t.is_contiguous():
            raise ValueError(f"{name}: a weight must be allocated and contiguous to be mapped")
        data_map, offset = data.mapping(source[name])
        if offset + t.nbytes() > len(data_map):
            raise BadInput(f"{name}: its {t.nbytes()} bytes at offset {offset} run past the end of the model file")
        t.buffer, t.offset = MappedBuffer(t.buffer.buft, data_map, offset, t.nbytes()), 0
