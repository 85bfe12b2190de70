"""Synthetic safetensors files for the sd planner tests: a real header, sparse zero data."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

ELEMENT_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "I32": 4, "I64": 8, "I8": 1}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> Path:
    """Write `name -> (dtype, shape)` as a safetensors file whose data section is a hole."""
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = 1
        for d in shape:
            n *= d
        size = n * ELEMENT_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    return path


@pytest.fixture
def st_file(tmp_path):
    def make(name: str, tensors: dict[str, tuple[str, list[int]]]) -> Path:
        return write_safetensors(tmp_path / name, tensors)

    return make
