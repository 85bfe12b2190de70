"""Kimi-VL's and Kimi-K2.5's projectors (PROJECTOR_TYPE_KIMIVL, PROJECTOR_TYPE_KIMIK25: MoonViT) and
PaddleOCR-VL's (PROJECTOR_TYPE_PADDLEOCR: the same tensors, M-RoPE), as clip.cpp builds them at the
warmup image (tools/mtmd/models/kimivl.cpp, kimik25.cpp, paddleocr.cpp).

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams: n_merge = clip.vision.projector.scale_factor; KIMIVL: set_limit_image_tokens(8,
  1024) then set_warmup_n_tokens(256), a 16 x 16-merged-token image whatever --image-max-tokens says;
  KIMIK25: with clip.vision.image_min_pixels and _max_pixels the warmup side is sqrt(max_pixels)
  (128 x 128 patches for Kimi-K2.5's 16384-patch limit), else set_limit_image_tokens(2, 4096);
  PADDLEOCR: n_merge 2, the pixel keys required, set_warmup_n_tokens(28 x 28): a 784 px image.
- clip.cpp load_tensors: the generic vision tower (q/k/v split for Kimi-VL, a fused qkv for K2.5), the
  position table (2-D {C, 64 x 64} for Kimi-VL, 3-D {C, 64, 64} for K2.5), mm.input_norm and mm.1 /
  mm.2 with biases.
- kimivl.cpp / kimik25.cpp: the learned positions resized to the grid (resize_position_embeddings;
  K2.5's 3-D variant: permute, interpolate, permute, cont_2d, or cont_2d alone at 64 x 64), build_vit
  with layer norms and build_rope_2d on q and k (columns, then rows), build_patch_merge_permute, a
  layer norm over n_embd-wide rows (viewed in and out of the merged width; eps 1e-5 for Kimi-VL, the
  file's for K2.5), and the GELU MLP; paddleocr.cpp: one M-RoPE node on q and k, then norm (eps 1e-5),
  the merger and the MLP with the FFN op.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from gguf import MODEL_TENSOR, Keys, VisionProjectorType

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from runtime.engine.clip import SiglipGraph, attn_core
from runtime.engine.clip_hparams import (
    ClipHParams,
    SiglipHead,
    UnsupportedProjector,
    ffn_unary,
    name,
    reading_keys,
    tower_figures,
)
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
CV = Keys.ClipVision
P = VisionProjectorType
KIMIVL_WARMUP_TOKENS = 256          # load_hparams' set_warmup_n_tokens ("avoid OOM on warmup")
KIMIK25_TOKEN_LIMITS = (2, 4096)    # load_hparams' set_limit_image_tokens without the pixel keys
KIMIVL_NORM_EPS = 1e-5              # kimivl.cpp: the projector's norm is a default nn.LayerNorm
PADDLEOCR_WARMUP_TOKENS = 28 * 28   # load_hparams (PADDLEOCR): set_warmup_n_tokens, n_merge fixed at 2
PADDLEOCR_N_MERGE = 2
PADDLEOCR_NORM_EPS = 1e-5           # paddleocr.cpp: the projector's pre-merge norm


def read_kimi_hparams(model: ModelFile, image_max_tokens: int = -1) -> ClipHParams:
    meta, proj = model.metadata, str(model.metadata.get(Keys.Clip.PROJECTOR_TYPE) or "")
    out = model.tensor(name(T.V_MMPROJ, 2))
    if out is None or not meta.get(Keys.Clip.HAS_VISION_ENCODER):
        raise BadInput(f"{model.path}: a {proj} projector without a vision encoder or {name(T.V_MMPROJ, 2)}")
    with reading_keys(model):
        patch, merge = int(meta[CV.PATCH_SIZE]), int(meta.get(CV.Projector.SCALE_FACTOR, 1))
        if proj == P.PADDLEOCR:     # load_hparams requires the pixel keys, then fixes the warmup
            int(meta[CV.IMAGE_MIN_PIXELS]), int(meta[CV.IMAGE_MAX_PIXELS])
            merge = PADDLEOCR_N_MERGE
            warmup = math.isqrt(PADDLEOCR_WARMUP_TOKENS) * patch * merge
        elif proj == P.KIMIVL:
            warmup = math.isqrt(KIMIVL_WARMUP_TOKENS) * patch * merge
        elif int(meta.get(CV.IMAGE_MIN_PIXELS, 0)) > 0 and int(meta.get(CV.IMAGE_MAX_PIXELS, 0)) > 0:
            warmup = math.isqrt(int(meta[CV.IMAGE_MAX_PIXELS]))
        else:        # clip-model.h set_limit_image_tokens: --image-max-tokens replaces the maximum
            tokens = image_max_tokens if image_max_tokens > 0 else KIMIK25_TOKEN_LIMITS[1]
            warmup = math.isqrt(tokens * (patch * merge) ** 2)
        hp = ClipHParams(proj, **tower_figures(meta), image_size=int(meta[CV.IMAGE_SIZE]), patch_size=patch,
                         n_merge=merge, ffn_op=ffn_unary(meta), n_mmproj_embd=out.shape[1], warmup_image_size=warmup)
    if merge < 2 or hp.n_patches_side % merge:
        # build_patch_merge_permute asserts a factor > 1 and pads a grid it does not divide (not modelled)
        raise UnsupportedProjector(model.path, f"{proj} merging {merge}x{merge} of a {hp.warmup_image_size} px image")
    return hp


_LAYER = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_QKV, T.V_ENC_ATTN_O, T.V_ENC_INPUT_NORM,
          T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_UP, T.V_ENC_FFN_GATE, T.V_ENC_FFN_DOWN)


def kimi_tensor_names(hp: ClipHParams) -> list[str]:
    names = [name(k, None, s) for k in (T.V_ENC_EMBD_PATCH, T.V_PRE_NORM, T.V_POST_NORM) for s in ("weight", "bias")]
    names += [name(T.V_ENC_EMBD_POS)]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER for s in ("weight", "bias")]
    return names + [name(T.V_MM_INP_NORM), name(T.V_MM_INP_NORM, None, "bias"),
                    *(name(T.V_MMPROJ, i, s) for i in (1, 2) for s in ("weight", "bias"))]


class KimiVLGraph(SiglipGraph):
    """clip_graph_kimivl::build: MoonViT with resized positions and 2-D RoPE, merger, norm, MLP."""

    norm_eps: float | None = KIMIVL_NORM_EPS

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        super().__init__(hp, w, flash_attn)
        self.head = SiglipHead((), "", 0, hp.n_merge, False, resizes_positions=True)
        n = hp.n_patches_side ** 2
        self.pos_h = g.new_tensor(GGMLType.I32, (n,), "pos_h", TensorFlag.INPUT)
        self.pos_w = g.new_tensor(GGMLType.I32, (n,), "pos_w", TensorFlag.INPUT)

    def add_pos(self, t: Tensor) -> Tensor:
        """build_rope_2d(pos_w, pos_h): one ROPE over the first half of each head, one over the second."""
        for pos in (self.pos_w, self.pos_h):
            t = Tensor(t.type, t.ne, op=Op.ROPE, src=[t, pos, None], op_params={"n_dims": t.ne[0] // 2})
        return t

    def kimi_head(self, x: Tensor) -> Tensor:
        """build_patch_merge_permute, the n_embd-row layer norm between two 2-D views, the GELU MLP."""
        e, m = self.hp.n_embd, self.hp.n_merge
        x = self.merge_permute(x)
        width, rows = x.ne[0], x.ne[1]
        x = g.view(x, (e, rows * m * m), (x.nb[0], x.nb[0] * e), 0)
        eps = self.hp.eps if self.norm_eps is None else self.norm_eps
        x = Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": eps})
        x = g.add(g.mul(x, self.w[name(T.V_MM_INP_NORM)]), self.w[name(T.V_MM_INP_NORM, None, "bias")])
        x = g.view(x, (width, rows), (x.nb[0], x.nb[0] * width), 0)
        return self.mlp(x, 1, 2, "GELU")

    def build(self) -> Graph:
        self.graph.expand(self.kimi_head(self.vit(self.inp())))
        return self.graph


class KimiK25Graph(KimiVLGraph):
    """clip_graph_kimik25::build: Kimi-VL's graph with the 3-D position table, a fused qkv (three
    views) and the file's eps in the projector norm."""

    norm_eps = None

    def positions(self) -> Tensor | None:
        pos, side, e = self.w[name(T.V_ENC_EMBD_POS)], self.hp.n_patches_side, self.hp.n_embd
        if pos.ne[0] != e or pos.ne[3] != 1:
            raise ValueError(f"the position table {pos.ne} is not {{{e}, W, H}}")
        if (pos.ne[1], pos.ne[2]) != (side, side):
            p = g.permute(pos, (2, 1, 0, 3))
            p = Tensor(pos.type, (side, side, e, 1), op=Op.UPSCALE, src=[p])
            pos = g.permute(p, (2, 1, 0, 3))
        return g.cont(pos, (e, side * side))

    def attention(self, x: Tensor, il: int) -> Tensor:
        """build_vit's fused path: the qkv matmul and bias, Q/K/V as views at 0, n_embd and 2 n_embd."""
        hp, n_pos = self.hp, self.n_pos
        d_head = hp.n_embd // hp.n_head
        qkv = self.linear(x, self.w[name(T.V_ENC_ATTN_QKV, il)], self._opt(name(T.V_ENC_ATTN_QKV, il, "bias")))
        views = []
        for i in range(3):
            t = g.view(qkv, (d_head, hp.n_head, n_pos, 1),
                       (qkv.nb[0], d_head * qkv.nb[0], qkv.nb[1], qkv.nb[1] * n_pos), i * hp.n_embd * qkv.nb[0])
            t = self.add_pos(t) if i < 2 else t
            self.graph.expand(t)
            views.append(t)
        out = attn_core(views[0], views[1], views[2], None, d_head ** -0.5, self.flash_attn)
        return self.linear(out, self.w[name(T.V_ENC_ATTN_O, il)], self._opt(name(T.V_ENC_ATTN_O, il, "bias")))


class PaddleOCRGraph(KimiVLGraph):
    """clip_graph_paddleocr::build: the same tower with M-RoPE (one ROPE node reading 4 position ids per
    patch) instead of the 2-D RoPE, then norm, build_patch_merge_permute and the MLP with the FFN op."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        super().__init__(hp, w, flash_attn)
        self.mrope_pos = g.new_tensor(GGMLType.I32, (4 * hp.n_patches_side ** 2,), "positions", TensorFlag.INPUT)

    def add_pos(self, t: Tensor) -> Tensor:
        return Tensor(t.type, t.ne, op=Op.ROPE, src=[t, self.mrope_pos, None], op_params={"mode": "vision"})

    def kimi_head(self, x: Tensor) -> Tensor:
        x = Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": PADDLEOCR_NORM_EPS})
        x = g.add(g.mul(x, self.w[name(T.V_MM_INP_NORM)]), self.w[name(T.V_MM_INP_NORM, None, "bias")])
        return self.mlp(self.merge_permute(x), 1, 2, self.hp.ffn_op)
