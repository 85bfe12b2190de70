"""stable-diffusion.cpp's building blocks as graph builders: its Conv2d, Linear, GroupNorm32, LayerNorm and
attention helpers, written against the runtime's ops so that a runner's graph has the nodes, shapes and
views sd.cpp's own has.

Sources (stable-diffusion.cpp 97d2990, src/core/ggml_extend.hpp): Conv2d::forward → ggml_ext_conv_2d
(ggml_conv_2d, or ggml_conv_2d_direct under --*-conv-direct, then the bias added in place), Linear::forward
→ ggml_ext_linear (inputs of more than 1024 rows in ne[2]*ne[3] are flattened around the matmul, the bias
added in place), GroupNorm → ggml_ext_group_norm (eps 1e-6 for GroupNorm32, weight and bias multiplied and
added in place), LayerNorm → ggml_ext_layer_norm, ggml_ext_attention_ext (flash attention: K and V cast to
f16 and FLASH_ATTN_EXT; else KQ in f32, scaled and soft-maxed in place). Parameters get a buffer of their own
(the runner's params buffer), so the compute buffer never holds them: Conv2d kernels are f16 whatever the
file stores, biases and norms f32. Only the compute buffer is sized here; parameter bytes come from the file.
"""
from __future__ import annotations

import math

from gguf import GGML_QUANT_SIZES

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.backend import Buffer, BufferType
from runtime.ggml.graph import BufferUsage, GGMLType, Tensor

F16 = GGMLType.F16
F32 = GGMLType.F32
GROUP_NORM_EPS = 1e-6       # GroupNorm32 (ggml_extend.hpp)
GROUP_NORM_GROUPS = 32
LAYER_NORM_EPS = 1e-5       # ggml_extend.hpp EPS, LayerNorm's default
LINEAR_FLATTEN_ROWS = 1024  # ggml_ext_linear: "workaround: avoid ggml cuda error" above ne[2]*ne[3] rows


class Blocks:
    """One runner's graph under construction: its switches and its parameters' buffer."""

    def __init__(self, buft: BufferType, flash_attn: bool = False, conv_direct: bool = False,
                 conv_scale: float = 1.0) -> None:
        self.flash_attn = flash_attn
        self.conv_direct = conv_direct
        self.conv_scale = conv_scale   # Conv2d::set_scale (SDXL's VAE without its own --vae: 1/32)
        self.one: Tensor | None = None   # the runner's built-in `one` (GGMLRunner), where a graph reads it
        self.params = Buffer(buft, 0, BufferUsage.WEIGHTS)   # never touched: sizes only
        self.cut_points: list[Tensor] = []   # the graph-cut outputs (sd::ggml_graph_cut::mark_graph_cut)

    def cut(self, t: Tensor) -> Tensor:
        """mark_graph_cut: `t` is a segment output when sd-cli plans graph cuts (--max-vram)."""
        self.cut_points.append(t)
        return t

    def param(self, ne: tuple[int, ...], ggml_type: GGMLType = F32, name: str = "") -> Tensor:
        t = Tensor(ggml_type, ne, name=name)
        t.buffer = self.params
        return t

    # --- Conv2d, Linear, norms ----------------------------------------------------------------
    def conv2d(self, x: Tensor, c_out: int, k: int, stride: int = 1, pad: int = 0) -> Tensor:
        """Conv2d(x.ne[2] -> c_out, k x k, stride, padding) with its bias."""
        w = self.param((k, k, x.ne[2], c_out), F16)
        b = self.param((c_out,))
        if self.conv_scale != 1.0:
            x = ext_scale(x, self.conv_scale)
        if self.conv_direct:
            y = im.conv_2d_direct(w, x, stride, stride, pad, pad)
        else:
            y = im.conv_2d(w, x, stride, stride, pad, pad)
        if self.conv_scale != 1.0:
            y = ext_scale(y, 1.0 / self.conv_scale)
        return im.add_inplace(y, im.reshape(b, (1, 1, c_out, 1)))

    def linear(self, x: Tensor, n_out: int, bias: bool = True, ggml_type: GGMLType = F16,
               scale: float = 1.0) -> Tensor:
        """Linear::forward; `scale` (a Linear's set_scale): the input scaled before the matmul, the
        product scaled back before the bias."""
        w = self.param((x.ne[0], n_out), ggml_type)
        if scale != 1.0:
            x = ext_scale(x, scale)
        if x.ne[2] * x.ne[3] > LINEAR_FLATTEN_ROWS:
            ne2, ne3 = x.ne[2], x.ne[3]
            y = g.mul_mat(w, im.reshape(x, (x.ne[0], x.ne[1] * ne2 * ne3)))
            y = im.reshape(y, (y.ne[0], y.ne[1] // ne2 // ne3, ne2, ne3))
        else:
            y = g.mul_mat(w, x)
        if scale != 1.0:
            y = ext_scale(y, 1.0 / scale)
        if bias:
            y = im.add_inplace(y, self.param((n_out,)))
        return y

    def group_norm32(self, x: Tensor) -> Tensor:
        c = x.ne[2]
        w, b = self.param((c,)), self.param((c,))
        if _n_dims(x) >= 3:
            w, b = im.reshape(w, (1, 1, c, 1)), im.reshape(b, (1, 1, c, 1))
        y = im.group_norm(x, GROUP_NORM_GROUPS, GROUP_NORM_EPS)
        return im.add_inplace(im.mul_inplace(y, w), b)

    def layer_norm(self, x: Tensor, eps: float = LAYER_NORM_EPS) -> Tensor:
        c = x.ne[0]
        y = im.norm(x, eps)
        return im.add_inplace(im.mul_inplace(y, self.param((c,))), self.param((c,)))

    # --- attention -------------------------------------------------------------------------------
    def attention(self, q: Tensor, k: Tensor, v: Tensor, n_head: int, mask: Tensor | None = None, *,
                  flash_attn: bool) -> Tensor:
        """ggml_ext_attention_ext with skip_reshape false: q [C, L_q, N], k and v [C_kv, L_k, N] -> [C, L_q, N].
        `flash_attn` is what the caller passes (the runner's switch, or false where sd.cpp hard-codes it)."""
        l_q, l_k, c, n = q.ne[1], k.ne[1], q.ne[0], q.ne[2]
        d_head = c // n_head
        n_kv_head = k.ne[0] // d_head
        q = im.reshape(im.cont_if_needed(g.permute(im.reshape(q, (d_head, n_head, l_q, n)), (0, 2, 1, 3))),
                       (d_head, l_q, n_head * n))
        k = im.reshape(im.cont_if_needed(g.permute(im.reshape(k, (d_head, n_kv_head, l_k, n)), (0, 2, 1, 3))),
                       (d_head, l_k, n_kv_head * n))
        v = im.reshape(v, (d_head, n_kv_head, l_k, n))
        return self.attention_heads(q, k, v, n_head, mask, flash_attn=flash_attn)

    def attention_heads(self, q: Tensor, k: Tensor, v: Tensor, n_head: int, mask: Tensor | None = None, *,
                        flash_attn: bool, kv_scale: float = 1.0) -> Tensor:
        """ggml_ext_attention_ext with skip_reshape true: q [d_head, L_q, n_head*N], k [d_head, L_k, n_kv_head*N],
        v [d_head, n_kv_head, L_k, N] -> [d_head*n_head, L_q, N]. `kv_scale` (flash attention only): K and V
        scaled before the f16 casts, the output scaled back."""
        d_head, l_q, l_k, n = v.ne[0], q.ne[1], k.ne[1], v.ne[3]
        n_kv_head = k.ne[2] // n
        scale = 1.0 / math.sqrt(d_head)
        if flash_attn and (mask is None or mask.ne[3] == 1):
            kqv = self._flash(q, k, v, mask, scale, (d_head, n_head, l_q, n, n_kv_head), kv_scale)
        else:
            v = im.reshape(im.cont_if_needed(g.permute(v, (1, 2, 0, 3))), (l_k, d_head, n_kv_head * n))
            kq = im.scale_inplace(g.mul_mat(k, q), scale)
            if mask is not None:
                kq = im.add_inplace(kq, mask)
            kq = im.soft_max_inplace(kq)
            kqv = g.permute(im.reshape(g.mul_mat(v, kq), (d_head, l_q, n_head, n)), (0, 2, 1, 3))
        return im.reshape(im.cont_if_needed(kqv), (d_head * n_head, l_q, n))

    def _flash(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
               dims: tuple[int, int, int, int, int], kv_scale: float = 1.0) -> Tensor:
        d_head, n_head, l_q, n, n_kv_head = dims
        if kv_scale != 1.0:
            k = ext_scale(k, kv_scale)
        k = im.cast(k, F16)
        v = im.reshape(im.cont_if_needed(g.permute(v, (0, 2, 1, 3))), (d_head, v.ne[2], n_kv_head * n))
        if kv_scale != 1.0:
            v = ext_scale(v, kv_scale)
        v = im.cast(v, F16)
        if mask is not None:
            if mask.ne[1] != l_q:
                raise ValueError("attention: a mask broadcast over queries is not modelled")
            mask = im.cast(mask, F16)
        out = g.flash_attn_ext(q, k, v, mask, scale / kv_scale)
        if kv_scale != 1.0:
            out = ext_scale(out, 1.0 / kv_scale)
        return g.view(out, (d_head, n_head, l_q, n), (out.nb[0], out.nb[1], out.nb[2], out.nb[1] * n_head))


def ext_scale(x: Tensor, factor: float) -> Tensor:
    """ggml_ext_scale: a copy first unless rows are packed and the higher dimensions follow on
    (ggml_ext_is_padded_1d), then a new SCALE node."""
    if not (x.nb[0] == GGML_QUANT_SIZES[x.type][1] and x.nb[2] == x.nb[1] * x.ne[1] and x.nb[3] == x.nb[2] * x.ne[2]):
        x = g.cont(x)
    return g.scale(x, factor)


def _n_dims(t: Tensor) -> int:
    """ggml_n_dims: the index of the last dimension of more than one element, plus one."""
    return max([i + 1 for i in range(4) if t.ne[i] > 1] or [1])
