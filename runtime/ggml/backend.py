"""Devices and memory, laid out as ggml-backend (seed 000): reg -> device -> backend,
buffer type -> buffer.

A `Device` answers static questions (supports_op, supports_buft, offload_op, memory) and
owns the capacity accounting; a `Backend` executes graphs. Every backend computes with the
numpy kernels, so a multi-GPU machine is emulated on a CPU by virtual devices that differ
only in name, capacity, buffer type, declared op support and op-offload batch threshold.
"""
from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from gguf import GGML_QUANT_SIZES

from planner.core.units import pad
from runtime.ggml.graph import VIEW_OPS, BufferUsage, GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS
from runtime.ggml.profiles import (
    CUDA_ALIGNMENT,
    GGML_OP_OFFLOAD_MIN_BATCH,
    TENSOR_ALIGNMENT,
    BackendProfile,
    fa_kernel_needs_f16,
    row_padding_bytes,
)
from runtime.ggml.profiles import op_batch_size as profile_batch_size
from runtime.ggml.sched_errors import BufferAllocationError

log = logging.getLogger(__name__)

UNLIMITED = 1 << 62


class DeviceType(enum.Enum):
    """ggml_backend_dev_type: the scheduler asserts its last backend is a CPU."""

    CPU = "CPU"
    GPU = "GPU"
    ACCEL = "ACCEL"


@dataclass(frozen=True)
class MemoryInfo:
    free: int
    total: int


@dataclass(frozen=True, eq=False)
class BufferType:
    """A kind of memory. Compared by identity, as ggml compares buft pointers: backends that
    share one BufferType object (CPU and an accelerator) pass tensors without a copy."""

    name: str
    alignment: int
    max_size: int
    is_host: bool
    device: Device = field(repr=False)
    row_padding: int = 0          # get_alloc_size pads quantized rows to a multiple (CUDA, SYCL: 512)
    fa_staging_cc: int | None = None   # CUDA: FA nodes hold f16 copies of non-f16 K/V (compute capability)

    def alloc_size(self, tensor: Tensor) -> int:
        """get_alloc_size of the buffer type (runtime/ggml/profiles.py names the sources)."""
        size = tensor.nbytes()
        if self.fa_staging_cc is not None and tensor.op is Op.FLASH_ATTN_EXT:
            size = _fa_staged_size(tensor, self.fa_staging_cc)
        return size + row_padding_bytes(*GGML_QUANT_SIZES[tensor.type], tensor.ne[0], self.row_padding)

    def alloc_buffer(self, size: int, usage: BufferUsage = BufferUsage.ANY) -> Buffer:
        return self.device.allocate(self, size, usage)


def _fa_staged_size(dst: Tensor, cc: int) -> int:
    """ggml_cuda_flash_attn_ext_get_alloc_size: the output, then 128-aligned f16 copies of K and of
    V (V shares K's when it is a view of the same bytes) where the kernel needs f16 caches."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    assert q is not None and k is not None and v is not None
    end = dst.nbytes()
    quantized = GGML_QUANT_SIZES[k.type][0] > 1 or GGML_QUANT_SIZES[v.type][0] > 1
    if not fa_kernel_needs_f16(cc, q.ne[1], q.ne[0], quantized):
        converted = [t for t in (k, v) if t.type is GGMLType.F32]   # the vector kernel converts f32 only
    else:
        converted = [t for t in (k, v) if t.type is not GGMLType.F16]
    v_is_k = v.view_src is not None and (v.view_src is k or (v.view_src is k.view_src and v.view_offs == k.view_offs))
    for t in converted:
        if t is v and v_is_k and k in converted:
            continue
        end = pad(end, CUDA_ALIGNMENT) + t.n_elements * 2
    return end


class Buffer:
    """One allocation of a buffer type. Its bytes are created on first touch, so planning a
    24 GiB layout costs nothing until something is computed in it."""

    def __init__(self, buft: BufferType, size: int, usage: BufferUsage) -> None:
        self.buft = buft
        self.size = size
        self.usage = usage
        self._storage: np.ndarray | None = None
        self.freed = False

    def __repr__(self) -> str:
        return f"Buffer({self.buft.name}, {self.size}, {self.usage.value})"

    @property
    def name(self) -> str:
        return self.buft.name

    @property
    def is_host(self) -> bool:
        return self.buft.is_host

    @property
    def storage(self) -> np.ndarray:
        if self._storage is None:
            self._storage = np.zeros(self.size, dtype=np.uint8)
        return self._storage

    def free(self) -> None:
        if not self.freed:
            self.freed = True
            self._storage = None
            self.buft.device.release(self)


def op_batch_size(t: Tensor, rule: str = "cuda") -> int:
    """The batch an op works on, as the backend's get_op_batch_size (profiles.op_batch_size)."""
    return profile_batch_size(t.op.value, t.ne, t.n_rows, rule)


class Device:
    """Static facts about one device plus its memory accounting."""

    def __init__(self, name: str, kind: DeviceType, capacity: int, *, buft_name: str | None = None,
                 alignment: int = CUDA_ALIGNMENT, max_alloc: int = UNLIMITED, host_memory: bool = False,
                 ops: Iterable[Op] | None = None, supports: Callable[[Tensor], bool] | None = None,
                 offload_min_batch: int | None = None, shared_buft: BufferType | None = None,
                 profile: BackendProfile | None = None, compute_capability: int | None = None) -> None:
        self.name = name
        self.kind = kind
        self.capacity = capacity
        self.used = 0
        self.profile = profile
        row_padding = profile.row_padding if profile else 0
        fa_cc = compute_capability if profile and profile.fa_f16_staging else None
        self.buffer_type = shared_buft or BufferType(buft_name or name, alignment, max_alloc, host_memory, self,
                                                     row_padding, fa_cc)
        self.reads_host = host_memory
        # NONE and view ops are metadata every backend accepts (CUDA's supports_op does too).
        declared = set(KERNELS) if ops is None else set(ops) & set(KERNELS)
        self.ops = frozenset(declared | VIEW_OPS | {Op.NONE})
        self._supports = supports
        self.offload_min_batch = offload_min_batch

    def __repr__(self) -> str:
        return f"Device({self.name}, {self.kind})"

    def memory(self) -> MemoryInfo:
        return MemoryInfo(self.capacity - self.used, self.capacity)

    def supports_op(self, t: Tensor) -> bool:
        if t.op not in self.ops:
            return False
        return self._supports is None or t.op in VIEW_OPS or t.op is Op.NONE or self._supports(t)

    def supports_buft(self, buft: BufferType) -> bool:
        """CPU-like devices read any host memory; a GPU reads only its own buffer type."""
        if self.reads_host:
            return buft.is_host
        return buft == self.buffer_type

    def offload_op(self, t: Tensor) -> bool:
        """Whether this device wants an op whose weight is in host memory (1.off)."""
        if self.offload_min_batch is None:
            return False
        if self.profile is not None:
            return self.profile.wants_op(t.op.value, t.ne, t.n_rows, self.offload_min_batch)
        return op_batch_size(t) >= self.offload_min_batch

    def allocate(self, buft: BufferType, size: int, usage: BufferUsage) -> Buffer:
        if buft.device is not self and buft != self.buffer_type:
            raise ValueError(f"{self.name}: buffer type {buft.name} belongs to {buft.device.name}")
        if self.used + size > self.capacity:
            raise BufferAllocationError(self.name, buft.name, size, self.used, self.capacity)
        self.used += size
        log.debug("%s: allocated %s buffer of %d bytes (%s)", self.name, buft.name, size, usage.value)
        return Buffer(buft, size, usage)

    def release(self, buffer: Buffer) -> None:
        self.used -= buffer.size

    def init_backend(self) -> Backend:
        return Backend(self)


class Backend:
    """Executes graphs on one device. All devices run the numpy kernels (kernels.KERNELS)."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.n_synchronize = 0
        self.kernels: Mapping[Op, Callable[[Tensor], None]] = KERNELS   # runtime/ggml/exact.py swaps in its table
        self.observer: Callable[[Tensor], None] | None = None          # sees each node once computed

    def __repr__(self) -> str:
        return f"Backend({self.name})"

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def buffer_type(self) -> BufferType:
        return self.device.buffer_type

    @property
    def is_cpu(self) -> bool:
        return self.device.kind is DeviceType.CPU

    def supports_op(self, t: Tensor) -> bool:
        return self.device.supports_op(t)

    def compute(self, nodes: Sequence[Tensor]) -> None:
        # ggml's kernels are IEEE arithmetic without traps: a header's rms eps of 0 over a zero row makes
        # NaN there and it propagates; numpy's warnings about it are not the user's business
        with np.errstate(all="ignore"):
            for node in nodes:
                if node.op is Op.NONE or node.op in VIEW_OPS:
                    continue
                self.kernels[node.op](node)
                if self.observer is not None:
                    self.observer(node)

    def synchronize(self) -> None:
        """Nothing runs asynchronously here; the count lets tests see where ggml would wait."""
        self.n_synchronize += 1


class Registry:
    """A loaded backend library: enumerates its devices."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.devices: list[Device] = []

    def add(self, device: Device) -> Device:
        if any(d.name == device.name for d in self.devices):
            raise ValueError(f"registry {self.name}: device {device.name} already registered")
        self.devices.append(device)
        return device

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(f"registry {self.name} has no device {name}")


def _host_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return UNLIMITED


def make_cpu(capacity: int | None = None, registry: Registry | None = None) -> Backend:
    """The CPU backend: host memory, every op with a kernel, never wants to offload."""
    device = Device("CPU", DeviceType.CPU, capacity if capacity is not None else _host_memory(),
                    alignment=TENSOR_ALIGNMENT, host_memory=True)
    if registry is not None:
        registry.add(device)
    return device.init_backend()


def make_virtual(name: str, capacity: int, *, ops: Iterable[Op] | None = None,
                 supports: Callable[[Tensor], bool] | None = None,
                 offload_min_batch: int = GGML_OP_OFFLOAD_MIN_BATCH, alignment: int = CUDA_ALIGNMENT,
                 max_alloc: int = UNLIMITED, registry: Registry | None = None) -> Backend:
    """A virtual GPU: its own buffer type named after it, executed with numpy.

    `ops` limits the declared op support (None: every op with a kernel); `supports` is an
    extra per-tensor veto (e.g. refusing a tensor type, as a GPU backend may).
    """
    device = Device(name, DeviceType.GPU, capacity, alignment=alignment, max_alloc=max_alloc,
                    ops=ops, supports=supports, offload_min_batch=offload_min_batch)
    if registry is not None:
        registry.add(device)
    return device.init_backend()


def make_accel(name: str, cpu: Backend, *, ops: Iterable[Op] | None = None) -> Backend:
    """An accelerator sharing the CPU's host buffer type (as BLAS does): pass 3 upgrades onto it."""
    device = Device(name, DeviceType.ACCEL, cpu.device.capacity, host_memory=True, ops=ops,
                    shared_buft=cpu.buffer_type)
    return device.init_backend()


def alloc_tensors(buft: BufferType, tensors: Sequence[Tensor],
                  usage: BufferUsage = BufferUsage.ANY) -> list[Buffer]:
    """Place tensors back to back in new buffers (ggml_backend_alloc_ctx_tensors_from_buft):
    each offset aligned to the buffer type; a new buffer when one would pass max_size."""
    groups: list[list[tuple[Tensor, int]]] = [[]]
    sizes = [0]
    for t in tensors:
        size = pad(buft.alloc_size(t), buft.alignment)
        if groups[-1] and sizes[-1] + size > buft.max_size:
            groups.append([])
            sizes.append(0)
        groups[-1].append((t, sizes[-1]))
        sizes[-1] += size
    buffers: list[Buffer] = []
    try:
        for size in sizes:
            buffers.append(buft.alloc_buffer(size, usage))
    except BufferAllocationError:
        for buffer in buffers:  # all or nothing: no tensor points into a half-made layout
            buffer.free()
        raise
    for group, buffer in zip(groups, buffers, strict=True):
        for t, offset in group:
            t.buffer, t.offset = buffer, offset
    return buffers
