"""Memory a GPU process holds outside llama.cpp's breakdown: the per-device overhead term.

llama.cpp's memory breakdown lists the buffers it allocates (model, context, compute). A process that
uses a GPU also holds what the driver and the backend's libraries allocate for it: the CUDA context,
the cuBLAS handle and its workspace, ggml-cuda's memory pool (runtime/ggml/profiles.py names the terms).
A plan fits model + context + compute + this overhead within each device's budget.

Who holds it, per device row of a llama.cpp process (llama-server, llama-cli, llama-bench):
- a local GPU device: the llama.cpp process itself, once per device in its device list, whether or not
  any layer is placed there (the H200 record's `three-80m` load: CUDA0 held no buffer and used memory
  still grew by the overhead);
- an RPC device: the rpc-server process behind it holds its own context on the remote GPU while it runs;
  an rpc-server on a CPU holds nothing on a GPU (its memory is that host's RAM).

Figures are labelled `measured` (with the record that measured them) or `assumed` (with what they are
taken from). The measured ones come from tests/peer/data/cuda/nvidia-h200.json (compute capability 9.0,
CUDA 13.0): each one-device llama-server load raised nvidia-smi's used memory by its breakdown plus
596 MiB, and two idle CUDA rpc-servers held 1051 MiB before any model (525 MiB each).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from planner.core.units import MiB
from planner.hardware.inventory import DeviceSpec, Inventory
from planner.hardware.vulkan_devices import vulkan_features
from planner.llama.placement import Device
from runtime.ggml.profiles import Backend


class ProcessKind(str, Enum):
    """The process that holds a device row's overhead."""

    LLAMA = "llama.cpp process"   # llama-server, llama-cli, llama-bench: the process the plan starts
    RPC_SERVER = "rpc-server"     # the rpc-server behind an RPC device


H200_RECORD = "tests/peer/data/cuda/nvidia-h200.json"
MEASURED_CC = 900          # the record's compute capability (9.0); another is another measurement
MEASURED_CUDA = "13.0"     # the record's CUDA runtime
CPU_DEVICE_TYPE = "PHYSICAL_DEVICE_TYPE_CPU"   # VkPhysicalDeviceType of a software implementation


@dataclass(frozen=True)
class Overhead:
    """One device row's memory outside the breakdown: bytes, who holds it, measured or assumed, and why."""

    bytes: int
    backend: Backend
    process: ProcessKind
    measured: bool
    source: str

    @property
    def label(self) -> str:
        return "measured" if self.measured else "assumed"

    def to_dict(self) -> dict[str, object]:
        return {"bytes": self.bytes, "backend": self.backend.value, "process": self.process.value,
                "measured": self.measured, "source": self.source}


# (backend, process) -> (bytes, measured on the record's GPU, source). CUDA's figures are the H200 record's;
# the others are assumed until a record of that backend measures them (scripts/gpu_record.py).
_CUDA_LLAMA = (596 * MiB, "nvidia-smi used memory after each one-device llama-server load minus its breakdown "
                          f"({H200_RECORD}: 596 MiB on every load)")
_CUDA_RPC = (525 * MiB, f"nvidia-smi used memory of two idle CUDA rpc-servers, halved ({H200_RECORD}: 1051 MiB)")
_ASSUMED_AS_CUDA = "not measured on {backend}: CUDA's measured figure (a driver context, a BLAS handle and " \
                   "workspace, a memory pool), until a {backend} record measures it"
_ASSUMED_SMALL = "not measured on {backend}: no BLAS library workspace or memory pool as CUDA's; a {n} MiB " \
                 "allowance for the driver's context, pipelines and command buffers, until a record measures it"

FIGURES: dict[tuple[Backend, ProcessKind], tuple[int, str]] = {
    (Backend.CUDA, ProcessKind.LLAMA): _CUDA_LLAMA,
    (Backend.CUDA, ProcessKind.RPC_SERVER): _CUDA_RPC,
    (Backend.ROCM, ProcessKind.LLAMA): (_CUDA_LLAMA[0], _ASSUMED_AS_CUDA.format(backend="ROCm")),
    (Backend.ROCM, ProcessKind.RPC_SERVER): (_CUDA_RPC[0], _ASSUMED_AS_CUDA.format(backend="ROCm")),
    (Backend.SYCL, ProcessKind.LLAMA): (_CUDA_LLAMA[0], _ASSUMED_AS_CUDA.format(backend="SYCL")),
    (Backend.SYCL, ProcessKind.RPC_SERVER): (_CUDA_RPC[0], _ASSUMED_AS_CUDA.format(backend="SYCL")),
    (Backend.VULKAN, ProcessKind.LLAMA): (256 * MiB, _ASSUMED_SMALL.format(backend="Vulkan", n=256)),
    (Backend.VULKAN, ProcessKind.RPC_SERVER): (256 * MiB, _ASSUMED_SMALL.format(backend="Vulkan", n=256)),
    (Backend.METAL, ProcessKind.LLAMA): (128 * MiB, _ASSUMED_SMALL.format(backend="Metal", n=128)),
    (Backend.METAL, ProcessKind.RPC_SERVER): (128 * MiB, _ASSUMED_SMALL.format(backend="Metal", n=128)),
}


def device_overhead(device: Device, inventory: Inventory | None = None) -> Overhead | None:
    """The overhead of one device of a llama.cpp process's device list; None where no GPU memory is held
    (an rpc-server on a CPU, whose buffers are its host's RAM). The figure is `measured` only for a device
    whose inventory states the record's compute capability (a resolved Device defaults an unknown one)."""
    if device.members:   # -sm tensor: each member is its own device row (planner/memory/tensor_members.py)
        return None
    process = ProcessKind.RPC_SERVER if device.backend is Backend.RPC else ProcessKind.LLAMA
    backend = device.remote_backend if device.backend is Backend.RPC else device.backend
    if backend is None or (backend, process) not in FIGURES:
        return None
    spec = inventory.get(device.name) if inventory is not None else None
    if spec is not None and backend is Backend.VULKAN and _cpu_type(spec):
        return None   # a CPU-type Vulkan device (Mesa's lavapipe): its memory and its context are the host's RAM
    n_bytes, source = FIGURES[backend, process]
    cc = spec.compute_capability if spec is not None else None
    measured = backend is Backend.CUDA and cc == MEASURED_CC
    if backend is Backend.CUDA and not measured:
        at = f"compute capability {cc // 100}.{cc % 100 // 10}" if cc else "an unknown compute capability"
        source = (f"not measured at {at}: the figure measured at 9.0 with CUDA {MEASURED_CUDA} "
                  f"({H200_RECORD}), until a record of that GPU measures it")
    return Overhead(n_bytes, backend, process, measured, source)


def _cpu_type(spec: DeviceSpec) -> bool:
    features = vulkan_features(spec.description)
    return features is not None and features.device_type == CPU_DEVICE_TYPE


def overheads(devices: tuple[Device, ...], inventory: Inventory | None = None) -> dict[str, Overhead]:
    """Each device's overhead by name (devices that hold none are left out)."""
    return {d.name: o for d in devices if (o := device_overhead(d, inventory)) is not None}
