"""ggml-vulkan's graph_optimize: the node order a Vulkan split is allocated and run in.

ggml's scheduler hands each split to its backend's `graph_optimize` before it copies the graph for
the allocator (ggml-backend.cpp ggml_backend_sched_split_graph). ggml-vulkan's
(ggml-vulkan.cpp ggml_vk_graph_optimize, unless GGML_VK_DISABLE_GRAPH_OPTIMIZE is set) rewrites the
split's node order so that independent nodes run back to back and the groups its kernels fuse stay
together; the allocator then frees and reuses blocks in that order, so the compute buffer differs
from the one the graph's own order needs (Llama-3.1-8B on lavapipe, -c 4096: 104 MiB, where the
builder's order needs 112).

The walk, from the first node not yet placed:
- a fusion group starting there (top-k MoE gating, RMS_NORM+MUL+ADD(+MUL), norm/rope feeding a
  cache row store) is placed as it is; the top-k groups also keep their outside sources alive up to
  their last node (add_alloc_dep, as ggml-cuda's fusions do: runtime/ggml/cuda_fusion.py);
- otherwise the node is placed, and then every later non-view node within the next 20 that depends
  on no unplaced node (bar the pairs the backend fuses: RMS_NORM->MUL, UNARY->MUL, MUL_MAT->ADD,
  MUL_MAT_ID->ADD_ID / MUL, ADD->ADD, SSM_CONV->ADD / UNARY), pulling along a ROPE fed by an
  RMS_NORM+MUL pair, a norm's or rope's VIEW+SET_ROWS, and the MUL that finishes a MUL_MAT_ID+ADD_ID,
  MUL_MAT+ADD+ADD, SSM_CONV+ADD+UNARY or UNARY+MUL group;
- then, unless the set ends in an ADD, the views among the next 20 whose sources are placed.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from runtime.ggml.build import _can_repeat
from runtime.ggml.cuda_fusion import AllocDeps, add_dep
from runtime.ggml.graph import FLAG_OUTPUT, FLAG_PARAM, BufferUsage, GGMLType, Op, Tensor

DISABLE_ENV = "GGML_VK_DISABLE_GRAPH_OPTIMIZE"   # read once by ggml-vulkan: set at all disables
LOOKAHEAD = 20     # NUM_TO_CHECK: how far past the first unplaced node the walk looks
PULL_WINDOW = 15   # how far a pulled ROPE, VIEW+SET_ROWS or closing MUL may be

EMPTY = frozenset({Op.NONE, Op.RESHAPE, Op.TRANSPOSE, Op.VIEW, Op.PERMUTE})

# ggml-vulkan-types.h fusion patterns, by op name (a pattern naming an op this runtime does not have
# never matches)
TOPK_MOE_PATTERNS: tuple[tuple[str, ...], ...] = (
    ("SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"),
    ("UNARY", "RESHAPE", "ADD", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"),
    ("UNARY", "SQRT", "RESHAPE", "ADD", "ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV",
     "RESHAPE"),
    ("SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW", "GET_ROWS"),
    ("ARGSORT", "VIEW", "GET_ROWS", "RESHAPE", "SOFT_MAX", "RESHAPE"),
)
KEPT_PATTERNS: tuple[tuple[str, ...], ...] = (
    ("MUL", "SIN", "SQR", "MUL", "ADD"),                                        # snake
    ("GET_ROWS", "PERMUTE", "CONT", "CPY", "RESHAPE", "ADD", "TOP_K"),          # top-k QSA
    ("RMS_NORM", "MUL", "ADD", "MUL"),
    ("RMS_NORM", "MUL", "ADD"),
    ("RMS_NORM", "MUL", "ROPE", "VIEW", "SET_ROWS"),
    ("RMS_NORM", "VIEW", "SET_ROWS"),
    ("ROPE", "VIEW", "SET_ROWS"),
)
HC_POST_GATE = ("SCALE", "UNARY", "SCALE", "DSV4_HC_POST")   # deps kept like the top-k groups
QSA = KEPT_PATTERNS[1]
SKIPPED_STARTS = TOPK_MOE_PATTERNS + KEPT_PATTERNS[:1] + KEPT_PATTERNS[2:] + (HC_POST_GATE,)
# (producer, consumer) pairs the walk may place together although one reads the other
FUSED_ANYWHERE = frozenset({(Op.RMS_NORM, Op.MUL), (Op.UNARY, Op.MUL)})
FUSED_ADJACENT = frozenset({(Op.MUL_MAT, Op.ADD), (Op.MUL_MAT_ID, Op.ADD_ID), (Op.MUL_MAT_ID, Op.MUL),
                            (Op.ADD, Op.ADD), (Op.SSM_CONV, Op.ADD), (Op.SSM_CONV, Op.UNARY)})
# (node, the node before it) -> the op ggml-vulkan pulls in after them: MUL_MAT_ID + ADD_ID + MUL,
# MUL_MAT + ADD + ADD
CLOSING: dict[tuple[Op, Op | None], Op] = {(Op.ADD_ID, Op.MUL_MAT_ID): Op.MUL, (Op.ADD, Op.MUL_MAT): Op.ADD}
UNARY_MUL_FUSED = frozenset({"GELU", "SIGMOID", "SILU", "SOFTPLUS"})   # ggml_vk_unary_mul_op_index


def disabled(env: Mapping[str, str] | None = None) -> bool:
    return DISABLE_ENV in (os.environ if env is None else env)


def _base(t: Tensor) -> Tensor:
    return t.view_src if t.view_src is not None else t


def _is_src_of(dst: Tensor, src: Tensor) -> bool:
    """dst reads src, or the two touch the same storage in an order that must hold."""
    if any(s is src for s in dst.src):
        return True
    if dst.op not in EMPTY and src.op not in EMPTY:
        base_dst = _base(dst)
        for s in dst.src:
            if s is not None and _base(s) is _base(src):
                return True
        for s in src.src:
            if s is not None and base_dst is _base(s):
                return True
    return _base(dst) is _base(src)


def _is_weight(t: Tensor) -> bool:
    """A weight: constant storage no node of this graph writes (ggml_is_constant)."""
    return t.buffer is not None and t.buffer.usage is BufferUsage.WEIGHTS and not t.flags & FLAG_PARAM


def _contiguous_rows(t: Tensor) -> bool:
    """ggml_is_contiguous_1 for an f32/f16 tensor: elements packed, dimension 1 free, dimensions 2
    and 3 packed over what precedes them."""
    size = _ELEM_SIZE.get(t.type, 0)
    ne, nb = t.ne, t.nb
    if ne[0] != 1 and nb[0] != size:
        return False
    next_nb = size * ne[0]
    for i in range(1, 4):
        if ne[i] == 1:
            continue
        if i > 1:
            if nb[i] != next_nb:
                return False
            next_nb *= ne[i]
        else:
            next_nb = ne[i] * nb[i]
    return True


_ELEM_SIZE = {GGMLType.F32: 4, GGMLType.F16: 2}


class _Walk:
    def __init__(self, nodes: list[Tensor], uses: Mapping[Tensor, int], deps: AllocDeps) -> None:
        self.nodes, self.uses, self.deps = nodes, uses, deps
        self.n = len(nodes)
        self.used = [False] * self.n
        self.placed: set[Tensor] = set()
        self.order: list[Tensor] = []
        self.first = 0

    def op(self, i: int) -> Op:
        return self.nodes[i].op

    def matches(self, pattern: tuple[str, ...], start: int) -> bool:
        if start + len(pattern) > self.n:
            return False
        return all(self.nodes[start + k].op.value == name and not self.used[start + k]
                   for k, name in enumerate(pattern))

    def place(self, indices: Sequence[int]) -> None:
        for i in indices:
            self.order.append(self.nodes[i])
            self.placed.add(self.nodes[i])
            self.used[i] = True
        while self.first < self.n and self.used[self.first]:
            self.first += 1

    def keep_deps(self, size: int, last: int) -> None:
        """add_pattern_alloc_deps: the group's outside sources kept alive until node `last`."""
        seen: set[Tensor] = set()
        for k in range(size):
            node = self.nodes[self.first + k]
            for s in node.src:
                if s is not None and s not in seen:
                    seen.add(s)
                    add_dep(self.deps, s, self.nodes[last])
            seen.add(node)

    def fixed_group(self) -> bool:
        """A fusion group at the first unplaced node, placed as it is."""
        first = self.first
        for pattern in TOPK_MOE_PATTERNS:
            if self.matches(pattern, first):
                last = first + len(pattern) - 1
                if last + 1 < self.n and self.op(last + 1) is Op.SCALE:
                    last += 1   # some top-k variants fuse a trailing scale
                self.keep_deps(len(pattern), last)
                self.place(range(first, first + len(pattern)))
                return True
        for pattern in KEPT_PATTERNS:
            if self.matches(pattern, first):
                self.place(range(first, first + len(pattern)))
                return True
        if self.matches(HC_POST_GATE, first):
            self.keep_deps(len(HC_POST_GATE), first + len(HC_POST_GATE) - 1)
            self.place(range(first, first + len(HC_POST_GATE)))
            return True
        return False

    def starts_group(self, j: int) -> bool:
        if any(self.matches(p, j) for p in SKIPPED_STARTS):
            return True
        # every node inside a top-k QSA group is protected, not only its first
        return any(j - o >= 0 and self.matches(QSA, j - o) for o in range(len(QSA)))

    def scheduled_between(self, lo: int, hi: int) -> bool:
        return all(self.used[v] or self.op(v) in EMPTY for v in range(lo, hi))

    def may_join(self, j: int, current: list[int]) -> bool:
        node = self.nodes[j]
        back = current[-1]
        for c in range(self.first, j):
            if self.used[c] or not _is_src_of(node, self.nodes[c]):
                continue
            pair = (self.op(c), node.op)
            if c == back and pair in FUSED_ANYWHERE and self.scheduled_between(c + 1, j):
                continue
            if c == back and j == c + 1 and pair in FUSED_ADJACENT:
                continue
            return False
        return True

    def pull(self, current: list[int], k: int) -> None:
        current.append(k)
        self.used[k] = True

    def done_or_weight(self, t: Tensor | None) -> bool:
        return t is not None and (t.op is Op.NONE or t in self.placed)

    def first_after(self, j: int, wanted: Callable[[Tensor], bool]) -> int:
        """The first node k in (j, j + PULL_WINDOW) with wanted(node k), or -1."""
        for k in range(j + 1, min(j + PULL_WINDOW, self.n)):
            if wanted(self.nodes[k]):
                return k
        return -1

    def pull_followers(self, j: int, current: list[int]) -> None:
        """What ggml-vulkan places right after node j once j joins the set."""
        node, prev = self.nodes[j], self.op(j - 1) if j > 0 else None
        rope = j
        if node.op is Op.MUL and prev is Op.RMS_NORM:
            k = self.first_after(j, lambda t: t.op is Op.ROPE and t.src[0] is node and _rope_inputs_ready(t))
            if k != -1:
                rope = k
                self.pull(current, k)
        if self.op(rope) in (Op.ROPE, Op.RMS_NORM):
            self._pull_row_store(rope, current)
        closing = CLOSING.get((node.op, prev))
        k = -1
        if closing is not None:   # MUL_MAT_ID + ADD_ID + MUL, MUL_MAT + ADD + ADD
            k = self.first_after(j, lambda t: t.op is closing and t.src[0] is node and self.done_or_weight(t.src[1]))
        elif node.op is Op.ADD and prev is Op.SSM_CONV:
            k = self.first_after(j, lambda t: t.op is Op.UNARY and t.src[0] is node)
        elif node.op is Op.UNARY:
            k = self.first_after(j, lambda t: self._closes_unary(node, t))
        if k != -1:
            self.pull(current, k)

    def _closes_unary(self, unary: Tensor, mul: Tensor) -> bool:
        if mul.op is not Op.MUL or not (mul.src[0] is unary or mul.src[1] is unary):
            return False
        other = mul.src[1] if mul.src[0] is unary else mul.src[0]
        return self.done_or_weight(other) and _unary_mul_fuses(unary, mul)

    def _pull_row_store(self, rope: int, current: list[int]) -> None:
        """A norm's or rope's VIEW + SET_ROWS (a cache row store) placed right after it."""
        nodes = self.nodes
        view = store = -1
        for k in range(rope + 1, min(rope + PULL_WINDOW, self.n)):
            if self.used[k]:
                continue
            if view == -1 and self.op(k) is Op.VIEW and nodes[k].src[0] is nodes[rope]:
                view = k
                continue
            if view != -1 and self.op(k) is Op.SET_ROWS and nodes[k].src[0] is nodes[view]:
                store = k
                break
        if store == -1 or not self._fusable((rope, view, store), store):
            return
        for c in range(rope + 1, store):
            if (not self.used[c] and c != view and self.op(c) not in EMPTY
                    and _is_src_of(nodes[store], nodes[c])):
                return
        self.pull(current, view)
        self.pull(current, store)

    def _fusable(self, idxs: Sequence[int], output: int) -> bool:
        """ggml_can_fuse_subgraph_ext with one output: every other member is read only inside the
        group, is no graph output, and views nothing outside it but weights."""
        members = {self.nodes[i] for i in idxs}
        for pos, i in enumerate(idxs):
            node = self.nodes[i]
            if i == output:
                continue
            if node.flags & FLAG_OUTPUT:
                return False
            inside = sum(1 for later in idxs[pos + 1:] for s in self.nodes[later].src if s is node)
            if inside != self.uses.get(node, 0):
                return False
            vs = node.view_src
            if vs is not None and vs not in members and not _is_weight(vs):
                return False
        return True

    def views_after(self, current: list[int]) -> None:
        if self.op(current[-1]) is Op.ADD:
            return   # an ADD->RMS_NORM or ADD->ADD fusion would be split
        members = set(current)
        for j in range(self.first + 1, min(self.first + LOOKAHEAD, self.n)):
            if self.used[j] or self.op(j) not in EMPTY:
                continue
            if all(self.used[c] or c in members or not _is_src_of(self.nodes[j], self.nodes[c])
                   for c in range(self.first, j)):
                current.append(j)
                members.add(j)

    def run(self) -> list[Tensor]:
        while self.first < self.n:
            if self.fixed_group():
                continue
            current = [self.first]
            for j in range(self.first + 1, min(self.first + LOOKAHEAD, self.n)):
                if self.used[j] or self.op(j) in EMPTY or self.starts_group(j):
                    continue
                if self.may_join(j, current):
                    current.append(j)
                    self.pull_followers(j, current)
            self.views_after(current)
            for c in current:
                self.order.append(self.nodes[c])
                self.placed.add(self.nodes[c])
                self.used[c] = True
            while self.first < self.n and self.used[self.first]:
                self.first += 1
        return self.order


def _rope_inputs_ready(rope: Tensor) -> bool:
    """The rope's positions (and frequency factors) are leaves, not computed in this graph."""
    pos = rope.src[1]
    factors = rope.src[2] if len(rope.src) > 2 else None
    return pos is not None and pos.op is Op.NONE and (factors is None or factors.op is Op.NONE)


def _unary_mul_fuses(unary: Tensor, mul: Tensor) -> bool:
    """ggml_vk_can_fuse_unary_mul."""
    if unary.op_params.get("unary") not in UNARY_MUL_FUSED:
        return False
    if unary.type not in (GGMLType.F32, GGMLType.F16) or unary.type != mul.type:
        return False
    other = mul.src[1] if mul.src[0] is unary else mul.src[0]
    if other is None or other.type != unary.type:
        return False
    if not _contiguous_rows(other) or not _contiguous_rows(unary.src[0]):   # type: ignore[arg-type]
        return False
    return _can_repeat(other, unary) if mul.src[0] is unary else _can_repeat(unary, mul.src[0])   # type: ignore[arg-type]


def vulkan_graph_optimize(nodes: list[Tensor], start: int, end: int, uses: Mapping[Tensor, int],
                          deps: AllocDeps) -> None:
    """Reorder nodes[start:end] (one split) in place as ggml-vulkan does; top-k MoE groups add their
    allocation dependencies to `deps`."""
    if disabled() or end - start < 2:
        return
    nodes[start:end] = _Walk(nodes[start:end], uses, deps).run()
