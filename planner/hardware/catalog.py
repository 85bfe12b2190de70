"""The hardware catalog (configs/catalog.yaml): vendors' datasheet figures by device id.

Used to describe hardware a user does not have yet (`--device 2xrtx3090`, `catalog:` in an
inventory), to fill bandwidth and throughput for detected devices by their description, and
listed by `fitplan catalog`. Every entry names its source (`source:`); a figure the source does
not give is null (0 inside: unknown), never estimated.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.core.errors import BadInput
from planner.core.render import table
from planner.core.units import fmt_bytes
from planner.hardware.inventory import LOCAL_BACKENDS, LOCAL_GPU_KINDS, Backend, DeviceKind, one_of, parse_link
from planner.system import schema as ds

GB = 1e9     # vendors quote bandwidth in decimal GB/s
TERA = 1e12

_DEVICE_KEYS = {
    "description": "the vendor's product name",
    "match": "a list of strings a detected device description may contain",
    "kind": one_of(k.value for k in LOCAL_GPU_KINDS),
    "backend": one_of(b.value for b in LOCAL_BACKENDS),
    "memory": "a size such as 24GiB (null for a UMA part: the host's RAM)",
    "bandwidth_gbs": "memory bandwidth in GB/s (null when unpublished)",
    "fp16_tflops": "dense fp16 matrix throughput in TFLOPS (null when unpublished)",
    "link": "a PCIe link such as pcie4x16",
    "uma": "true when the memory is system RAM",
    "source": "the document the figures come from: vendor, title (and section)",
    "measured": "figures fitplan measured on this product with the pinned llama.cpp: {stream_gbs, kernel_us, source}",
}
_MEASURED_KEYS = {
    "stream_gbs": "the bandwidth the pinned llama.cpp's decode streams weights at, in GB/s",
    "kernel_us": "microseconds per op node of a decoded token's graph (a kernel launched each)",
    "source": "the record and the method the figures come from",
}
_HOST_KEYS = {
    "description": "what the host is",
    "bandwidth_gbs": "RAM bandwidth in GB/s",
    "fp16_tflops": "CPU fp16 throughput in TFLOPS (null when unpublished)",
    "source": "the document the figures come from",
}
# A catalog device is a product in a machine: behind an rpc-server it is the `@host:port` that
# makes it an RPC device (planner.hardware.inventory_yaml).
_KINDS = {k.value: k for k in LOCAL_GPU_KINDS}
_BACKENDS = {b.value: b for b in LOCAL_BACKENDS}
_REQUIRED = ("description", "kind", "backend", "memory", "bandwidth_gbs", "fp16_tflops", "source")
HOST_KIND = "host"   # `fitplan catalog --kind host`: the host memory configurations


@dataclass(frozen=True)
class CatalogDevice:
    id: str
    description: str
    kind: DeviceKind
    backend: Backend
    total_bytes: int
    bandwidth_bytes_s: int
    fp16_flops: int
    link_bytes_s: int
    uma: bool
    match: tuple[str, ...]
    source: str = ""        # total_bytes 0: a UMA part whose memory is the host's RAM
    stream_bytes_s: int = 0          # measured: decode's weight-streaming bandwidth (0 = not measured)
    kernel_seconds: float = 0.0      # measured: seconds per op node of a decoded token's graph
    measured_source: str = ""


@dataclass(frozen=True)
class CatalogHost:
    id: str
    description: str
    bandwidth_bytes_s: int
    fp16_flops: int
    source: str = ""


@dataclass(frozen=True)
class Catalog:
    devices: dict[str, CatalogDevice]
    hosts: dict[str, CatalogHost]
    path: str


def catalog_path() -> Path:
    """configs/catalog.yaml next to the package, or $FITPLAN_CATALOG."""
    env = os.environ.get("FITPLAN_CATALOG")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "configs" / "catalog.yaml"


@lru_cache(maxsize=4)
def load_catalog(path: str | None = None) -> Catalog:
    where = ds.Where(str(path or catalog_path()))
    top = {"devices": "device entries by id", "hosts": "host entries by id"}
    doc = ds.mapping(ds.read_yaml(where.file), where, top, ("devices",))
    devices = ds.table(doc["devices"], where.key("devices"), "device entries")
    hosts = ds.table(doc.get("hosts") or {}, where.key("hosts"), "host entries")
    return Catalog(
        devices={str(k).lower(): _device(str(k).lower(), v, where.key("devices").key(str(k)))
                 for k, v in devices.items()},
        hosts={str(k).lower(): _host(str(k).lower(), v, where.key("hosts").key(str(k))) for k, v in hosts.items()},
        path=where.file,
    )


def _optional_flops(value: Any, where: ds.Where) -> int:
    return 0 if value is None else int(ds.number(value, where, "TFLOPS") * TERA)


def _optional_rate(value: Any, where: ds.Where) -> int:
    return 0 if value is None else int(ds.number(value, where, "GB/s") * GB)


def _device(ident: str, entry: Any, where: ds.Where) -> CatalogDevice:
    entry = ds.mapping(entry, where, _DEVICE_KEYS, _REQUIRED)
    description = ds.text(entry["description"], where.key("description"))
    link_text = entry.get("link")
    link = 0
    if link_text is not None:
        link = parse_link(str(link_text)) or 0
        if not link:
            raise where.key("link").error(f"expected a PCIe link such as pcie4x16; got {link_text!r}")
    match = ds.sequence(entry.get("match", [description]), where.key("match"), "strings")
    uma = ds.flag(entry.get("uma", False), where.key("uma"))
    if entry["memory"] is None and not uma:
        raise where.key("memory").error("expected a size: only a UMA part (uma: true) may leave it null")
    measured: dict[str, Any] = {}
    if "measured" in entry:
        at = where.key("measured")
        measured = ds.mapping(entry["measured"], at, _MEASURED_KEYS, ("stream_gbs", "kernel_us", "source"))
        measured = {"stream_bytes_s": int(ds.number(measured["stream_gbs"], at.key("stream_gbs"), "GB/s") * GB),
                    "kernel_seconds": ds.number(measured["kernel_us"], at.key("kernel_us"), "microseconds") * 1e-6,
                    "measured_source": ds.text(measured["source"], at.key("source"))}
    return CatalogDevice(
        id=ident,
        description=description,
        kind=ds.choice(entry["kind"], where.key("kind"), _KINDS),
        backend=ds.choice(entry["backend"], where.key("backend"), _BACKENDS),
        total_bytes=0 if entry["memory"] is None else ds.size(entry["memory"], where.key("memory")),
        bandwidth_bytes_s=_optional_rate(entry["bandwidth_gbs"], where.key("bandwidth_gbs")),
        fp16_flops=_optional_flops(entry["fp16_tflops"], where.key("fp16_tflops")),
        link_bytes_s=link,
        uma=uma,
        match=tuple(ds.text(m, where.key("match").index(i)) for i, m in enumerate(match)),
        source=ds.text(entry["source"], where.key("source")),
        **measured,
    )


def _host(ident: str, entry: Any, where: ds.Where) -> CatalogHost:
    entry = ds.mapping(entry, where, _HOST_KEYS, ("description", "bandwidth_gbs", "source"))
    return CatalogHost(
        id=ident,
        description=ds.text(entry["description"], where.key("description")),
        bandwidth_bytes_s=int(ds.number(entry["bandwidth_gbs"], where.key("bandwidth_gbs"), "GB/s") * GB),
        fp16_flops=_optional_flops(entry.get("fp16_tflops"), where.key("fp16_tflops")),
        source=ds.text(entry["source"], where.key("source")),
    )


def _unknown(kind: str, ident: str, known: list[str], where: ds.Where) -> Exception:
    close = difflib.get_close_matches(ident.lower(), known, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    examples = ", ".join(known[:4])
    return where.error(f"unknown {kind} {ident!r}{hint}; expected an id from {catalog_path().name} such as {examples}")


def device(ident: str, where: ds.Where | None = None) -> CatalogDevice:
    cat = load_catalog()
    entry = cat.devices.get(ident.strip().lower())
    if entry is None:
        raise _unknown("catalog device", ident, sorted(cat.devices), where or ds.Where("--device"))
    return entry


def host(ident: str, where: ds.Where | None = None) -> CatalogHost:
    cat = load_catalog()
    entry = cat.hosts.get(ident.strip().lower())
    if entry is None:
        raise _unknown("catalog host", ident, sorted(cat.hosts), where or ds.Where("--host"))
    return entry


def match_description(description: str) -> CatalogDevice | None:
    """The catalog device whose longest `match` string occurs in a detected description
    ('NVIDIA GeForce RTX 3090 Ti' matches 'RTX 3090 Ti' before 'RTX 3090')."""
    text = description.lower()
    best: tuple[int, CatalogDevice] | None = None
    for entry in load_catalog().devices.values():
        for needle in entry.match:
            if needle.lower() in text and (best is None or len(needle) > best[0]):
                best = (len(needle), entry)
    return best[1] if best else None


# ----------------------------------------------------------------------------- `fitplan catalog`

CATALOG_KINDS = (*(k.value for k in LOCAL_GPU_KINDS), HOST_KIND)


@dataclass(frozen=True)
class CatalogRow:
    """One entry as `fitplan catalog` lists it: figures in bytes, bytes/s and FLOP/s, None when the
    source gives none; `source` is where every figure of the entry comes from."""

    id: str
    kind: str
    description: str
    backend: str | None
    memory_bytes: int | None
    bandwidth_bytes_s: int | None
    fp16_flops: int | None
    link_bytes_s: int | None
    uma: bool
    source: str


@dataclass(frozen=True)
class CatalogListing:
    path: str
    rows: tuple[CatalogRow, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"catalog": self.path, "count": len(self.rows), "entries": [dict(vars(r)) for r in self.rows]}

    def to_table(self) -> str:
        def rate(n: int | None, scale: float, digits: int) -> str:
            return "" if n is None else f"{n / scale:.{digits}f}"

        rows = [[r.id, r.kind, r.backend or "", "" if r.memory_bytes is None else fmt_bytes(r.memory_bytes),
                 rate(r.bandwidth_bytes_s, GB, 1), rate(r.fp16_flops, TERA, 1), r.description] for r in self.rows]
        heads = ["id", "kind", "backend", "memory", "GB/s", "fp16 TFLOPS", "description"]
        return (table(heads, rows, align="lllrrrl") + f"\n\n{len(self.rows)} entries from {self.path}; "
                "empty: the source gives no such figure (a UMA part's memory is the host's RAM)\n")


def _nonzero(n: int) -> int | None:
    return n or None


def _device_row(d: CatalogDevice) -> CatalogRow:
    return CatalogRow(d.id, d.kind.value, d.description, d.backend.value, _nonzero(d.total_bytes),
                      _nonzero(d.bandwidth_bytes_s), _nonzero(d.fp16_flops), _nonzero(d.link_bytes_s), d.uma, d.source)


def _host_row(h: CatalogHost) -> CatalogRow:
    return CatalogRow(h.id, HOST_KIND, h.description, None, None, _nonzero(h.bandwidth_bytes_s),
                      _nonzero(h.fp16_flops), None, False, h.source)


def list_catalog(kind: str | None = None, match: str | None = None) -> CatalogListing:
    """The catalog's entries (devices, then hosts), of one kind and/or whose id or description
    contains `match` (case-insensitive)."""
    if kind is not None and kind not in CATALOG_KINDS:
        raise BadInput(f"--kind {kind!r}: expected {one_of(CATALOG_KINDS)}")
    cat = load_catalog()
    rows = [_device_row(d) for d in cat.devices.values()] + [_host_row(h) for h in cat.hosts.values()]
    needle = (match or "").strip().lower()
    chosen = tuple(r for r in rows if (kind is None or r.kind == kind)
                   and (not needle or needle in r.id or needle in r.description.lower()))
    return CatalogListing(cat.path, chosen)
