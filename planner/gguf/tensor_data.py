"""A memory map of a GGUF model's tensor bytes: a weight is read straight into its device buffer,
never through an intermediate copy of the whole file. Where each tensor's bytes sit comes from
the header planner.gguf.reader already read (TensorInfo.shard and .data_offset)."""
from __future__ import annotations

import numpy as np

from planner.gguf.reader import ModelFile, require_weights


class TensorData:
    """Read-only access to the tensor bytes of a (possibly split) model."""

    def __init__(self, model: ModelFile) -> None:
        require_weights(model, "reading tensor data")
        paths = model.shard_paths or (model.path,)
        maps = [np.memmap(p, dtype=np.uint8, mode="r") for p in paths]
        self._where = {t.name: (maps[t.shard], t.data_offset) for t in model.tensors}

    def raw(self, name: str, n_bytes: int) -> np.ndarray:
        data, off = self._where[name]
        return data[off:off + n_bytes]

    def __contains__(self, name: str) -> bool:
        return name in self._where
