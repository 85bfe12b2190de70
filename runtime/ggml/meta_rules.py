"""The per-op split-state rules of the meta device: one function per handle_* lambda of
ggml-backend-meta.cpp ggml_backend_meta_get_split_state, and `SPLIT_RULES`, the switch over ops.

The table is a whitelist: an op without a rule is refused by name, as ggml aborts. A rule gets
the node, its sources' states (resolved with assume_sync, see meta_resolve.py) and the node's own
assume_sync flag, which only the row-parallel matmul reads.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gguf import GGML_QUANT_SIZES

from runtime.ggml.graph import MAX_DIMS, Op, Tensor
from runtime.ggml.meta import MIRRORED, PARTIAL, SplitAxis, SplitState, split_error

SrcStates = Sequence["SplitState | None"]
Rule = Callable[[Tensor, SrcStates, bool], SplitState]


def n_dims(t: Tensor) -> int:
    """ggml_n_dims: 1 + the last dimension whose extent is not 1."""
    for i in range(MAX_DIMS - 1, 0, -1):
        if t.ne[i] != 1:
            return i + 1
    return 1


def _contiguous(t: Tensor) -> bool:
    """ggml_is_contiguous (ggml.c ggml_is_contiguous_n with n = 0): unit dims may have any stride."""
    block, type_size = GGML_QUANT_SIZES[t.type]
    if t.ne[0] != block and t.nb[0] != type_size:
        return False
    next_nb = type_size * (t.ne[0] // block)
    for i in range(1, MAX_DIMS):
        if t.ne[i] != 1:
            if t.nb[i] != next_nb:
                return False
            next_nb *= t.ne[i]
    return True


def _permuted(t: Tensor) -> bool:
    """ggml_is_permuted: strides out of increasing order."""
    return t.nb[0] > t.nb[1] or t.nb[1] > t.nb[2] or t.nb[2] > t.nb[3]


def _state(src_ss: SrcStates, i: int) -> SplitState | None:
    return src_ss[i] if i < len(src_ss) else None


def _axis(src_ss: SrcStates, i: int) -> SplitAxis | None:
    s = _state(src_ss, i)
    return s.axis if s is not None else None


def _need(node: Tensor, src_ss: SrcStates, i: int) -> SplitState:
    s = _state(src_ss, i)
    if s is None:
        raise split_error(node, f"source {i} is missing")
    return s


# --- the rules (one per handle_* of ggml_backend_meta_get_split_state) ----------------------------

def _generic(node: Tensor, src_ss: SrcStates, scalar_only: bool) -> SplitState:
    """handle_generic: every present source in the same state; `scalar_only` refuses a dim split."""
    ret: SplitState | None = None
    for s in src_ss:
        if s is None:
            continue
        if ret is None:
            ret = s
        elif not s.same_split(ret):
            raise split_error(node, f"sources disagree ({ret.axis.name} vs {s.axis.name})")
    if ret is None:
        raise split_error(node, "no source to take a split state from")
    if scalar_only and ret.axis.is_dim:
        raise split_error(node, f"cannot run split along {ret.axis.name}")
    return ret


def generic(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    return _generic(node, src_ss, scalar_only=False)


def generic_whole(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_generic with scalar_only: ops that only run mirrored (or on partial sums)."""
    return _generic(node, src_ss, scalar_only=True)


def per_row(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_per_row (norms, row sums, argsort): each row whole on one member, so not split along dim 0."""
    s = _need(node, src_ss, 0)
    if s.axis is SplitAxis.AXIS_0:
        raise split_error(node, "a per-row op cannot take rows split along AXIS_0")
    return s


def bin_bcast(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_bin_bcast: a mirrored src1 that broadcasts along src0's split axis keeps src0's split;
    ADD_ID's mirrored ids keep src0's state when the bias agrees or is a partial (expert-bias) sum."""
    s0, s1, s2 = _need(node, src_ss, 0), _state(src_ss, 1), _state(src_ss, 2)
    src1 = node.src[1]
    if s0.axis.is_dim and s1 is not None and src1 is not None and src1.ne[s0.axis] == 1 \
            and s1.axis is SplitAxis.MIRRORED:
        return s0
    if s2 is not None and s2.axis is SplitAxis.MIRRORED and s1 is not None and (
            s0.axis == s1.axis or (s0.axis is SplitAxis.MIRRORED and s1.axis is SplitAxis.PARTIAL)):
        return s0
    if s2 is not None and s2.axis is not SplitAxis.MIRRORED:
        raise split_error(node, "the third source must be mirrored")
    return _generic(node, src_ss, scalar_only=False)


def concat(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_concat: a split operand keeps its split unless the concatenation runs along it."""
    s0, s1 = _need(node, src_ss, 0), _need(node, src_ss, 1)
    dim = int(node.op_params.get("dim", 0))
    for split, other in ((s1, s0), (s0, s1)):
        if other.axis is SplitAxis.MIRRORED and split.axis.is_dim:
            if split.axis == dim:
                raise split_error(node, "concatenation along the split axis")
            return split
    if s0.axis == s1.axis and s0.axis != dim:
        return s0
    return _generic(node, src_ss, scalar_only=True)


def mul_mat(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_mul_mat: the tensor-parallel cost model. src0 split by output rows (AXIS_1) times a
    mirrored activation gives outputs split (AXIS_0) for free; both split along the reduced dim
    (AXIS_0) gives partial sums that need an AllReduce: PARTIAL, or MIRRORED once synced."""
    s0, s1 = _need(node, src_ss, 0), _need(node, src_ss, 1)
    a0, a1 = s0.axis, s1.axis
    if a0 is SplitAxis.MIRRORED and a1 is SplitAxis.MIRRORED:
        return MIRRORED
    if a0 is SplitAxis.AXIS_1 and a1 is SplitAxis.MIRRORED:
        return SplitState(SplitAxis.AXIS_0, s0.ne, 1)
    if a1 is SplitAxis.AXIS_1 and a0 is SplitAxis.MIRRORED:
        return s1
    if a0 is SplitAxis.AXIS_0 and a1 is SplitAxis.AXIS_0:
        if not s0.same_split(s1):
            raise split_error(node, "the reduced dimension is split differently in the two operands")
        return MIRRORED if assume_sync else PARTIAL
    if a0 == a1 and a0 in (SplitAxis.AXIS_2, SplitAxis.AXIS_3):
        if not s0.same_split(s1):
            raise split_error(node, "batch dims split differently")
        return s0
    if a0 in (SplitAxis.AXIS_2, SplitAxis.AXIS_3) and a1 is SplitAxis.MIRRORED:
        return s0   # batches split across members, activation replicated
    raise split_error(node, f"no matmul rule for src0 {a0.name} x src1 {a1.name}")


def reshape(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_reshape: find the output dim the split lands on, from the element count up to and
    including the split axis (`nr` > 1 when a split row becomes several pieces of an output row)."""
    s = _need(node, src_ss, 0)
    if not s.axis.is_dim:
        return s
    src = node.source(0)
    ax = int(s.axis)
    base_in = 1
    for d in range(ax + 1):
        base_in *= src.ne[d]
    base_in //= s.nr
    if ax == n_dims(src) - 1 and s.nr == 1:
        return SplitState(SplitAxis(n_dims(node) - 1))
    if ax == 0 and node.ne[0] == src.ne[0] and node.ne[1] == 1 and s.nr == 1 \
            and all(n in (0, src.ne[0]) for n in s.ne):
        return SplitState(SplitAxis.AXIS_1)   # whole rows per member: move to the next unit dim
    base_out = 1
    for d in range(MAX_DIMS):
        base_out *= node.ne[d]
        if base_out % base_in == 0:
            return SplitState(SplitAxis(d), nr=base_out // base_in)
        if base_out > base_in:
            if s.nr != 1:
                raise split_error(node, "a repeated split cannot be reshaped across its boundary")
            return SplitState(SplitAxis(d))
    raise split_error(node, "shape mismatch")


def cpy(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_cpy: a split source is re-laid out like a reshape; otherwise source and destination agree."""
    if _need(node, src_ss, 0).axis.is_dim:
        return reshape(node, src_ss, assume_sync)
    return _generic(node, src_ss, scalar_only=False)


def view(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_view: contiguous views reshape; same strides keep the split; otherwise the split
    follows the output dim whose next stride equals the source's stride after the split axis."""
    s, src = _need(node, src_ss, 0), node.source(0)
    if _contiguous(node) and _contiguous(src):
        return reshape(node, src_ss, assume_sync)
    if all(node.nb[d] == src.nb[d] for d in range(MAX_DIMS) if not (node.ne[d] == 1 and src.ne[d] == 1)):
        return s
    if not _permuted(node) and not _permuted(src) and s.axis.is_dim and s.axis < MAX_DIMS - 1:
        for d in range(MAX_DIMS - 1):
            if node.nb[d + 1] == src.nb[s.axis + 1]:
                return SplitState(SplitAxis(d))
        raise split_error(node, "no output dim matches the split axis")
    if not s.axis.is_dim:
        return s
    raise split_error(node, "view of a permuted split tensor")


def permute(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_permute: the split axis moves where op_params sends it (source dim i -> axes[i])."""
    s = _need(node, src_ss, 0)
    if not s.axis.is_dim:
        return s
    axes = node.op_params["axes"]
    return SplitState(SplitAxis(int(axes[s.axis])), nr=s.nr)


def transpose(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_transpose: dims 0 and 1 swap."""
    s = _need(node, src_ss, 0)
    if s.axis in (SplitAxis.AXIS_0, SplitAxis.AXIS_1):
        return SplitState(SplitAxis(int(s.axis) ^ 1), nr=s.nr)
    return s


def get_rows(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_get_rows: rows of a table split along the row (AXIS_0) stay split that way."""
    s0, s1 = _need(node, src_ss, 0), _need(node, src_ss, 1)
    if s0.axis is SplitAxis.AXIS_0 and s1.axis is SplitAxis.MIRRORED:
        return s0
    return _generic(node, src_ss, scalar_only=True)


def set_rows(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_set_rows: rows written as split as the destination; indices mirrored."""
    rows, idx, dst = _need(node, src_ss, 0), _need(node, src_ss, 1), _need(node, src_ss, 2)
    if rows.axis is SplitAxis.AXIS_1 or idx.axis is not SplitAxis.MIRRORED or not rows.same_split(dst):
        raise split_error(node, f"rows {rows.axis.name}, indices {idx.axis.name}, destination {dst.axis.name}")
    return rows


def rope(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_rope: positions mirrored, the rotated tensor keeps its split (heads rotate alone)."""
    if _axis(src_ss, 1) is not SplitAxis.MIRRORED:
        raise split_error(node, "positions must be mirrored")
    return _need(node, src_ss, 0)


def flash_attn_ext(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_flash_attn_ext: Q split on heads (AXIS_2 of the permuted q), K/V split the same way or
    mirrored, mask mirrored, sinks split per head (AXIS_0); the output [Dv, n_head, ...] on AXIS_1."""
    q, k, v = _need(node, src_ss, 0), _need(node, src_ss, 1), _need(node, src_ss, 2)
    mask, sinks = _state(src_ss, 3), _state(src_ss, 4)
    if mask is not None and mask.axis is not SplitAxis.MIRRORED:
        raise split_error(node, "the mask must be mirrored")
    if q.axis is SplitAxis.MIRRORED:
        if not (k.axis is v.axis is SplitAxis.MIRRORED) or (sinks is not None and sinks.axis is not SplitAxis.MIRRORED):
            raise split_error(node, "a mirrored Q needs mirrored K, V and sinks")
        return MIRRORED
    if q.axis is not SplitAxis.AXIS_2:
        raise split_error(node, f"Q must be split on heads (AXIS_2), not {q.axis.name}")
    if not (k.axis is v.axis and k.axis in (SplitAxis.AXIS_2, SplitAxis.MIRRORED)):
        raise split_error(node, f"K {k.axis.name} and V {v.axis.name} must both be split on heads or mirrored")
    if sinks is not None and sinks.axis is not SplitAxis.AXIS_0:
        raise split_error(node, "sinks must be split per head (AXIS_0)")
    return SplitState(SplitAxis.AXIS_1)


def ssm_conv(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_ssm_conv: channels split on both operands come out on the other axis."""
    s0, s1 = _need(node, src_ss, 0), _need(node, src_ss, 1)
    if s0.axis == s1.axis and s0.axis in (SplitAxis.AXIS_0, SplitAxis.AXIS_1):
        return SplitState(SplitAxis(int(s0.axis) ^ 1))
    return _generic(node, src_ss, scalar_only=False)


def gated_delta_net(node: Tensor, src_ss: SrcStates, assume_sync: bool) -> SplitState:
    """handle_gated_delta_net: all mirrored, or q/k/v/gate/beta split on heads (AXIS_1) -> AXIS_0."""
    states = [_need(node, src_ss, i) for i in range(6)]
    if all(s.axis is SplitAxis.MIRRORED for s in states):
        return states[0]
    if any(s.axis is not SplitAxis.AXIS_1 for s in states[:5]) or states[5].axis not in (
            SplitAxis.AXIS_0, SplitAxis.AXIS_1, SplitAxis.AXIS_2):
        raise split_error(node, "inputs must be split on heads")
    return SplitState(SplitAxis.AXIS_0)


# Which rule resolves which op (the switch of ggml_backend_meta_get_split_state). A whitelist:
# an op missing here is refused by name. NONE is absent on purpose: leaves take the static callback.
SPLIT_RULES: Mapping[Op, Rule] = {
    Op.DUP: generic_whole,
    Op.ADD: bin_bcast, Op.ADD_ID: bin_bcast, Op.SUB: bin_bcast, Op.MUL: bin_bcast, Op.DIV: bin_bcast,
    Op.SQR: generic, Op.SQRT: generic,
    Op.SUM_ROWS: per_row, Op.NORM: per_row, Op.RMS_NORM: per_row, Op.ARGSORT: per_row,
    Op.REPEAT: generic,
    Op.CONCAT: concat,
    Op.MUL_MAT: mul_mat, Op.MUL_MAT_ID: mul_mat,
    Op.SCALE: generic, Op.CLAMP: generic, Op.UNARY: generic, Op.GLU: generic, Op.SOFT_MAX: generic,
    Op.CPY: cpy, Op.CONT: reshape, Op.RESHAPE: reshape, Op.VIEW: view,
    Op.PERMUTE: permute, Op.TRANSPOSE: transpose,
    Op.GET_ROWS: get_rows, Op.SET_ROWS: set_rows,
    Op.DIAG_MASK_INF: generic_whole,
    Op.ROPE: rope,
    Op.IM2COL: generic_whole, Op.CONV_2D: generic_whole, Op.POOL_2D: generic_whole, Op.UPSCALE: generic_whole,
    Op.FLASH_ATTN_EXT: flash_attn_ext,
    Op.SSM_CONV: ssm_conv, Op.SSM_SCAN: generic_whole,
    Op.GATED_DELTA_NET: gated_delta_net,
}

