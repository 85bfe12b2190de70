"""The meta device: one device that is N devices underneath (seed 000, "One backend that is
secretly N"; ggml-backend-meta.cpp).

- `MetaDevice` is a `Device` that delegates: an op is supported only if every member supports
  it, memory is the members' sum, its buffer type combines theirs (ggml_backend_meta_device_*),
  so the scheduler takes it as one entry of its backend list: [Meta(GPU0,GPU1), CPU].
- A meta tensor is N slices (`MetaSlices`): a slice has the member's share of the split axis,
  strides above the split axis scaled to it, and a view's offset scaled unless it falls inside
  the split (ggml_backend_meta_buffer_init_tensor_impl); a slice a member gets nothing of is not
  computed there.
- `MetaBackend.run` cuts the nodes at PARTIAL nodes (meta_cut.py), runs each subgraph on every
  member and AllReduces its last node (allreduce.py), as ggml_backend_meta_graph_compute.

Simplification: a meta buffer holds each tensor's full image, and the member slices are cut
from it per graph (ggml keeps only the N slices, from load time on). `compute`, which the
scheduler calls, writes every node's gathered result back to its image, so splits after it,
KV-cache stores and the caller see ordinary tensors. The members' memory therefore holds one
graph's slices at a time, not the weights for good: memory figures come from elsewhere.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES

from runtime.ggml.allreduce import ReduceStep, StepBuffers, allreduce
from runtime.ggml.backend import Backend, Buffer, Device, DeviceType, MemoryInfo, alloc_tensors
from runtime.ggml.graph import MAX_DIMS, VIEW_OPS, Op, Tensor, numpy_dtype
from runtime.ggml.meta import MetaSplitError, SplitAxis, SplitState
from runtime.ggml.meta_cut import MetaCut, cut_subgraphs
from runtime.ggml.meta_resolve import SplitResolver, StaticStates
from runtime.ggml.profiles import BackendProfile


class MetaDevice(Device):
    """N member backends seen as one device, to the scheduler one entry of its backend list.

    Its buffer type is the members' combined: the largest alignment, the smallest max size, host
    only if every member is (ggml_backend_meta_buffer_type_*); it holds each tensor's full image,
    which the meta backend slices (see the module note).
    """

    def __init__(self, members: Sequence[Backend], *, name: str | None = None, capacity: int | None = None,
                 profile: BackendProfile | None = None, compute_capability: int | None = None) -> None:
        """`name`, `capacity`: the planner's (llama.cpp prints `Meta()`; the budget of its row) instead of
        the members' names and summed capacities; `profile`, `compute_capability`: the combined
        profile (planner/llama/tensor_parallel.meta_profile), so alloc_size pads as get_alloc_size does."""
        if not members:
            raise MetaSplitError("a meta device needs at least one member")
        self.members = tuple(members)
        bufts = [m.buffer_type for m in self.members]
        name = name or "Meta(" + ",".join(m.name for m in self.members) + ")"
        total = sum(m.device.capacity for m in self.members) if capacity is None else capacity
        super().__init__(name, DeviceType.GPU, total, alignment=max(b.alignment for b in bufts),
                         max_alloc=min(b.max_size for b in bufts), host_memory=all(b.is_host for b in bufts),
                         profile=profile, compute_capability=compute_capability)

    def __repr__(self) -> str:
        return f"MetaDevice({self.name})"

    @property
    def n_devices(self) -> int:
        return len(self.members)

    def memory(self) -> MemoryInfo:
        """The members' free and total memory summed (ggml_backend_meta_device_get_memory)."""
        infos = [m.device.memory() for m in self.members]
        return MemoryInfo(sum(i.free for i in infos), sum(i.total for i in infos))

    def supports_op(self, t: Tensor) -> bool:
        return all(m.supports_op(t) for m in self.members)

    def init_backend(self) -> Backend:
        raise MetaSplitError("a meta backend needs the static split callback: use MetaBackend(device, static)")


def slice_shape(t: Tensor, state: SplitState, member: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ne, nb) of a member's slice: its share of the split axis, strides above it scaled."""
    ne, nb = list(t.ne), list(t.nb)
    if state.axis.is_dim:
        a = int(state.axis)
        ne[a] = state.totals()[member]
        for i in range(MAX_DIMS):
            if t.nb[i] > t.nb[a]:
                nb[i] = t.nb[i] * ne[a] // t.ne[a]
    return tuple(ne), tuple(nb)


def _slice_offset(t: Tensor, state: SplitState, root_state: SplitState, ne_split: int) -> int:
    """A view's offset in the member's slice of its root: scaled, unless it lies inside the split."""
    offs = t.view_offs
    if offs <= 0 or not state.axis.is_dim:
        return offs
    root = t.view_src
    assert root is not None
    a = int(state.axis)
    if not root_state.axis.is_dim:
        raise MetaSplitError(f"view {t.name!r} is split but its root {root.name!r} is not")
    internal = offs <= root.nb[root_state.axis] or any(
        offs <= t.ne[i] * t.nb[i] < t.nb[a] for i in range(MAX_DIMS))
    return offs if internal else offs * ne_split // t.ne[a]


def _byte_grid(t: Tensor, data: np.ndarray) -> np.ndarray:
    """A contiguous tensor's bytes as [ne3, ne2, ne1, row bytes]."""
    return data.reshape(t.ne[3], t.ne[2], t.ne[1], -1)


def _copy_partial(full: Tensor, part: Tensor, state: SplitState, member: int) -> None:
    """A static PARTIAL tensor (an expert bias summed by the reduce): every contributing member
    (one with a share of the source split, or all when none is recorded) holds value / contributors,
    the others zeros (ggml_backend_meta_buffer_set_tensor)."""
    if numpy_dtype(full.type) is not np.float32:
        raise MetaSplitError(f"partial leaf {full.name!r} must be F32")
    contributors = sum(1 for n in state.ne if n) or len(state.ne) or 1
    if state.ne and state.ne[member] == 0 and any(state.ne):
        part.numpy()[...] = 0.0
    else:
        part.numpy()[...] = full.numpy() / np.float32(contributors)


def _copy_piece(full: Tensor, part: Tensor, state: SplitState, member: int) -> None:
    """Copy the member's piece of a contiguous leaf into its slice, by bytes (any type): members'
    pieces follow each other along the axis in member order (ggml_backend_meta_buffer_set_tensor)."""
    if state.axis is SplitAxis.PARTIAL:
        _copy_partial(full, part, state, member)
        return
    if not state.axis.is_dim:
        part.raw_bytes()[:] = full.raw_bytes()
        return
    if not full.is_contiguous() or state.nr != 1:
        raise MetaSplitError(f"leaf {full.name!r}: only contiguous, single-segment splits are sliced")
    if part.nbytes() == 0:
        return
    src, dst = _byte_grid(full, full.raw_bytes()), _byte_grid(part, part.raw_bytes())
    a = int(state.axis)
    start, count = sum(state.ne[:member]), state.ne[member]
    if a == 0:
        block, type_size = GGML_QUANT_SIZES[full.type]
        lo, size = start // block * type_size, count // block * type_size
        dst[...] = src[..., lo:lo + size]
        return
    index: list[slice] = [slice(None)] * MAX_DIMS
    index[MAX_DIMS - 1 - a] = slice(start, start + count)
    dst[...] = src[tuple(index)]


@dataclass(frozen=True)
class MetaRun:
    """What one compute did: the cut and the AllReduce steps after each reducing subgraph."""

    cut: MetaCut
    reduces: tuple[tuple[ReduceStep, ...], ...]

    @property
    def reduced_bytes(self) -> int:
        return sum(s.bytes_moved for steps in self.reduces for s in steps)


class MetaSlices:
    """Every tensor of one graph as N member slices, allocated in the members' buffer types."""

    def __init__(self, device: MetaDevice, resolver: SplitResolver) -> None:
        self.device, self.resolver = device, resolver
        self.parts: dict[Tensor, list[Tensor]] = {}
        self.buffers: list[Buffer] = []

    def build(self, nodes: Sequence[Tensor]) -> list[Tensor]:
        """Make the slices of the nodes and of every leaf they read; returns the leaves."""
        known = set(nodes)
        leaves: list[Tensor] = []
        for node in nodes:
            for s in [*node.src, node.view_src]:
                if s is not None and s not in known:
                    known.add(s)
                    leaves.append(s)
        owned: list[list[Tensor]] = [[] for _ in self.device.members]
        for t in [*leaves, *nodes]:
            self.parts[t] = self._make(t, owned)
        for j, member in enumerate(self.device.members):
            self.buffers += alloc_tensors(member.buffer_type, owned[j])
        return leaves

    def _make(self, t: Tensor, owned: list[list[Tensor]]) -> list[Tensor]:
        state = self.resolver.state(t, assume_sync=True)
        out = []
        for j in range(self.device.n_devices):
            ne, nb = slice_shape(t, state, j)
            src = [None if s is None else self.parts[s][j] for s in t.src]
            if t.view_src is not None:
                root_state = self.resolver.state(t.view_src, assume_sync=True)
                offs = _slice_offset(t, state, root_state, ne[int(state.axis)] if state.axis.is_dim else 0)
                part = Tensor(t.type, ne, name=t.name, op=t.op, src=src, op_params=t.op_params,
                              view_src=self.parts[t.view_src][j], view_offs=offs, nb=nb, flags=t.flags)
            else:
                part = Tensor(t.type, ne, name=t.name, op=t.op, src=src, op_params=t.op_params, nb=nb,
                              flags=t.flags)
                owned[j].append(part)
            out.append(part)
        return out

    def load(self, leaves: Sequence[Tensor], inputs: Mapping[Tensor, Any]) -> None:
        """Fill the leaves' slices: inputs (mirrored) from `inputs`, the rest from the full tensors."""
        for t in leaves:
            if t.view_src is not None:
                continue
            state = self.resolver.state(t, assume_sync=True)
            if t in inputs and state.axis is not SplitAxis.MIRRORED:
                raise MetaSplitError(f"input {t.name!r} is {state.axis.name}: inputs are mirrored")
            for j, part in enumerate(self.parts[t]):
                if t in inputs:
                    part.set_data(inputs[t])
                else:
                    _copy_piece(t, part, state, j)

    def release(self) -> None:
        for b in self.buffers:
            b.free()
        self.buffers = []


class MetaBackend(Backend):
    """Runs graphs on a meta device: subgraphs on every member, an AllReduce between them.

    `run` executes nodes from the full images of their leaves (and `inputs`); `compute`, what the
    scheduler calls per split, runs and then writes each node's gathered result back to its full
    image, so later splits and the caller read ordinary tensors.
    """

    device: MetaDevice

    def __init__(self, device: MetaDevice, static: StaticStates) -> None:
        super().__init__(device)
        self.static = static
        self.scratch = StepBuffers(device.n_devices)   # kept across graphs, as the meta backend's bufs
        self.slices: MetaSlices | None = None
        self.last_run: MetaRun | None = None

    def run(self, nodes: Sequence[Tensor], inputs: Mapping[Tensor, Any] | None = None) -> MetaRun:
        if self.slices is not None:
            self.slices.release()
        resolver = SplitResolver(self.device.n_devices, self.static)
        cut = cut_subgraphs(nodes, resolver)
        self.slices = slices = MetaSlices(self.device, resolver)
        slices.load(slices.build(nodes), inputs or {})
        reduces = []
        for sg in cut.subgraphs:
            for j, member in enumerate(self.device.members):
                member.compute([slices.parts[n][j] for k, n in enumerate(nodes[sg.start:sg.stop], sg.start)
                                if k not in cut.skipped[j]])
            if sg.reduce:
                last = nodes[sg.stop - 1]
                bufs = [slices.parts[last][j].numpy() for j in range(self.device.n_devices)]
                computed = [sg.stop - 1 not in cut.skipped[j] for j in range(self.device.n_devices)]
                reduces.append(allreduce(bufs, computed, self.scratch))
        self.last_run = MetaRun(cut, tuple(reduces))
        return self.last_run

    def compute(self, nodes: Sequence[Tensor]) -> None:
        nodes = [n for n in nodes if n.op is not Op.NONE]
        run = self.run(nodes)
        for k, node in enumerate(nodes):
            if node.op in VIEW_OPS:
                continue   # metadata: its bytes are its root's
            node.numpy()[...] = self._gathered(node, k, run.cut)
            if self.observer is not None:
                self.observer(node)

    def _gathered(self, node: Tensor, k: int, cut: MetaCut) -> np.ndarray:
        """gather, a mirrored node read from a member that computed it."""
        assert self.slices is not None
        if self.slices.resolver.state(node).axis is SplitAxis.MIRRORED:
            j = next((j for j, skip in enumerate(cut.skipped) if k not in skip), 0)
            return np.array(self.slices.parts[node][j].numpy())
        return self.gather(node)

    def gather(self, t: Tensor) -> np.ndarray:
        """The whole tensor, numpy order: a mirrored one from member 0, a split one joined along
        its axis, a partial one summed (ggml_backend_meta_get_tensor)."""
        if self.slices is None:
            raise MetaSplitError("nothing computed yet")
        parts = self.slices.parts[t]
        state = self.slices.resolver.state(t)
        if numpy_dtype(t.type) is None:
            raise MetaSplitError(f"{t.name!r}: gather reads element types only")
        arrays = [np.array(p.numpy()) for p in parts]
        if state.axis is SplitAxis.MIRRORED:
            return arrays[0]
        if state.axis is SplitAxis.PARTIAL:
            return np.sum(arrays, axis=0)
        if state.nr != 1:
            raise MetaSplitError(f"{t.name!r}: gathering a repeated split is not implemented")
        return np.concatenate(arrays, axis=MAX_DIMS - 1 - int(state.axis))
