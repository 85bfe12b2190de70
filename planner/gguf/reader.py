"""GGUF header reading: through a byte source, bounds-checked, tensor data never touched.

gguf-py's `GGUFReader` builds a Python object per array element; on a 262k-token vocabulary
that takes ~15 s, far from the 1 s `inspect` budget. This reader walks the same format
(gguf-py's enums and `GGML_QUANT_SIZES` are the tables) but skips large arrays by arithmetic,
and checks every length against the bytes the file holds *before* allocating, so a hostile
header is refused instead of exhausting memory. It reads from a `planner.gguf.source` source
(a mapped local file, or a URL read by Range) and asks it for more bytes only when the parse
reaches the end of what it has, saying how many more it certainly needs.

A file holding the whole header but not all of the tensor data (a header-only file, as
`fitplan fetch-header` writes) is a model to plan with: `ModelFile.has_weights` is False and
whatever reads tensor data calls `require_weights` first.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType, Keys

from planner.core.errors import BadInput, GGUFError, RemoteError
from planner.core.units import pad
from planner.gguf.cursor import Cursor, short
from planner.gguf.keys import KeyType, key_types
from planner.gguf.location import open_source
from planner.gguf.source import Buffer, ByteSource, is_url

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
GGML_MAX_DIMS = 4
# Arrays longer than this (tokenizer vocabularies, merges, scores) are not materialised.
MAX_MATERIALISED_ARRAY = 4096
# The fewest bytes a metadata entry (key length 8, type 4, a one-byte value) and a tensor info
# (name length 8, n_dims 4, one dimension 8, type 4, offset 8) can take: what the rest of a
# header certainly holds, told to a remote source so it fetches it in one request.
MIN_KV_BYTES = 13
MIN_TENSOR_INFO_BYTES = 32
# A tensor said to end past this is hostile even in a header-only file (which cannot be checked
# against its data): 256 TiB.
MAX_TENSOR_END = 1 << 48
# ggml.h GGML_MAX_NAME: gguf.cpp refuses a tensor name of this many bytes or more
GGML_MAX_NAME = 64
INT64_MAX = (1 << 63) - 1
# No tensor of a model llama.cpp loads is this wide or more: it creates every tensor with dimensions
# from its 32-bit hyperparameters (llama_hparams' uint32_t fields, n_vocab an int32_t) and refuses a file
# tensor of another shape ("tensor '%s' has wrong shape", llama_model_loader::check_tensor_dims). A
# dimension past it is a lie, even in a header-only file whose data cannot be checked against the shape.
MAX_TENSOR_DIM = 1 << 32

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
    has_weights: bool = True  # False: a header-only file, or a model read over HTTP
    header_digest: str | None = field(default=None, repr=False)  # sha256 of a header read over HTTP

    @property
    def remote(self) -> bool:
        return is_url(self.path)

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
        a plan file records to recognise its model. A URL's comes from the bytes already read."""
        if self.header_digest is not None:
            return self.header_digest
        with open(self.path, "rb") as f:
            return _digest(f.read(self.header_bytes), self.header_bytes)

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None


def _digest(header: Buffer, header_bytes: int) -> str:
    """sha256 of the header's `header_bytes` bytes; a header-only file that stops before the
    alignment padding hashes as if the padding (zeros, as every GGUF writer pads) were there."""
    data = bytes(header[:header_bytes])
    return hashlib.sha256(data + bytes(header_bytes - len(data))).hexdigest()


def require_weights(model: ModelFile, what: str) -> None:
    """Refuse, in one line, to read tensor data that is not on this machine."""
    if model.has_weights:
        return
    if model.remote:
        raise BadInput(f"{model.path}: {what} needs the weights, and this model is read over HTTP "
                       f"(its header only): download it and pass the local file")
    raise BadInput(f"{model.path}: {what} needs the weights, and this is a header-only file "
                   f"(it holds no tensor data): pass the full model file")


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


def _value_type(cur: Cursor, raw: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFError(cur.path, f"unknown metadata value type {raw} for key {short(key)}", cur.pos - 4) from None


def _read_value(cur: Cursor, vtype: GGUFValueType, key: str) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of {short(key)}")
    if vtype in _SCALAR_FORMAT:
        return cur.unpack(_SCALAR_FORMAT[vtype], f"value of {short(key)}")
    # ARRAY: element type first, then a 64-bit count (seed 003 notes the order trap).
    etype = _value_type(cur, cur.unpack("<I", f"array type of {short(key)}"), key)
    count = cur.unpack("<Q", f"array length of {short(key)}")
    if etype == GGUFValueType.ARRAY:
        raise GGUFError(cur.path, f"nested arrays are not supported (key {short(key)})")
    min_elem = 8 if etype == GGUFValueType.STRING else struct.calcsize(_SCALAR_FORMAT[etype])
    if count * min_elem > cur.size - cur.pos:
        raise GGUFError(cur.path, f"hostile header: array {short(key)} claims {count} elements, "
                                  f"more than the {cur.size - cur.pos} remaining bytes can hold")
    if count > MAX_MATERIALISED_ARRAY:
        if etype == GGUFValueType.STRING:
            cur.skip_strings(count, f"array {short(key)}")
        else:
            cur.pos += count * min_elem   # the next read fetches what a remote source skipped
        return SkippedArray(etype, count)
    if etype == GGUFValueType.STRING:
        return tuple(cur.string(f"element of {short(key)}") for _ in range(count))
    fmt = _SCALAR_FORMAT[etype]
    cur.need(count * min_elem, f"array {short(key)}")
    values = struct.unpack_from(f"<{count}{fmt[1]}", cur.buf, cur.pos)
    cur.pos += count * min_elem
    return tuple(values)


def _ggml_type(cur: Cursor, raw: int, name: str) -> GGMLQuantizationType:
    try:
        qtype = GGMLQuantizationType(raw)
    except ValueError:
        qtype = None
    if qtype is None or qtype not in GGML_QUANT_SIZES:
        raise GGUFError(cur.path, f"tensor {short(name)} has unknown ggml type {raw}", cur.pos - 4)
    return qtype


@dataclass(frozen=True)
class _Shard:
    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    header_bytes: int = 0
    has_weights: bool = True
    digest: str | None = None    # sha256 of the header, for a shard read over HTTP


@dataclass(frozen=True)
class ShardHeader:
    """One file's header bytes (up to where its tensor data begins) and its split count."""

    data: bytes
    split_count: int


def read_header_bytes(location: str) -> ShardHeader:
    """The header of one GGUF file, parsed (so it is known to be whole) and returned as bytes, the
    alignment padding included: written out, it is a header-only file of the same model."""
    with open_source(location) as source:
        shard = _parse(source, 0)
        source.keep(shard.header_bytes)
        data = bytes(source.prefix(shard.header_bytes)[:shard.header_bytes])
    count = int(shard.metadata.get(Keys.Split.LLM_KV_SPLIT_COUNT, 1) or 1)
    return ShardHeader(data + bytes(shard.header_bytes - len(data)), count)


def _read_shard(location: str, shard_no: int) -> _Shard:
    with open_source(location) as source:
        shard = _parse(source, shard_no)
        source.keep(shard.header_bytes)
        return shard


def _parse(source: ByteSource, shard_no: int) -> _Shard:
    cur = Cursor(source)
    path = cur.path
    cur.fill(4)
    if cur.avail < 4 or bytes(cur.buf[:4]) != GGUF_MAGIC:
        raise GGUFError(path, "not a GGUF file (it is empty)" if cur.avail == 0 else "not a GGUF file (bad magic)")
    cur.pos = 4
    version = cur.unpack("<I", "version")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(path, f"unsupported GGUF version {version} (fitplan reads versions 2 and 3)")
    n_tensors = cur.unpack("<Q", "tensor count")
    n_kv = cur.unpack("<Q", "metadata count")
    if n_kv * MIN_KV_BYTES > cur.size - cur.pos:
        raise GGUFError(path, f"hostile header: {n_kv} metadata entries cannot fit in {cur.size} bytes")
    if n_tensors * MIN_TENSOR_INFO_BYTES > cur.size - cur.pos:
        raise GGUFError(path, f"hostile header: {n_tensors} tensors cannot fit in {cur.size} bytes")

    metadata, entries = _read_metadata(cur, n_kv, n_tensors * MIN_TENSOR_INFO_BYTES)
    _check_types(path, metadata, entries)
    infos: list[_RawTensorInfo] = []
    seen: dict[str, int] = {}
    for i in range(n_tensors):
        cur.reserve = (n_tensors - i - 1) * MIN_TENSOR_INFO_BYTES
        info = _read_tensor_info(cur, i)
        if info.name in seen:   # gguf.cpp: "duplicate tensor name"
            raise GGUFError(path, f"tensor {short(info.name)} is listed twice (tensors {seen[info.name]} and {i})",
                            info.at)
        seen[info.name] = i
        infos.append(info)
    alignment = int(metadata.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(path, f"{Keys.General.ALIGNMENT} {alignment} is not a power of two",
                        entries[Keys.General.ALIGNMENT].offset)
    data_start = pad(cur.pos, alignment)
    tensors = tuple(_tensor(cur, info, data_start, shard_no) for info in infos)
    _check_layout(path, infos, tensors, alignment)
    data_end = max((t.data_offset + t.n_bytes for t in tensors), default=data_start)
    has_weights = not source.remote and source.size is not None and data_end <= source.size
    digest = _digest(cur.buf, data_start) if source.remote else None
    return _Shard(version, metadata, tensors, data_start, has_weights, digest)


@dataclass(frozen=True)
class _Entry:
    """How a metadata value is stored: its GGUF type (and its elements', for an array) and where its
    entry starts in the file."""

    vtype: GGUFValueType
    element: GGUFValueType | None
    offset: int


def _read_metadata(cur: Cursor, n_kv: int, after: int) -> tuple[dict[str, Any], dict[str, _Entry]]:
    """The key-value section, and each key's stored type; `after` is what the tensor infos that
    follow it certainly hold."""
    metadata: dict[str, Any] = {}
    entries: dict[str, _Entry] = {}
    for i in range(n_kv):
        cur.reserve = (n_kv - i - 1) * MIN_KV_BYTES + after
        at = cur.pos
        key = cur.string("a metadata key")
        if not key:    # gguf.cpp: "key %d is empty"
            raise GGUFError(cur.path, f"metadata key {i} is empty", at)
        if key in entries:   # gguf.cpp: "duplicate key"
            raise GGUFError(cur.path, f"metadata key {short(key)} is listed twice (first at byte "
                                      f"{entries[key].offset})", at)
        vtype = _value_type(cur, cur.unpack("<I", f"type of {short(key)}"), key)
        element = None
        if vtype == GGUFValueType.ARRAY:
            cur.need(4, f"array type of {short(key)}")
            raw = struct.unpack_from("<I", cur.buf, cur.pos)[0]
            element = GGUFValueType(raw) if raw in GGUFValueType._value2member_map_ else None
        metadata[key] = _read_value(cur, vtype, key)
        entries[key] = _Entry(vtype, element, at)
    return metadata, entries


def _type_name(entry: _Entry) -> str:
    return f"an array of {entry.element.name}" if entry.element is not None else entry.vtype.name


def _check_types(path: str, metadata: dict[str, Any], entries: dict[str, _Entry]) -> None:
    """Every key fitplan reads must hold the type llama.cpp reads it as (planner.gguf.keys): llama.cpp
    refuses a key of another type, so fitplan does not convert '12' to 12 or 2.5 to 2."""
    arch_entry = entries.get(Keys.General.ARCHITECTURE)
    is_str = arch_entry is not None and arch_entry.vtype == GGUFValueType.STRING
    arch = metadata[Keys.General.ARCHITECTURE] if is_str else ""
    expected: dict[str, KeyType] = key_types(arch)
    for key, entry in entries.items():
        want = expected.get(key)
        if want is not None and not want.accepts(entry.vtype, entry.element):
            raise GGUFError(path, f"key {short(key)} is {_type_name(entry)}; llama.cpp reads it as {want.describe()} "
                                  f"and refuses any other type", entry.offset)


@dataclass(frozen=True)
class _RawTensorInfo:
    """A tensor-index entry as the header spells it: the offset is relative to the data section."""

    name: str
    ggml_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    at: int = 0     # where the entry starts in the file


def _read_tensor_info(cur: Cursor, i: int) -> _RawTensorInfo:
    at = cur.pos
    name = cur.string(f"name of tensor {i}", limit=GGML_MAX_NAME - 1)
    n_dims = cur.unpack("<I", f"dimension count of {short(name)}")
    if n_dims == 0 or n_dims > GGML_MAX_DIMS:
        raise GGUFError(cur.path, f"hostile header: tensor {short(name)} has {n_dims} dimensions (ggml allows 1 to 4)")
    cur.need(8 * n_dims, f"dimensions of {short(name)}")
    shape = struct.unpack_from(f"<{n_dims}Q", cur.buf, cur.pos)
    n_elements = 1
    for d in shape:   # gguf.cpp reads each dimension as int64 and refuses a product past INT64_MAX
        n_elements *= d
        if d > INT64_MAX or n_elements > INT64_MAX:
            raise GGUFError(cur.path, f"hostile header: tensor {short(name)} has shape {list(shape)}, "
                                      f"more elements than int64 holds", cur.pos)
    if max(shape) >= MAX_TENSOR_DIM:
        raise GGUFError(cur.path, f"hostile header: tensor {short(name)} has shape {list(shape)}; llama.cpp "
                                  f"creates no tensor with a dimension of 2^32 or more", cur.pos)
    cur.pos += 8 * n_dims
    qtype = _ggml_type(cur, cur.unpack("<I", f"type of {short(name)}"), name)
    offset = cur.unpack("<Q", f"data offset of {short(name)}")
    return _RawTensorInfo(name, qtype, tuple(int(d) for d in shape), offset, at)


def _check_layout(path: str, infos: list[_RawTensorInfo], tensors: tuple[TensorInfo, ...], alignment: int) -> None:
    """Tensor data in index order, each tensor at the aligned end of the one before: gguf.cpp refuses
    any other offset ("tensor has offset X, expected Y"), so misaligned, overlapping or scattered
    data is a broken file, not a layout to plan."""
    expected = 0
    for info, t in zip(infos, tensors, strict=True):
        if info.offset != expected:
            raise GGUFError(path, f"tensor {short(info.name)} has data offset {info.offset}, expected {expected} "
                                  f"(tensor data must follow the index order, each tensor {alignment}-byte aligned "
                                  f"after the one before)", info.at)
        expected += pad(t.n_bytes, alignment)


def _tensor(cur: Cursor, info: _RawTensorInfo, data_start: int, shard_no: int) -> TensorInfo:
    """The entry's size and absolute offset, refused where its rows or its bytes do not fit."""
    name, qtype, shape = info.name, info.ggml_type, info.shape
    block_size, _ = GGML_QUANT_SIZES[qtype]
    if shape[0] % block_size:
        raise GGUFError(cur.path, f"tensor {short(name)}: row length {shape[0]} is not a multiple of "
                                  f"{qtype.name}'s block size {block_size}")
    n_bytes = tensor_nbytes(qtype, shape)
    end = data_start + info.offset + n_bytes
    # A header-only file holds no data to check against; a URL's size is the whole file's.
    limit = cur.source.size if cur.source.remote and cur.source.size is not None else MAX_TENSOR_END
    if end > limit:
        raise GGUFError(cur.path, f"truncated: tensor {short(name)} ends at byte {end}, the file has {limit}"
                        if limit != MAX_TENSOR_END else f"hostile header: tensor {short(name)} ends at byte {end}")
    return TensorInfo(name, qtype, shape, n_bytes, shard_no, data_start + info.offset)


def shard_paths(path: str) -> list[str]:
    """All shards of a split model named like llama.cpp's gguf-split (`-00001-of-00003.gguf`)."""
    m = _SPLIT_NAME.match(path)
    if not m:
        return [path]
    count = int(m.group("count"))
    return [f"{m.group('prefix')}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _read_other_shard(location: str, shard_no: int, count: int, named: str) -> _Shard:
    if not is_url(location) and not Path(location).exists():
        raise GGUFError(named, f"missing shard {shard_no + 1} of {count}: {location}")
    try:
        return _read_shard(location, shard_no)
    except RemoteError as e:
        if e.status == 404:
            raise GGUFError(named, f"missing shard {shard_no + 1} of {count}: {location}") from None
        raise


def _check_shards(paths: list[str], shards: list[_Shard]) -> None:
    """Each shard says which it is, and no tensor is in two: llama_model_loader refuses a shard whose
    split.no is not its place ("invalid split file idx") and a tensor listed twice ("is duplicated")."""
    owner: dict[str, int] = {}
    for i, (p, shard) in enumerate(zip(paths, shards, strict=True)):
        no = shard.metadata.get(Keys.Split.LLM_KV_SPLIT_NO)
        if no != i:
            said = "has no split.no" if no is None else f"says split.no {no}"
            raise GGUFError(p, f"shard {i + 1} of {len(paths)} {said}, expected {i} (is it a copy of another shard?)")
        for t in shard.tensors:
            if t.name in owner:
                raise GGUFError(p, f"tensor {short(t.name)} is in shard {owner[t.name] + 1} and shard {i + 1}")
            owner[t.name] = i


def read_model(path: str | os.PathLike[str], require_architecture: bool = True) -> ModelFile:
    """Read a GGUF model's header (and every shard's tensor index for a split model) from a local
    path or an http(s):// URL. require_architecture=False accepts files without
    general.architecture (stable-diffusion.cpp's converter writes no metadata); their
    architecture is then ''."""
    path = str(path)
    first = read_first = _read_shard(path, 0)
    paths = [path]
    shards = [first]
    split_count = int(first.metadata.get(Keys.Split.LLM_KV_SPLIT_COUNT, 1) or 1)
    if split_count > 1:
        paths = shard_paths(path)
        if len(paths) != split_count:
            raise GGUFError(path, f"{Keys.Split.LLM_KV_SPLIT_COUNT} is {split_count} but the file name does not follow "
                                  f"the NAME-00001-of-{split_count:05d}.gguf pattern")
        given = paths.index(path) if path in paths else -1
        if given != 0:
            first = _read_other_shard(paths[0], 0, split_count, path)
        shards = [first]
        for i, shard in enumerate(paths[1:], start=1):
            if i == given:   # the file named on the command line is parsed already
                shards.append(replace(read_first, tensors=tuple(replace(t, shard=i) for t in read_first.tensors)))
            else:
                shards.append(_read_other_shard(shard, i, split_count, path))
        _check_shards(paths, shards)
    arch = first.metadata.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        if require_architecture:
            raise GGUFError(path, f"missing required key {Keys.General.ARCHITECTURE}")
        arch = ""
    if not any(s.tensors for s in shards):
        raise GGUFError(path, "the file lists no tensors: a vocabulary-only or empty GGUF, not a model to plan")
    return ModelFile(path=paths[0], version=first.version, architecture=arch,
                     metadata=first.metadata, tensors=tuple(t for s in shards for t in s.tensors),
                     shard_paths=tuple(paths), header_bytes=first.header_bytes,
                     has_weights=all(s.has_weights for s in shards), header_digest=first.digest)
