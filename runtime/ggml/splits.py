"""Scheduler pass 5 (cut the node list into splits, make input copies, rewire sources),
pass 6 (pipeline copies of graph inputs) and the flattened graph the allocator walks.

Sources: seed 000 "The backend changed", "a new weight to stage", "What an input means",
"input_dep and input_cpy"; ggml_backend_sched_split_graph in ggml-backend.cpp.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from runtime.ggml.alloc import PlannedGraph
from runtime.ggml.cuda_fusion import GGML_MAX_SRC, AllocDeps, cuda_alloc_deps
from runtime.ggml.graph import FLAG_INPUT, FLAG_OUTPUT, VIEW_OPS, BufferUsage, Graph, Op, Tensor
from runtime.ggml.passes import Assignment, SchedContext, buffer_supported
from runtime.ggml.sched_errors import SchedulerError
from runtime.ggml.vulkan_reorder import vulkan_graph_optimize


@dataclass(frozen=True)
class Split:
    """Nodes [i_start, i_end) of the graph run on one backend after copying `inputs` in."""

    backend_id: int
    backend: str
    i_start: int
    i_end: int
    inputs: tuple[Tensor, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)


@dataclass
class SplitPlan:
    """Pass 5's output: the splits, every input copy by (source, backend), and the source
    rewrites made in the caller's graph (so `Scheduler.reset` can undo them)."""

    splits: list[Split] = field(default_factory=list)
    copies: dict[tuple[Tensor, int], list[Tensor]] = field(default_factory=dict)
    rewires: list[tuple[Tensor, int, Tensor]] = field(default_factory=list)
    graph_inputs: list[Tensor] = field(default_factory=list)


def dup_layout(t: Tensor, name: str) -> Tensor:
    """A fresh tensor with t's type, shape and strides (ggml_dup_tensor_layout)."""
    return Tensor(t.type, t.ne, name=name, nb=t.nb)


def _needs_new_split(ctx: SchedContext, a: Assignment, plan: SplitPlan, node: Tensor, cur: int,
                     n_inputs: int, max_inputs: int | None) -> bool:
    """Same backend, but cut anyway: a weight must be staged here (cutting ends the previous
    staged weights' lifetime so their bytes are reused), or the input list is full."""
    if n_inputs == 0:
        return False
    ids = a.ids
    inputs_full = max_inputs is not None and n_inputs >= max_inputs
    for src in node.src:
        if src is None:
            continue
        weight = src.buffer is not None and src.buffer.usage is BufferUsage.WEIGHTS
        if not weight and not inputs_full:
            continue  # neither rule below can fire: spare the buffer question
        foreign = ids.get(src, -1) != cur and not buffer_supported(ctx, a, src, cur)
        if foreign and weight:
            return True
        # The pinned llama.cpp grows the input array instead; seed 000's backstop is opt-in.
        if foreign and max_inputs is not None and n_inputs >= max_inputs and (src, cur) not in plan.copies:
            return True
    return False


def _first_backend(a: Assignment, nodes: list[Tensor]) -> int:
    for node in nodes:
        if node.op not in VIEW_OPS:
            return a.get(node)
    return a.get(nodes[0]) if nodes else -1


def _copy_input(ctx: SchedContext, a: Assignment, plan: SplitPlan, src: Tensor, cur: int,
                n_copies: int) -> tuple[list[Tensor], bool]:
    """The copies of src on backend cur, made on first use, named <Backend>#<name>#<copy>."""
    key = (src, cur)
    made = key not in plan.copies
    if made:
        copies = [dup_layout(src, f"{ctx.backends[cur].name}#{src.name}#{c}") for c in range(n_copies)]
        for t in copies:
            if n_copies > 1:  # the allocator must neither share nor overwrite pipeline copies
                t.flags |= FLAG_INPUT | FLAG_OUTPUT
            a.set(t, cur, "4.cpy")
        plan.copies[key] = copies
    return plan.copies[key], made


def _rewire_foreign_sources(ctx: SchedContext, a: Assignment, plan: SplitPlan, node: Tensor, cur: int,
                            n_copies: int, cur_copy: int) -> list[Tensor]:
    """Point each source of node that backend cur cannot read at its current copy on cur (in
    place, recorded in plan.rewires); returns the sources copied for the first time, which
    become inputs of the current split."""
    ids = a.ids
    new_inputs: list[Tensor] = []
    for j, src in enumerate(node.src):
        if src is None:
            continue
        sb = ids.get(src, -1)
        if sb == -1:
            raise SchedulerError(f"source {src.name!r} of {node.name!r} has no backend")
        if sb == cur or buffer_supported(ctx, a, src, cur):
            continue
        copies, made = _copy_input(ctx, a, plan, src, cur, n_copies)
        if made:
            new_inputs.append(src)
        plan.rewires.append((node, j, src))
        node.src[j] = copies[cur_copy]
    return new_inputs


def cut_splits(ctx: SchedContext, graph: Graph, a: Assignment, n_copies: int = 1, cur_copy: int = 0,
               max_inputs: int | None = None) -> SplitPlan:
    """Pass 5: a new split where the backend changes (view ops never cut), where a weight
    must be staged, or where the input list is full; foreign sources get copies and the
    consuming node's src is rewired to the current copy, in place."""
    plan = SplitPlan()
    nodes = graph.nodes
    ids = a.ids
    cur = _first_backend(a, nodes)
    i_start = 0
    inputs: list[Tensor] = []
    for i, node in enumerate(nodes):
        if node.op in VIEW_OPS:
            continue
        nb = ids.get(node, -1)
        if nb == -1:
            raise SchedulerError(f"node {node.name!r} ({node.op.value}) has no backend: "
                                 "all nodes should be assigned by now (no CPU fallback?)")
        if nb != cur or (inputs and _needs_new_split(ctx, a, plan, node, cur, len(inputs), max_inputs)):
            if i > i_start:
                plan.splits.append(Split(cur, ctx.backends[cur].name, i_start, i, tuple(inputs)))
            i_start, inputs, cur = i, [], nb
        inputs += _rewire_foreign_sources(ctx, a, plan, node, cur, n_copies, cur_copy)
    if nodes:
        plan.splits.append(Split(cur, ctx.backends[cur].name, i_start, len(nodes), tuple(inputs)))
    return plan


def collect_graph_inputs(ctx: SchedContext, graph: Graph, a: Assignment, plan: SplitPlan,
                         n_copies: int, cur_copy: int) -> SplitPlan:
    """Pass 6 (pipeline parallelism only): every INPUT leaf gets n_copies slots, the current
    one being the leaf itself, so the graph's shape does not depend on which inputs a batch
    uses (which would otherwise reallocate)."""
    if n_copies == 1:
        return plan
    for leaf in graph.leafs:
        if not leaf.flags & FLAG_INPUT:
            continue
        lb = a.get(leaf)
        if lb == -1:
            raise SchedulerError(f"input {leaf.name!r} has no backend")
        if (leaf, lb) not in plan.copies:
            copies = [leaf if c == cur_copy else dup_layout(leaf, f"{ctx.backends[lb].name}#{leaf.name}#{c}")
                      for c in range(n_copies)]
            for t in copies:
                t.flags |= FLAG_INPUT | FLAG_OUTPUT
                a.ids.setdefault(t, lb)
            plan.copies[(leaf, lb)] = copies
        plan.graph_inputs.append(leaf)
    return plan


def planned_graph(graph: Graph, a: Assignment, plan: SplitPlan, n_copies: int, cur_copy: int,
                  alloc_deps: AllocDeps | None = None) -> PlannedGraph:
    """The flattened graph for the allocator: before each split's nodes, per input a
    dependency marker on the source (kept alive until copied) and the copy (allocated at the
    start of the split). With pipeline copies, every copy is also a leaf, allocated first.
    `alloc_deps` (a backend's graph_optimize, runtime/ggml/cuda_fusion.py): after a node, one
    dependency node per GGML_MAX_SRC tensors it keeps alive until then."""
    nodes: list[Tensor] = []
    node_ids: list[int] = []
    ids = a.ids
    for split in plan.splits:
        for inp in split.inputs:
            dep = Tensor(inp.type, inp.ne, name=f"{inp.name} (dep)", op=Op.NONE, src=[inp],
                         view_src=inp, nb=inp.nb)
            nodes.append(dep)
            node_ids.append(a.get(inp))
            nodes.append(plan.copies[(inp, split.backend_id)][cur_copy])
            node_ids.append(split.backend_id)
        span = graph.nodes[split.i_start:split.i_end]
        if not alloc_deps:
            nodes.extend(span)
            node_ids.extend([ids.get(node, -1) for node in span])
            continue
        for node in span:
            nodes.append(node)
            node_ids.append(ids.get(node, -1))
            keep = alloc_deps.get(node, ())
            for k in range(0, len(keep), GGML_MAX_SRC):
                nodes.append(Tensor(keep[k].type, keep[k].ne, name=f"{keep[k].name} (alloc dep)", op=Op.NONE,
                                    src=keep[k:k + GGML_MAX_SRC], view_src=keep[k], nb=keep[k].nb))
                node_ids.append(split.backend_id)
    leafs: list[Tensor] = []
    leaf_ids: list[int] = []
    if n_copies > 1:
        pairs = [(inp, a.get(inp)) for inp in plan.graph_inputs]
        pairs += [(inp, s.backend_id) for s in plan.splits for inp in s.inputs]
        for inp, b in pairs:
            for t in plan.copies[(inp, b)]:
                leafs.append(t)
                leaf_ids.append(b)
    leafs.extend(graph.leafs)
    leaf_ids.extend([ids.get(leaf, -1) for leaf in graph.leafs])
    return PlannedGraph(nodes, node_ids, leafs, leaf_ids)


def graph_size(graph: Graph, plan: SplitPlan, n_copies: int, alloc_deps: AllocDeps | None = None) -> int:
    """ggml's graph_size, remembered for the unexpected-reallocation tripwire."""
    total_inputs = len(plan.graph_inputs) + sum(len(s.inputs) for s in plan.splits)
    n_dep_nodes = sum(-(-len(keep) // GGML_MAX_SRC) for keep in (alloc_deps or {}).values())
    return max(len(graph.nodes), len(graph.leafs)) + total_inputs * 2 * n_copies + n_dep_nodes


def backend_alloc_deps(ctx: SchedContext, graph: Graph, plan: SplitPlan) -> AllocDeps:
    """Each split handed to its backend's graph_optimize (ggml-backend.cpp, before the graph copy is
    made): the tensors a fusing backend keeps alive past their last use. A reordering backend
    (Vulkan) rewrites graph.nodes within its splits, as ggml-vulkan rewrites the graph it is handed."""
    deps: AllocDeps = {}
    uses: dict[Tensor, int] | None = None
    for split in plan.splits:
        profile = ctx.backends[split.backend_id].device.profile
        if profile is None or not (profile.fusion_alloc_deps or profile.graph_reorder):
            continue
        uses = uses if uses is not None else graph.use_counts()
        if profile.fusion_alloc_deps:
            cuda_alloc_deps(graph.nodes, split.i_start, split.i_end, uses, deps)
        if profile.graph_reorder:
            vulkan_graph_optimize(graph.nodes, split.i_start, split.i_end, uses, deps)
    return deps
