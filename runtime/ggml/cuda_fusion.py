"""ggml-cuda's graph_optimize: the allocation dependencies its fusions ask the scheduler for.

Before it allocates a graph, ggml's scheduler hands each split to its backend's `graph_optimize`
(ggml-backend.cpp ggml_backend_sched_split_graph). ggml-cuda's (ggml-cuda.cu
ggml_backend_cuda_graph_optimize) finds the node groups its kernels fuse at compute time and asks,
through `add_alloc_dep(tensor, until)`, that tensors the fused kernel still reads are not freed
before the group's last node: the scheduler then puts, after `until`, a NONE node whose sources are
the kept tensors (one per GGML_MAX_SRC of them), and the graph allocator keeps them alive that long.
"This may increase the overall compute buffer size" (the source's own comment): where ggml-alloc
would have reused a tensor in place, it now needs a second block.

Two fusions ask for it at the pinned build (unless GGML_CUDA_DISABLE_FUSION is set to a non-zero
integer):
- the MoE weighted reduction (ggml_cuda_match_moe_weighted_reduction): `experts * weights` (or
  `(experts * scale) * weights`), one view per used expert and the chain of adds summing them, for 2
  to 15 used experts — experts, weights (and scale) are kept until the last add;
- top-k MoE gating (ggml_cuda_topk_moe_fusion, non-delayed softmax only): soft_max/sigmoid ->
  reshape -> (bias add) -> argsort -> view -> get_rows (-> reshape, sum_rows, clamp, div, reshape)
  (-> scale) — every node of the group and its sources are kept until the node after the group.

Only backends whose profile has `graph_optimize` (CUDA, and ROCm, which compiles the same source) run
this; an rpc-server's client backend has no graph_optimize, whatever the server runs.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runtime.ggml.graph import FLAG_OUTPUT, BufferUsage, GGMLType, Op, Tensor
from runtime.ggml.profiles import atoi

# ggml.h GGML_MAX_SRC: sources per node (a dependency node holds at most this many kept tensors)
GGML_MAX_SRC = 10
# ggml-cuda.cu: "The long form spans 2*k + 1 nodes. ggml_can_fuse_subgraph() accepts at most 31 nodes"
MOE_WEIGHTED_REDUCTION_MAX_EXPERTS = 15
# ggml-cuda.cu graph_optimize reads this once
DISABLE_FUSION_ENV = "GGML_CUDA_DISABLE_FUSION"

AllocDeps = dict[Tensor, list[Tensor]]   # until -> the tensors kept alive until it is computed


def fusion_disabled(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(DISABLE_FUSION_ENV)
    return value is not None and atoi(value) != 0


def add_dep(deps: AllocDeps, tensor: Tensor, until: Tensor) -> None:
    """ggml-backend.cpp's add_alloc_dep: `tensor` kept until `until`, once."""
    keep = deps.setdefault(until, [])
    if not any(k is tensor for k in keep):
        keep.append(tensor)


def cuda_alloc_deps(nodes: Sequence[Tensor], start: int, end: int, uses: Mapping[Tensor, int],
                    deps: AllocDeps) -> None:
    """graph_optimize over one split, nodes[start:end] of the whole graph (`uses`: its use counts;
    the top-k group's `until` may be the node after the split, as the C code's graph view reads it)."""
    if fusion_disabled():
        return
    i = start
    while i < end:
        reduction = _weighted_reduction(nodes, i, end, uses)
        if reduction is not None:
            for kept in reduction.kept:
                add_dep(deps, kept, reduction.dst)
            i += reduction.node_count - 1
        if nodes[i].op in (Op.UNARY, Op.SOFT_MAX, Op.ARGSORT):
            n_ops = _topk_moe(nodes, i, end, uses)
            if n_ops and i + n_ops < len(nodes):
                until = nodes[i + n_ops]
                for node in nodes[i:i + n_ops]:
                    add_dep(deps, node, until)
                    for s in node.src:
                        if s is not None:
                            add_dep(deps, s, until)
                i += n_ops - 1
        i += 1


# --- the MoE weighted reduction -------------------------------------------------------------------

@dataclass(frozen=True)
class _Reduction:
    kept: tuple[Tensor, ...]   # experts, weights (and the expert scale)
    dst: Tensor
    node_count: int


def _f32_contiguous(t: Tensor | None) -> bool:
    return t is not None and t.type == GGMLType.F32 and t.is_contiguous()


def _split_mul(mul: Tensor) -> tuple[Tensor, Tensor] | None:
    """(experts, broadcast weights) of a MUL, either way round."""
    def is_weights(t: Tensor | None) -> bool:
        return _f32_contiguous(t) and t is not None and t.ne[0] == 1 and tuple(t.ne[1:]) == tuple(mul.ne[1:])

    def is_experts(t: Tensor | None) -> bool:
        return _f32_contiguous(t) and t is not None and tuple(t.ne) == tuple(mul.ne)

    a, b = (mul.src + [None, None])[:2]
    if is_experts(a) and is_weights(b):
        return a, b      # type: ignore[return-value]
    if is_experts(b) and is_weights(a):
        return b, a      # type: ignore[return-value]
    return None


def _weighted_head(nodes: Sequence[Tensor], i: int, end: int) -> tuple[Tensor, tuple[Tensor, ...], int] | None:
    """The product the reduction starts with: (weighted, kept tensors, its one or two MULs), matching
    `(experts * scale) * weights` first, then `experts * weights`."""
    first = nodes[i]
    if first.op is not Op.MUL or not _f32_contiguous(first):
        return None
    if i + 1 < end:
        second = nodes[i + 1]
        outer = _split_mul(second) if second.op is Op.MUL and _f32_contiguous(second) else None
        inner = _split_mul(first)
        if outer is not None and outer[0] is first and inner is not None:
            return second, (inner[0], inner[1], outer[1]), 2     # experts, scale, weights
    plain = _split_mul(first)
    return (first, plain, 1) if plain is not None else None


def _summed_views(group: Sequence[Tensor], weighted: Tensor, n_used: int) -> Tensor | None:
    """The reduction's tail: one view per used expert of `weighted` and the chain of adds summing
    them (views before adds, as build_moe_ffn orders them); the last add, or None."""
    n_tokens = weighted.ne[2] * weighted.ne[3]
    views: list[Tensor] = []
    previous: Tensor | None = None
    n_adds = 0
    for cand in group:
        if cand.op is Op.VIEW:
            if len(views) >= n_used or not _is_expert_view(cand, weighted, len(views), n_tokens):
                return None
            views.append(cand)
            continue
        if not _is_next_add(cand, views, previous, n_adds):
            return None
        previous, n_adds = cand, n_adds + 1
    if len(views) != n_used or previous is None or n_adds != n_used - 1:
        return None
    if not previous.is_contiguous() or tuple(previous.ne) != (weighted.ne[0], n_tokens, 1, 1):
        return None
    return previous


def _is_expert_view(cand: Tensor, weighted: Tensor, e: int, n_tokens: int) -> bool:
    """`cand` is expert e's f32 slice of `weighted`: {n_embd, n_tokens} at offset e * nb[1], rows nb[2] apart."""
    return (cand.src[0] is weighted and cand.view_src is weighted
            and cand.type == GGMLType.F32 and tuple(cand.ne) == (weighted.ne[0], n_tokens, 1, 1)
            and cand.nb[0] == weighted.nb[0] and cand.nb[1] == weighted.nb[2]
            and cand.view_offs == e * weighted.nb[1])


def _is_next_add(cand: Tensor, views: list[Tensor], previous: Tensor | None, n_adds: int) -> bool:
    """`cand` is the next f32 add of the chain: the sum so far (the first view to start) plus the next view,
    after at least two views and while views remain to add."""
    if cand.op is not Op.ADD or len(views) < 2 or n_adds + 1 >= len(views):
        return False
    lhs = views[0] if previous is None else previous
    return cand.src[0] is lhs and cand.src[1] is views[n_adds + 1] and cand.type == GGMLType.F32


def _weighted_reduction(nodes: Sequence[Tensor], i: int, end: int, uses: Mapping[Tensor, int]) -> _Reduction | None:
    head = _weighted_head(nodes, i, end)
    if head is None:
        return None
    weighted, kept, mul_count = head
    n_used, n_tokens = weighted.ne[1], weighted.ne[2] * weighted.ne[3]
    if not 2 <= n_used <= MOE_WEIGHTED_REDUCTION_MAX_EXPERTS or n_tokens <= 0:
        return None
    count = 2 * n_used + mul_count - 1
    if i + count > end or _summed_views(nodes[i + mul_count:i + count], weighted, n_used) is None:
        return None
    if not can_fuse(nodes, i, count, (i + count - 1,), uses):
        return None
    return _Reduction(kept, nodes[i + count - 1], count)


# --- top-k MoE gating -----------------------------------------------------------------------------

def _topk_moe(nodes: Sequence[Tensor], i: int, end: int, uses: Mapping[Tensor, int]) -> int:
    """The number of nodes ggml-cuda fuses into its top-k MoE kernel from node i (0: none), for the
    forms whose alloc deps graph_optimize adds (softmax or sigmoid gating first, not delayed)."""
    head = _topk_head(nodes, i, end)
    if head is None:
        return 0
    ids_idx, j = head
    n_ops = j - i + _norm_and_scale(nodes, j, end)
    weights_idx = i + n_ops - 1
    if not can_fuse(nodes, i, n_ops, (ids_idx, weights_idx), uses):
        return 0
    return n_ops if _should_use_topk_moe(nodes[i], nodes[i].source(0), nodes[weights_idx], nodes[ids_idx]) else 0


def _is(nodes: Sequence[Tensor], k: int, end: int, op: Op, **src: Tensor) -> bool:
    """nodes[k] is `op`, within the split, with the given sources (src0=..., src1=...)."""
    return k < end and nodes[k].op is op and all(
        (nodes[k].src + [None, None])[int(key[-1])] is t for key, t in src.items())


def _topk_head(nodes: Sequence[Tensor], i: int, end: int) -> tuple[int, int] | None:
    """gating -> reshape -> (bias add) -> argsort -> view -> get_rows (ggml_cuda_topk_moe_fusion up to
    the weights): the index of the top-k view and of the node after get_rows."""
    node = nodes[i]
    sigmoid = node.op is Op.UNARY and node.op_params.get("unary") == "SIGMOID"
    if not (node.op is Op.SOFT_MAX or sigmoid):
        return None   # softplus+sqrt (DeepSeek-V4) and the delayed softmax are not built here
    j = i + 1
    if not _is(nodes, j, end, Op.RESHAPE, src0=nodes[i]):
        return None
    probs_reshaped = nodes[j]
    j += 1
    bias = _is(nodes, j, end, Op.ADD, src0=nodes[j - 2])
    j += int(bias)
    if not _is(nodes, j, end, Op.ARGSORT, src0=nodes[j - 1 if bias else j - 2]):
        return None
    if not _is(nodes, j + 1, end, Op.VIEW, src0=nodes[j]):
        return None
    if not _is(nodes, j + 2, end, Op.GET_ROWS, src0=probs_reshaped, src1=nodes[j + 1]):
        return None
    return j + 1, j + 3


def _norm_and_scale(nodes: Sequence[Tensor], j: int, end: int) -> int:
    """The nodes of the weights' normalisation (reshape, sum_rows, clamp, div, reshape) and scale that
    follow get_rows, as the fusion takes them."""
    n = 0
    if (_is(nodes, j, end, Op.RESHAPE, src0=nodes[j - 1]) and _is(nodes, j + 1, end, Op.SUM_ROWS, src0=nodes[j])
            and _is(nodes, j + 2, end, Op.CLAMP, src0=nodes[j + 1])
            and _is(nodes, j + 3, end, Op.DIV, src0=nodes[j], src1=nodes[j + 2])
            and _is(nodes, j + 4, end, Op.RESHAPE, src0=nodes[j + 3])):
        n = 5
    if _is(nodes, j + n, end, Op.SCALE, src0=nodes[j + n - 1]):
        n += 1
    return n


def _should_use_topk_moe(gating: Tensor, logits: Tensor, weights: Tensor, ids: Tensor) -> bool:
    """topk-moe.cu ggml_cuda_should_use_topk_moe."""
    n_expert = ids.nb[1] // ids.nb[0]
    if ((n_expert & (n_expert - 1)) or n_expert > 512) and n_expert not in (288, 576):
        return False
    if not weights.is_contiguous() or not logits.is_contiguous():
        return False
    if gating.op is Op.SOFT_MAX:
        params = gating.op_params
        if not gating.source(0).is_contiguous():
            return False
        if params.get("scale", 1.0) != 1.0 or params.get("max_bias", 0.0) != 0.0:
            return False
        return all(s is None for s in gating.src[1:3])
    return True


def can_fuse(nodes: Sequence[Tensor], i: int, count: int, outputs: Sequence[int], uses: Mapping[Tensor, int]) -> bool:
    """ggml.c ggml_can_fuse_subgraph_ext over nodes[i:i+count]: every node that is not one of the
    outputs is used only inside the group and is no graph output, and a view's sources are in the
    group or are weights."""
    group = nodes[i:i + count]
    if i + count > len(nodes):
        return False
    members = {id(t) for t in group}
    for k, node in enumerate(group):
        if i + k in outputs:
            continue
        if node.flags & FLAG_OUTPUT:
            return False
        inside = sum(1 for other in group[k + 1:] for s in other.src if s is node)
        if inside != uses.get(node, 0):
            return False
        v = node.view_src
        while v is not None:
            if id(v) not in members and not _is_weight(v):
                return False
            v = v.view_src
    return True


def _is_weight(t: Tensor) -> bool:
    """ggml_is_constant: a tensor of a weights buffer."""
    return t.buffer is not None and t.buffer.usage is BufferUsage.WEIGHTS
