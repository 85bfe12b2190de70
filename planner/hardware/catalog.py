"""The hardware catalog (configs/catalog.yaml): vendors' datasheet figures by device id.

Used to describe hardware a user does not have yet (`--device 2xrtx3090`, `catalog:` in an
inventory) and to fill bandwidth and throughput for detected devices by their description.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.core import schema as ds
from planner.hardware.inventory import LOCAL_BACKENDS, LOCAL_GPU_KINDS, Backend, DeviceKind, one_of, parse_link

GB = 1e9     # vendors quote bandwidth in decimal GB/s
TERA = 1e12

_DEVICE_KEYS = {
    "description": "the vendor's product name",
    "match": "a list of strings a detected device description may contain",
    "kind": one_of(k.value for k in LOCAL_GPU_KINDS),
    "backend": one_of(b.value for b in LOCAL_BACKENDS),
    "memory": "a size such as 24GiB",
    "bandwidth_gbs": "memory bandwidth in GB/s",
    "fp16_tflops": "dense fp16 matrix throughput in TFLOPS (null when unpublished)",
    "link": "a PCIe link such as pcie4x16",
    "uma": "true when the memory is system RAM",
}
_HOST_KEYS = {
    "description": "what the host is",
    "bandwidth_gbs": "RAM bandwidth in GB/s",
    "fp16_tflops": "CPU fp16 throughput in TFLOPS (null when unpublished)",
}
# A catalog device is a product in a machine: behind an rpc-server it is the `@host:port` that
# makes it an RPC device (planner.hardware.inventory_yaml).
_KINDS = {k.value: k for k in LOCAL_GPU_KINDS}
_BACKENDS = {b.value: b for b in LOCAL_BACKENDS}
_REQUIRED = ("description", "kind", "backend", "memory", "bandwidth_gbs", "fp16_tflops")


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


@dataclass(frozen=True)
class CatalogHost:
    id: str
    description: str
    bandwidth_bytes_s: int
    fp16_flops: int


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
    return CatalogDevice(
        id=ident,
        description=description,
        kind=ds.choice(entry["kind"], where.key("kind"), _KINDS),
        backend=ds.choice(entry["backend"], where.key("backend"), _BACKENDS),
        total_bytes=ds.size(entry["memory"], where.key("memory")),
        bandwidth_bytes_s=int(ds.number(entry["bandwidth_gbs"], where.key("bandwidth_gbs"), "GB/s") * GB),
        fp16_flops=_optional_flops(entry["fp16_tflops"], where.key("fp16_tflops")),
        link_bytes_s=link,
        uma=ds.flag(entry.get("uma", False), where.key("uma")),
        match=tuple(ds.text(m, where.key("match").index(i)) for i, m in enumerate(match)),
    )


def _host(ident: str, entry: Any, where: ds.Where) -> CatalogHost:
    entry = ds.mapping(entry, where, _HOST_KEYS, ("description", "bandwidth_gbs"))
    return CatalogHost(
        id=ident,
        description=ds.text(entry["description"], where.key("description")),
        bandwidth_bytes_s=int(ds.number(entry["bandwidth_gbs"], where.key("bandwidth_gbs"), "GB/s") * GB),
        fp16_flops=_optional_flops(entry.get("fp16_tflops"), where.key("fp16_tflops")),
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
