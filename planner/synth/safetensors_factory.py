"""Synthetic safetensors files for the stable-diffusion.cpp planner: a real header, sparse data.

The layout is the format's own (huggingface/safetensors README): a u64 little-endian header
length N, N bytes of JSON mapping tensor name -> {dtype, shape, data_offsets: [begin, end]}
(offsets from the first byte after the header), then the data. The data section is a hole
(`truncate`), so a 12B-parameter checkpoint costs only its header on disk; `data=False` leaves it
out altogether, as a header-only file does.

Bytes per element are the format's storage sizes, written here and not imported from
planner/sd/safetensors_header.py, so that tests of the reader do not check it against itself.
"""
from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

from planner.system.files import write_atomic

# safetensors Dtype -> bytes of one element in the file
ELEMENT_BYTES: dict[str, int] = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1,
                                 "I32": 4, "I64": 8, "I8": 1}


def write_safetensors(path: Path, tensors: Mapping[str, tuple[str, Sequence[int]]], *, data: bool = True) -> Path:
    """Write `name -> (dtype, shape)` as a safetensors file, tensors laid out in the given order."""
    header: dict[str, dict[str, object]] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * ELEMENT_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            if data:
                f.truncate(8 + len(raw) + offset)   # the tensor data: a sparse hole

    write_atomic(path, write)
    return path
