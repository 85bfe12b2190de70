"""Op constructors for image graphs (stable-diffusion.cpp's UNet, VAE and text encoders): shapes only.

Each function mirrors the ggml function of the same name (ggml/src/ggml.c at the ggml commit
stable-diffusion.cpp pins): the result's `ne`, type, `src` order and view source, which are all the
graph allocator reads. No kernel computes them; the graphs are reserved, never run.

- ggml's `*_inplace` ops return a view of their first operand (ggml_view_tensor), so the allocator gives
  them no bytes and keeps the operand alive through the view; the plain ops are new tensors, which the
  allocator may still place over a dying parent when the op is in ggml_op_can_inplace.
- ggml_conv_2d is a composition: IM2COL (f16 columns, f32 for a bf16 kernel), a MUL_MAT against the
  flattened kernel, a reshape and a permuted CONT; ggml_conv_2d_direct is one CONV_2D node.
- ggml_is_contiguous skips unit dimensions (ggml_is_contiguous_m_n), so a permute that only moves a
  size-1 axis stays contiguous and may be reshaped without a copy.
"""
from __future__ import annotations

from collections.abc import Sequence

from gguf import GGML_QUANT_SIZES

from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Op, Tensor

F16 = GGMLType.F16
F32 = GGMLType.F32


def is_contiguous(t: Tensor) -> bool:
    """ggml_is_contiguous: rows packed, and each further dimension of more than one element packed."""
    block, type_size = GGML_QUANT_SIZES[t.type]
    if t.ne[0] != block and t.nb[0] != type_size:
        return False
    next_nb = type_size * (t.ne[0] // block)
    for i in range(1, 4):
        if t.ne[i] != 1 and t.nb[i] != next_nb:
            return False
        next_nb *= t.ne[i]
    return True


def reshape(a: Tensor, ne: Sequence[int], name: str = "") -> Tensor:
    """ggml_reshape_Nd under ggml's own contiguity rule (runtime.ggml.build.reshape asks for exact strides)."""
    if a.is_contiguous():
        return g.reshape(a, ne, name)
    if not is_contiguous(a):
        raise ValueError(f"reshape: {a.name} {a.ne} is not contiguous")
    full_ne = tuple(ne) + (1,) * (4 - len(ne))
    if full_ne[0] * full_ne[1] * full_ne[2] * full_ne[3] != a.n_elements:
        raise ValueError(f"reshape: {a.ne} cannot be viewed as {full_ne}")
    return Tensor(a.type, full_ne, name=name or f"{a.name} (reshaped)", op=Op.RESHAPE, src=[a], view_src=a)


def cont_if_needed(a: Tensor) -> Tensor:
    """stable-diffusion.cpp's ggml_ext_cont: a copy only where ggml_is_contiguous says one is needed."""
    return a if is_contiguous(a) else g.cont(a)


def _inplace(op: Op, a: Tensor, src: Sequence[Tensor | None], name: str, **params: object) -> Tensor:
    """A `*_inplace` op: a view of a (ggml_view_tensor) computed by `op`."""
    return Tensor(a.type, a.ne, name=name or f"{a.name} ({op.value.lower()}, inplace)", op=op, src=src,
                  view_src=a, nb=a.nb, op_params=params)


def add_inplace(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    g.add(a, b)   # the broadcast check
    return _inplace(Op.ADD, a, [a, b], name)


def mul_inplace(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    g.mul(a, b)
    return _inplace(Op.MUL, a, [a, b], name)


def scale_inplace(a: Tensor, s: float, name: str = "") -> Tensor:
    return _inplace(Op.SCALE, a, [a], name, scale=float(s))


def unary_inplace(a: Tensor, kind: str, name: str = "") -> Tensor:
    return _inplace(Op.UNARY, a, [a], name, unary=kind)


def soft_max_inplace(a: Tensor, name: str = "") -> Tensor:
    """ggml_soft_max_inplace: no mask (src[1] absent)."""
    return _inplace(Op.SOFT_MAX, a, [a, None], name, scale=1.0, max_bias=0.0)


def cast(a: Tensor, ggml_type: GGMLType, name: str = "") -> Tensor:
    """ggml_cast: a CPY into a new tensor. ggml also makes the result its own src[1]; the allocator's child
    count nets that out when the node runs, so it is left out here (as runtime/engine/clip.py does)."""
    return Tensor(ggml_type, a.ne, name=name or f"{a.name} (copy)", op=Op.CPY, src=[a])


def norm(a: Tensor, eps: float, name: str = "") -> Tensor:
    """ggml_norm: layer norm without weights, a new tensor of a's shape."""
    return Tensor(a.type, a.ne, name=name, op=Op.NORM, src=[a], op_params={"eps": float(eps)})


def group_norm(a: Tensor, n_groups: int, eps: float, name: str = "") -> Tensor:
    """ggml_group_norm over ne[2] in `n_groups` groups: a new tensor of a's shape."""
    if a.ne[2] % n_groups:
        raise ValueError(f"group_norm: {a.ne[2]} channels in {n_groups} groups")
    return Tensor(a.type, a.ne, name=name, op=Op.GROUP_NORM, src=[a],
                  op_params={"n_groups": n_groups, "eps": float(eps)})


def conv_output_size(size: int, kernel: int, stride: int, pad: int, dilation: int) -> int:
    """ggml_calc_conv_output_size."""
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def im2col(kernel: Tensor, x: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
           dst_type: GGMLType, name: str = "") -> Tensor:
    """ggml_im2col, 2-D: kernel [KW, KH, IC, OC], x [W, H, IC, N] -> [IC*KH*KW, OW, OH, N] of dst_type."""
    kw, kh, ic, _ = kernel.ne
    if ic != x.ne[2]:
        raise ValueError(f"im2col: kernel {kernel.ne} vs input {x.ne}")
    ow = conv_output_size(x.ne[0], kw, s0, p0, d0)
    oh = conv_output_size(x.ne[1], kh, s1, p1, d1)
    return Tensor(dst_type, (ic * kh * kw, ow, oh, x.ne[3]), name=name, op=Op.IM2COL, src=[kernel, x],
                  op_params={"s": (s0, s1), "p": (p0, p1), "d": (d0, d1)})


def conv_2d(kernel: Tensor, x: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
            d0: int = 1, d1: int = 1) -> Tensor:
    """ggml_conv_2d: im2col, matmul with the flattened kernel, reshape, permute, cont -> [OW, OH, OC, N] f32."""
    col_type = F32 if kernel.type == GGMLType.BF16 else F16
    col = im2col(kernel, x, s0, s1, p0, p1, d0, d1, col_type)
    kw, kh, ic, oc = kernel.ne
    y = g.mul_mat(reshape(col, (col.ne[0], col.ne[3] * col.ne[2] * col.ne[1])), reshape(kernel, (kw * kh * ic, oc)))
    y = reshape(y, (col.ne[1], col.ne[2], col.ne[3], oc))
    return g.cont(g.permute(y, (0, 1, 3, 2)))


def conv_3d(kernel: Tensor, bias: Tensor, x: Tensor, c_out: int, stride: tuple[int, int, int],
            pad: tuple[int, int, int] = (0, 0, 0)) -> Tensor:
    """stable-diffusion.cpp's 3-D convolution as im2col_3d and one matmul, bias added in place; `pad` (pw, ph, pt):
    im2col_3d's own zero padding (Wan's causal convolution pads itself first and passes none):
    kernel [KW, KH, KT, IC*OC], x [W, H, T, IC], stride (sw, sh, st) -> [OW, OH, OD, OC]."""
    kw, kh, kt = kernel.ne[0], kernel.ne[1], kernel.ne[2]
    ic = x.ne[3]
    sw, sh, st = stride
    ow, oh, od = ((x.ne[i] + 2 * p - k) // s + 1 for i, k, s, p in ((0, kw, sw, pad[0]), (1, kh, sh, pad[1]),
                                                                    (2, kt, st, pad[2])))
    col = Tensor(GGMLType.F16, (kw * kh * kt * ic, ow, oh, od), name="im2col_3d", op=Op.IM2COL, src=[kernel, x],
                 op_params={"s": stride, "p": pad})
    y = g.mul_mat(reshape(col, (col.ne[0], od * oh * ow)), reshape(kernel, (kw * kh * kt * ic, c_out)))
    y = reshape(y, (ow * oh, od, 1, c_out))
    y = reshape(g.cont(g.permute(y, (0, 1, 3, 2))), (ow, oh, od, c_out))
    return add_inplace(y, reshape(bias, (1, 1, 1, c_out)))


def conv_2d_direct(kernel: Tensor, x: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
                   d0: int = 1, d1: int = 1, name: str = "") -> Tensor:
    """ggml_conv_2d_direct: one CONV_2D node of the input's type, [OW, OH, OC, N]."""
    kw, kh, ic, oc = kernel.ne
    if ic != x.ne[2]:
        raise ValueError(f"conv_2d_direct: kernel {kernel.ne} vs input {x.ne}")
    ne = (conv_output_size(x.ne[0], kw, s0, p0, d0), conv_output_size(x.ne[1], kh, s1, p1, d1), oc, x.ne[3])
    return Tensor(x.type, ne, name=name, op=Op.CONV_2D, src=[kernel, x],
                  op_params={"s": (s0, s1), "p": (p0, p1), "d": (d0, d1)})


def upscale(a: Tensor, factor: int, name: str = "") -> Tensor:
    """ggml_upscale: ne[0] and ne[1] times `factor` (ggml_interpolate), a new tensor of a's type."""
    return Tensor(a.type, (a.ne[0] * factor, a.ne[1] * factor, a.ne[2], a.ne[3]), name=name, op=Op.UPSCALE,
                  src=[a], op_params={"factor": factor})


def pad_ext(a: Tensor, pads: Sequence[tuple[int, int]], name: str = "") -> Tensor:
    """ggml_pad_ext: (left, right) padding per dimension, a new tensor of a's type."""
    full = list(pads) + [(0, 0)] * (4 - len(pads))
    ne = tuple(a.ne[i] + full[i][0] + full[i][1] for i in range(4))
    return Tensor(a.type, ne, name=name, op=Op.PAD, src=[a], op_params={"pads": tuple(full)})


def concat(a: Tensor, b: Tensor, dim: int, name: str = "") -> Tensor:
    """ggml_concat along `dim`: the other dimensions agree; a new tensor of a's type."""
    if any(a.ne[i] != b.ne[i] for i in range(4) if i != dim):
        raise ValueError(f"concat: {a.ne} and {b.ne} along {dim}")
    ne = tuple(a.ne[i] + b.ne[i] if i == dim else a.ne[i] for i in range(4))
    return Tensor(a.type, ne, name=name, op=Op.CONCAT, src=[a, b], op_params={"dim": dim})


def timestep_embedding(timesteps: Tensor, dim: int, max_period: int = 10000, name: str = "") -> Tensor:
    """ggml_timestep_embedding: [dim, len(timesteps)] f32."""
    return Tensor(F32, (dim, timesteps.ne[0], 1, 1), name=name, op=Op.TIMESTEP_EMBEDDING, src=[timesteps],
                  op_params={"dim": dim, "max_period": max_period})


def repeat(a: Tensor, ne: Sequence[int], name: str = "") -> Tensor:
    """ggml_repeat(a, b): a tiled to b's shape; only a is a source (b lends its shape)."""
    full = tuple(ne) + (1,) * (4 - len(ne))
    if any(full[i] % a.ne[i] for i in range(4)):
        raise ValueError(f"repeat: {a.ne} does not tile {full}")
    return Tensor(a.type, full, name=name, op=Op.REPEAT, src=[a])
