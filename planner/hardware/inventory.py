"""The inventory model: the devices a plan is made for, real (detected) or described (YAML, CLI).

`Inventory.devices` is in llama.cpp's device order and never holds the CPU; the host's RAM
is `Inventory.host`. Names are llama.cpp's own (`CUDA0`, `Vulkan1`, `MTL0`, `RPC0`).
Rates are decimal (GB/s, TFLOPS), as vendors quote them; memory is binary (GiB).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from planner.core.errors import InventoryError
from runtime.ggml.profiles import Backend


class DeviceKind(str, Enum):
    GPU = "gpu"     # discrete: its memory adds to the host's
    IGPU = "igpu"   # integrated: llama.cpp uses it only when no discrete GPU exists
    CPU = "cpu"
    RPC = "rpc"     # a device behind a ggml rpc-server


# The row of llama.cpp's memory breakdown that is host memory (common_get_device_memory_data;
# DESIGN.md: host memory is reported as `Host`). planner.llama.placement adds its other host rows.
HOST = "Host"

# Inventory.devices never holds the CPU: the host is Inventory.host. LOCAL_GPU_KINDS are the
# devices in this machine (not behind an rpc-server), discrete before integrated as KIND_ORDER has it.
LOCAL_GPU_KINDS: tuple[DeviceKind, ...] = (DeviceKind.GPU, DeviceKind.IGPU)
DEVICE_KINDS: tuple[DeviceKind, ...] = (*LOCAL_GPU_KINDS, DeviceKind.RPC)
DEVICE_BACKENDS: tuple[Backend, ...] = tuple(b for b in Backend if b is not Backend.CPU)
LOCAL_BACKENDS: tuple[Backend, ...] = tuple(b for b in DEVICE_BACKENDS if b is not Backend.RPC)

# Device-name prefixes as ggml registers them: GGML_CUDA_NAME ("CUDA", "ROCm" under HIP),
# GGML_VK_NAME, GGML_METAL_NAME ("MTL"), GGML_SYCL_NAME, and "RPC<n>" (ggml/include/*.h,
# ggml-metal.cpp, ggml-rpc.cpp in the pinned llama.cpp).
NAME_PREFIX: dict[Backend, str] = {
    Backend.CUDA: "CUDA",
    Backend.ROCM: "ROCm",
    Backend.VULKAN: "Vulkan",
    Backend.METAL: "MTL",
    Backend.SYCL: "SYCL",
    Backend.RPC: "RPC",
}

# llama.cpp's default device list (src/llama.cpp, llama_model_load devices): RPC servers
# first "to minimize network transfers", then discrete GPUs, then integrated GPUs.
KIND_ORDER: dict[DeviceKind, int] = {DeviceKind.RPC: 0, DeviceKind.GPU: 1, DeviceKind.IGPU: 2, DeviceKind.CPU: 3}

# The order ggml registers its backends in (ggml/src/ggml-backend-reg.cpp, ggml_backend_registry():
# CUDA — ROCm is ggml-cuda built for HIP — then Metal, SYCL, Vulkan, ..., RPC). ggml_backend_dev_get(i)
# walks devices in this order, so when two backends list one card the earlier backend's name is kept.
BACKEND_REG_ORDER: dict[Backend, int] = {
    Backend.CUDA: 0, Backend.ROCM: 0, Backend.METAL: 1, Backend.SYCL: 2, Backend.VULKAN: 3, Backend.RPC: 4,
    Backend.CPU: 5,
}

# Usable bytes/s per lane and direction after line coding (PCI-SIG base specs: 8b/10b for
# gen 1-2, 128b/130b for gen 3-5, 242/256 FLIT efficiency for gen 6).
PCIE_LANE_BYTES_S: dict[int, float] = {
    1: 2.5e9 * 8 / 10 / 8,
    2: 5e9 * 8 / 10 / 8,
    3: 8e9 * 128 / 130 / 8,
    4: 16e9 * 128 / 130 / 8,
    5: 32e9 * 128 / 130 / 8,
    6: 64e9 * 242 / 256 / 8,
}
PCIE_WIDTHS = (1, 2, 4, 8, 16)

_LINK = re.compile(r"^\s*(?:pcie|gen)\s*(\d)(?:\.0)?\s*x\s*(\d+)\s*$", re.IGNORECASE)
_ENDPOINT = re.compile(r"^([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):(\d{1,5})$")


@dataclass(frozen=True)
class DeviceSpec:
    """One llama.cpp device. Rates of 0 mean unknown.

    `link_bytes_s` is the device's link to its own host (PCIe). For an RPC device,
    `network_bytes_s` is the network between the planning host and the rpc-server.
    `uma`: the device's memory is carved from system RAM (seed 003 §7) — it is not
    additive with the host's RAM.
    """

    name: str
    kind: DeviceKind
    backend: Backend
    total_bytes: int
    free_bytes: int
    bandwidth_bytes_s: int
    fp16_flops: int
    link_bytes_s: int
    endpoint: str | None = None
    uma: bool = False
    network_bytes_s: int = 0
    description: str = ""
    remote_backend: Backend | None = None   # RPC: the backend the rpc-server runs (it sizes allocations)
    compute_capability: int | None = None   # CUDA: major * 100 + minor * 10 (8.6 -> 860)
    id: str | None = None   # ggml_backend_dev_props.device_id: the PCI bus id ("0000:01:00.0"); None = unknown
    # a CPU rpc-server's host CPUs (its process's affinity) and compute threads; () / 0 = unknown.
    # Devices whose CPUs overlap share those cores when they compute at once (planner/search/verdict.py)
    cpus: tuple[int, ...] = ()
    threads: int = 0
    # measured on this product with the pinned llama.cpp (a catalog entry's `measured:` block): the bandwidth its
    # decode streams weights at, and the seconds per op node of a decoded token's graph; 0 = not measured
    stream_bytes_s: int = 0
    kernel_seconds: float = 0.0

    @property
    def transfer_bytes_s(self) -> int:
        """The slowest hop between the planning host and this device's memory (0 = unknown)."""
        hops = [r for r in (self.link_bytes_s, self.network_bytes_s) if r > 0]
        return min(hops) if hops else 0


@dataclass(frozen=True)
class HostSpec:
    ram_total_bytes: int
    ram_available_bytes: int
    bandwidth_bytes_s: int
    cpu_model: str
    fp16_flops: int = 0


class Quantity(str, Enum):
    """A rate `fitplan calibrate` measures (planner/measuring/calibrate.py), in SI units inside."""

    BANDWIDTH = "bandwidth"           # bytes/s of weight streaming (decode)
    FLOPS = "flops"                   # FLOP/s of matrix products (prefill)
    SPLIT_LATENCY = "split_latency"   # seconds per split boundary touching the device (the hand-off)
    DEVICE_LATENCY = "device_latency"  # seconds per boundary between two devices (neither is the host)
    LINK = "link"                     # bytes/s of the activations crossing a boundary
    ATTENTION_BANDWIDTH = "attention_bandwidth"   # bytes/s of KV cache a decoded token's attention reads
    ATTENTION_FLOPS = "attention_flops"           # FLOP/s of a prompt's attention (QK^T, softmax·V)
    ATTENTION_CELLS = "attention_cells"           # (query head, cached cell) pairs/s a decoded token's attention
                                                  # works through (one softmax step and two head-wide rows each)
    ATTENTION_VALUES = "attention_values"         # K and V values/s of those pairs: with ATTENTION_CELLS, a pair
                                                  # costs 1/cells + (d_k + d_v)/values seconds
    ATTENTION_SWEEP = "attention_sweep"           # bytes/s of cache rows a decoded token's query heads stream: each
                                                  # query head reads its layer's whole row (every KV head) per cell
    KERNEL_TIME = "kernel_time"                   # seconds per op node of a decoded token's graph on a device that
                                                  # launches a kernel for each (a GPU backend), beyond its bytes


@dataclass(frozen=True)
class CalibratedFigure:
    device: str        # a device name, or `CPU` for the host (llama.cpp's name for it)
    quantity: Quantity
    value: float       # SI units: bytes/s, FLOP/s, seconds
    how: str           # how it was obtained, in words


@dataclass(frozen=True)
class Calibration:
    """Rates measured on a machine (an inventory's `calibrated:` block); they win over stated ones."""

    date: str
    method: str
    tool: str
    figures: tuple[CalibratedFigure, ...]

    def figure(self, device: str, quantity: Quantity) -> float | None:
        return next((f.value for f in self.figures if f.device == device and f.quantity is quantity), None)


@dataclass(frozen=True)
class Inventory:
    devices: tuple[DeviceSpec, ...]
    host: HostSpec
    source: str = field(default="", compare=False)
    calibration: Calibration | None = None

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for dev in self.devices:
            if dev.name.lower() in seen:
                where = self.source or "inventory"
                raise InventoryError(f"{where}: device {dev.name} appears twice; expected unique names")
            seen.add(dev.name.lower())

    def get(self, name: str) -> DeviceSpec | None:
        return next((d for d in self.devices if d.name == name), None)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]


def one_of(names: Iterable[str]) -> str:
    """'a, b or c': the allowed values of a field, for help and error texts."""
    *rest, last = names
    return f"{', '.join(rest)} or {last}" if rest else last


def pcie_link_bytes_s(generation: int, width: int) -> int:
    if generation not in PCIE_LANE_BYTES_S or width not in PCIE_WIDTHS:
        raise ValueError(f"PCIe gen {generation} x{width}")
    return int(PCIE_LANE_BYTES_S[generation] * width)


def parse_link(text: str) -> int | None:
    """'pcie4x16', 'PCIe 4.0 x16', 'gen3x8' -> bytes/s; None when not of that form."""
    m = _LINK.match(text)
    if not m:
        return None
    try:
        return pcie_link_bytes_s(int(m.group(1)), int(m.group(2)))
    except ValueError:
        return None


def check_endpoint(text: str) -> str | None:
    """'host:port' as llama.cpp's --rpc takes it; None when malformed."""
    m = _ENDPOINT.match(text.strip())
    if not m or not 1 <= int(m.group(2)) <= 65535:
        return None
    return text.strip()


def backend_of_name(name: str) -> tuple[Backend, str] | None:
    """'cuda0' -> (CUDA, 'CUDA0'): the backend a llama.cpp device name belongs to, canonically spelled."""
    for backend, prefix in NAME_PREFIX.items():
        # ASCII digits only: 'CUDA٠' is no device llama.cpp lists
        m = re.fullmatch(re.escape(prefix) + r"([0-9]+)", name.strip(), re.IGNORECASE | re.ASCII)
        if m:
            return backend, f"{prefix}{int(m.group(1))}"
    return None


def llama_order(devices: list[DeviceSpec] | tuple[DeviceSpec, ...]) -> tuple[DeviceSpec, ...]:
    """Order devices as llama.cpp lists them for a model (stable within a kind)."""
    return tuple(sorted(devices, key=lambda d: KIND_ORDER[d.kind]))


@dataclass(frozen=True)
class SameCard:
    """A device llama.cpp skips because another backend already lists the same physical card."""

    skipped: str    # the name llama.cpp does not use (e.g. Vulkan0)
    used: str       # the name it uses for that card (e.g. CUDA0)
    id: str         # the device id both report


@dataclass(frozen=True)
class Selection:
    """The devices llama.cpp uses for a model when no -dev is given, and the duplicates it skipped."""

    devices: tuple[DeviceSpec, ...]
    same_cards: tuple[SameCard, ...] = ()

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]


def same_cards(devices: Iterable[DeviceSpec]) -> tuple[SameCard, ...]:
    """Devices that repeat a card an earlier backend lists. llama_prepare_model_devices (src/llama.cpp)
    skips a discrete GPU whose device_id equals one already taken (both ids known), walking devices in
    backend registration order; RPC devices and unknown ids are never merged."""
    local = [d for d in devices if d.kind is DeviceKind.GPU]
    ordered = sorted(local, key=lambda d: BACKEND_REG_ORDER[d.backend])
    first: dict[str, DeviceSpec] = {}
    out = []
    for dev in ordered:
        if not dev.id:
            continue
        key = dev.id.strip().lower()
        if key in first:
            out.append(SameCard(dev.name, first[key].name, dev.id))
        else:
            first[key] = dev
    return tuple(out)


def llama_devices(devices: Iterable[DeviceSpec]) -> Selection:
    """llama.cpp's default device list (llama_prepare_model_devices, no -dev): RPC servers first, then
    discrete GPUs without the cards a second backend repeats, then integrated GPUs only when no discrete
    GPU is left — and among those, only the first integrated GPU's backend (an APU seen by Vulkan and
    another backend is used once, ggml-org/llama.cpp#23897)."""
    specs = [d for d in devices if d.kind is not DeviceKind.CPU]
    repeats = same_cards(specs)
    skipped = {s.skipped for s in repeats}
    kept = [d for d in specs if d.name not in skipped]
    igpus = sorted((d for d in kept if d.kind is DeviceKind.IGPU), key=lambda d: BACKEND_REG_ORDER[d.backend])
    gpus = [d for d in kept if d.kind is DeviceKind.GPU]
    if gpus or not igpus:
        kept = [d for d in kept if d.kind is not DeviceKind.IGPU]
    else:
        first_backend = igpus[0].backend
        kept = [d for d in kept if d.kind is not DeviceKind.IGPU or d.backend is first_backend]
    return Selection(llama_order(kept), repeats)


def number_devices(devices: list[DeviceSpec]) -> list[DeviceSpec]:
    """Name RPC devices RPC0.. in --rpc order (ggml-rpc.cpp numbers them globally in the order
    servers are added) and give unnamed local devices the next free index of their backend."""
    rpc = 0
    taken = {d.name for d in devices if d.name}
    out = []
    for dev in devices:
        if dev.kind is DeviceKind.RPC:
            dev = replace(dev, name=f"RPC{rpc}")
            rpc += 1
        elif not dev.name:
            prefix = NAME_PREFIX[dev.backend]
            index = next(i for i in range(len(devices) + len(taken) + 1) if f"{prefix}{i}" not in taken)
            dev = replace(dev, name=f"{prefix}{index}")
            taken.add(dev.name)
        out.append(dev)
    return out


def rpc_endpoints(inventory: Inventory) -> list[str]:
    """Distinct rpc-server endpoints in the order their devices appear (= --rpc order)."""
    seen: list[str] = []
    for dev in inventory.devices:
        if dev.endpoint and dev.endpoint not in seen:
            seen.append(dev.endpoint)
    return seen


def rpc_flag(inventory: Inventory) -> list[str]:
    """The llama.cpp arguments that register this inventory's RPC devices ([] when none)."""
    endpoints = rpc_endpoints(inventory)
    return ["--rpc", ",".join(endpoints)] if endpoints else []


def inventory_to_dict(inventory: Inventory) -> dict[str, Any]:
    """Plain data for JSON output; sizes in bytes, rates in bytes/s and FLOP/s."""
    devices = []
    for dev in inventory.devices:
        row = {k: v for k, v in vars(dev).items()}
        row["kind"] = dev.kind.value
        row["backend"] = dev.backend.value
        row["remote_backend"] = dev.remote_backend.value if dev.remote_backend else None
        devices.append(row)
    return {"devices": devices, "host": dict(vars(inventory.host))}


def inventory_from_dict(doc: dict[str, Any], source: str) -> Inventory:
    """The inverse of inventory_to_dict (a plan file's inventory, read back)."""
    devices = []
    for row in doc.get("devices") or []:
        fields = dict(row)
        fields["kind"], fields["backend"] = DeviceKind(fields["kind"]), Backend(fields["backend"])
        if fields.get("remote_backend"):
            fields["remote_backend"] = Backend(fields["remote_backend"])
        fields["cpus"] = tuple(fields.get("cpus") or ())
        devices.append(DeviceSpec(**fields))
    return Inventory(tuple(devices), HostSpec(**doc["host"]), source=source)

