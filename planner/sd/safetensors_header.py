"""Safetensors header reading: the 8-byte length, the JSON index, nothing else.

Format (huggingface/safetensors README): u64 little-endian header length N, then N bytes of
JSON mapping tensor name -> {dtype, shape, data_offsets: [begin, end]} (offsets relative to the
byte after the header), plus an optional "__metadata__" entry. Every length is checked against
the file's size before anything is read, so a hostile header is refused, not obeyed.

The bytes come through planner.gguf.source, so a local file, a header-only file (the JSON header
and no data, whose offsets cannot be checked against data that is not there) and an http(s) URL
(read by Range, through the header cache) are all read the same way.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

from planner.core.errors import BadInput
from planner.gguf.location import open_source
from planner.gguf.source import ByteSource

# dtype -> (bytes per element in the file, bytes per element once stable-diffusion.cpp loads
# it). sd.cpp widens F8 to F16 and narrows F64/I64 to 32 bits at load time
# (src/model_io/safetensors_io.cpp, safetensors_dtype_to_ggml_type); the loaded size is what
# occupies a device.
DTYPE_BYTES: dict[str, tuple[int, int]] = {
    "F32": (4, 4), "F16": (2, 2), "BF16": (2, 2), "F64": (8, 4),
    "F8_E4M3": (1, 2), "F8_E5M2": (1, 2),
    "I32": (4, 4), "I64": (8, 4), "I8": (1, 1),
}
HEADER_LEN_BYTES = 8
# The safetensors reference implementation refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100 * 1000 * 1000
# Offsets and dimensions are u64 in the format (20 decimal digits at most); a longer integer is
# refused while parsing, before Python converts it (a 5,000-digit one would raise ValueError).
MAX_INT_DIGITS = 20
# How much of a name or dtype a message quotes.
QUOTE_CHARS = 48


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= QUOTE_CHARS else f"{text[:QUOTE_CHARS]}... ({len(text)} characters)"


class _Refused(ValueError):
    """Raised from inside json.loads by the number hooks."""


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text)} digits")
    return int(text)


def _constant(text: str) -> float:
    raise _Refused(f"{text} (not JSON)")


def SafetensorsError(path: str, problem: str) -> BadInput:  # noqa: N802 - reads as a raise
    """A file that is not a readable safetensors file, or whose header is hostile (exit 2)."""
    return BadInput(f"{path}: {problem}")


@dataclass(frozen=True)
class StTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    n_bytes: int  # as loaded by stable-diffusion.cpp (see DTYPE_BYTES)


@dataclass(frozen=True)
class _Header:
    """A safetensors file's JSON header and where its data section lies."""

    file_bytes: int
    header_len: int  # bytes of JSON after the 8-byte length
    entries: dict[str, object]

    @property
    def data_bytes(self) -> int:
        return self.file_bytes - HEADER_LEN_BYTES - self.header_len


def _read_header(path: str) -> _Header:
    with open_source(path) as source:
        header = _parse_header(path, source)
        source.keep(HEADER_LEN_BYTES + header.header_len)
    return header


def _parse_header(path: str, source: ByteSource) -> _Header:
    head = source.prefix(HEADER_LEN_BYTES)
    size = source.size if source.size is not None else len(head)
    if len(head) < HEADER_LEN_BYTES:
        raise SafetensorsError(path, f"file is {len(head)} bytes, too short for a safetensors header")
    (n,) = struct.unpack_from("<Q", head, 0)
    if source.size is not None and n > size - HEADER_LEN_BYTES:
        raise SafetensorsError(path, f"header length {n} is larger than the file ({size} bytes)")
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(path, f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
    buf = source.prefix(HEADER_LEN_BYTES + n)
    if len(buf) < HEADER_LEN_BYTES + n:
        raise SafetensorsError(path, f"header length {n} is larger than the file ({len(buf)} bytes)")
    raw = bytes(buf[HEADER_LEN_BYTES:HEADER_LEN_BYTES + n])
    try:
        doc = json.loads(raw.decode("utf-8"), parse_int=_int, parse_constant=_constant)
    except _Refused as e:
        raise SafetensorsError(path, f"header holds {e}") from None
    except RecursionError:   # the C scanner recurses per nesting level: Python's limit bounds it
        raise SafetensorsError(path, "header nests arrays or objects too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(path, f"header is not valid JSON ({e.__class__.__name__})") from None
    if not isinstance(doc, dict):
        raise SafetensorsError(path, "header is not a JSON object")
    return _Header(source.size if source.size is not None else len(buf), n, doc)


def _tensor(path: str, name: str, entry: object, data_bytes: int) -> StTensor:
    if not isinstance(entry, dict):
        raise SafetensorsError(path, f"tensor {_short(name)}: entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise SafetensorsError(path, f"tensor {_short(name)}: unsupported dtype {_short(dtype)}")
    if (not isinstance(shape, list) or not all(_is_count(d) for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_count(o) for o in offsets)):
        raise SafetensorsError(path, f"tensor {_short(name)}: malformed shape or data_offsets")
    begin, end = offsets
    n_elements = 1
    for d in shape:
        n_elements *= d
    file_size, loaded_size = DTYPE_BYTES[dtype]
    # data_bytes 0: a header-only file, whose offsets have no data to lie inside
    if not 0 <= begin <= end or (data_bytes and end > data_bytes):
        raise SafetensorsError(path, f"tensor {_short(name)}: data_offsets {offsets} outside the "
                                     f"{data_bytes}-byte data section")
    if end - begin != n_elements * file_size:
        raise SafetensorsError(path, f"tensor {_short(name)}: {end - begin} data bytes for "
                                     f"{n_elements} {dtype} values")
    return StTensor(name, dtype, tuple(shape), n_elements * loaded_size)


def _is_count(value: object) -> bool:
    """A non-negative JSON integer (not a bool, which Python counts as an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_safetensors(path: str | os.PathLike[str]) -> tuple[StTensor, ...]:
    """The tensor index of a safetensors file; raises BadInput (exit 2) if unusable."""
    path = str(path)
    try:
        header = _read_header(path)
    except OSError as e:
        raise SafetensorsError(path, e.strerror or str(e)) from None
    return tuple(_tensor(path, name, entry, header.data_bytes)
                 for name, entry in header.entries.items() if name != "__metadata__")
