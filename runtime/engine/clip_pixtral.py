"""Pixtral's projector (PROJECTOR_TYPE_PIXTRAL: Pixtral, Mistral Small 3.x), as clip.cpp builds it at
the warmup image size (tools/mtmd/models/pixtral.cpp clip_graph_pixtral::build).

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams (PROJECTOR_TYPE_PIXTRAL): n_merge = clip.vision.spatial_merge_size (default
  1), set_limit_image_tokens(8, 1024) then set_warmup_n_tokens(256): the warmup image is
  16 x patch x merge px square whatever --image-max-tokens says.
- clip.cpp load_tensors: the vision tower (no position table; RMS norms, a pre-norm, a gated FFN),
  mm.1 / mm.2 (biases optional), v.token_embd.img_break, and for Mistral Small 3.1 mm.input_norm and
  mm.patch_merger.
- pixtral.cpp: build_vit with RMS norms and build_rope_2d on q and k (two ROPE nodes each, rows and
  columns), the patch merger (RMS norm, the grid as [x, y, n_embd], an im2col unfold by n_merge over a
  zero-stride dummy kernel, a matmul), the GELU MLP, then one [IMG_BREAK] embedding appended per row
  (a zeroed tensor, scaled and added, concatenated, viewed back without the last).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from gguf import MODEL_TENSOR, Keys, VisionProjectorType

from planner.gguf.reader import ModelFile
from runtime.engine.clip import SiglipGraph
from runtime.engine.clip_hparams import ClipHParams, ffn_unary, name, reading_keys, required_tensor, tower_figures
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
CV = Keys.ClipVision
PIXTRAL_WARMUP_TOKENS = 256   # load_hparams' set_warmup_n_tokens ("avoid OOM on warmup")
_LAYER = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O, T.V_ENC_INPUT_NORM,
          T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_UP, T.V_ENC_FFN_GATE, T.V_ENC_FFN_DOWN)


def read_pixtral_hparams(model: ModelFile) -> ClipHParams:
    meta = model.metadata
    out = required_tensor(model, "pixtral", name(T.V_MMPROJ, 2))
    with reading_keys(model):
        patch, merge = int(meta[CV.PATCH_SIZE]), int(meta.get(CV.SPATIAL_MERGE_SIZE, 1))
        return ClipHParams(VisionProjectorType.PIXTRAL, **tower_figures(meta), image_size=int(meta[CV.IMAGE_SIZE]),
                           patch_size=patch, n_merge=merge, ffn_op=ffn_unary(meta), n_mmproj_embd=out.shape[1],
                           warmup_image_size=math.isqrt(PIXTRAL_WARMUP_TOKENS) * patch * merge)


def pixtral_tensor_names(hp: ClipHParams) -> list[str]:
    names = [name(T.V_ENC_EMBD_PATCH), name(T.V_ENC_EMBD_PATCH, None, "bias")]
    names += [name(k, None, s) for k in (T.V_PRE_NORM, T.V_POST_NORM) for s in ("weight", "bias")]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER for s in ("weight", "bias")]
    names += [name(T.V_MMPROJ, i, s) for i in (1, 2) for s in ("weight", "bias")]
    return names + [name(T.V_TOK_EMBD_IMG_BREAK, None, None), name(T.V_MM_INP_NORM), name(T.V_MM_PATCH_MERGER)]


class PixtralGraph(SiglipGraph):
    """build_vit with RMS norms and 2-D RoPE, then Pixtral's head."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        super().__init__(hp, w, flash_attn)
        self.rms = True
        n = hp.n_patches_side ** 2
        self.pos_h = g.new_tensor(GGMLType.I32, (n,), "pos_h", TensorFlag.INPUT)
        self.pos_w = g.new_tensor(GGMLType.I32, (n,), "pos_w", TensorFlag.INPUT)

    def positions(self) -> Tensor | None:
        return None

    def add_pos(self, t: Tensor) -> Tensor:
        """build_rope_2d: one ROPE over the first half of each head (rows), one over the second (columns)."""
        for pos in (self.pos_h, self.pos_w):
            t = Tensor(t.type, t.ne, op=Op.ROPE, src=[t, pos, None], op_params={"n_dims": t.ne[0] // 2})
        return t

    def pixtral_head(self, x: Tensor) -> Tensor:
        hp, side, m, e = self.hp, self.hp.n_patches_side, self.hp.n_merge, self.hp.n_embd
        merger = self._opt(name(T.V_MM_PATCH_MERGER))
        if merger is not None:
            x = g.mul(g.rms_norm(x, hp.eps), self.w[name(T.V_MM_INP_NORM)])
            x = g.cont(g.permute(g.reshape(x, (e, side, side)), (2, 0, 1, 3)))
            kernel = g.view(x, (m, m, x.ne[2]), (x.nb[0], 0, 0, 0))      # a dummy kernel: im2col reads its shape
            x = Tensor(GGMLType.F32, (e * m * m, side // m, side // m, 1), op=Op.IM2COL, src=[kernel, x])
            x = g.mul_mat(merger, g.reshape(x, (x.ne[0], x.ne[1] * x.ne[2])))
        x = g.unary(self.linear(x, self.w[name(T.V_MMPROJ, 1)], self._opt(name(T.V_MMPROJ, 1, "bias"))), "GELU")
        x = self.linear(x, self.w[name(T.V_MMPROJ, 2)], self._opt(name(T.V_MMPROJ, 2, "bias")))
        brk = self._opt(name(T.V_TOK_EMBD_IMG_BREAK, None, None))
        if brk is None:
            return x
        p = side // m
        rows = g.reshape(x, (x.ne[0], p, p))
        tok = g.add(g.scale(Tensor(rows.type, (x.ne[0], 1, p, 1), name="img_break rows"), 0.0), brk)
        joined = Tensor(rows.type, (x.ne[0], p + 1, p, 1), op=Op.CONCAT, src=[rows, tok], op_params={"dim": 1})
        return g.view(joined, (x.ne[0], p * p + p - 1), (joined.nb[0], joined.nb[1]), 0)

    def build(self) -> Graph:
        self.graph.expand(self.pixtral_head(self.vit(self.inp())))
        return self.graph
