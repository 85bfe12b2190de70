"""GLM-4.1V's and GLM-4.5V's vision projector (PROJECTOR_TYPE_GLM4V), as clip.cpp builds it at the warmup
image size (tools/mtmd/models/glm4v.cpp clip_graph_glm4v::build).

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams (GLM4V): n_merge = clip.vision.spatial_merge_size (default 2), rope_theta 10000,
  set_limit_image_tokens(8, 4096) then set_warmup_n_tokens(46 x 46): the warmup image is 46 x patch x
  merge px square whatever --image-max-tokens says.
- clip.cpp load_tensors: two patch kernels and their bias, v.norm_embd (the post-conv RMS norm), the
  position table, RMS-normed layers with a fused qkv and a SwiGLU FFN, v.post_ln, then mm.patch_merger
  (a merge x merge conv with its bias), mm.model.fc, mm.post_norm, mm.gate / mm.up / mm.down (biases
  optional).
- glm4v.cpp: both kernels' conv2d summed and regrouped 2 x 2 (as Qwen2-VL), the patch bias, the
  post-conv norm, the learned positions resized (bicubic) to the grid and regrouped the same way,
  build_vit with M-RoPE (vision mode) on q and k, the merge x merge conv over each group of patches,
  the FC projection, a layer norm (eps 1e-5), GELU (erf), and build_ffn's SwiGLU.
"""
from __future__ import annotations

import math

from gguf import MODEL_TENSOR, Keys, VisionProjectorType

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from runtime.engine.clip_hparams import ClipHParams, ffn_unary, name, reading_keys, required_tensor, tower_figures
from runtime.engine.clip_qwen2vl import Qwen3VLGraph, QwenVLHParams
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor

T = MODEL_TENSOR
CV = Keys.ClipVision
GLM4V = VisionProjectorType.GLM4V
GLM4V_WARMUP_TOKENS = 46 * 46        # load_hparams' set_warmup_n_tokens ("avoid OOM on warmup")
GLM4V_N_MERGE = 2
GLM4V_MM_NORM_EPS = 1e-5              # glm4v.cpp: the post-projection LayerNorm's default eps
_LAYER = (T.V_ENC_ATTN_QKV, T.V_ENC_ATTN_O, T.V_ENC_INPUT_NORM, T.V_ENC_POST_ATTN_NORM, T.V_ENC_FFN_UP,
          T.V_ENC_FFN_GATE, T.V_ENC_FFN_DOWN)
_MM = (T.V_MM_PATCH_MERGER, T.V_MMPROJ_FC, T.V_MM_POST_NORM, T.V_MM_UP, T.V_MM_GATE, T.V_MM_DOWN)


def read_glm4v_hparams(model: ModelFile) -> QwenVLHParams:
    meta = model.metadata
    down = required_tensor(model, "glm4v", name(T.V_MM_DOWN))
    with reading_keys(model):
        patch, merge = int(meta[CV.PATCH_SIZE]), int(meta.get(CV.SPATIAL_MERGE_SIZE, GLM4V_N_MERGE))
        hp = QwenVLHParams(GLM4V, **tower_figures(meta), image_size=int(meta[CV.IMAGE_SIZE]), patch_size=patch,
                           n_merge=merge, ffn_op=ffn_unary(meta), n_mmproj_embd=down.shape[1],
                           warmup_image_size=math.isqrt(GLM4V_WARMUP_TOKENS) * patch * merge, rms_norm=True)
    if merge < 1:
        raise BadInput(f"{model.path}: a glm4v projector merging {merge}")
    return hp


def glm4v_tensor_names(hp: ClipHParams) -> list[str]:
    names = [name(T.V_ENC_EMBD_PATCH), name(T.V_ENC_EMBD_PATCH, None, "weight.1"),
             name(T.V_ENC_EMBD_PATCH, None, "bias"), name(T.V_ENC_EMBD_POS)]
    names += [name(k, None, s) for k in (T.V_ENC_EMBD_NORM, T.V_POST_NORM) for s in ("weight", "bias")]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER for s in ("weight", "bias")]
    return names + [name(k, None, s) for k in _MM for s in ("weight", "bias")]


def conv2d_batched(kernel: Tensor, x: Tensor, s: int) -> Tensor:
    """ggml_conv_2d with stride s and no padding over a batch x [W, H, C, N]: im2col (f16, f32 for a
    bf16 kernel), a matmul against the flattened kernel, reshape_4d, permute, cont -> [OW, OH, OC, N]."""
    k0, k1, ic, oc = kernel.ne
    ow, oh, n = (x.ne[0] - k0) // s + 1, (x.ne[1] - k1) // s + 1, x.ne[3]
    col_type = GGMLType.F32 if kernel.type == GGMLType.BF16 else GGMLType.F16
    col = Tensor(col_type, (ic * k1 * k0, ow, oh, n), op=Op.IM2COL, src=[kernel, x])
    y = g.mul_mat(g.reshape(col, (col.ne[0], n * oh * ow)), g.reshape(kernel, (k0 * k1 * ic, oc)))
    y = g.reshape(y, (ow, oh, n, oc))
    return g.cont(g.permute(y, (0, 1, 3, 2)))


class Glm4VGraph(Qwen3VLGraph):
    """clip_graph_glm4v::build: Qwen3-VL's fused-qkv M-RoPE layers with RMS norms, GLM's merger."""

    def ffn(self, x: Tensor, il: int) -> Tensor:
        """build_ffn with the layer's up, gate and down as stored (GLM4V is not in is_ffn_swapped)."""
        return self.swiglu_ffn(x, name(T.V_ENC_FFN_UP, il), name(T.V_ENC_FFN_GATE, il), name(T.V_ENC_FFN_DOWN, il))

    def swiglu_ffn(self, x: Tensor, up: str, gate: str, down: str) -> Tensor:
        u = self.mm_bias(x, up)
        gt = self.mm_bias(x, gate)
        y = Tensor(gt.type, gt.ne, op=Op.GLU, src=[gt, u], op_params={"glu": self.hp.ffn_op})
        return self.mm_bias(y, down)

    def mm_bias(self, x: Tensor, weight: str) -> Tensor:
        y = g.mul_mat(self.w[weight], x)
        b = self._opt(weight.removesuffix("weight") + "bias")
        return g.add(y, b) if b is not None else y

    def merger(self, x: Tensor) -> Tensor:
        """The patch merger (a merge x merge conv per group of patches, its bias), the FC projection,
        mm.post_norm as a layer norm, GELU (erf), the SwiGLU FFN."""
        e, m = self.hp.n_embd, self.hp.n_merge
        n_tok = self.n_pos // (m * m)
        x = g.cont(g.permute(g.reshape(x, (e, m, m, n_tok)), (2, 0, 1, 3)))
        x = conv2d_batched(self.w[name(T.V_MM_PATCH_MERGER)], x, m)
        x = g.add(g.reshape(x, (x.ne[2], n_tok)), self.w[name(T.V_MM_PATCH_MERGER, None, "bias")])
        x = g.mul_mat(self.w[name(T.V_MMPROJ_FC)], x)
        x = Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": GLM4V_MM_NORM_EPS})
        x = g.mul(x, self.w[name(T.V_MM_POST_NORM)])
        b = self._opt(name(T.V_MM_POST_NORM, None, "bias"))
        x = g.unary(g.add(x, b) if b is not None else x, "GELU_ERF")
        return self.swiglu_ffn(x, name(T.V_MM_UP), name(T.V_MM_GATE), name(T.V_MM_DOWN))

    def build(self) -> Graph:
        hp, e, n_pos = self.hp, self.hp.n_embd, self.n_pos
        x = g.add(self.inp(), self.w[name(T.V_ENC_EMBD_PATCH, None, "bias")])
        if self._opt(name(T.V_ENC_EMBD_NORM)) is not None:
            x = self.norm(x, T.V_ENC_EMBD_NORM)
        if self._opt(name(T.V_ENC_EMBD_POS)) is not None:
            x = g.add(x, self.positions_table())
        x = g.reshape(x, (e, n_pos))
        for il in range(hp.n_layer):
            x = g.add(self.attention(self.norm(x, T.V_ENC_INPUT_NORM, il), il, None), x)
            x = g.add(x, self.ffn(self.norm(x, T.V_ENC_POST_ATTN_NORM, il), il))
        if self._opt(name(T.V_POST_NORM)) is not None:
            x = self.norm(x, T.V_POST_NORM)
        self.graph.expand(self.merger(g.reshape(x, (e, n_pos, 1))))
        return self.graph
