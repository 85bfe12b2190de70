"""Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's projectors (tools/mtmd/models/qwen2vl.cpp
clip_graph_qwen2vl::build, models/qwen3vl.cpp clip_graph_qwen3vl::build), as clip.cpp builds them at
the warmup image size.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams (PROJECTOR_TYPE_QWEN2VL / QWEN25VL / QWEN3VL): n_merge = clip.vision.spatial_merge_size
  (default 2); clip.vision.n_wa_pattern (required for 2.5: every n-th layer attends fully, the others
  within windows); set_limit_image_tokens(8, 4096) then set_warmup_n_tokens(46 x 46), so the warmup
  image is 46 x patch x merge px square whatever --image-max-tokens says ("TODO: support warmup size
  for custom token numbers", clip-model.h).
- clip.cpp load_tensors: two patch kernels (v.patch_embd.weight and .weight.1), no position table,
  q/k/v/out with biases, an FFN with an optional gate, post_ln, mm.0 and mm.2.
- qwen2vl.cpp: both kernels' conv2d summed, a 2x2 patch regrouping, RMS norms for 2.5 (layer norms
  for 2), M-RoPE on q and k (4 position ids per patch), window attention through a gathered order
  (get_rows by inv_window_idx) and an n_pos x n_pos mask (f16 for flash attention, cast again in each
  windowed layer by build_attn), the 4-patch merge into a GELU MLP, and the window order undone.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gguf import MODEL_TENSOR, Keys, VisionProjectorType

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from runtime.engine.clip import cast, conv2d
from runtime.engine.clip_hparams import ClipHParams, UnsupportedProjector, ffn_unary, name, reading_keys, tower_figures
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
CV = Keys.ClipVision
QWEN_WARMUP_TOKENS = 46 * 46    # load_hparams' set_warmup_n_tokens ("avoid OOM on warmup")
QWEN_N_MERGE = 2


@dataclass(frozen=True)
class QwenVLHParams(ClipHParams):
    n_wa_pattern: int = 0      # 0: every layer attends fully
    projection_dim: int = 0    # clip.vision.projection_dim: the window reorder's row width
    rms_norm: bool = False     # Qwen2.5-VL: RMS norms; Qwen2-VL: layer norms


def read_qwen2vl_hparams(model: ModelFile) -> QwenVLHParams:
    meta, proj = model.metadata, str(model.metadata.get(Keys.Clip.PROJECTOR_TYPE) or "")
    out = model.tensor(name(T.V_MMPROJ, 2, "bias"))
    if out is None:
        raise BadInput(f"{model.path}: a {proj} projector without {name(T.V_MMPROJ, 2, 'bias')}")
    is_25 = proj == VisionProjectorType.QWEN25VL
    # clip_n_mmproj_embd: Qwen3-VL's output is the main path plus one per deepstack layer
    n_deepstack = sum(1 for t in model.tensors if t.name.startswith("v.deepstack.") and t.name.endswith("fc1.weight"))
    with reading_keys(model):
        patch, merge = int(meta[CV.PATCH_SIZE]), int(meta.get(CV.SPATIAL_MERGE_SIZE, QWEN_N_MERGE))
        n_wa = int(meta[CV.N_WA_PATTERN]) if is_25 else int(meta.get(CV.N_WA_PATTERN, 0))
        return QwenVLHParams(proj, **tower_figures(meta), image_size=int(meta[CV.IMAGE_SIZE]), patch_size=patch,
                             n_merge=merge, ffn_op=ffn_unary(meta), n_mmproj_embd=out.shape[0] * (1 + n_deepstack),
                             warmup_image_size=math.isqrt(QWEN_WARMUP_TOKENS) * patch * merge, n_wa_pattern=n_wa,
                             projection_dim=int(meta[CV.PROJECTION_DIM]), rms_norm=is_25)


_LAYER = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_QKV, T.V_ENC_ATTN_O, T.V_ENC_INPUT_NORM,
          T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_UP, T.V_ENC_FFN_GATE, T.V_ENC_FFN_DOWN, T.V_DS_NORM, T.V_DS_FC1,
          T.V_DS_FC2)


def qwen2vl_tensor_names(hp: ClipHParams) -> list[str]:
    names = [name(T.V_ENC_EMBD_PATCH), name(T.V_ENC_EMBD_PATCH, None, "weight.1"),
             name(T.V_ENC_EMBD_PATCH, None, "bias"), name(T.V_ENC_EMBD_POS)]
    names += [name(k, None, s) for k in (T.V_PRE_NORM, T.V_POST_NORM) for s in ("weight", "bias")]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER for s in ("weight", "bias")]
    return names + [name(T.V_MMPROJ, i, s) for i in (0, 2) for s in ("weight", "bias")]


class Qwen2VLGraph:
    """clip_graph_qwen2vl::build for one still image (n_batch 1) at the warmup size."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        if not isinstance(hp, QwenVLHParams):
            raise TypeError(f"{type(self).__name__} needs a Qwen-VL reader's figures (QwenVLHParams)")
        if hp.n_patches_side % 2:
            raise UnsupportedProjector("", f"{hp.projector} with an odd patch grid")
        self.hp, self.w, self.fa = hp, w, flash_attn
        self.graph = Graph()
        n_pos = hp.n_patches_side ** 2
        self.n_pos = n_pos
        self.positions = g.new_tensor(GGMLType.I32, (4 * n_pos,), "positions", TensorFlag.INPUT)

    def _opt(self, n: str) -> Tensor | None:
        return self.w.get(n)

    def norm(self, x: Tensor, kind: MODEL_TENSOR, il: int | None = None) -> Tensor:
        """build_norm: RMS (2.5) or layer norm (2), times the weight, plus a bias when present."""
        x = g.rms_norm(x, self.hp.eps) if self.hp.rms_norm else \
            Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": self.hp.eps})
        wt, b = self._opt(name(kind, il)), self._opt(name(kind, il, "bias"))
        x = g.mul(x, wt) if wt is not None else x
        return g.add(x, b) if b is not None else x

    def linear(self, x: Tensor, kind: MODEL_TENSOR, il: int | None) -> Tensor:
        x = g.mul_mat(self.w[name(kind, il)], x)
        b = self._opt(name(kind, il, "bias"))
        return g.add(x, b) if b is not None else x

    def conv_sum(self) -> Tensor:
        """build_inp_with_temporal_merge for one still frame: both kernels over the same image, summed."""
        hp, side = self.hp, self.hp.warmup_image_size
        raw = g.new_tensor(GGMLType.F32, (side, side, 3, 1), "inp_raw", TensorFlag.INPUT)
        return g.add(conv2d(self.w[name(T.V_ENC_EMBD_PATCH)], raw, hp.n_patches_side),
                     conv2d(self.w[name(T.V_ENC_EMBD_PATCH, None, "weight.1")], raw, hp.n_patches_side))

    def regroup(self, x: Tensor) -> Tensor:
        """The 2x2 regrouping of patches ("second conv dimension"): cont_4d, reshape_4d, permute, cont_3d."""
        e, px = self.hp.n_embd, self.hp.n_patches_side
        x = g.cont(x, (e * 2, px // 2, px, 1))
        x = g.permute(g.reshape(x, (e * 2, px // 2, 2, px // 2)), (0, 2, 1, 3))
        return g.cont(x, (e, px * px, 1))

    def inp(self) -> Tensor:
        return self.regroup(g.permute(self.conv_sum(), (1, 2, 0, 3)))   # [w, h, c] -> [c, w, h]

    def rope(self, x: Tensor) -> Tensor:
        """ggml_rope_multi (M-RoPE, vision mode): a ROPE node reading 4 position ids per patch."""
        return Tensor(x.type, x.ne, op=Op.ROPE, src=[x, self.positions, None], op_params={"mode": "vision"})

    def attention(self, x: Tensor, il: int, mask: Tensor | None) -> Tensor:
        hp, d_head = self.hp, self.hp.n_embd // self.hp.n_head
        qkv = []
        for kind, roped in ((T.V_ENC_ATTN_Q, True), (T.V_ENC_ATTN_K, True), (T.V_ENC_ATTN_V, False)):
            t = g.reshape(self.linear(x, kind, il), (d_head, hp.n_head, self.n_pos))
            t = self.rope(t) if roped else t
            self.graph.expand(t)     # build_attn's ggml_build_forward_order: q, k, v in this order
            qkv.append(t)
        return self.attend(qkv, il, mask)

    def attend(self, qkv: list[Tensor], il: int, mask: Tensor | None) -> Tensor:
        """build_attn on q, k, v [d_head, n_head, n_pos]: flash attention or the soft_max path, out proj."""
        d_head = self.hp.n_embd // self.hp.n_head
        q, k = g.permute(qkv[0], (0, 2, 1, 3)), g.permute(qkv[1], (0, 2, 1, 3))
        scale = d_head ** -0.5
        if self.fa:
            v = g.permute(qkv[2], (0, 2, 1, 3))
            m = cast(mask, GGMLType.F16) if mask is not None else None
            out = g.flash_attn_ext(q, cast(k, GGMLType.F16), cast(v, GGMLType.F16), m, scale)
            out = g.reshape(out, (out.ne[0] * out.ne[1], out.ne[2] * out.ne[3]))
        else:
            v = g.cont(g.permute(qkv[2], (1, 2, 0, 3)))
            kqv = g.permute(g.mul_mat(v, g.soft_max_ext(g.mul_mat(k, q), mask, scale)), (0, 2, 1, 3))
            out = g.cont(kqv, (kqv.ne[0] * kqv.ne[1], kqv.ne[2] * kqv.ne[3]))
        return self.linear(out, T.V_ENC_ATTN_O, il)

    def ffn(self, x: Tensor, il: int) -> Tensor:
        """build_ffn: up (+bias), an optional gate (+bias) joined by the GLU of the FFN op, down (+bias);
        up and down swapped back when stored the legacy way (load_tensors' is_ffn_swapped lists both
        Qwen types)."""
        up_k, down_k = T.V_ENC_FFN_UP, T.V_ENC_FFN_DOWN
        if self.w[name(down_k, il)].ne[0] == self.hp.n_embd:
            up_k, down_k = down_k, up_k
        up = self.linear(x, up_k, il)
        if self._opt(name(T.V_ENC_FFN_GATE, il)) is not None:
            gate = self.linear(x, T.V_ENC_FFN_GATE, il)
            y = Tensor(gate.type, gate.ne, op=Op.GLU, src=[gate, up], op_params={"glu": self.hp.ffn_op})
        else:
            y = g.unary(up, self.hp.ffn_op)
        return self.linear(y, down_k, il)

    def build(self) -> Graph:
        hp, e, n_pos = self.hp, self.hp.n_embd, self.n_pos
        x = self.inp()
        if self._opt(name(T.V_PRE_NORM)) is not None:
            x = self.norm(x, T.V_PRE_NORM)
        mask = None
        if hp.n_wa_pattern > 0:
            inv_idx = g.new_tensor(GGMLType.I32, (n_pos // 4,), "inv_window_idx", TensorFlag.INPUT)
            mask = g.new_tensor(GGMLType.F32, (n_pos, n_pos), "window_mask", TensorFlag.INPUT)
            mask = cast(mask, GGMLType.F16) if self.fa else mask
            x = g.reshape(g.get_rows(g.reshape(x, (e * 4, n_pos // 4)), inv_idx), (e, n_pos, 1))
        for il in range(hp.n_layer):
            full = hp.n_wa_pattern == 0 or (il + 1) % hp.n_wa_pattern == 0
            y = self.attention(self.norm(x, T.V_ENC_INPUT_NORM, il), il, None if full else mask)
            x = g.add(y, x)
            x = g.add(x, self.ffn(self.norm(x, T.V_ENC_POST_ATTN_NORM, il), il))
        if self._opt(name(T.V_POST_NORM)) is not None:
            x = self.norm(x, T.V_POST_NORM)
        x = g.reshape(x, (e * 4, n_pos // 4, 1))
        x = g.unary(self.linear(x, T.V_MMPROJ, 0), "GELU")
        x = self.linear(x, T.V_MMPROJ, 2)
        if hp.n_wa_pattern > 0:
            idx = g.new_tensor(GGMLType.I32, (n_pos // 4,), "window_idx", TensorFlag.INPUT)
            x = g.reshape(g.get_rows(g.reshape(x, (hp.projection_dim, n_pos // 4)), idx),
                          (hp.projection_dim, n_pos // 4, 1))
        self.graph.expand(x)
        return self.graph



class Qwen3VLGraph(Qwen2VLGraph):
    """models/qwen3vl.cpp clip_graph_qwen3vl::build: Qwen2-VL's input with a patch bias and the learned
    position table (resized to the grid, regrouped 2x2 as the patches), layer norms, a fused qkv (three
    views), M-RoPE, no windows, and the deepstack layers' merged features concatenated after the
    merger's output (ggml_concat along the features)."""

    def positions_table(self) -> Tensor:
        """resize_position_embeddings (bilinear, align corners), then the 2x2 regrouping."""
        pos, side, e = self.w[name(T.V_ENC_EMBD_POS)], self.hp.n_patches_side, self.hp.n_embd
        n_per_side = math.isqrt(pos.ne[1])
        if side != n_per_side:
            p = g.permute(g.reshape(pos, (e, n_per_side, n_per_side)), (2, 0, 1, 3))
            p = Tensor(pos.type, (side, side, e, 1), op=Op.UPSCALE, src=[p])
            pos = g.cont(g.permute(p, (1, 2, 0, 3)), (e, side * side))
        return self.regroup(pos)

    def attention(self, x: Tensor, il: int, mask: Tensor | None) -> Tensor:
        hp, e, d_head = self.hp, self.hp.n_embd, self.hp.n_embd // self.hp.n_head
        qkv = self.linear(x, T.V_ENC_ATTN_QKV, il)
        views = []
        for i in range(3):      # ggml_view_3d: d_head x n_head x n_pos, at 0, n_embd and 2 n_embd
            t = g.view(qkv, (d_head, hp.n_head, self.n_pos), (qkv.nb[0], d_head * qkv.nb[0], qkv.nb[1]),
                       i * e * qkv.nb[0])
            views.append(self.rope(t) if i < 2 else t)
        for t in views:
            self.graph.expand(t)     # build_attn's ggml_build_forward_order
        return self.attend(views, il, mask)

    def build(self) -> Graph:
        hp, e, n_pos = self.hp, self.hp.n_embd, self.n_pos
        x = g.add(self.inp(), self.w[name(T.V_ENC_EMBD_PATCH, None, "bias")])
        x = g.add(x, self.positions_table())
        if self._opt(name(T.V_PRE_NORM)) is not None:
            x = self.norm(x, T.V_PRE_NORM)
        merge = hp.n_merge * hp.n_merge if hp.n_merge > 0 else 4
        stack: Tensor | None = None
        for il in range(hp.n_layer):
            x = g.add(self.attention(self.norm(x, T.V_ENC_INPUT_NORM, il), il, None), x)
            x = g.add(x, self.ffn(self.norm(x, T.V_ENC_POST_ATTN_NORM, il), il))
            if self._opt(name(T.V_DS_FC1, il)) is not None:
                f = self.norm(g.reshape(x, (e * merge, n_pos // merge, 1)), T.V_DS_NORM, il)
                f = self.linear(g.unary(self.linear(f, T.V_DS_FC1, il), "GELU"), T.V_DS_FC2, il)
                stack = f if stack is None else _concat0(stack, f)
        if self._opt(name(T.V_POST_NORM)) is not None:
            x = self.norm(x, T.V_POST_NORM)
        x = g.reshape(x, (e * 4, n_pos // 4, 1))
        x = self.linear(g.unary(self.linear(x, T.V_MMPROJ, 0), "GELU"), T.V_MMPROJ, 2)
        self.graph.expand(_concat0(x, stack) if stack is not None else x)
        return self.graph


def _concat0(a: Tensor, b: Tensor) -> Tensor:
    """ggml_concat along dim 0 (the features)."""
    ne = (a.ne[0] + b.ne[0], a.ne[1], a.ne[2], a.ne[3])
    return Tensor(a.type, ne, op=Op.CONCAT, src=[a, b], op_params={"dim": 0})
