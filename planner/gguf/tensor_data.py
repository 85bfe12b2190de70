"""A memory map of a GGUF model's tensor bytes: a weight is read straight from the map (or into its
device buffer), never through an intermediate copy of the whole file. Where each tensor's bytes sit
comes from the header planner.gguf.reader already read (TensorInfo.shard and .data_offset)."""
from __future__ import annotations

import mmap

import numpy as np

from planner.gguf.reader import ModelFile, require_weights


def _map(path: str) -> mmap.mmap:
    with open(path, "rb") as f:   # the map keeps its own reference to the file
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class TensorData:
    """Read-only access to the tensor bytes of a (possibly split) model."""

    def __init__(self, model: ModelFile) -> None:
        require_weights(model, "reading tensor data")
        paths = model.shard_paths or (model.path,)
        self._maps = [_map(p) for p in paths]
        self._where = {t.name: (t.shard, t.data_offset) for t in model.tensors}

    def raw(self, name: str, n_bytes: int) -> np.ndarray:
        shard, off = self._where[name]
        return np.frombuffer(self._maps[shard], dtype=np.uint8, count=n_bytes, offset=off)

    def mapping(self, name: str) -> tuple[mmap.mmap, int]:
        """The read-only map holding a tensor's bytes and their offset in it."""
        shard, off = self._where[name]
        return self._maps[shard], off

    def __contains__(self, name: str) -> bool:
        return name in self._where
