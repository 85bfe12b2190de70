"""Scheduler passes 1-4: give every node a backend (seed 000; ggml_backend_sched_split_graph).

Each pass is one function taking the scheduler's static context, the graph and an
`Assignment`, and returning the assignment (STYLE.md #6). The index of a backend in the
context is its priority: 0 is the highest, the last is the CPU. Tensors pinned by the user
(`Assignment.pinned`) are never overwritten.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.ggml.backend import Backend, BufferType
from runtime.ggml.graph import FLAG_INPUT, VIEW_OPS, BufferUsage, Graph, Op, Tensor
from runtime.ggml.sched_errors import SchedulerError

# Ops that abstain from the weight rule: their model tensor (rope frequencies, attention
# sinks) is too small to decide where the op runs (ggml-backend.cpp, seed 000 "1.wgtN").
WEIGHT_RULE_EXCLUDED = frozenset({Op.ROPE, Op.FLASH_ATTN_EXT})


@dataclass(frozen=True)
class SchedContext:
    """What the passes may ask: the backends in priority order, their buffer types, op_offload."""

    backends: tuple[Backend, ...]
    bufts: tuple[BufferType, ...]
    op_offload: bool
    # memo: buffer type -> ids of the backends that read it, in priority order (devices answer
    # supports_buft from fixed facts; a 128-layer graph asks once per weight per split)
    _readers: dict[BufferType, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def cpu(self) -> int:
        return len(self.backends) - 1

    def supports_op(self, b: int, t: Tensor) -> bool:
        return self.backends[b].device.supports_op(t)

    def readers(self, buft: BufferType) -> tuple[int, ...]:
        ids = self._readers.get(buft)
        if ids is None:
            ids = tuple(b for b, backend in enumerate(self.backends) if backend.device.supports_buft(buft))
            self._readers[buft] = ids
        return ids

    def reads(self, b: int, buft: BufferType) -> bool:
        return b in self.readers(buft)


class Assignment:
    """Backend id per tensor (-1: undecided) and the cause code of each decision."""

    __slots__ = ("causes", "ids", "pinned")

    def __init__(self, pins: dict[Tensor, int] | None = None) -> None:
        self.ids: dict[Tensor, int] = dict(pins or {})
        self.causes: dict[Tensor, str] = {t: "usr" for t in self.ids}
        self.pinned = frozenset(self.ids)

    def get(self, t: Tensor | None) -> int:
        return -1 if t is None else self.ids.get(t, -1)

    def set(self, t: Tensor, backend_id: int, cause: str) -> None:
        self.ids[t] = backend_id
        self.causes[t] = cause


def buffer_supported(ctx: SchedContext, a: Assignment, t: Tensor, b: int) -> bool:
    """Can backend b read t where it is (its buffer, else the buffer type of its backend)?"""
    vs = t.view_src
    buf = t.buffer if vs is None else vs.buffer
    if buf is not None:
        buft = buf.buft
    else:
        ids = a.ids
        tb = ids.get(t, -1)
        if tb == -1 and vs is not None:
            tb = ids.get(vs, -1)
        if tb == -1:
            return False
        buft = ctx.bufts[tb]
    if b < 0:  # a negative id indexes from the end, as the backends tuple would
        b += len(ctx.backends)
    return b in ctx.readers(buft)


def _backend_from_buffer(ctx: SchedContext, t: Tensor, op_node: Tensor) -> int:
    """Highest-priority backend that reads t's buffer type and runs op_node; -1 if none."""
    buf = t.root_buffer()
    if buf is None:
        return -1
    backends = ctx.backends
    for b in ctx.readers(buf.buft):
        if backends[b].device.supports_op(op_node):
            return b
    return -1


def _backend_from_storage(ctx: SchedContext, t: Tensor) -> tuple[int, str]:
    """1.dst: the first backend that reads the buffer t lives in (its root's) and runs t;
    1.vsrc: the same asked through t's view source."""
    b = _backend_from_buffer(ctx, t, t)
    if b != -1:
        return b, "1.dst"
    vs = t.view_src
    if vs is not None:
        b = _backend_from_buffer(ctx, vs, t)
        if b != -1:
            return b, "1.vsrc"
    return -1, ""


def _offload_backend(ctx: SchedContext, t: Tensor, below: int) -> int:
    """1.off: a backend of higher priority than `below` that wants t anyway; -1 if none."""
    for b in range(below):
        if ctx.supports_op(b, t) and ctx.backends[b].device.offload_op(t):
            return b
    return -1


def _backend_from_weights(ctx: SchedContext, t: Tensor) -> tuple[int, str]:
    """1.wgtN: the backend that reads t's first weight source (N its index), unless a device
    takes a host weight's op (1.off); -1 when t has no weight source."""
    for j, src in enumerate(t.src):
        if src is None or src.buffer is None or src.buffer.usage is not BufferUsage.WEIGHTS:
            continue
        sb = _backend_from_buffer(ctx, src, t)
        if ctx.op_offload and sb == ctx.cpu and src.buffer.is_host:
            b = _offload_backend(ctx, t, sb)
            if b != -1:
                return b, "1.off"
        return sb, f"1.wgt{j}"
    return -1, ""


def _forced_backend(ctx: SchedContext, t: Tensor) -> tuple[int, str]:
    """Pass 1's question for one tensor: is its placement already decided, and why."""
    vs = t.view_src
    buf = t.buffer if vs is None else vs.buffer   # t.root_buffer()
    # without a root buffer both questions of _backend_from_storage answer -1 (a view source
    # has no view source of its own: Tensor collapses view chains), so most compute nodes skip it
    if buf is not None or (vs is not None and vs.view_src is not None):
        b, cause = _backend_from_storage(ctx, t)
        if b != -1:
            return b, cause
    if buf is not None:  # pre-allocated: cannot move, nothing to negotiate (ggml aborts)
        raise SchedulerError(f"pre-allocated tensor ({t.name}) in a buffer ({buf.name}) that no "
                             f"backend can run the operation ({t.op.value}) on")
    if t.flags & FLAG_INPUT:
        return ctx.cpu, "1.inp"  # the caller writes inputs in host memory
    if t.op in WEIGHT_RULE_EXCLUDED:
        return -1, ""
    return _backend_from_weights(ctx, t)


def assign_forced(ctx: SchedContext, graph: Graph, a: Assignment) -> Assignment:
    """Pass 1: leafs, then nodes, whose placement is forced (1.dst, 1.vsrc, 1.inp, 1.wgt, 1.off)."""
    ids = a.ids
    for t in (*graph.leafs, *graph.nodes):
        if ids.get(t, -1) == -1:
            b, cause = _forced_backend(ctx, t)
            if b != -1:
                a.set(t, b, cause)
    return a


def _sweep(ctx: SchedContext, nodes: list[Tensor], a: Assignment, skip_cpu: bool) -> Assignment:
    """Carry the last seen backend onto unassigned nodes that backend supports. With
    skip_cpu a CPU node clears the carried id: the CPU never spreads in the GPU sweeps."""
    cur = -1
    ids = a.ids
    cpu = ctx.cpu
    supports = [backend.device.supports_op for backend in ctx.backends]
    for node in nodes:
        if node.op in VIEW_OPS:
            continue  # metadata: placed by pass 4
        b = ids.get(node, -1)
        if b != -1:
            cur = -1 if skip_cpu and b == cpu else b
        elif cur != -1 and supports[cur](node):
            a.set(node, cur, "2.sup")
    return a


def expand_gpu_down(ctx: SchedContext, graph: Graph, a: Assignment) -> Assignment:
    """Pass 2, sweep 1: GPU assignments flow forward."""
    return _sweep(ctx, graph.nodes, a, skip_cpu=True)


def expand_gpu_up(ctx: SchedContext, graph: Graph, a: Assignment) -> Assignment:
    """Pass 2, sweep 2: GPU assignments flow backward."""
    return _sweep(ctx, graph.nodes[::-1], a, skip_cpu=True)


def expand_rest_down(ctx: SchedContext, graph: Graph, a: Assignment) -> Assignment:
    """Pass 2, sweep 3: any assignment (now the CPU too) flows forward."""
    return _sweep(ctx, graph.nodes, a, skip_cpu=False)


def expand_rest_up(ctx: SchedContext, graph: Graph, a: Assignment) -> Assignment:
    """Pass 2, sweep 4: any assignment flows backward."""
    return _sweep(ctx, graph.nodes[::-1], a, skip_cpu=False)


def _guess(ctx: SchedContext, a: Assignment, node: Tensor) -> None:
    """Unassigned node: the backend able to read most of its sources where they are."""
    best = -1
    for b in range(len(ctx.backends)):
        if not ctx.supports_op(b, node):
            continue
        n_ok = sum(1 for s in node.src if s is not None
                   and (a.get(s) != -1 or a.get(s.view_src) != -1) and buffer_supported(ctx, a, s, b))
        if n_ok > best:  # strictly greater: ties go to the higher priority
            best = n_ok
            a.set(node, b, "3.best")


def _upgrade(ctx: SchedContext, a: Assignment, node: Tensor, cur: int) -> None:
    """Assigned node: move up to a higher-priority backend with the identical buffer type
    (a stricter test than needed, as ggml's comment admits, but cheap)."""
    for b in range(cur):
        if ctx.bufts[b] != ctx.bufts[cur] or not ctx.supports_op(b, node):
            continue
        if all(buffer_supported(ctx, a, s, b) for s in node.src if s is not None):
            a.set(node, b, "3.upg")
            return


def upgrade_and_guess(ctx: SchedContext, graph: Graph, a: Assignment) -> Assignment:
    """Pass 3. User pins are not upgraded: seed 000 promises they survive every pass (ggml
    itself would move a CPU pin onto a same-buffer-type accelerator here)."""
    ids, pinned = a.ids, a.pinned
    for node in graph.nodes:
        if node.op in VIEW_OPS:
            continue
        cur = ids.get(node, -1)
        if cur == -1:
            _guess(ctx, a, node)
        elif cur > 0 and node not in pinned:  # backend 0 has nothing above it
            _upgrade(ctx, a, node, cur)
    return a


def _place_sources(a: Assignment, node: Tensor, cur: int) -> None:
    """node's unassigned sources: a view follows its view source (4.vsrc), any other source
    the node's backend cur (4.cur; none while cur is -1)."""
    ids = a.ids
    for src in node.src:
        if src is None or ids.get(src, -1) != -1:
            continue
        if src.view_src is not None:
            vb = ids.get(src.view_src, -1)
            if vb != -1:
                a.set(src, vb, "4.vsrc")
        elif cur != -1:
            a.set(src, cur, "4.cur")


def _first_runner(ctx: SchedContext, node: Tensor) -> int:
    """The highest-priority backend that runs node; raises when none can."""
    b = next((b for b in range(len(ctx.backends)) if ctx.supports_op(b, node)), -1)
    if b == -1:
        names = ", ".join(backend.name for backend in ctx.backends)
        raise SchedulerError(
            f"node {node.name!r} ({node.op.value}): no backend among [{names}] runs it; "
            "all nodes should be assigned by now (no CPU fallback for this op)")
    return b


def assign_sources(ctx: SchedContext, graph: Graph, a: Assignment) -> Assignment:
    """Pass 4: views follow their view source (4.vsrc), other sources their consumer (4.cur);
    a node still unplaced takes the first backend that runs it, or nothing can."""
    ids = a.ids
    for node in graph.nodes:
        cur = ids.get(node, -1)
        if node.view_src is not None and cur == -1:
            cur = ids.get(node.view_src, -1)
            if cur != -1:
                a.set(node, cur, "4.vsrc")
        _place_sources(a, node, cur)
        if cur == -1:
            a.set(node, _first_runner(ctx, node), "2.sup")
    return a
