"""Graph allocator, after ggml-alloc.c (seed 000 "Liveness by refcount, offsets by free list").

The walk is a simulation: it counts each tensor's children and views, then goes through the
nodes in execution order, allocating each node (in place over a dying parent when the op
allows it), then freeing every parent whose children and views reached zero. Offsets come
from one best-fit free list per distinct buffer type, in chunks no larger than the buffer
type's max size. Only afterwards are real buffers made at the sizes found (`reserve`), and
`alloc_graph` stamps (buffer, offset) into each tensor.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from planner.core.units import pad
from runtime.ggml.backend import Buffer, BufferType
from runtime.ggml.graph import FLAG_INPUT, FLAG_OUTPUT, INPLACE_OPS, BufferUsage, Op, Tensor
from runtime.ggml.sched_errors import BufferAllocationError, SchedulerError

log = logging.getLogger(__name__)

MAX_CHUNKS = 16  # GGML_VBUFFER_MAX_CHUNKS
MAX_FREE_BLOCKS = 256
_HUGE = 1 << 62  # the last chunk is unbounded, as ggml's SIZE_MAX/2


class DynAllocator:
    """Offsets within up to 16 chunks; each chunk's free blocks sorted by offset, the last
    block being the chunk's open tail (ggml_dyn_tallocr)."""

    def __init__(self, alignment: int, max_chunk_size: int) -> None:
        self.alignment = alignment
        self.max_chunk_size = min(max_chunk_size, _HUGE)
        self.blocks: list[list[list[int]]] = []  # per chunk: [[offset, size], ...]
        self.max_size: list[int] = []

    def reset(self) -> None:
        self.blocks, self.max_size = [], []

    def chunk_sizes(self) -> list[int]:
        return list(self.max_size)

    def _new_chunk(self, min_size: int) -> int:
        if len(self.blocks) >= MAX_CHUNKS:
            return -1
        # a chunk may exceed the max size for one oversized tensor; the last one is unbounded
        size = _HUGE if len(self.blocks) == MAX_CHUNKS - 1 else max(min_size, self.max_chunk_size)
        self.blocks.append([[0, size]])
        self.max_size.append(0)
        return len(self.blocks) - 1

    def _best_fit(self, size: int) -> tuple[int, int]:
        """(chunk, block) of the best fit among the non-tail blocks, or (-1, -1)."""
        best_chunk, best_block = -1, -1
        for c, blocks in enumerate(self.blocks):
            best_size = _HUGE * 4  # reset per chunk as in ggml: a fit in a later chunk wins
            for i in range(len(blocks) - 1):
                if size <= blocks[i][1] <= best_size:
                    best_chunk, best_block, best_size = c, i, blocks[i][1]
        return best_chunk, best_block

    def _best_tail(self, size: int) -> tuple[int, int]:
        """(chunk, block) of the tail block that grows its chunk least, or (-1, -1)."""
        best_chunk, best_block = -1, -1
        best_reuse = -_HUGE * 8  # reuse < 0: bytes the chunk must grow; >= 0: bytes left idle
        for c, blocks in enumerate(self.blocks):
            if not blocks:
                continue
            off, avail = blocks[-1]
            reuse = self.max_size[c] - off - size
            better = (best_reuse < 0 and reuse > best_reuse) or (0 <= reuse < best_reuse)
            if avail >= size and better:
                best_chunk, best_block, best_reuse = c, len(blocks) - 1, reuse
        return best_chunk, best_block

    def alloc(self, size: int) -> tuple[int, int]:
        size = pad(size, self.alignment)
        best_chunk, best_block = self._best_fit(size)
        if best_block == -1:
            best_chunk, best_block = self._best_tail(size)
        if best_block == -1:
            best_chunk, best_block = self._new_chunk(size), 0
            if best_chunk == -1:
                raise SchedulerError(f"graph allocation: no chunk left for {size} bytes")
        block = self.blocks[best_chunk][best_block]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best_chunk][best_block]
        self.max_size[best_chunk] = max(self.max_size[best_chunk], offset + size)
        return best_chunk, offset

    def free(self, addr: tuple[int, int], size: int) -> None:
        size = pad(size, self.alignment)
        chunk, offset = addr
        blocks = self.blocks[chunk]
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:  # freed bytes follow this block
                block[1] += size
                if i + 1 < len(blocks) and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:  # freed bytes precede this block
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        if len(blocks) >= MAX_FREE_BLOCKS:
            raise SchedulerError("graph allocation: out of free blocks")
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


@dataclass(frozen=True)
class PlannedGraph:
    """What the allocator walks: nodes and leafs in order, each with its buffer id (backend)."""

    nodes: Sequence[Tensor]
    node_ids: Sequence[int]
    leafs: Sequence[Tensor]
    leaf_ids: Sequence[int]


@dataclass(frozen=True)
class TensorAlloc:
    buffer_id: int
    chunk: int
    offset: int
    size_max: int


class _Info:
    """Per-tensor walk state. Defaults live on the class (no __init__): a walk makes one per
    tensor it touches, tens of thousands for a 128-layer graph, and most keep the defaults."""

    n_children = 0
    n_views = 0
    buffer_id = -1
    addr = (0, 0)
    allocated = False


class GraphAllocator:
    """One dynamic allocator per distinct buffer type; one compute buffer (list of chunks) each."""

    def __init__(self, bufts: Sequence[BufferType]) -> None:
        self.bufts = list(bufts)
        self.allocs: list[DynAllocator] = []
        for i, buft in enumerate(self.bufts):
            shared = next((self.allocs[j] for j in range(i) if self.bufts[j] == buft), None)
            self.allocs.append(shared or DynAllocator(buft.alignment, buft.max_size))
        self.buffers: list[list[Buffer] | None] = [None] * len(self.bufts)
        self._info: defaultdict[Tensor, _Info] = defaultdict(_Info)
        self._allocs: tuple[list[tuple[TensorAlloc | None, tuple[TensorAlloc | None, ...]]],
                            list[TensorAlloc | None]] | None = ([], [])
        self._pending: tuple[dict[Tensor, _Info], PlannedGraph, list[tuple[Tensor | None, ...]]] | None = None
        self._stamped: list[Tensor] = []
        self.n_reserves = 0

    # --- the walk ----------------------------------------------------------------------------
    def _get(self, t: Tensor) -> _Info:
        return self._info[t]

    def _allocate_node(self, node: Tensor, buffer_id: int) -> None:
        if node.buffer is not None or node.view_src is not None:
            return  # pre-allocated (weights, caches) or a view: no arena space
        hn = self._info[node]
        if hn.allocated:
            return
        if buffer_id < 0:
            raise SchedulerError(f"tensor {node.name!r} needs memory but has no backend assigned")
        hn.allocated = True
        if node.op in INPLACE_OPS and self._reuse_parent(node, hn):
            return
        hn.buffer_id = buffer_id
        hn.addr = self.allocs[buffer_id].alloc(self.bufts[buffer_id].alloc_size(node))

    def _reuse_parent(self, node: Tensor, hn: _Info) -> bool:
        """In place: take a parent's storage when this node is its only remaining child."""
        info = self._info
        for parent in node.src:
            if parent is None:
                continue
            p_hn = info[parent]
            if not p_hn.allocated:
                continue  # external data (weights, caches) is never overwritten
            vs = parent.view_src
            if parent.flags & FLAG_OUTPUT or (vs is not None and vs.flags & FLAG_OUTPUT):
                continue
            if not node.same_layout(parent):
                continue
            if p_hn.n_children != 1 or p_hn.n_views != 0:
                continue
            owner = parent
            if vs is not None:
                vs_hn = info[vs]
                if not (vs_hn.n_views == 1 and vs_hn.n_children == 0 and parent.view_offs == 0):
                    continue
                vs_hn.allocated = False
                owner = vs
            hn.buffer_id, hn.addr = p_hn.buffer_id, p_hn.addr
            p_hn.allocated = False  # the node now owns these bytes
            self._free_extra_space(node, owner, hn)
            return True
        return False

    def _free_extra_space(self, node: Tensor, parent: Tensor, hn: _Info) -> None:
        p_hn = self._info[parent]
        alloc = self.allocs[p_hn.buffer_id]
        parent_size = pad(self.bufts[p_hn.buffer_id].alloc_size(parent), alloc.alignment)
        node_size = pad(self.bufts[hn.buffer_id].alloc_size(node), alloc.alignment)
        if parent_size > node_size:
            alloc.free((p_hn.addr[0], p_hn.addr[1] + node_size), parent_size - node_size)

    def _free_node(self, node: Tensor) -> None:
        if node.flags & FLAG_OUTPUT:
            return  # graph outputs are never freed
        hn = self._info[node]
        self.allocs[hn.buffer_id].free(hn.addr, self.bufts[hn.buffer_id].alloc_size(node))
        hn.allocated = False

    def _count_uses(self, graph: PlannedGraph) -> None:
        info = self._info
        allocate = self._allocate_node
        for node, buffer_id in zip(graph.nodes, graph.node_ids, strict=True):
            # an op-NONE node with a view source is the scheduler's dependency marker, not a view
            if node.view_src is not None and node.op is not Op.NONE:
                info[node.view_src].n_views += 1
            if node.flags & FLAG_INPUT:
                allocate(node, buffer_id)
            for src in node.src:
                if src is None:
                    continue
                info[src].n_children += 1
                if src.flags & FLAG_INPUT:
                    allocate(src, buffer_id)

    def _walk(self, graph: PlannedGraph) -> None:
        self._info = defaultdict(_Info)
        for a in self.allocs:
            a.reset()
        for leaf, leaf_id in zip(graph.leafs, graph.leaf_ids, strict=True):
            self._allocate_node(leaf, leaf_id)
        self._count_uses(graph)
        info = self._info
        allocate, release_parents = self._allocate_node, self._release_parents
        for node, buffer_id in zip(graph.nodes, graph.node_ids, strict=True):
            srcs = node.src   # not changed by allocating
            for parent in srcs:
                # _allocate_node's own early exits, tested here to save a call per edge
                if parent is not None and parent.buffer is None and parent.view_src is None \
                        and not info[parent].allocated:
                    allocate(parent, buffer_id)
            if node.buffer is None and node.view_src is None and not info[node].allocated:
                allocate(node, buffer_id)
            release_parents(srcs)

    def _release_parents(self, srcs: list[Tensor | None]) -> None:
        """After a node: free each parent it was the last child of and no view still needs
        (a view's bytes are its view source's, freed with the source's last view)."""
        info = self._info
        free_node = self._free_node
        for parent in srcs:
            if parent is None:
                continue
            p_hn = info[parent]
            left = p_hn.n_children - 1
            p_hn.n_children = left
            if left != 0 or p_hn.n_views != 0:
                continue
            vs = parent.view_src
            if vs is not None:
                vs_hn = info[vs]
                vs_hn.n_views -= 1
                if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                    free_node(vs)
            elif p_hn.allocated:
                free_node(parent)

    # --- records, buffers, stamping ------------------------------------------------------------
    def plan(self, graph: PlannedGraph) -> list[int]:
        """Walk the graph and record every tensor's address; returns bytes per buffer id.
        Touches no device memory (ggml_gallocr_reserve_n_size)."""
        self.unstamp()
        self._walk(graph)
        # The per-node records are made when first needed (alloc_graph): a reserve that only
        # sizes buffers never reads them. The walk's state and the sources as they are now
        # (the scheduler rewires them) are kept for that.
        self._pending = (self._info, graph, [tuple(n.src) for n in graph.nodes])
        self._allocs = None
        self.n_reserves += 1
        sizes = []
        for i, alloc in enumerate(self.allocs):
            shared = any(self.allocs[j] is alloc for j in range(i))
            sizes.append(0 if shared else sum(alloc.chunk_sizes()))
        return sizes

    def _recorded(self) -> tuple[list[tuple[TensorAlloc | None, tuple[TensorAlloc | None, ...]]],
                                 list[TensorAlloc | None]]:
        """(per node: its record and its sources'; per leaf: its record) from the last plan.
        Only tensors that are neither views nor pre-allocated ever get a buffer id in the walk
        (_allocate_node), so views, pre-allocated and absent tensors get no record."""
        if self._allocs is None:
            assert self._pending is not None
            info, graph, srcs = self._pending
            bufts = self.bufts
            # keyed by Tensor | None: a node's absent sources look up None and get no record
            records: dict[Tensor | None, TensorAlloc] = {
                t: TensorAlloc(hn.buffer_id, hn.addr[0], hn.addr[1], bufts[hn.buffer_id].alloc_size(t))
                for t, hn in info.items() if hn.buffer_id >= 0}
            record = records.get
            self._allocs = ([(record(n), tuple(map(record, ss))) for n, ss in zip(graph.nodes, srcs, strict=True)],
                            [record(leaf) for leaf in graph.leafs])
            self._pending = None
        return self._allocs

    def reserve(self, graph: PlannedGraph) -> list[int]:
        """Plan, then (re)allocate each buffer type's chunks where they grew (ggml_gallocr_reserve_n).
        A device that cannot hold its buffer raises BufferAllocationError."""
        sizes = self.plan(graph)
        for i, buft in enumerate(self.bufts):
            first = next(j for j in range(i + 1) if self.allocs[j] is self.allocs[i])
            if first != i:
                self.buffers[i] = self.buffers[first]
                continue
            self._grow_buffer(i, buft)
        return sizes

    def _grow_buffer(self, i: int, buft: BufferType) -> None:
        wanted = self.allocs[i].chunk_sizes()
        current = self.buffers[i]
        have = [b.size for b in current] if current is not None else []
        if current is not None and all(w <= (have[c] if c < len(have) else 0) for c, w in enumerate(wanted)):
            return
        if current:
            log.debug("reallocating %s compute buffer: %d -> %d bytes", buft.name, sum(have), sum(wanted))
            for b in current:
                b.free()
        self.buffers[i] = None
        made: list[Buffer] = []
        try:
            for size in wanted:
                made.append(buft.alloc_buffer(size, BufferUsage.COMPUTE))
        except BufferAllocationError:
            for b in made:
                b.free()
            raise
        self.buffers[i] = made

    def needs_realloc(self, graph: PlannedGraph) -> bool:
        """True when the recorded plan cannot hold this graph (ggml_gallocr_needs_realloc)."""
        node_allocs, leaf_allocs = self._recorded()
        if len(graph.nodes) != len(node_allocs) or len(graph.leafs) != len(leaf_allocs):
            return True
        for node, (dst, srcs) in zip(graph.nodes, node_allocs, strict=True):
            if not self._fits(node, dst):
                return True
            for s, rec in zip(node.src, srcs, strict=False):  # this graph's node may have other sources
                if s is not None and not self._fits(s, rec):
                    return True
        return False

    def _fits(self, t: Tensor, rec: TensorAlloc | None) -> bool:
        if t.view_src is not None or t.buffer is not None:
            return True
        if rec is None:
            return False
        return rec.size_max >= self.bufts[rec.buffer_id].alloc_size(t)

    def alloc_graph(self, graph: PlannedGraph) -> bool:
        """Stamp the recorded addresses into the tensors. False when the plan is stale and there
        are several buffers (the caller must reserve); a single buffer re-reserves by itself."""
        self.unstamp()
        if self.needs_realloc(graph):
            if len(self.bufts) != 1:
                return False
            self.reserve(graph)
        node_allocs, leaf_allocs = self._recorded()
        for leaf, rec in zip(graph.leafs, leaf_allocs, strict=True):
            self._stamp(leaf, rec)
        for node, (dst, srcs) in zip(graph.nodes, node_allocs, strict=True):
            for s, rec in zip(node.src, srcs, strict=False):  # as in needs_realloc
                if s is not None:
                    self._stamp(s, rec)
            self._stamp(node, dst)
        return True

    def _stamp(self, t: Tensor, rec: TensorAlloc | None) -> None:
        if rec is None or t.view_src is not None or t.buffer is not None:
            return
        chunks = self.buffers[rec.buffer_id]
        if chunks is None:
            raise SchedulerError(f"tensor {t.name!r}: its compute buffer was never reserved")
        t.buffer, t.offset = chunks[rec.chunk], rec.offset
        self._stamped.append(t)

    def unstamp(self) -> None:
        """Forget the addresses this allocator stamped, so the next split sees fresh tensors."""
        for t in self._stamped:
            t.buffer, t.offset = None, 0
        self._stamped = []

    def buffer_size(self, buffer_id: int) -> int:
        """Bytes of buffer `buffer_id`; a buffer shared by equal buffer types counts once."""
        chunks = self.buffers[buffer_id]
        if chunks is None or any(self.buffers[j] is chunks for j in range(buffer_id)):
            return 0
        return sum(b.size for b in chunks)

    def address(self, t: Tensor) -> tuple[int, int, int] | None:
        """(buffer id, chunk, offset) the last plan gave t, or None (for tests and debugging)."""
        hn = self._info.get(t)
        return None if hn is None or hn.buffer_id < 0 else (hn.buffer_id, *hn.addr)
