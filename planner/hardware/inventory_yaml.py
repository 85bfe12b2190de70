"""Building inventories from YAML files and from CLI shorthands.

YAML schema: configs/devices/README.md. Shorthands (`--device`):
  CUDA0=24GiB          a device of that llama.cpp name with 24 GiB (an existing one is resized)
  CUDA0=rtx3090        a device of that name with a catalog entry's figures
  2xrtx3090            two catalog devices, named after the next free indexes (CUDA0, CUDA1)
  ...,bw=360,tflops=51 any form above with its rates: memory bandwidth (GB/s), dense fp16 TFLOPS,
                       and `link=pcie4x8`, `free=10GiB`, `id=0000:01:00.0` (over a catalog's figures)
  ...@host:port        the device(s) sit behind an rpc-server at that endpoint
`--ram 64GiB` sets the host's total and available RAM.
"""
from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from planner.core.errors import BadInput, InventoryError
from planner.core.units import parse_size, quote
from planner.hardware import catalog
from planner.hardware.inventory import (
    DEVICE_BACKENDS,
    DEVICE_KINDS,
    NAME_PREFIX,
    Backend,
    CalibratedFigure,
    Calibration,
    DeviceKind,
    DeviceSpec,
    HostSpec,
    Inventory,
    Quantity,
    backend_of_name,
    check_endpoint,
    llama_order,
    number_devices,
    one_of,
    parse_link,
    same_cards,
)
from planner.hardware.limits import LLAMA_MAX_DEVICES
from planner.system import schema as ds

log = logging.getLogger(__name__)

GB = 1e9
MIB = 1 << 20
TERA = 1e12

_TOP_KEYS = {"description": "a note about this inventory", "host": "the host mapping", "devices": "a list of devices",
             "calibrated": "rates fitplan calibrate measured (date, method, tool, host, devices)"}
_HOST_KEYS = {
    "ram": "total RAM, a size such as 64GiB",
    "available": "available RAM (MemAvailable), a size; default: ram",
    "bandwidth_gbs": "RAM bandwidth in GB/s",
    "fp16_tflops": "CPU fp16 throughput in TFLOPS",
    "cpu": "the CPU model",
    "catalog": "a host id from configs/catalog.yaml (fills bandwidth)",
}
_DEVICE_KEYS = {
    "name": "a llama.cpp device name such as CUDA0",
    "catalog": "a device id from configs/catalog.yaml",
    "count": "how many identical devices (default 1)",
    "kind": one_of(k.value for k in DEVICE_KINDS),
    "backend": one_of(b.value for b in DEVICE_BACKENDS),
    "description": "the product name",
    "memory": "total memory, a size such as 24GiB",
    "free": "free memory, a size; default: memory",
    "bandwidth_gbs": "memory bandwidth in GB/s",
    "fp16_tflops": "fp16 matrix throughput in TFLOPS",
    "link": "the host link, e.g. pcie4x16",
    "link_gbs": "the host link in GB/s",
    "endpoint": "the rpc-server host:port",
    "network_gbs": "network bandwidth to the rpc-server in GB/s",
    "uma": "true when the device's memory is system RAM",
    "remote_backend": "RPC devices: the backend the rpc-server runs (" + one_of(b.value for b in DEVICE_BACKENDS) + ")",
    "compute_capability": "CUDA devices: the compute capability, e.g. 8.6",
    "id": "the card's id as llama.cpp reports it (PCI bus id such as 0000:01:00.0): one card under two backends",
    "cpus": "RPC devices on a CPU rpc-server: the host CPUs it runs on, a list such as 0-3,8 (its taskset)",
    "threads": "RPC devices on a CPU rpc-server: its compute threads (its -t)",
}
# the most CPUs a Linux kernel is built for (CONFIG_NR_CPUS's upper bound): a CPU list past it is a typo
MAX_CPUS = 8192
_KINDS = {k.value: k for k in DEVICE_KINDS}
_BACKENDS = {b.value: b for b in DEVICE_BACKENDS}
_COUNT = re.compile(r"^([0-9]+)\s*[x×*]\s*(\S+)$", re.IGNORECASE)


def load_inventory(path: str | Path) -> Inventory:
    """Read a YAML inventory (schema: configs/devices/README.md)."""
    where = ds.Where(str(path))
    doc = ds.mapping(ds.read_yaml(path), where, _TOP_KEYS, ("host",))
    host = _host(doc["host"], where.key("host"))
    entries = ds.sequence(doc.get("devices") or [], where.key("devices"), "device mappings")
    if len(entries) > LLAMA_MAX_DEVICES:
        raise where.key("devices").error(f"expected at most {LLAMA_MAX_DEVICES} devices (llama_max_devices()); "
                                         f"got {len(entries)}")
    devices: list[DeviceSpec] = []
    given: list[tuple[str, ds.Where]] = []
    for i, entry in enumerate(entries):
        made = _yaml_devices(entry, where.key("devices").index(i))
        devices.extend(made)
        given.extend((d.name, where.key("devices").index(i).key("name")) for d in made if d.name)
    inventory = _finish(devices, host, given, str(path))
    if "calibrated" not in doc:
        return inventory
    calibration = _calibration(doc["calibrated"], where.key("calibrated"), set(inventory.names))
    return replace(inventory, calibration=calibration)


# ----------------------------------------------------------------------------- the calibrated block

# The host's figures are kept under llama.cpp's name for it (planner.llama.placement.CPU).
CALIBRATED_HOST = "CPU"
_CALIBRATED_KEYS = {
    "date": "when the figures were measured (ISO 8601)",
    "method": "how they were measured, in words",
    "tool": "the tool and build that measured them",
    "model": "the model measured",
    "host": "the host's figures",
    "devices": "a mapping from device names to their figures",
}
# YAML key -> (quantity, scale to SI units); each figure is a mapping {value, how}.
CALIBRATED_FIGURES: dict[str, tuple[Quantity, float]] = {
    "bandwidth_gbs": (Quantity.BANDWIDTH, GB),
    "fp16_tflops": (Quantity.FLOPS, TERA),
    "split_latency_us": (Quantity.SPLIT_LATENCY, 1e-6),
    "device_latency_us": (Quantity.DEVICE_LATENCY, 1e-6),
    "link_gbs": (Quantity.LINK, GB),
    "attention_gbs": (Quantity.ATTENTION_BANDWIDTH, GB),
    "attention_tflops": (Quantity.ATTENTION_FLOPS, TERA),
    "attention_mcells": (Quantity.ATTENTION_CELLS, 1e6),
    "attention_gvalues": (Quantity.ATTENTION_VALUES, 1e9),
    "attention_sweep_gbs": (Quantity.ATTENTION_SWEEP, GB),
    "kernel_us": (Quantity.KERNEL_TIME, 1e-6),
}
_FIGURE_HELP = {key: f"{{value: a number in {key.rsplit('_', 1)[1]}, how: how it was obtained}}"
                for key in CALIBRATED_FIGURES}
_VALUE_KEYS = {"value": "the figure", "how": "how it was obtained"}


def _calibration(entry: Any, where: ds.Where, names: set[str]) -> Calibration:
    entry = ds.mapping(entry, where, _CALIBRATED_KEYS, ("date", "method", "tool"))
    figures = list(_figures(entry.get("host") or {}, where.key("host"), CALIBRATED_HOST))
    per_device = ds.table(entry.get("devices") or {}, where.key("devices"), "figure mappings")
    for name, block in per_device.items():
        if name not in names:
            known = ", ".join(sorted(names)) or "none"
            raise where.key("devices").key(name).error(f"not a device of this inventory; expected one of: {known}")
        figures += _figures(block, where.key("devices").key(name), name)
    return Calibration(ds.text(str(entry["date"]), where.key("date")), ds.text(entry["method"], where.key("method")),
                       ds.text(entry["tool"], where.key("tool")), tuple(figures))


def _figures(block: Any, where: ds.Where, device: str) -> list[CalibratedFigure]:
    block = ds.mapping(block, where, _FIGURE_HELP)
    out = []
    for key, value in block.items():
        quantity, scale = CALIBRATED_FIGURES[key]
        fig = ds.mapping(value, where.key(key), _VALUE_KEYS, ("value", "how"))
        number = ds.number(fig["value"], where.key(key).key("value"), key)
        out.append(CalibratedFigure(device, quantity, number * scale, ds.text(fig["how"], where.key(key).key("how"))))
    return out


def inventory_yaml_dict(inventory: Inventory, model: str = "") -> dict[str, Any]:
    """An inventory as the YAML load_inventory reads (sizes in whole MiB, stated rates in GB/s and
    TFLOPS), with its `calibrated:` block when it has one."""
    def size(n: int) -> str:
        return f"{n // MIB}MiB"

    host = inventory.host
    doc_host: dict[str, Any] = {"ram": size(host.ram_total_bytes), "available": size(host.ram_available_bytes)}
    if host.cpu_model:
        doc_host["cpu"] = host.cpu_model
    devices = []
    for dev in inventory.devices:
        row: dict[str, Any] = {"name": dev.name, "memory": size(dev.total_bytes), "free": size(dev.free_bytes)}
        if dev.kind is not DeviceKind.RPC:
            row["kind"] = dev.kind.value
        for key, text in (("description", dev.description), ("endpoint", dev.endpoint),
                          ("cpus", cpu_list_text(dev.cpus)), ("threads", dev.threads)):
            if text:
                row[key] = text
        for key, value, scale in (("bandwidth_gbs", dev.bandwidth_bytes_s, GB), ("fp16_tflops", dev.fp16_flops, TERA),
                                  ("link_gbs", dev.link_bytes_s, GB), ("network_gbs", dev.network_bytes_s, GB)):
            if value:
                row[key] = float(f"{value / scale:.4g}")
        devices.append(row)
    doc: dict[str, Any] = {"host": doc_host, "devices": devices}
    if inventory.calibration is not None:
        doc["calibrated"] = calibration_dict(inventory.calibration, model)
    return doc


def calibration_dict(calibration: Calibration, model: str = "") -> dict[str, Any]:
    """The `calibrated:` block as YAML data: the inverse of what load_inventory reads."""
    by_quantity = {quantity: (key, scale) for key, (quantity, scale) in CALIBRATED_FIGURES.items()}
    host: dict[str, Any] = {}
    devices: dict[str, dict[str, Any]] = {}
    for fig in calibration.figures:
        key, scale = by_quantity[fig.quantity]
        block = host if fig.device == CALIBRATED_HOST else devices.setdefault(fig.device, {})
        block[key] = {"value": float(f"{fig.value / scale:.4g}"), "how": fig.how}
    doc: dict[str, Any] = {"date": calibration.date, "method": calibration.method, "tool": calibration.tool}
    if model:
        doc["model"] = model
    return {**doc, "host": host, "devices": devices}


def _host(entry: Any, where: ds.Where) -> HostSpec:
    entry = ds.mapping(entry, where, _HOST_KEYS, ("ram",))
    ram = ds.size(entry["ram"], where.key("ram"))
    available = ds.size(entry.get("available", entry["ram"]), where.key("available"))
    if available > ram:
        raise where.key("available").error(f"expected at most ram ({entry['ram']}); got {quote(entry['available'])}")
    bandwidth, flops, cpu = 0, 0, ""
    if "catalog" in entry:
        known = catalog.host(ds.text(entry["catalog"], where.key("catalog")), where.key("catalog"))
        bandwidth, flops, cpu = known.bandwidth_bytes_s, known.fp16_flops, known.description
    if "bandwidth_gbs" in entry:
        bandwidth = int(ds.number(entry["bandwidth_gbs"], where.key("bandwidth_gbs"), "GB/s") * GB)
    if "fp16_tflops" in entry:
        flops = int(ds.number(entry["fp16_tflops"], where.key("fp16_tflops"), "TFLOPS") * TERA)
    if "cpu" in entry:
        cpu = ds.text(entry["cpu"], where.key("cpu"))
    return HostSpec(ram, available, bandwidth, cpu, flops)


# A catalog entry's backend is a default: the same card may be named under another backend
# (`Vulkan0=rtx3090` on a CUDA+Vulkan build, seed 003 §3), and a name's backend wins.
CATALOG_BACKEND = "catalog_backend"


def _from_catalog(entry: catalog.CatalogDevice) -> dict[str, Any]:
    return dict(kind=entry.kind, catalog_backend=entry.backend, description=entry.description,
                total_bytes=entry.total_bytes,
                bandwidth_bytes_s=entry.bandwidth_bytes_s, fp16_flops=entry.fp16_flops,
                link_bytes_s=entry.link_bytes_s, uma=entry.uma,
                stream_bytes_s=entry.stream_bytes_s, kernel_seconds=entry.kernel_seconds)


def _link(value: Any, where: ds.Where) -> int:
    link = parse_link(str(value))
    if not link:
        raise where.error(f"expected a PCIe link such as pcie4x16 or gen3x8; got {quote(value)}")
    return link


def _endpoint(value: Any, where: ds.Where) -> str:
    endpoint = check_endpoint(str(value))
    if not endpoint:
        raise where.error(f"expected host:port; got {quote(value)}")
    return endpoint


def _scaled(scale: float, what: str) -> Callable[[Any, ds.Where], int]:
    """A rate in decimal units (GB/s, TFLOPS) -> bytes/s or FLOP/s."""
    return lambda value, where: int(ds.number(value, where, what) * scale)


# YAML key -> (DeviceSpec field, converter), in the order they apply: `link` after `link_gbs`,
# so that a PCIe link given both ways is the one `link` names.
_FIELDS: dict[str, tuple[str, Callable[[Any, ds.Where], Any]]] = {
    "kind": ("kind", lambda value, where: ds.choice(value, where, _KINDS)),
    "backend": ("backend", lambda value, where: ds.choice(value, where, _BACKENDS)),
    "description": ("description", ds.text),
    "memory": ("total_bytes", ds.size),
    "free": ("free_bytes", ds.size),
    "bandwidth_gbs": ("bandwidth_bytes_s", _scaled(GB, "bandwidth_gbs")),
    "fp16_tflops": ("fp16_flops", _scaled(TERA, "fp16_tflops")),
    "link_gbs": ("link_bytes_s", _scaled(GB, "link_gbs")),
    "network_gbs": ("network_bytes_s", _scaled(GB, "network_gbs")),
    "link": ("link_bytes_s", _link),
    "endpoint": ("endpoint", _endpoint),
    "uma": ("uma", ds.flag),
    "remote_backend": ("remote_backend", lambda value, where: ds.choice(value, where, _BACKENDS)),
    "compute_capability": ("compute_capability", lambda value, where: _compute_capability(value, where)),
    "id": ("id", ds.text),
    "cpus": ("cpus", lambda value, where: _cpu_list(value, where)),
    "threads": ("threads", lambda value, where: _threads(value, where)),
}


def _cpu_list(value: Any, where: ds.Where) -> tuple[int, ...]:
    """"0-3,8" (the Linux CPU-list form taskset and /proc print), one number, or a list of numbers."""
    items = value if isinstance(value, list) else str(value).split(",")
    cpus: set[int] = set()
    for item in items:
        text = str(item).strip()
        low, dash, high = text.partition("-")
        ends = (low, high if dash else low)
        if not all(e.isascii() and e.isdigit() for e in ends) or not int(ends[0]) <= int(ends[1]) < MAX_CPUS:
            raise where.error(f"expected a CPU list such as 0-3,8 (CPUs below {MAX_CPUS}); got {quote(value)}")
        cpus.update(range(int(ends[0]), int(ends[1]) + 1))
    return tuple(sorted(cpus))


def _threads(value: Any, where: ds.Where) -> int:
    n = ds.number(value, where, "a thread count")
    if n != int(n) or not 1 <= n <= MAX_CPUS:
        raise where.error(f"expected a whole number of threads from 1 to {MAX_CPUS}; got {quote(value)}")
    return int(n)


def cpu_list_text(cpus: tuple[int, ...]) -> str:
    """The inverse of _cpu_list: ascending CPUs as ranges ("0-3,8")."""
    runs: list[list[int]] = []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _compute_capability(value: Any, where: ds.Where) -> int:
    """8.6 -> 860 (ggml-cuda's GGML_CUDA_CC numbering: major * 100 + minor * 10)."""
    number = ds.number(value, where, "a compute capability such as 8.6")
    cc = round(number * 100)
    if not 300 <= cc <= 1500:
        raise where.error(f"expected a CUDA compute capability between 3.0 and 15.0; got {quote(value)}")
    return cc


def _yaml_fields(entry: dict[str, Any], where: ds.Where) -> dict[str, Any]:
    """The device fields an entry sets explicitly (over its catalog entry's), converted to bytes and FLOP/s."""
    f: dict[str, Any] = {}
    if "catalog" in entry:
        f.update(_from_catalog(catalog.device(ds.text(entry["catalog"], where.key("catalog")), where.key("catalog"))))
    for key, (name, convert) in _FIELDS.items():
        if key in entry:
            f[name] = convert(entry[key], where.key(key))
    if "bandwidth_gbs" in entry:
        f.pop("stream_bytes_s", None)   # a bandwidth stated for this card wins over the catalog product's measurement
    return f


def _yaml_devices(entry: Any, where: ds.Where) -> list[DeviceSpec]:
    entry = ds.mapping(entry, where, _DEVICE_KEYS)
    fields = _yaml_fields(entry, where)
    name = ""
    if "name" in entry:
        name = _check_name(ds.text(entry["name"], where.key("name")), fields, where.key("name"))
    count = int(ds.number(entry.get("count", 1), where.key("count"), "a count"))
    if count < 1 or count != entry.get("count", 1) or count > LLAMA_MAX_DEVICES:
        raise where.key("count").error(f"expected a whole number from 1 to {LLAMA_MAX_DEVICES} (llama_max_devices()); "
                                       f"got {quote(entry.get('count'))}")
    if name and count > 1:
        raise where.key("count").error("expected 1 when name is given (names are unique); omit name to number them")
    if "id" in fields and count > 1:
        raise where.key("count").error("expected 1 when id is given (an id names one physical card)")
    dev = _build(name, fields, where)
    return [dev] * count


def _check_name(name: str, fields: dict[str, Any], where: ds.Where) -> str:
    parsed = backend_of_name(name)
    if parsed is None:
        examples = ", ".join(p + "0" for p in NAME_PREFIX.values())
        raise where.error(f"expected a llama.cpp device name ({examples}); got {quote(name)}")
    backend, canonical = parsed
    product = fields.get(CATALOG_BACKEND)
    if backend is Backend.RPC:
        fields["kind"] = DeviceKind.RPC
    elif fields.setdefault("backend", backend) is not backend:
        wanted = fields["backend"]
        raise where.error(f"expected a {wanted.value} name ({NAME_PREFIX[wanted]}0, ...); got {quote(name)}")
    elif product is not None and backend not in (product, Backend.VULKAN):
        # Vulkan lists every vendor's card; the vendor backends only their own
        raise where.error(f"expected a {product.value} name ({NAME_PREFIX[product]}0, ...) or a Vulkan one "
                          f"(Vulkan0, ...) for this catalog device; got {quote(name)}")
    return canonical


def _build(name: str, f: dict[str, Any], where: ds.Where) -> DeviceSpec:
    """Complete a device from its explicit fields: an endpoint makes it an RPC device."""
    if f.get("endpoint") or f.get("kind") is DeviceKind.RPC:
        f["kind"], f["backend"] = DeviceKind.RPC, Backend.RPC
        if not f.get("endpoint"):
            raise where.key("endpoint").error("missing; expected host:port of the rpc-server for an RPC device")
    if "backend" not in f and CATALOG_BACKEND in f:
        f["backend"] = f[CATALOG_BACKEND]
    if "backend" not in f:
        raise where.key("backend").error(
            f"missing; expected one of {', '.join(_BACKENDS)}, a llama.cpp name, or a catalog id")
    if "total_bytes" not in f:
        raise where.key("memory").error("missing; expected a size such as 24GiB, or a catalog id")
    free = f.get("free_bytes", f["total_bytes"])
    if free > f["total_bytes"]:
        raise where.key("free").error(f"expected at most memory ({f['total_bytes']} bytes); got {free} bytes")
    return DeviceSpec(
        name=name, kind=f.get("kind", DeviceKind.GPU), backend=f["backend"], total_bytes=f["total_bytes"],
        free_bytes=free, bandwidth_bytes_s=f.get("bandwidth_bytes_s", 0), fp16_flops=f.get("fp16_flops", 0),
        link_bytes_s=f.get("link_bytes_s", 0), endpoint=f.get("endpoint"), uma=f.get("uma", False),
        network_bytes_s=f.get("network_bytes_s", 0), description=f.get("description", ""),
        remote_backend=f.get("remote_backend"), compute_capability=f.get("compute_capability"), id=f.get("id"),
        cpus=f.get("cpus", ()), threads=f.get("threads", 0),
        stream_bytes_s=f.get("stream_bytes_s", 0), kernel_seconds=f.get("kernel_seconds", 0.0),
    )


def _finish(devices: list[DeviceSpec], host: HostSpec, given: list[tuple[str, ds.Where]], source: str) -> Inventory:
    """Order as llama.cpp does, number RPC devices, and check RPC names the user gave agree. A UMA
    device without a memory figure (a catalog APU sold with any amount of RAM) is given the host's."""
    if len(devices) > LLAMA_MAX_DEVICES:
        raise ds.Where(source).error(f"expected at most {LLAMA_MAX_DEVICES} devices (llama_max_devices() in the "
                                     f"pinned llama.cpp); got {len(devices)}")
    devices = [replace(d, total_bytes=host.ram_total_bytes, free_bytes=host.ram_available_bytes)
               if d.uma and not d.total_bytes else d for d in devices]
    ordered = list(llama_order(devices))
    numbered = number_devices(ordered)
    where_of = dict(given)
    for before, after in zip(ordered, numbered, strict=True):
        if before.kind is DeviceKind.RPC and before.name and before.name != after.name:
            where = where_of.get(before.name, ds.Where(source))
            raise where.error(
                f"expected {after.name}: llama.cpp numbers RPC devices in --rpc order; got {quote(before.name)}")
    for same in same_cards(numbered):
        log.warning("%s and %s are one card (id %s): llama.cpp uses %s and skips %s", same.used, same.skipped,
                    same.id, same.used, same.skipped)
    return Inventory(tuple(numbered), host, source=source)


# ----------------------------------------------------------------------------- shorthands

def apply_shorthands(specs: list[str], ram: str | None, base: Inventory | None) -> Inventory:
    if base is None and ram is None:
        raise InventoryError(
            "--ram: missing; expected the host's RAM (e.g. --ram 64GiB) when no inventory is detected or loaded")
    host = base.host if base else HostSpec(0, 0, 0, "")
    if ram is not None:
        n_bytes = _size(ram, "--ram", "a size such as 64GiB")
        if n_bytes <= 0:
            raise InventoryError(f"--ram {quote(ram)}: expected a size above 0 such as 64GiB")
        host = replace(host, ram_total_bytes=n_bytes, ram_available_bytes=n_bytes)
    devices = list(base.devices) if base else []
    given: list[tuple[str, ds.Where]] = []
    for spec in specs:
        devices = _apply_one(spec, devices, given)
    finished = _finish(devices, host, given, base.source if base else "--device")
    return replace(finished, calibration=base.calibration) if base else finished


def _size(text: str, flag: str, expected: str) -> int:
    try:
        return parse_size(text)
    except BadInput:
        raise InventoryError(f"{flag} {quote(text)}: expected {expected}") from None


# `--device ...,KEY=VALUE` extras: the shorthand's key -> the YAML key whose converter it shares
_EXTRAS = {"bw": "bandwidth_gbs", "tflops": "fp16_tflops", "link": "link", "free": "free", "id": "id"}


def _scalar(text: str) -> Any:
    """A command-line value as YAML would have typed it: a number when it reads as one."""
    if not text.isascii():      # float() reads '٣٦٠' as 360; no llama.cpp flag does
        return text
    try:
        return float(text)
    except ValueError:
        return text


def _extras(items: list[str], where: ds.Where) -> dict[str, Any]:
    """`bw=360`, `tflops=51`, ... after the device: DeviceSpec fields, converted as the YAML keys are."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or key.lower() not in _EXTRAS or not value:
            raise where.error(f"expected KEY=VALUE with KEY one of {', '.join(_EXTRAS)} (bw=360 is GB/s, "
                              f"tflops=51 dense fp16 TFLOPS) after the device; got {quote(item.strip())}")
        field, convert = _FIELDS[_EXTRAS[key.lower()]]
        numeric = key.lower() in ("bw", "tflops")
        out[field] = convert(_scalar(value) if numeric else value, where.key(key.lower()))
    return out


def _with_extras(fields: dict[str, Any], extras: dict[str, Any]) -> dict[str, Any]:
    """A device's fields with `bw=`/`tflops=`/... over them: a bandwidth stated for this card also replaces the
    catalog product's measured streaming figure."""
    out = {**fields, **extras}
    if "bandwidth_bytes_s" in extras:
        out.pop("stream_bytes_s", None)
    return out


def _apply_one(spec: str, devices: list[DeviceSpec], given: list[tuple[str, ds.Where]]) -> list[DeviceSpec]:
    where = ds.Where(f"--device {spec if len(spec) <= 80 else quote(spec)}")
    body, endpoint = spec.strip(), None
    if "@" in body:
        body, ep_text = body.rsplit("@", 1)
        endpoint = check_endpoint(ep_text)
        if endpoint is None:
            raise where.error(f"expected host:port after '@'; got {quote(ep_text)}")
    body, *extra_items = body.split(",")
    extras = _extras(extra_items, where)
    if "=" not in body:
        m = _COUNT.match(body)
        digits = m.group(1) if m else "1"
        count, ident = (int(digits) if len(digits) <= 6 else LLAMA_MAX_DEVICES + 1), (m.group(2) if m else body)
        if not 1 <= count <= LLAMA_MAX_DEVICES:
            raise where.error(f"expected a count from 1 to {LLAMA_MAX_DEVICES} (llama_max_devices()), e.g. 2xrtx3090")
        if "id" in extras and count > 1:
            raise where.error("expected one device with id= (an id names one physical card)")
        fields = _with_extras(_catalog(ident, where), extras)
        fields["endpoint"] = endpoint
        return devices + [_build("", dict(fields), where)] * count
    name, value = (part.strip() for part in body.split("=", 1))
    if not name:
        raise where.error("missing device name before '='; expected NAME=SIZE such as CUDA0=24GiB")
    if not value:
        raise where.error(f"missing value after '{name}='; expected a size such as 24GiB or a catalog id")
    fields = _with_extras(_shorthand_value(value, where), extras)
    fields["endpoint"] = endpoint
    existing = next((d for d in devices if d.name.lower() == name.lower()), None)
    if existing is not None:
        return [_resize(d, fields) if d is existing else d for d in devices]
    canonical = _check_name(name, fields, where)
    given.append((canonical, where))
    return devices + [_build(canonical, fields, where)]


def _resize(dev: DeviceSpec, fields: dict[str, Any]) -> DeviceSpec:
    """`NAME=...` on a device the base already has: a size sets its total and free memory;
    a catalog id replaces its figures; the name (and, unless given, the endpoint) stay."""
    change = {k: v for k, v in fields.items() if k not in ("endpoint", CATALOG_BACKEND)}
    change.setdefault("free_bytes", change["total_bytes"])
    if change["free_bytes"] > change["total_bytes"]:
        raise InventoryError(f"--device {dev.name}: free ({change['free_bytes']} bytes) is above the memory "
                             f"({change['total_bytes']} bytes)")
    if fields.get("endpoint"):
        change.update(endpoint=fields["endpoint"], kind=DeviceKind.RPC, backend=Backend.RPC)
    elif dev.kind is DeviceKind.RPC:
        change.update(kind=DeviceKind.RPC, backend=Backend.RPC)
    return replace(dev, **change)


def _catalog(ident: str, where: ds.Where) -> dict[str, Any]:
    known = catalog.load_catalog().devices
    if ident.lower() not in known:
        close = difflib.get_close_matches(ident.lower(), list(known), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; catalog ids: {', '.join(sorted(known)[:6])}, ..."
        raise where.error(f"expected NAME=SIZE (CUDA0=24GiB), NAME=CATALOG_ID or [N x]CATALOG_ID (2xrtx3090); "
                          f"{quote(ident)} is not in {catalog.catalog_path().name}{hint}")
    return _from_catalog(known[ident.lower()])


def _shorthand_value(value: str, where: ds.Where) -> dict[str, Any]:
    """'24GiB' -> a bare device of that size; anything else must be a catalog id."""
    if re.match(r"^-?[0-9]", value):
        n_bytes = _size(value, where.file, "a size such as 24GiB")
        if n_bytes <= 0:
            raise where.error(f"expected a size above 0 such as 24GiB; got {quote(value)}")
        return {"total_bytes": n_bytes}
    return _catalog(value, where)


# ----------------------------------------------------------------------------- entry points

def inventory_from_cli(devices: list[str], ram: str | None, base: Inventory | None) -> Inventory:
    """Apply `--device` shorthands and `--ram` to `base` (the module docstring lists the forms)."""
    return apply_shorthands(devices, ram, base)


def inventory_from_options(path: str | Path | None, devices: list[str], ram: str | None) -> Inventory | None:
    """An inventory from an optional YAML file plus `--device`/`--ram`, where the host's RAM is
    optional (estimate, sweep, the Python API): shorthands without a file start from an empty
    host; None when nothing is given."""
    base = load_inventory(path) if path else None
    if not devices and not ram:
        return base
    return inventory_from_cli(devices, ram, base or Inventory((), HostSpec(0, 0, 0, ""), source="--device"))
