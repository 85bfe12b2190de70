"""Op constructors: ggml's shape rules for the ops llama-shaped graphs use.

Each function mirrors the ggml function of the same name (ggml.c): it checks the operand
shapes the way ggml asserts them, and returns a new node whose `ne`, `type`, `src` order and
view source match ggml's, because the scheduler's rules read exactly those fields (e.g.
CPY and SET_ROWS are views of their destination, so 1.dst pins KV-cache writes).
"""
from __future__ import annotations

from collections.abc import Sequence

from planner.core.errors import ModelShapeError
from runtime.ggml.graph import GGMLType, Op, Tensor, TensorFlag, contiguous_strides

F32 = GGMLType.F32


def new_tensor(ggml_type: GGMLType, ne: Sequence[int], name: str = "",
               flags: TensorFlag = TensorFlag.NONE) -> Tensor:
    return Tensor(ggml_type, ne, name=name, flags=flags)


def new_input(ggml_type: GGMLType, ne: Sequence[int], name: str) -> Tensor:
    """A graph input the caller fills (GGML_TENSOR_FLAG_INPUT: placed on the CPU by 1.inp)."""
    return Tensor(ggml_type, ne, name=name, flags=TensorFlag.INPUT)


def _node(op: Op, ne: Sequence[int], src: Sequence[Tensor | None], name: str,
          ggml_type: GGMLType = F32, **params: object) -> Tensor:
    return Tensor(ggml_type, ne, name=name, op=op, src=src, op_params=params)


def _can_repeat(b: Tensor, a: Tensor) -> bool:
    """ggml_can_repeat (ggml/src/ggml.c): an empty tensor repeats only into an empty one; otherwise each of
    a's dimensions is a multiple of b's."""
    an, bn = a.ne, b.ne
    if bn[0] and bn[1] and bn[2] and bn[3]:   # spelled out: the graph builders call this for every add and mul
        return an[0] % bn[0] == 0 and an[1] % bn[1] == 0 and an[2] % bn[2] == 0 and an[3] % bn[3] == 0
    return 0 in an


def add(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    if not _can_repeat(b, a):
        raise ValueError(f"add: {b.ne} does not broadcast to {a.ne}")
    return _node(Op.ADD, a.ne, [a, b], name, a.type)


def mul(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    if not _can_repeat(b, a):
        raise ValueError(f"mul: {b.ne} does not broadcast to {a.ne}")
    return _node(Op.MUL, a.ne, [a, b], name, a.type)


def scale(a: Tensor, s: float, name: str = "") -> Tensor:
    return _node(Op.SCALE, a.ne, [a], name, a.type, scale=float(s))


def sqr(a: Tensor, name: str = "") -> Tensor:
    return _node(Op.SQR, a.ne, [a], name, a.type)


def rms_norm(a: Tensor, eps: float, name: str = "") -> Tensor:
    return _node(Op.RMS_NORM, a.ne, [a], name, a.type, eps=float(eps))


def unary(a: Tensor, kind: str, name: str = "") -> Tensor:
    return _node(Op.UNARY, a.ne, [a], name, a.type, unary=kind)


def silu(a: Tensor, name: str = "") -> Tensor:
    return unary(a, "SILU", name)


def swiglu(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """ggml_swiglu_split: silu(a) * b."""
    if a.ne != b.ne:
        raise ValueError(f"swiglu: {a.ne} vs {b.ne}")
    return _node(Op.GLU, a.ne, [a, b], name, a.type, glu="SWIGLU")


def swiglu_halves(a: Tensor, name: str = "") -> Tensor:
    """ggml_swiglu: one source whose first half of each row gates the second (glm4's fused ffn_up)."""
    return _node(Op.GLU, (a.ne[0] // 2, *a.ne[1:]), [a], name, a.type, glu="SWIGLU")


def swiglu_oai(a: Tensor, b: Tensor, alpha: float, limit: float, name: str = "") -> Tensor:
    """ggml_swiglu_oai: gpt-oss's clamped SwiGLU of gate a and up b."""
    if a.ne != b.ne:
        raise ValueError(f"swiglu_oai: {a.ne} vs {b.ne}")
    return _node(Op.GLU, a.ne, [a, b], name, a.type, glu="SWIGLU_OAI", alpha=float(alpha), limit=float(limit))


def add_id(a: Tensor, b: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """ggml_add_id: a [K, n_used, n_tokens] plus row ids[i, t] of b [K, n_rows] (per-expert biases)."""
    if not (a.ne[0] == b.ne[0] and a.ne[1] == ids.ne[0] and a.ne[2] == ids.ne[1] and ids.type == GGMLType.I32):
        raise ValueError(f"add_id: bad operands {a.ne} {b.ne} {ids.ne}")
    return _node(Op.ADD_ID, a.ne, [a, b, ids], name, a.type)


def mul_mat(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """ggml_mul_mat: a [K, M, a2, a3] x b [K, N, b2, b3] -> [M, N, b2, b3] (f32)."""
    if not (a.ne[0] == b.ne[0] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0):
        raise ValueError(f"mul_mat: {a.name} {a.ne} cannot multiply {b.name} {b.ne}")
    return _node(Op.MUL_MAT, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), [a, b], name)


def mul_mat_id(experts: Tensor, b: Tensor, ids: Tensor, name: str = "") -> Tensor:
    """ggml_mul_mat_id: experts [K, M, n_expert], b [K, n_used or 1, n_tokens], ids [n_used, n_tokens]."""
    if not (ids.type == GGMLType.I32 and ids.ne[1] == b.ne[2] and experts.ne[0] == b.ne[0]):
        raise ValueError(f"mul_mat_id: bad operands {experts.ne} {b.ne} {ids.ne}")
    if b.ne[1] not in (1, ids.ne[0]):
        raise ValueError(f"mul_mat_id: b.ne[1]={b.ne[1]} must be 1 or n_used={ids.ne[0]}")
    return _node(Op.MUL_MAT_ID, (experts.ne[1], ids.ne[0], b.ne[2], 1), [experts, b, ids], name)


def get_rows(a: Tensor, rows: Tensor, name: str = "") -> Tensor:
    if rows.type != GGMLType.I32:
        raise ValueError("get_rows: row ids must be I32")
    out_type = GGMLType.I32 if a.type == GGMLType.I32 else F32
    return _node(Op.GET_ROWS, (a.ne[0], rows.ne[0], rows.ne[1], rows.ne[2]), [a, rows], name, out_type)


def soft_max_ext(a: Tensor, mask: Tensor | None, scale_: float, max_bias: float = 0.0,
                 name: str = "", sinks: Tensor | None = None) -> Tensor:
    """ggml_soft_max_ext; `sinks` as ggml_soft_max_add_sinks sets them (src[2], one logit per head)."""
    src = [a, mask] if sinks is None else [a, mask, sinks]
    return _node(Op.SOFT_MAX, a.ne, src, name, a.type, scale=float(scale_), max_bias=float(max_bias))


def rope(a: Tensor, pos: Tensor, n_dims: int, mode: int = 0, freq_base: float = 10000.0,
         freq_factors: Tensor | None = None, name: str = "") -> Tensor:
    """ggml_rope_ext: a [head_dim, n_head, n_tokens], pos [n_tokens] I32; mode 0 normal, 2 neox."""
    if not (pos.type == GGMLType.I32 and pos.ne[0] == a.ne[2]):
        raise ValueError(f"rope: pos {pos.ne} vs {a.ne}")
    return _node(Op.ROPE, a.ne, [a, pos, freq_factors], name, a.type,
                 n_dims=n_dims, mode=mode, freq_base=float(freq_base))


def flash_attn_ext(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale_: float,
                   sinks: Tensor | None = None, name: str = "", softcap: float = 0.0) -> Tensor:
    """q [D, n_tokens, n_head], k/v [D, n_kv, n_head_kv] -> [Dv, n_head, n_tokens] (f32); `softcap`
    is ggml's logit_softcap parameter (0: off)."""
    if not (q.ne[0] == k.ne[0] and k.ne[1] == v.ne[1] and q.ne[2] % k.ne[2] == 0):
        raise ValueError(f"flash_attn_ext: q {q.ne} k {k.ne} v {v.ne}")
    src: list[Tensor | None] = [q, k, v, mask, sinks]
    return _node(Op.FLASH_ATTN_EXT, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), src, name, scale=float(scale_),
                 softcap=float(softcap))


# --- views -------------------------------------------------------------------------------

def view(a: Tensor, ne: Sequence[int], nb: Sequence[int] | None = None, offset: int = 0,
         name: str = "") -> Tensor:
    """ggml_view_Nd: a strided window into a's storage; nb defaults to contiguous rows of ne."""
    full_ne = tuple(ne) + (1,) * (4 - len(ne))
    strides = list(nb) if nb is not None else list(contiguous_strides(a.type, full_ne))
    while len(strides) < 4:
        strides.append(strides[-1] * full_ne[len(strides) - 1])
    return Tensor(a.type, full_ne, name=name or f"{a.name} (view)", op=Op.VIEW, src=[a],
                  view_src=a, view_offs=offset, nb=strides, op_params={"offset": offset})


def reshape(a: Tensor, ne: Sequence[int], name: str = "") -> Tensor:
    full_ne = tuple(ne) + (1,) * (4 - len(ne))
    if not a.is_contiguous():
        raise ValueError(f"reshape: {a.name} is not contiguous")
    if len(full_ne) != 4 or min(full_ne) < 0:
        Tensor(a.type, full_ne)  # raises its bad-shape error
    if int(full_ne[0]) * int(full_ne[1]) * int(full_ne[2]) * int(full_ne[3]) != a.n_elements:
        raise ModelShapeError(f"the model's tensors do not match its metadata: {a.name} of shape "
                              f"{tuple(a.ne)} cannot be viewed as {full_ne}")
    return Tensor(a.type, full_ne, name=name or f"{a.name} (reshaped)", op=Op.RESHAPE, src=[a],
                  view_src=a)


def permute(a: Tensor, axes: Sequence[int], name: str = "") -> Tensor:
    """ggml_permute: source dim i goes to position axes[i]."""
    axes = tuple(axes) + tuple(range(len(axes), 4))
    if sorted(axes) != [0, 1, 2, 3]:
        raise ValueError(f"permute: bad axes {axes}")
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    return Tensor(a.type, ne, name=name or f"{a.name} (permuted)", op=Op.PERMUTE, src=[a],
                  view_src=a, nb=nb, op_params={"axes": axes})


def transpose(a: Tensor, name: str = "") -> Tensor:
    ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    return Tensor(a.type, ne, name=name or f"{a.name} (transposed)", op=Op.TRANSPOSE, src=[a],
                  view_src=a, nb=nb)


def cont(a: Tensor, ne: Sequence[int] | None = None, name: str = "") -> Tensor:
    """ggml_cont / ggml_cont_Nd: a contiguous copy, optionally with a new shape."""
    out_ne = tuple(ne) if ne is not None else a.ne
    return _node(Op.CONT, out_ne, [a], name or f"{a.name} (cont)", a.type)


def cpy(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """ggml_cpy: write a into b; the node is a view of b (so it lives where b lives)."""
    if a.n_elements != b.n_elements:
        raise ValueError(f"cpy: {a.ne} into {b.ne}")
    return Tensor(b.type, b.ne, name=name or f"{b.name} (copy of {a.name})", op=Op.CPY,
                  src=[a, b], view_src=b, nb=b.nb)


def set_rows(dst: Tensor, rows: Tensor, idx: Tensor, name: str = "") -> Tensor:
    """ggml_set_rows: dst[idx[i]] = rows[i]; a view of dst, src order (rows, idx, dst) as ggml."""
    if not (dst.ne[0] == rows.ne[0] and rows.ne[1] == idx.ne[0]):
        raise ValueError(f"set_rows: {dst.ne} {rows.ne} {idx.ne}")
    if idx.type not in (GGMLType.I32, GGMLType.I64):
        raise ValueError("set_rows: idx must be I32 or I64")
    return Tensor(dst.type, dst.ne, name=name or f"{dst.name} (set_rows)", op=Op.SET_ROWS,
                  src=[rows, idx, dst], view_src=dst, nb=dst.nb)
