"""The backend scheduler: split -> allocate -> compute (seed 000; ggml_backend_sched_*).

The backends list is the whole policy: index 0 is the highest priority and the last entry
must be the CPU, the universal fallback. `split_graph` only calls the passes in order.

Usage::

    sched = Scheduler([gpu0, gpu1, cpu])
    sched.reserve(worst_case_graph)           # size the compute buffers once
    result = sched.compute(graph, inputs={tokens: ids})
    print(sched.debug_text())                 # GGML_SCHED_DEBUG=2-style assignment dump

Departures from ggml, each for a Python caller that reuses one graph object instead of
rebuilding it: `reset()` undoes the in-place source rewiring and forgets allocator
addresses (ggml asks callers to discard the graph), and user pins survive `reset()` (ggml
clears them, and llama.cpp pins again while rebuilding). Until `reset()`, the graph's sources
point at this scheduler's input copies: reset before handing the graph to another scheduler.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runtime.ggml.alloc import GraphAllocator, PlannedGraph
from runtime.ggml.backend import Backend, BufferType
from runtime.ggml.compute import EvalCallback, Measurement, RunState, compute_splits
from runtime.ggml.debug import debug_text
from runtime.ggml.graph import VIEW_OPS, Graph, Op, Tensor
from runtime.ggml.passes import (
    Assignment,
    SchedContext,
    assign_forced,
    assign_sources,
    expand_gpu_down,
    expand_gpu_up,
    expand_rest_down,
    expand_rest_up,
    upgrade_and_guess,
)
from runtime.ggml.profiles import GGML_SCHED_MAX_COPIES
from runtime.ggml.sched_errors import SchedulerError
from runtime.ggml.splits import (
    Split,
    SplitPlan,
    backend_alloc_deps,
    collect_graph_inputs,
    cut_splits,
    graph_size,
    planned_graph,
)

log = logging.getLogger(__name__)

MAX_BACKENDS = 16  # GGML_SCHED_MAX_BACKENDS

PassFn = Callable[[SchedContext, Graph, Assignment], Assignment]
PASSES: tuple[PassFn, ...] = (
    assign_forced,  # 1
    expand_gpu_down, expand_gpu_up, expand_rest_down, expand_rest_up,  # 2
    upgrade_and_guess,  # 3
    assign_sources,  # 4
)


def _ids_changed(new: Sequence[int], old: Sequence[int], bufts: Sequence[BufferType]) -> bool:
    """A move only counts when the memory changes: same buffer type is not a change."""
    # the graphs may differ in length: only the common prefix is compared
    return any(n != o and (n < 0 or o < 0 or bufts[n] != bufts[o]) for n, o in zip(new, old, strict=False))


class Scheduler:
    def __init__(self, backends: Sequence[Backend], bufts: Sequence[BufferType] | None = None, *,
                 parallel: bool = False, op_offload: bool = True, max_split_inputs: int | None = None,
                 debug_realloc: int | None = None) -> None:
        if not backends or len(backends) > MAX_BACKENDS:
            raise SchedulerError(f"a scheduler takes 1 to {MAX_BACKENDS} backends, got {len(backends)}")
        if not backends[-1].is_cpu:
            raise SchedulerError(f"the last backend must be the CPU (the fallback every op can run on), "
                                 f"got {backends[-1].name}")
        bufts = tuple(bufts) if bufts is not None else tuple(b.buffer_type for b in backends)
        for b, buft in zip(backends, bufts, strict=False):  # bufts as given: not checked against backends
            if not b.device.supports_buft(buft):
                raise SchedulerError(f"backend {b.name} cannot use buffer type {buft.name}")
        self.ctx = SchedContext(tuple(backends), bufts, op_offload)
        self.n_copies = GGML_SCHED_MAX_COPIES if parallel else 1
        self.max_split_inputs = max_split_inputs
        env = os.environ.get("GGML_SCHED_DEBUG_REALLOC")
        self.debug_realloc = debug_realloc if debug_realloc is not None else int(env or 0)
        # GGML_SCHED_DEBUG=2 logs debug_text() after every split (at DEBUG level: never printed)
        self.debug = int(os.environ.get("GGML_SCHED_DEBUG") or 0)
        self.galloc = GraphAllocator(bufts)
        self.pins: dict[Tensor, int] = {}
        self.assignment = Assignment()
        self.plan = SplitPlan()
        self.callback: EvalCallback | None = None
        self.cur_copy = self.next_copy = 0
        self.is_alloc = False
        self.n_reallocs = 0
        self._graph: Graph | None = None
        self._planned: PlannedGraph | None = None
        self._ids: tuple[Sequence[int], Sequence[int]] = ((), ())
        self._prev_ids: tuple[Sequence[int], Sequence[int]] = ((), ())
        self._graph_size = self._prev_graph_size = 0
        self._reordered: tuple[Graph, list[Tensor]] | None = None

    # --- queries -------------------------------------------------------------------------------
    @property
    def backends(self) -> tuple[Backend, ...]:
        return self.ctx.backends

    @property
    def splits(self) -> list[Split]:
        return self.plan.splits

    @property
    def n_splits(self) -> int:
        return len(self.plan.splits)

    def backend_index(self, backend: Backend) -> int:
        for i, b in enumerate(self.ctx.backends):
            if b is backend:
                return i
        raise SchedulerError(f"backend {backend.name} is not one of this scheduler's backends")

    def get_tensor_backend(self, t: Tensor) -> Backend | None:
        b = self.assignment.get(t)
        return self.ctx.backends[b] if b != -1 else None

    def assignment_names(self, tensors: Sequence[Tensor]) -> dict[str, str]:
        """name -> backend name (or 'NULL'), for reading a placement at a glance."""
        return {t.name: (self.ctx.backends[b].name if (b := self.assignment.get(t)) != -1 else "NULL")
                for t in tensors}

    def kernel_nodes(self) -> dict[str, int]:
        """Per backend, the nodes of the last split graph that run an op: not NONE, VIEW, RESHAPE, PERMUTE or
        TRANSPOSE, which only describe memory (ggml-cuda's compute loop, like every backend's, skips them; each
        other node is a kernel a GPU backend launches, before its fusions merge some). The throughput model
        charges a device's per-kernel time on these (planner/speed/throughput.py)."""
        out: dict[str, int] = {}
        if self._graph is None:
            return out
        nodes = self._graph.nodes
        for split in self.plan.splits:
            n = sum(1 for t in nodes[split.i_start:split.i_end] if t.op is not Op.NONE and t.op not in VIEW_OPS)
            out[split.backend] = out.get(split.backend, 0) + n
        return out

    def buffer_size(self, backend: Backend) -> int:
        """Bytes of this backend's compute buffer (0 if it shares a buffer type listed earlier)."""
        return self.galloc.buffer_size(self.backend_index(backend))

    def debug_text(self) -> str:
        if self._graph is None:
            return ""
        return debug_text(self._graph, self.plan.splits, self.assignment, self.ctx.backends)

    # --- configuration -----------------------------------------------------------------------
    def set_tensor_backend(self, t: Tensor, backend: Backend) -> None:
        """Pin a tensor; the pin survives every pass (llama.cpp pins attention to the CPU
        when the KV cache is not offloaded)."""
        self.pins[t] = self.backend_index(backend)

    def set_eval_callback(self, callback: EvalCallback | None) -> None:
        """callback(tensor, ask): with ask=True answer whether you want to see tensor; with
        ask=False it has been computed: return False to stop the rest of its split."""
        self.callback = callback

    # --- stage 1: split ----------------------------------------------------------------------
    def split_graph(self, graph: Graph) -> list[Split]:
        self._undo_rewires()
        self.galloc.unstamp()
        a = Assignment(self.pins)
        for run_pass in PASSES:
            a = run_pass(self.ctx, graph, a)
        plan = cut_splits(self.ctx, graph, a, self.n_copies, self.cur_copy, self.max_split_inputs)
        plan = collect_graph_inputs(self.ctx, graph, a, plan, self.n_copies, self.cur_copy)
        if any(getattr(self.ctx.backends[sp.backend_id].device.profile, "graph_reorder", False) for sp in plan.splits):
            self._reordered = (graph, list(graph.nodes))   # the builder's order, restored before a new split
        deps = backend_alloc_deps(self.ctx, graph, plan)
        self.assignment, self.plan, self._graph = a, plan, graph
        self._prev_graph_size, self._graph_size = self._graph_size, graph_size(graph, plan, self.n_copies, deps)
        self._planned = planned_graph(graph, a, plan, self.n_copies, self.cur_copy, deps)
        self._prev_ids = self._ids
        self._ids = (self._planned.node_ids, self._planned.leaf_ids)
        log.debug("graph nodes = %d, graph splits = %d", len(graph.nodes), len(plan.splits))
        if self.debug > 1:
            log.debug("%s", self.debug_text())
        return plan.splits

    def _undo_rewires(self) -> None:
        for node, j, original in reversed(self.plan.rewires):
            node.src[j] = original
        self.plan.rewires = []
        if self._reordered is not None:   # llama.cpp builds each graph anew: a new split starts from its order
            graph, order = self._reordered
            graph.nodes[:] = order
            self._reordered = None

    # --- stage 2: allocate ---------------------------------------------------------------------
    def reserve(self, graph: Graph) -> dict[str, int]:
        """Split a worst-case graph and allocate compute buffers for it; bytes per backend.
        The graph is restored afterwards (reset)."""
        self.synchronize()
        self.split_graph(graph)
        assert self._planned is not None
        sizes = self.galloc.reserve(self._planned)
        self.reset()
        return {b.name: s for b, s in zip(self.ctx.backends, sizes, strict=False)}

    def reserve_sizes(self, graph: Graph) -> dict[str, int]:
        """Like reserve, but touches no device memory (ggml_backend_sched_reserve_size)."""
        self.reset()
        self.synchronize()
        self.split_graph(graph)
        assert self._planned is not None
        sizes = self.galloc.plan(self._planned)
        self.reset()
        return {b.name: s for b, s in zip(self.ctx.backends, sizes, strict=False)}

    def alloc(self, graph: Graph) -> None:
        """Split and give every tensor its address; re-reserves when the plan went stale."""
        if self.is_alloc:
            self.reset()
        self.cur_copy = self.next_copy
        self.next_copy = (self.next_copy + 1) % self.n_copies
        self.split_graph(graph)
        self._alloc_splits()
        self.is_alloc = True

    def _alloc_splits(self) -> None:
        assert self._planned is not None
        bufts = self.ctx.bufts
        changed = _ids_changed(self._ids[0], self._prev_ids[0], bufts) or \
            _ids_changed(self._ids[1], self._prev_ids[1], bufts)
        if not changed and self.galloc.alloc_graph(self._planned):
            return
        if self.debug_realloc > 0:
            unexpected = not changed and self._prev_graph_size == self._graph_size
            if unexpected or self.debug_realloc > 1:
                raise SchedulerError(
                    f"unexpected graph reallocation (graph size = {self._graph_size}, "
                    f"nodes = {len(self._planned.nodes)}, leafs = {len(self._planned.leafs)})")
        log.debug("reallocating compute buffers (backend ids changed: %s)", changed)
        for b in self.ctx.backends:  # not self.synchronize(): that could reset the copy index
            b.synchronize()
        self.galloc.reserve(self._planned)
        self.n_reallocs += 1
        if not self.galloc.alloc_graph(self._planned):
            raise SchedulerError("failed to allocate the graph after reserving it")

    # --- stage 3: compute ----------------------------------------------------------------------
    def compute(self, graph: Graph, inputs: Mapping[Tensor, Any] | None = None) -> Measurement:
        """Allocate if needed, write `inputs`, run the splits, synchronize; what it cost."""
        if not self.is_alloc or graph is not self._graph:
            self.alloc(graph)
        for t, values in (inputs or {}).items():
            t.set_data(values)
        state = RunState(graph, self.plan, self.assignment, self.ctx.backends, self.cur_copy, self.callback)
        copies = compute_splits(state)
        self.synchronize()
        sizes = {b.name: self.galloc.buffer_size(i) for i, b in enumerate(self.ctx.backends)}
        return Measurement(len(self.plan.splits), len(graph.nodes), sizes, tuple(copies))

    def synchronize(self) -> None:
        """Wait for every backend. While no graph is allocated the next graph uses copy 0,
        so token-by-token generation sees the same copy every time (seed 000)."""
        for b in self.ctx.backends:
            b.synchronize()
        if not self.is_alloc:
            self.next_copy = 0

    def release(self) -> None:
        """Free every compute buffer (a scheduler given up, as llama.cpp resets its sched)."""
        seen: set[int] = set()
        for chunks in self.galloc.buffers:
            if chunks is None or id(chunks) in seen:
                continue
            seen.add(id(chunks))
            for b in chunks:
                b.free()
        self.galloc.buffers = [None] * len(self.galloc.buffers)

    def reset(self) -> None:
        """Forget the allocated graph: restore rewired sources, drop stamped addresses."""
        self._undo_rewires()
        self.galloc.unstamp()
        self.is_alloc = False
