"""Where each tensor's bytes sit in a GGUF file, and a memory map to read them.

planner.gguf_file reads the header but keeps no data offsets (the planner never touches
tensor data). The runtime needs them, so this module walks the header once more — gguf-py's
value-type enum is the table, arrays are skipped without building a Python object per
element — and memory-maps the file: a weight is read straight into its
device buffer, never through an intermediate copy of the whole file.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGUFValueType

from planner.errors import GGUFError

# Fixed-width value sizes (GGUF spec; gguf-py's GGUFValueType numbering).
_FIXED: dict[GGUFValueType, int] = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class DataIndex:
    """Absolute byte offset of every tensor's data in one GGUF file."""

    path: str
    offsets: dict[str, int]


def _skip_strings(buf: mmap.mmap, pos: int, count: int) -> int:
    """Skip `count` length-prefixed strings (a 262k-token vocabulary takes ~0.1 s)."""
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", buf, pos)
        pos += 8 + n
    return pos


def _skip_value(buf: mmap.mmap, pos: int, vtype: GGUFValueType) -> tuple[int, object]:
    if vtype in _FIXED:
        fmt = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[_FIXED[vtype]]
        if vtype == GGUFValueType.FLOAT32:
            fmt = "<f"
        return pos + _FIXED[vtype], struct.unpack_from(fmt, buf, pos)[0]
    if vtype == GGUFValueType.STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n, bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8", "replace")
    if vtype == GGUFValueType.ARRAY:
        sub, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        sub = GGUFValueType(sub)
        if sub in _FIXED:
            return pos + _FIXED[sub] * count, None
        if sub == GGUFValueType.STRING:
            return _skip_strings(buf, pos, count), None
        for _ in range(count):
            pos, _v = _skip_value(buf, pos, sub)
        return pos, None
    raise ValueError(f"unknown GGUF value type {vtype}")


def read_data_index(path: str) -> DataIndex:
    """Tensor data offsets of one GGUF file (the header is re-walked; planner checked it)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
            pos, alignment = 24, DEFAULT_ALIGNMENT
            for _ in range(n_kv):
                (n,) = struct.unpack_from("<Q", buf, pos)
                key = bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8", "replace")
                (vtype,) = struct.unpack_from("<I", buf, pos + 8 + n)
                pos, value = _skip_value(buf, pos + 12 + n, GGUFValueType(vtype))
                if key == "general.alignment" and value:
                    alignment = int(value)  # type: ignore[arg-type]
            rel: dict[str, int] = {}
            for _ in range(n_tensors):
                (n,) = struct.unpack_from("<Q", buf, pos)
                name = bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8", "replace")
                pos += 8 + n
                (n_dims,) = struct.unpack_from("<I", buf, pos)
                pos += 4 + 8 * n_dims + 4
                (rel[name],) = struct.unpack_from("<Q", buf, pos)
                pos += 8
        except (struct.error, ValueError) as e:
            raise GGUFError(path, f"cannot index tensor data: {e}") from None
    start = -(-pos // alignment) * alignment
    return DataIndex(path, {name: start + off for name, off in rel.items()})


class TensorData:
    """Read-only access to the tensor bytes of a (possibly split) model."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self._maps: dict[str, np.memmap] = {}
        self._where: dict[str, tuple[str, int]] = {}
        for path in paths:
            index = read_data_index(path)
            self._maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
            for name, off in index.offsets.items():
                self._where[name] = (path, off)

    def raw(self, name: str, n_bytes: int) -> np.ndarray:
        path, off = self._where[name]
        return self._maps[path][off:off + n_bytes]

    def __contains__(self, name: str) -> bool:
        return name in self._where
