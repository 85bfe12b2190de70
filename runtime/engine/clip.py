"""The multimodal projector's graph (tools/mtmd), as clip.cpp builds it at its warmup image size:
the SigLIP-tower graphs (hparams and weights: runtime/engine/clip_hparams.py); runtime/engine/
clip_reserve.py reserves them.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams: clip.* keys; the warmup image is image_size square unless the type sets
  token limits (clip-model.h set_limit_image_tokens: LFM2's 64..256 tokens, --image-max-tokens
  replacing the maximum) or a warmup token count (set_warmup_n_tokens: Phi-4's 16 x 16);
  get_dummy_batch makes that one image.
- clip.cpp load_tensors: the generic vision tensors plus each type's mm.* (HEADS); is_ffn_swapped.
- clip.cpp build_inp / build_vit / build_norm / build_attn / build_ffn / build_patch_merge_permute /
  resize_position_embeddings, models/siglip.cpp clip_graph_siglip::build (PROJECTOR_TYPE_GEMMA3,
  IDEFICS3, LFM2, JANUS_PRO, PHI4) and models/internvl.cpp (INTERNVL: a class token, layer scales,
  a pixel shuffle): the graph below, node for node (865 nodes for Gemma 3's 27-layer SigLIP-So400m
  tower, as llama.cpp logs).

Only sizes are simulated: IM2COL, POOL_2D, NORM, UPSCALE and the other ops of CLIP_SIZED_OPS have no
numpy kernel, so the devices declare them for the scheduler and no projector graph is ever computed.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from gguf import MODEL_TENSOR, VisionProjectorType

from runtime.engine.clip_hparams import HEADS, ClipHParams, SiglipHead, name
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
# the ops the projector graphs use that have no numpy kernel (sizes only): the towers' convolutions, pools,
# norms and upscales; the audio encoders' pool, pads and convolutions; MiniCPM-V's sin/cos; Gemma 4's SUB
CLIP_SIZED_OPS = frozenset({Op.IM2COL, Op.POOL_2D, Op.NORM, Op.UPSCALE, Op.REPEAT, Op.CONCAT, Op.SUB, Op.POOL_1D,
                            Op.PAD, Op.SIN, Op.COS, Op.CONV_2D, Op.CONV_2D_DW, Op.ROLL, Op.SSM_CONV})
LFM2_NORM_EPS = 1e-5         # siglip.cpp's LFM2 input norm: "default nn.LayerNorm"
INTERNVL_NORM_EPS = 1e-5     # internvl.cpp: the projector's LayerNorm uses pytorch's default eps
INTERNVL_RMS_VIT = (3200, 45)   # internvl.cpp: the 6B ViT (n_embd, n_layer) uses RMS norms


# --- the graph (clip.cpp build_* and models/siglip.cpp) ---------------------------------------------

class SiglipGraph:
    """clip_graph_siglip::build at the warmup image size, with the head of the file's projector type."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        self.hp, self.w, self.flash_attn = hp, w, flash_attn
        self.graph = Graph()
        self.head = HEADS.get(hp.projector, SiglipHead((), "", 0, 1, False))   # builders of their own: none
        self.cls = self.head.cls_token
        self.n_pos = hp.n_patches_side ** 2 + (1 if self.cls else 0)
        self.rms = hp.projector == VisionProjectorType.INTERNVL and (hp.n_embd, hp.n_layer) == INTERNVL_RMS_VIT

    def _opt(self, n: str) -> Tensor | None:
        return self.w.get(n)

    def norm(self, x: Tensor, kind: MODEL_TENSOR, il: int | None = None) -> Tensor:
        """build_norm: layer norm (RMS for InternVL's 6B ViT), times the weight, plus the bias."""
        x = g.rms_norm(x, self.hp.eps) if self.rms else Tensor(x.type, x.ne, op=Op.NORM, src=[x],
                                                                 op_params={"eps": self.hp.eps})
        wt, b = self._opt(name(kind, il)), self._opt(name(kind, il, "bias"))
        x = g.mul(x, wt) if wt is not None else x
        return g.add(x, b) if b is not None else x

    def linear(self, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        x = g.mul_mat(w, x)
        return g.add(x, b) if b is not None else x

    def inp(self) -> Tensor:
        """build_inp_raw and build_inp: the stride-patch conv2d, patches as rows, the patch bias."""
        hp, side = self.hp, self.hp.warmup_image_size
        raw = g.new_tensor(GGMLType.F32, (side, side, 3, 1), "inp_raw", TensorFlag.INPUT)
        y = conv2d(self.w[name(T.V_ENC_EMBD_PATCH)], raw, hp.n_patches_side)
        y = g.reshape(y, (hp.n_patches_side ** 2, hp.n_embd, 1))
        y = g.cont(g.transpose(y))
        bias = self._opt(name(T.V_ENC_EMBD_PATCH, None, "bias"))
        return g.add(y, bias) if bias is not None else y

    def attention(self, x: Tensor, il: int) -> Tensor:
        """build_vit's separate q/k/v projections and build_attn (flash or soft_max path)."""
        hp, n_pos = self.hp, self.n_pos
        d_head = hp.n_embd // hp.n_head
        qkv = []
        for kind in (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V):
            t = self.linear(x, self.w[name(kind, il)], self._opt(name(kind, il, "bias")))
            t = g.reshape(t, (d_head, hp.n_head, n_pos, 1))
            t = self.add_pos(t) if kind is not T.V_ENC_ATTN_V else t
            self.graph.expand(t)    # ggml_build_forward_order: q, k, v enter the graph in this order
            qkv.append(t)
        q = g.permute(qkv[0], (0, 2, 1, 3))
        k = g.permute(qkv[1], (0, 2, 1, 3))
        scale = d_head ** -0.5
        if self.flash_attn:
            v = g.permute(qkv[2], (0, 2, 1, 3))
            k16, v16 = cast(k, GGMLType.F16), cast(v, GGMLType.F16)
            out = g.flash_attn_ext(q, k16, v16, None, scale)
            out = g.reshape(out, (out.ne[0] * out.ne[1], out.ne[2] * out.ne[3]))
        else:
            v = g.cont(g.permute(qkv[2], (1, 2, 0, 3)))
            kq = g.soft_max_ext(g.mul_mat(k, q), None, scale)
            kqv = g.permute(g.mul_mat(v, kq), (0, 2, 1, 3))
            out = g.cont(kqv, (kqv.ne[0] * kqv.ne[1], kqv.ne[2] * kqv.ne[3]))
        return self.linear(out, self.w[name(T.V_ENC_ATTN_O, il)], self._opt(name(T.V_ENC_ATTN_O, il, "bias")))

    def add_pos(self, t: Tensor) -> Tensor:
        """build_vit's add_pos hook on q and k (none here; Pixtral's 2-D RoPE overrides it)."""
        return t

    def ffn(self, x: Tensor, il: int) -> Tensor:
        """build_ffn: up, an optional gate joined by the FFN op's GLU, down; up/down swapped back when
        stored as the converter names them (load_tensors: is_ffn_swapped)."""
        up, down = self.w[name(T.V_ENC_FFN_UP, il)], self.w[name(T.V_ENC_FFN_DOWN, il)]
        up_b, down_b = self._opt(name(T.V_ENC_FFN_UP, il, "bias")), self._opt(name(T.V_ENC_FFN_DOWN, il, "bias"))
        if self.head.swaps_ffn and down.ne[0] == self.hp.n_embd:
            up, down, up_b, down_b = down, up, down_b, up_b
        y = self.linear(x, up, up_b)
        gate = self._opt(name(T.V_ENC_FFN_GATE, il))
        if gate is not None:
            gx = self.linear(x, gate, self._opt(name(T.V_ENC_FFN_GATE, il, "bias")))
            y = Tensor(gx.type, gx.ne, op=Op.GLU, src=[gx, y], op_params={"glu": self.hp.ffn_op})
        else:
            y = g.unary(y, self.hp.ffn_op)
        return self.linear(y, down, down_b)

    def vit(self, x: Tensor) -> Tensor:
        """build_vit: learned positions, the pre-norm layers (layer scales where present), the post
        layer norm."""
        hp, n_pos = self.hp, self.n_pos
        pos = self.positions()
        x = g.add(x, pos) if pos is not None else x
        x = g.reshape(x, (hp.n_embd, n_pos))
        if self._opt(name(T.V_PRE_NORM)) is not None:
            x = self.norm(x, T.V_PRE_NORM)
        for il in range(hp.n_layer):
            y = self.scaled(self.attention(self.norm(x, T.V_ENC_INPUT_NORM, il), il), T.V_LAYER_SCALE_1, il)
            x = g.add(y, x)
            y = self.scaled(self.ffn(self.norm(x, T.V_ENC_POST_ATTN_NORM, il), il), T.V_LAYER_SCALE_2, il)
            x = g.add(x, y)
        if self._opt(name(T.V_POST_NORM)) is not None:
            x = self.norm(x, T.V_POST_NORM)
        return g.reshape(x, (hp.n_embd, n_pos, 1))

    def scaled(self, x: Tensor, kind: MODEL_TENSOR, il: int) -> Tensor:
        ls = self._opt(name(kind, il))
        return g.mul(x, ls) if ls is not None else x

    def with_cls(self, x: Tensor) -> Tensor:
        """internvl.cpp: the class embedding repeated per image (ggml_repeat_4d) and concatenated
        after the patches (ggml_concat, dim 1)."""
        cls = self.w[name(T.V_ENC_EMBD_CLS, None, None)]
        cls = Tensor(cls.type, (cls.ne[0], 1, 1, 1), op=Op.REPEAT, src=[cls])
        return Tensor(x.type, (x.ne[0], x.ne[1] + 1, x.ne[2], 1), op=Op.CONCAT, src=[x, cls], op_params={"dim": 1})

    def internvl(self, x: Tensor) -> Tensor:
        """internvl.cpp: drop the class token (a view and cont), pixel shuffle by n_merge, then the
        projector: layer norm (mm.model.mlp.0, eps 1e-5), mlp.1, GELU, mlp.3."""
        side, s, e = self.hp.n_patches_side, self.hp.n_merge, self.hp.n_embd
        x = g.cont(g.view(x, (e, side * side, 1), (x.nb[0], x.nb[1], x.nb[2]), 0))
        x = g.permute(g.reshape(x, (e * s, side // s, side, 1)), (0, 2, 1, 3))
        x = g.permute(g.cont(x, (e * s * s, side // s, side // s, 1)), (0, 2, 1, 3))
        x = g.cont(x, (x.ne[0], x.ne[1] * x.ne[2], x.ne[3]))
        x = Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": INTERNVL_NORM_EPS})
        x = g.add(g.mul(x, self.w[name(T.V_MMPROJ_MLP, 0)]), self.w[name(T.V_MMPROJ_MLP, 0, "bias")])
        x = g.unary(self.linear(x, self.w[name(T.V_MMPROJ_MLP, 1)], self._opt(name(T.V_MMPROJ_MLP, 1, "bias"))), "GELU")
        return self.linear(x, self.w[name(T.V_MMPROJ_MLP, 3)], self._opt(name(T.V_MMPROJ_MLP, 3, "bias")))

    def positions(self) -> Tensor | None:
        """The learned position table; resize_position_embeddings interpolates it to the image's
        patch grid (reshape, permute, ggml_interpolate = UPSCALE, permute, cont_2d) when they differ."""
        pos, side, e = self.w[name(T.V_ENC_EMBD_POS)], self.hp.n_patches_side, self.hp.n_embd
        n_per_side = math.isqrt(pos.ne[1])
        if not self.head.resizes_positions or side == n_per_side:
            return pos
        p = g.permute(g.reshape(pos, (e, n_per_side, n_per_side)), (2, 0, 1, 3))
        p = Tensor(pos.type, (side, side, e, 1), op=Op.UPSCALE, src=[p])
        return g.cont(g.permute(p, (1, 2, 0, 3)), (e, side * side))

    def gemma3(self, x: Tensor) -> Tensor:
        """siglip.cpp's Gemma 3 branch: average-pool n_merge x n_merge patches, RMS norm, project."""
        hp, side = self.hp, self.hp.n_patches_side
        x = g.cont(g.transpose(x), (side, side, hp.n_embd, 1))
        pooled = side // hp.n_merge        # ggml_calc_pool_output_size with stride = kernel, no padding
        x = Tensor(GGMLType.F32, (pooled, pooled, hp.n_embd, 1), op=Op.POOL_2D, src=[x],
                   op_params={"k": hp.n_merge, "s": hp.n_merge})
        x = g.reshape(x, (pooled * pooled, hp.n_embd, 1))
        x = g.cont(g.transpose(x))
        x = g.mul(g.rms_norm(x, hp.eps), self.w[name(T.V_MM_SOFT_EMB_NORM)])
        proj = g.cont(g.transpose(self.w[name(T.V_MM_INP_PROJ)]))
        return g.mul_mat(proj, x)

    def merge_permute(self, x: Tensor) -> Tensor:
        """build_patch_merge_permute: pixel unshuffle by n_merge on each side (the side divides, so
        no ggml_pad)."""
        hp, side, s = self.hp, self.hp.n_patches_side, self.hp.n_merge
        x = g.reshape(x, (hp.n_embd, side, side))
        x = g.permute(g.reshape(x, (hp.n_embd * s, side // s, side)), (0, 2, 1, 3))
        x = g.permute(g.cont(x, (hp.n_embd * s * s, side // s, side // s)), (0, 2, 1, 3))
        return g.cont(x, (x.ne[0], x.ne[1] * x.ne[2]))

    def idefics3(self, x: Tensor) -> Tensor:
        """siglip.cpp's IDEFICS3 branch: the pixel unshuffle, then mm.model.fc."""
        return g.mul_mat(self.w[name(T.V_MMPROJ_FC)], self.merge_permute(x))

    def lfm2(self, x: Tensor) -> Tensor:
        """siglip.cpp's LFM2 branch: the pixel unshuffle, an optional layer norm (eps 1e-5, as
        nn.LayerNorm), then build_ffn with mm.1 / mm.2 and GELU."""
        x = self.merge_permute(x)
        nw, nb = self._opt(name(T.V_MM_INP_NORM)), self._opt(name(T.V_MM_INP_NORM, None, "bias"))
        if nw is not None:
            x = g.mul(Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": LFM2_NORM_EPS}), nw)
        x = g.add(x, nb) if nb is not None else x
        return self.mlp(x, 1, 2, "GELU")

    def mlp(self, x: Tensor, a: int, b: int, op: str) -> Tensor:
        """build_ffn with mm.a / mm.b and no gate."""
        x = g.unary(self.linear(x, self.w[name(T.V_MMPROJ, a)], self._opt(name(T.V_MMPROJ, a, "bias"))), op)
        return self.linear(x, self.w[name(T.V_MMPROJ, b)], self._opt(name(T.V_MMPROJ, b, "bias")))

    def janus_pro(self, x: Tensor) -> Tensor:
        """siglip.cpp's JANUS_PRO branch: mm.0 / mm.1 with the tower's FFN op."""
        return self.mlp(x, 0, 1, self.hp.ffn_op)

    def phi4(self, x: Tensor) -> Tensor:
        """siglip.cpp's PHI4 branch: mm.0 / mm.2 with GELU."""
        return self.mlp(x, 0, 2, "GELU")

    def build(self) -> Graph:
        heads = {VisionProjectorType.GEMMA3: self.gemma3, VisionProjectorType.IDEFICS3: self.idefics3,
                 VisionProjectorType.LFM2: self.lfm2, VisionProjectorType.JANUS_PRO: self.janus_pro,
                 VisionProjectorType.PHI4: self.phi4, VisionProjectorType.INTERNVL: self.internvl}
        x = self.inp()
        x = self.with_cls(x) if self.cls else x
        self.graph.expand(heads[self.hp.projector](self.vit(x)))
        return self.graph


def cast(a: Tensor, ggml_type: GGMLType) -> Tensor:
    """ggml_cast: a CPY into a new tensor of `ggml_type`. ggml makes the result its own src[1]; the
    allocator's child count then nets out the same, so the self-reference is left out here."""
    return Tensor(ggml_type, a.ne, name=f"{a.name} (copy)", op=Op.CPY, src=[a])


def conv2d(kernel: Tensor, raw: Tensor, n_side: int) -> Tensor:
    """ggml_conv_2d with stride = kernel size and no padding: im2col (f16, or f32 for a bf16 kernel),
    a matmul against the flattened kernel, reshape, permute, cont -> [n_side, n_side, OC, 1]."""
    col_type = GGMLType.F32 if kernel.type == GGMLType.BF16 else GGMLType.F16
    k0, k1, ic, oc = kernel.ne
    col = Tensor(col_type, (ic * k1 * k0, n_side, n_side, 1), op=Op.IM2COL, src=[kernel, raw])
    y = g.mul_mat(g.reshape(col, (col.ne[0], n_side * n_side)), g.reshape(kernel, (k0 * k1 * ic, oc)))
    y = g.reshape(y, (n_side, n_side, 1, oc))
    return g.cont(g.permute(y, (0, 1, 3, 2)))


# projb: build_attn's core for the builders of clip_whisper.py, clip_minicpmv.py, clip_kimivl.py
def attn_core(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, flash_attn: bool) -> Tensor:
    """clip.cpp build_attn from q, k, v [d_head, n_head, n_pos] to [n_embd, n_pos] before the output
    projection: flash attention (k and v cast to f16, the mask too) or the soft_max path."""
    qp, kp = g.permute(q, (0, 2, 1, 3)), g.permute(k, (0, 2, 1, 3))
    if flash_attn:
        vp = g.permute(v, (0, 2, 1, 3))
        m = cast(mask, GGMLType.F16) if mask is not None else None
        out = g.flash_attn_ext(qp, cast(kp, GGMLType.F16), cast(vp, GGMLType.F16), m, scale)
        return g.reshape(out, (out.ne[0] * out.ne[1], out.ne[2] * out.ne[3]))
    vp = g.cont(g.permute(v, (1, 2, 0, 3)))
    kqv = g.permute(g.mul_mat(vp, g.soft_max_ext(g.mul_mat(kp, qp), mask, scale)), (0, 2, 1, 3))
    return g.cont(kqv, (kqv.ne[0] * kqv.ne[1], kqv.ne[2] * kqv.ne[3]))
