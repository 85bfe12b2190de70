"""GGUF headers as fields: a walker and serializer of the GGUF layout, so that a valid file written by
gguf-py (gguf_factory) can be written again with any field lying — a duplicated key, a misaligned
tensor, a lying length — which gguf-py's writer refuses to produce.

`parse` reads the header of a valid file into key-value entries (raw value bytes) and tensor infos;
`Gguf.encode` writes them back byte for byte (checked against the file parsed) and records where every
field starts, so a truncation or a length lie can land on each boundary. The layout is ggml's
docs/gguf.md; the types are gguf-py's GGUFValueType.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGUFValueType as VT

from planner.system.files import write_atomic

SCALAR = {VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h", VT.UINT32: "<I", VT.INT32: "<i",
          VT.FLOAT32: "<f", VT.BOOL: "<?", VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d"}


def enc_str(s: bytes | str) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def enc_value(vtype: VT, value: object, sub: VT | None = None) -> bytes:
    """The payload of one metadata value (what follows its type field)."""
    if vtype == VT.STRING:
        return enc_str(value)  # type: ignore[arg-type]
    if vtype == VT.ARRAY:
        assert sub is not None
        items = list(value)  # type: ignore[call-overload]
        body = b"".join(enc_value(sub, v) for v in items)
        return struct.pack("<IQ", sub, len(items)) + body
    return struct.pack(SCALAR[vtype], value)


def _value_len(buf: bytes, pos: int, vtype: int) -> int:
    if vtype == VT.STRING:
        return 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype == VT.ARRAY:
        sub, n = struct.unpack_from("<IQ", buf, pos)
        p = pos + 12
        if sub == VT.STRING:
            for _ in range(n):
                p += 8 + struct.unpack_from("<Q", buf, p)[0]
            return p - pos
        return 12 + n * struct.calcsize(SCALAR[VT(sub)])
    return struct.calcsize(SCALAR[VT(vtype)])


@dataclass
class KV:
    key: bytes
    vtype: int
    payload: bytes


@dataclass
class TI:
    name: bytes
    dims: list[int]
    ggml_type: int
    offset: int


@dataclass
class Gguf:
    version: int
    kvs: list[KV]
    tis: list[TI]
    alignment: int = 32
    data_bytes: int = 0
    n_tensors: int | None = None   # a lying count; None: the real one
    n_kv: int | None = None
    boundaries: list[tuple[int, str]] = field(default_factory=list)  # (offset, field kind) of the last encode

    def kv(self, key: str) -> KV | None:
        return next((e for e in self.kvs if e.key == key.encode()), None)

    def set(self, key: str, vtype: VT, value: object, sub: VT | None = None) -> None:
        entry = KV(key.encode(), int(vtype), enc_value(vtype, value, sub))
        for i, e in enumerate(self.kvs):
            if e.key == entry.key:
                self.kvs[i] = entry
                return
        self.kvs.append(entry)

    def drop(self, key: str) -> None:
        self.kvs = [e for e in self.kvs if e.key != key.encode()]

    def encode(self) -> bytes:
        out = bytearray(b"GGUF")
        b = self.boundaries = [(0, "magic")]

        def put(data: bytes, kind: str) -> None:
            b.append((len(out), kind))
            out.extend(data)

        put(struct.pack("<I", self.version), "version")
        put(struct.pack("<Q", len(self.tis) if self.n_tensors is None else self.n_tensors), "count")
        put(struct.pack("<Q", len(self.kvs) if self.n_kv is None else self.n_kv), "count")
        for e in self.kvs:
            put(struct.pack("<Q", len(e.key)), "length")
            put(e.key, "key")
            put(struct.pack("<I", e.vtype), "type")
            if e.vtype == VT.ARRAY:
                put(e.payload[:4], "type")
                put(e.payload[4:12], "length")
                put(e.payload[12:], "value")
            elif e.vtype == VT.STRING:
                put(e.payload[:8], "length")
                put(e.payload[8:], "value")
            else:
                put(e.payload, "value")
        for t in self.tis:
            put(struct.pack("<Q", len(t.name)), "length")
            put(t.name, "name")
            put(struct.pack("<I", len(t.dims)), "count")
            put(struct.pack(f"<{len(t.dims)}Q", *t.dims), "dims")
            put(struct.pack("<I", t.ggml_type), "ggml_type")
            put(struct.pack("<Q", t.offset), "offset")
        b.append((len(out), "end"))
        pad = -len(out) % self.alignment if self.alignment > 0 else 0
        return bytes(out) + bytes(pad)

    def write(self, path: Path, truncate_at: int | None = None) -> Path:
        header = self.encode()

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                f.write(header if truncate_at is None else header[:truncate_at])
                if truncate_at is None:
                    f.truncate(len(header) + self.data_bytes)   # the tensor data: a sparse hole

        write_atomic(path, write)
        return path


def parse(data: bytes, file_size: int) -> Gguf:
    """A valid GGUF's header as fields (the files gguf-py writes; no checks)."""
    version, n_t, n_kv = struct.unpack_from("<IQQ", data, 4)
    pos, kvs = 24, []
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8:pos + 8 + klen]
        (vtype,) = struct.unpack_from("<I", data, pos + 8 + klen)
        pos += 12 + klen
        n = _value_len(data, pos, vtype)
        kvs.append(KV(key, vtype, data[pos:pos + n]))
        pos += n
    tis = []
    for _ in range(n_t):
        (nlen,) = struct.unpack_from("<Q", data, pos)
        name = data[pos + 8:pos + 8 + nlen]
        pos += 8 + nlen
        (nd,) = struct.unpack_from("<I", data, pos)
        dims = list(struct.unpack_from(f"<{nd}Q", data, pos + 4))
        pos += 4 + 8 * nd
        gtype, off = struct.unpack_from("<IQ", data, pos)
        pos += 12
        tis.append(TI(name, dims, gtype, off))
    g = Gguf(version, kvs, tis)
    align = g.kv("general.alignment")
    g.alignment = struct.unpack("<I", align.payload)[0] if align is not None else 32
    start = pos + (-pos % g.alignment)
    g.data_bytes = file_size - start
    assert g.encode() == data[:start], "the walker must re-encode gguf-py's header byte for byte"
    return g


def load(path: Path) -> Gguf:
    data = path.read_bytes()
    return parse(data, len(data))
