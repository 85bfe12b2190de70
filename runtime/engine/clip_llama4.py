"""Llama 4's vision projector (PROJECTOR_TYPE_LLAMA4), as clip.cpp builds it at the warmup image size.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams (LLAMA4): n_merge = clip.vision.projector.scale_factor (the converter writes
  1 / pixel_shuffle_ratio), rope_theta 10000; the warmup image is image_size square (its llava-uhd
  candidates change only the preprocessor).
- clip.cpp load_tensors: the generic tower (the linear patch embedder v.patch_embd {3 p^2, n_embd},
  v.class_embd, v.position_embd for the patches and the class token, pre_ln / post_ln with biases,
  biased q/k/v/out, ln1/ln2, fc1/fc2), then mm.model.mlp.1, mm.model.mlp.2 and mm.model.fc.
- models/llama4.cpp clip_graph_llama4::build: the unfold convolution (im2col over the patch
  embedder reshaped to a kernel, a matmul), the class token concatenated after the patches, build_vit
  with layer norms, the learned positions and 2-D RoPE (build_rope_2d: x then y), the class token
  dropped (a view), the pixel shuffle by n_merge, the GELU adapter MLP and the projection.
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR, Keys, VisionProjectorType

from planner.gguf.reader import ModelFile
from runtime.engine.clip import SiglipGraph
from runtime.engine.clip_hparams import (
    ClipHParams,
    UnsupportedProjector,
    ffn_unary,
    name,
    reading_keys,
    required_tensor,
    tower_figures,
)
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
CV = Keys.ClipVision
LLAMA4 = VisionProjectorType.LLAMA4
LLAMA4_ROPE_THETA = 10000.0          # load_hparams: hparams.rope_theta
_LAYER = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O, T.V_ENC_INPUT_NORM,
          T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_UP, T.V_ENC_FFN_DOWN)


def read_llama4_hparams(model: ModelFile) -> ClipHParams:
    meta = model.metadata
    out = required_tensor(model, "llama4", name(T.V_MMPROJ_FC))
    with reading_keys(model):
        image = int(meta[CV.IMAGE_SIZE])
        hp = ClipHParams(LLAMA4, **tower_figures(meta), image_size=image, patch_size=int(meta[CV.PATCH_SIZE]),
                         n_merge=int(meta.get(CV.Projector.SCALE_FACTOR, 1)), ffn_op=ffn_unary(meta),
                         n_mmproj_embd=out.shape[1], warmup_image_size=image)
    if hp.n_merge < 1 or hp.n_patches_side % hp.n_merge:
        raise UnsupportedProjector(model.path, f"llama4 shuffling {hp.n_merge}x{hp.n_merge} of "
                                               f"{hp.n_patches_side}x{hp.n_patches_side} patches")
    return hp


def llama4_tensor_names(hp: ClipHParams) -> list[str]:
    names = [name(T.V_ENC_EMBD_PATCH), name(T.V_ENC_EMBD_CLS, None, None), name(T.V_ENC_EMBD_POS)]
    names += [name(k, None, s) for k in (T.V_PRE_NORM, T.V_POST_NORM) for s in ("weight", "bias")]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER for s in ("weight", "bias")]
    return names + [name(T.V_MMPROJ_MLP, 1), name(T.V_MMPROJ_MLP, 2), name(T.V_MMPROJ_FC)]


class Llama4Graph(SiglipGraph):
    """clip_graph_llama4::build: build_vit's layer-norm ViT with a class token and 2-D RoPE."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        super().__init__(hp, w, flash_attn)
        self.n_pos = hp.n_patches_side ** 2 + 1
        self.pos_h = g.new_tensor(GGMLType.I32, (self.n_pos,), "pos_h", TensorFlag.INPUT)
        self.pos_w = g.new_tensor(GGMLType.I32, (self.n_pos,), "pos_w", TensorFlag.INPUT)

    def inp(self) -> Tensor:
        """Llama4UnfoldConvolution, then the class token (ggml_concat along the patches)."""
        hp, side, p = self.hp, self.hp.warmup_image_size, self.hp.patch_size
        n = hp.n_patches_side
        raw = g.new_tensor(GGMLType.F32, (side, side, 3, 1), "inp_raw", TensorFlag.INPUT)
        embd = self.w[name(T.V_ENC_EMBD_PATCH)]
        kernel = g.reshape(embd, (p, p, 3, hp.n_embd))
        col = Tensor(GGMLType.F32, (3 * p * p, n, n, 1), op=Op.IM2COL, src=[kernel, raw])
        x = g.reshape(g.mul_mat(embd, col), (hp.n_embd, n * n))
        cls = self.w[name(T.V_ENC_EMBD_CLS, None, None)]
        return Tensor(x.type, (hp.n_embd, n * n + 1, 1, 1), op=Op.CONCAT, src=[x, cls], op_params={"dim": 1})

    def add_pos(self, t: Tensor) -> Tensor:
        """build_rope_2d(pos_w, pos_h): half the head's dims each, no interleaved frequencies."""
        for pos in (self.pos_w, self.pos_h):
            t = g.rope(t, pos, t.ne[0] // 2, 0, LLAMA4_ROPE_THETA)
        return t

    def shuffle_project(self, x: Tensor) -> Tensor:
        """The class token dropped, Llama4VisionPixelShuffleMLP's shuffle, the adapter MLP, the projection."""
        n, s, e = self.hp.n_patches_side, self.hp.n_merge, self.hp.n_embd
        x = g.view(x, (e, n * n), (x.nb[0], x.nb[1]), 0)
        x = g.permute(g.reshape(x, (e * s, n // s, n, 1)), (0, 2, 1, 3))
        x = g.cont(x, (e * s * s, n // s, n // s, 1))
        x = g.cont(x, (e * s * s, n * n // (s * s)))
        x = g.unary(g.mul_mat(self.w[name(T.V_MMPROJ_MLP, 1)], x), "GELU")
        x = g.unary(g.mul_mat(self.w[name(T.V_MMPROJ_MLP, 2)], x), "GELU")
        return g.mul_mat(self.w[name(T.V_MMPROJ_FC)], x)

    def build(self) -> Graph:
        self.graph.expand(self.shuffle_project(self.vit(self.inp())))
        return self.graph
