"""GGUF header reading: memory-mapped, bounds-checked, tensor data never touched.

gguf-py's `GGUFReader` builds a Python object per array element; on a 262k-token vocabulary
that takes ~15 s, far from the 1 s `inspect` budget. This reader walks the same format
(gguf-py's enums and `GGML_QUANT_SIZES` are the tables) but skips large arrays by arithmetic,
and checks every length against the bytes the file still holds *before* allocating, so a
hostile header is refused instead of exhausting memory.
"""
from __future__ import annotations

import functools
import hashlib
import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType, Keys

from planner.core.errors import GGUFError
from planner.core.units import pad

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
GGML_MAX_DIMS = 4
# Arrays longer than this (tokenizer vocabularies, merges, scores) are not materialised.
MAX_MATERIALISED_ARRAY = 4096

_SCALAR_FORMAT: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class SkippedArray:
    """A long array left unread: its element type and length are all fitplan needs."""

    element_type: GGUFValueType
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length (ne0)
    n_bytes: int
    shard: int = 0
    data_offset: int = 0    # where its bytes start in its shard's file

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ModelFile:
    path: str
    version: int
    architecture: str
    metadata: dict[str, Any] = field(repr=False)
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    shard_paths: tuple[str, ...] = ()
    header_bytes: int = 0   # where the first shard's tensor data begins: the header a plan hashes

    @property
    def file_type(self) -> int | None:
        value = self.metadata.get(Keys.General.FILE_TYPE)
        return int(value) if value is not None else None

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def total_tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @functools.cached_property
    def header_sha256(self) -> str:
        """sha256 of the first shard's header (metadata and tensor index, not the weights): what
        a plan file records to recognise its model."""
        with open(self.path, "rb") as f:
            return hashlib.sha256(f.read(self.header_bytes)).hexdigest()

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None


def tensor_nbytes(ggml_type: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """ggml_nbytes for a contiguous tensor: rows x row size, row size from the type's block."""
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    row = shape[0] // block_size * type_size
    n_rows = 1
    for d in shape[1:]:
        n_rows *= d
    return row * n_rows


def row_size(ggml_type: GGMLQuantizationType, n_elements: int) -> int:
    """ggml_row_size: bytes of `n_elements` consecutive values of a (possibly quantized) type."""
    block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    return n_elements // block_size * type_size


class _Cursor:
    """Reads little-endian values from a mapped file, refusing to step past its end."""

    def __init__(self, path: str, buf: mmap.mmap | bytes) -> None:
        self.path = path
        self.buf = buf
        self.size = len(buf)
        self.pos = 0

    def need(self, n_bytes: int, what: str) -> None:
        if n_bytes < 0 or self.pos + n_bytes > self.size:
            raise GGUFError(self.path, f"truncated header: {what} at byte {self.pos} needs {n_bytes} bytes, "
                                       f"the file has {self.size - self.pos} left")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def string(self, what: str) -> str:
        length = self.unpack("<Q", f"length of {what}")
        if length > self.size - self.pos:
            raise GGUFError(self.path, f"hostile header: {what} claims {length} bytes, "
                                       f"only {self.size - self.pos} remain in the file")
        raw = bytes(self.buf[self.pos:self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, count: int, what: str) -> None:
        buf, pos, size = self.buf, self.pos, self.size
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, f"an element of {what}")
            (length,) = struct.unpack_from("<Q", buf, pos)
            pos += 8 + length
            if pos > size:
                self.pos = pos - length
                raise GGUFError(self.path, f"hostile header: an element of {what} claims {length} bytes, "
                                           f"past the end of the file")
        self.pos = pos


def _value_type(cur: _Cursor, raw: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFError(cur.path, f"unknown metadata value type {raw} for key {key!r}") from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, key: str) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of {key!r}")
    if vtype in _SCALAR_FORMAT:
        return cur.unpack(_SCALAR_FORMAT[vtype], f"value of {key!r}")
    # ARRAY: element type first, then a 64-bit count (seed 003 notes the order trap).
    etype = _value_type(cur, cur.unpack("<I", f"array type of {key!r}"), key)
    count = cur.unpack("<Q", f"array length of {key!r}")
    if etype == GGUFValueType.ARRAY:
        raise GGUFError(cur.path, f"nested arrays are not supported (key {key!r})")
    min_elem = 8 if etype == GGUFValueType.STRING else struct.calcsize(_SCALAR_FORMAT[etype])
    if count * min_elem > cur.size - cur.pos:
        raise GGUFError(cur.path, f"hostile header: array {key!r} claims {count} elements, "
                                  f"more than the {cur.size - cur.pos} remaining bytes can hold")
    if count > MAX_MATERIALISED_ARRAY:
        if etype == GGUFValueType.STRING:
            cur.skip_strings(count, f"array {key!r}")
        else:
            cur.pos += count * min_elem
        return SkippedArray(etype, count)
    if etype == GGUFValueType.STRING:
        return tuple(cur.string(f"element of {key!r}") for _ in range(count))
    fmt = _SCALAR_FORMAT[etype]
    values = struct.unpack_from(f"<{count}{fmt[1]}", cur.buf, cur.pos)
    cur.pos += count * min_elem
    return tuple(values)


def _ggml_type(cur: _Cursor, raw: int, name: str) -> GGMLQuantizationType:
    try:
        qtype = GGMLQuantizationType(raw)
    except ValueError:
        qtype = None
    if qtype is None or qtype not in GGML_QUANT_SIZES:
        raise GGUFError(cur.path, f"tensor {name!r} has unknown ggml type {raw}")
    return qtype


@dataclass(frozen=True)
class _Shard:
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    header_bytes: int = 0


def _read_shard(path: str, shard_no: int) -> _Shard:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise GGUFError(path, "no such file") from None
    except OSError as e:
        raise GGUFError(path, f"cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a directory or a device opens fine but cannot be mapped
            raise GGUFError(path, "not a regular file")
        if st.st_size == 0:
            raise GGUFError(path, "not a GGUF file (it is empty)")
        try:
            buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFError(path, f"cannot map: {e.strerror}") from None
        with buf:
            return _parse(path, buf, shard_no)
    finally:
        os.close(fd)


def _parse(path: str, buf: mmap.mmap, shard_no: int) -> _Shard:
    cur = _Cursor(path, buf)
    if cur.size < 4 or bytes(buf[:4]) != GGUF_MAGIC:
        raise GGUFError(path, "not a GGUF file (bad magic)")
    cur.pos = 4
    version = cur.unpack("<I", "version")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(path, f"unsupported GGUF version {version} (fitplan reads versions 2 and 3)")
    n_tensors = cur.unpack("<Q", "tensor count")
    n_kv = cur.unpack("<Q", "metadata count")
    # A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info 8+4+8+4+8.
    if n_kv * 13 > cur.size - cur.pos:
        raise GGUFError(path, f"hostile header: {n_kv} metadata entries cannot fit in {cur.size} bytes")
    if n_tensors * 32 > cur.size - cur.pos:
        raise GGUFError(path, f"hostile header: {n_tensors} tensors cannot fit in {cur.size} bytes")

    metadata = _read_metadata(cur, n_kv)
    infos = [_read_tensor_info(cur, i) for i in range(n_tensors)]
    alignment = int(metadata.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT) or GGUF_DEFAULT_ALIGNMENT)
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(path, f"{Keys.General.ALIGNMENT} {alignment} is not a power of two")
    data_start = pad(cur.pos, alignment)
    tensors = tuple(_tensor(cur, info, data_start, shard_no) for info in infos)
    return _Shard(version, metadata, tensors, data_start)


def _read_metadata(cur: _Cursor, n_kv: int) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("a metadata key")
        vtype = _value_type(cur, cur.unpack("<I", f"type of {key!r}"), key)
        metadata[key] = _read_value(cur, vtype, key)
    return metadata


@dataclass(frozen=True)
class _RawTensorInfo:
    """A tensor-index entry as the header spells it: the offset is relative to the data section."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int


def _read_tensor_info(cur: _Cursor, i: int) -> _RawTensorInfo:
    name = cur.string(f"name of tensor {i}")
    n_dims = cur.unpack("<I", f"dimension count of {name!r}")
    if n_dims == 0 or n_dims > GGML_MAX_DIMS:
        raise GGUFError(cur.path, f"hostile header: tensor {name!r} has {n_dims} dimensions (ggml allows 1 to 4)")
    cur.need(8 * n_dims, f"dimensions of {name!r}")
    shape = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
    cur.pos += 8 * n_dims
    qtype = _ggml_type(cur, cur.unpack("<I", f"type of {name!r}"), name)
    offset = cur.unpack("<Q", f"data offset of {name!r}")
    return _RawTensorInfo(name, qtype, tuple(int(d) for d in shape), offset)


def _tensor(cur: _Cursor, info: _RawTensorInfo, data_start: int, shard_no: int) -> TensorInfo:
    """The entry's size and absolute offset, refused where its rows or its bytes do not fit."""
    name, qtype, shape = info.name, info.ggml_type, info.shape
    block_size, _ = GGML_QUANT_SIZES[qtype]
    if shape[0] % block_size:
        raise GGUFError(cur.path, f"tensor {name!r}: row length {shape[0]} is not a multiple of "
                                  f"{qtype.name}'s block size {block_size}")
    n_bytes = tensor_nbytes(qtype, shape)
    if data_start + info.offset + n_bytes > cur.size:
        raise GGUFError(cur.path, f"truncated: tensor {name!r} ends at byte {data_start + info.offset + n_bytes}, "
                                  f"the file has {cur.size}")
    return TensorInfo(name, qtype, shape, n_bytes, shard_no, data_start + info.offset)


def shard_paths(path: str) -> list[str]:
    """All shards of a split model named like llama.cpp's gguf-split (`-00001-of-00003.gguf`)."""
    m = _SPLIT_NAME.match(path)
    if not m:
        return [path]
    count = int(m.group("count"))
    return [f"{m.group('prefix')}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def read_model(path: str | os.PathLike[str], require_architecture: bool = True) -> ModelFile:
    """Read a GGUF model's header (and every shard's tensor index for a split model).
    require_architecture=False accepts files without general.architecture (stable-diffusion.cpp's
    converter writes no metadata); their architecture is then ''."""
    path = str(path)
    first = read_first = _read_shard(path, 0)
    paths = [path]
    tensors = list(first.tensors)
    split_count = int(first.metadata.get(Keys.Split.LLM_KV_SPLIT_COUNT, 1) or 1)
    if split_count > 1:
        paths = shard_paths(path)
        if len(paths) != split_count:
            raise GGUFError(path, f"{Keys.Split.LLM_KV_SPLIT_COUNT} is {split_count} but the file name does not follow "
                                  f"the NAME-00001-of-{split_count:05d}.gguf pattern")
        given = paths.index(path) if path in paths else -1
        if given != 0:
            first = _read_shard(paths[0], 0)
            tensors = list(first.tensors)
        for i, shard in enumerate(paths[1:], start=1):
            if not Path(shard).exists():
                raise GGUFError(path, f"missing shard {i + 1} of {split_count}: {shard}")
            if i == given:   # the file named on the command line is parsed already
                tensors.extend(replace(t, shard=i) for t in read_first.tensors)
            else:
                tensors.extend(_read_shard(shard, i).tensors)
    arch = first.metadata.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        if require_architecture:
            raise GGUFError(path, f"missing required key {Keys.General.ARCHITECTURE}")
        arch = ""
    return ModelFile(path=paths[0], version=first.version, architecture=arch,
                     metadata=first.metadata, tensors=tuple(tensors), shard_paths=tuple(paths),
                     header_bytes=first.header_bytes)
