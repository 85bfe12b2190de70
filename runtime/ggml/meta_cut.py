"""The meta backend's cut of a graph into subgraphs, each followed by an AllReduce.

A subgraph ends at every node whose split state is PARTIAL (ggml-backend-meta.cpp
ggml_backend_meta_graph_compute); the reduce point may then move forward past mirrored
element-wise work on the partial sum — an ADD_ID of a partial expert bias, a chain of MULs by
mirrored gates, the view-and-add tree that sums MoE experts — and past a second independent
partial branch that is added to the first (AllReduce(a) + AllReduce(b) == AllReduce(a + b)):
get_i_delayed_branch / get_i_delayed there. Reducing later is arithmetically the same and moves
no more data.

A member whose slice of the PARTIAL node is empty does not compute it and joins the reduce with
zeros; when the reduce is delayed, the nodes up to the new reduce point are not computed by that
member either, or it would add garbage.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.ggml.graph import Op, Tensor
from runtime.ggml.meta import SplitAxis
from runtime.ggml.meta_resolve import SplitResolver


@dataclass(frozen=True)
class Subgraph:
    """nodes[start:stop]; the AllReduce, when `reduce`, sums nodes[stop - 1] over the members."""

    start: int
    stop: int
    reduce: bool


@dataclass(frozen=True)
class MetaCut:
    subgraphs: tuple[Subgraph, ...]
    skipped: tuple[frozenset[int], ...]   # per member: node indices its slice does not compute
    tmp_bytes: int                         # the largest PARTIAL node: each reduce step's buffer size


def _use_counts(nodes: Sequence[Tensor]) -> dict[Tensor, int]:
    counts: dict[Tensor, int] = {}
    for n in nodes:
        for s in n.src:
            if s is not None:
                counts[s] = counts.get(s, 0) + 1
    return counts


class _Walk:
    """The forward walks of get_i_delayed_branch / get_i_delayed over one node list."""

    def __init__(self, nodes: Sequence[Tensor], resolver: SplitResolver, computed: list[list[bool]]) -> None:
        self.nodes, self.r, self.computed = nodes, resolver, computed
        self.uses = _use_counts(nodes)

    def axis(self, t: Tensor | None) -> SplitAxis | None:
        return None if t is None else self.r.state(t).axis

    def use(self, i: int) -> int:
        return self.uses.get(self.nodes[i], 0)

    def skip_unrelated(self, i: int, node: Tensor) -> int:
        """Past mirrored nodes that read only mirrored tensors and not `node`."""
        nodes = self.nodes
        while i + 1 < len(nodes):
            nxt = nodes[i + 1]
            if self.axis(nxt) is not SplitAxis.MIRRORED:
                break
            if any(s is node or self.axis(s) is not SplitAxis.MIRRORED for s in nxt.src if s is not None):
                break
            i += 1
        return i

    def branch(self, i: int) -> int:
        """The last node the reduce of nodes[i] can move to on its own branch."""
        nodes, n = self.nodes, len(self.nodes)
        node, idr = nodes[i], i
        i = self.skip_unrelated(i, node)
        if i + 1 >= n:
            return idr
        nxt = nodes[i + 1]
        if nxt.op is Op.ADD_ID and nxt.src[0] is node and self.axis(nxt.src[1]) is SplitAxis.PARTIAL \
                and self.axis(nxt.src[2]) is SplitAxis.MIRRORED:
            node, i, idr = nxt, i + 1, i + 1
        while True:   # a chain of MULs by mirrored factors
            i = self.skip_unrelated(i, node)
            if i + 1 >= n:
                return idr
            nxt = nodes[i + 1]
            if not (nxt.op is Op.MUL and nxt.src[0] is node and self.axis(nxt.src[1]) is SplitAxis.MIRRORED):
                break
            node, i, idr = nxt, i + 1, i + 1
        tree = self.expert_sum(i, node)
        return tree if tree is not None else idr

    def expert_sum(self, i: int, node: Tensor) -> int | None:
        """The MoE combination: one view per used expert of node [n_embd, n_used, n_tokens], then
        ADD(v0, v1), ADD(sum, v2), ...; returns the last ADD's index, or None if the pattern breaks."""
        nodes, n_used = self.nodes, self.uses.get(node, 0)
        if n_used != node.ne[1] or n_used < 2 or i + 2 * n_used - 1 >= len(nodes):
            return None
        for k in range(n_used):
            v = nodes[i + 1]
            if not (v.op is Op.VIEW and v.view_src is node and v.view_offs == k * node.nb[1]
                    and v.ne[0] == node.ne[0] and v.ne[1] == node.ne[2] and v.nb[1] == node.nb[2]
                    and self.use(i + 1) == 1):
                return None
            i += 1
        views = nodes[i - n_used + 1:i + 1]
        acc = views[0]
        for v in views[1:]:
            add = nodes[i + 1]
            if not (add.op is Op.ADD and add.src[0] is acc and add.src[1] is v and self.use(i + 1) == 1):
                return None
            acc, i = add, i + 1
        return i

    def delayed(self, i: int) -> int:
        """get_i_delayed: the branch's point, or past a later independent PARTIAL branch added to it."""
        nodes = self.nodes
        d = self.branch(i)
        node = nodes[d]
        if self.use(d) != 1:
            return d
        for k in range(d + 1, len(nodes)):
            nxt = nodes[k]
            if nxt.view_src is node or any(s is node for s in nxt.src):
                return d
            if self.axis(nxt) is not SplitAxis.PARTIAL:
                continue
            od = self.branch(k)
            other = nodes[od]
            if self.use(od) != 1 or od + 1 >= len(nodes):
                return d
            total = nodes[od + 1]
            if not (total.op is Op.ADD and node.ne == other.ne and node.type == other.type == total.type
                    and {id(s) for s in total.src[:2]} == {id(node), id(other)}
                    and self.axis(total) is SplitAxis.MIRRORED):
                return d
            if any(c[i] != c[k] for c in self.computed):
                return d
            return od + 1
        return d


def cut_subgraphs(nodes: Sequence[Tensor], resolver: SplitResolver) -> MetaCut:
    """Cut `nodes` at PARTIAL nodes, each reduce delayed as far as it safely goes."""
    computed = [[resolver.computes(t, j) for t in nodes] for j in range(resolver.n_devices)]
    walk = _Walk(nodes, resolver, computed)
    subgraphs: list[Subgraph] = []
    tmp_bytes, start, i = 0, 0, 0
    while i < len(nodes):
        partial = resolver.state(nodes[i]).axis is SplitAxis.PARTIAL
        if partial:
            tmp_bytes = max(tmp_bytes, nodes[i].nbytes())
        if not partial and i + 1 < len(nodes):
            i += 1
            continue
        d = walk.delayed(i)
        for flags in computed:   # a member that skips the partial node skips everything up to the reduce
            if not flags[i]:
                for k in range(i + 1, d + 1):
                    flags[k] = False
        subgraphs.append(Subgraph(start, d + 1, reduce=d + 1 < len(nodes)))
        start = i = d + 1
    skipped = tuple(frozenset(k for k, c in enumerate(flags) if not c) for flags in computed)
    return MetaCut(tuple(subgraphs), skipped, tmp_bytes)
