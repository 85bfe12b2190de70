"""Gemma 4's vision projectors (PROJECTOR_TYPE_GEMMA4V, the ViT of Gemma 4; PROJECTOR_TYPE_GEMMA4UV,
the unified models' transformer-less patch embedder), as clip.cpp builds them at the warmup image size.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams (GEMMA4V / GEMMA4UV): n_merge = clip.vision.projector.scale_factor (default
  3, the pooling kernel); the unified variant multiplies the patch by it and merges 1;
  set_limit_image_tokens(70, 1120) then set_warmup_n_tokens(256): the warmup image is
  16 x patch x merge px square whatever --image-max-tokens says.
- clip.cpp load_tensors: the generic layer set (q/k/v/out, per-head q/k RMS norms, ln1, ln2, the
  post-attention and post-FFN norms, a gated FFN, the per-layer out_scale), v.position_embd as two
  tables [n_embd, n, 2], mm.input_projection, the optional v.std_bias / v.std_scale; every loaded
  `.weight` gets clamp bounds (the file's .input_min/.input_max/.output_min/.output_max scalars, read
  from the file and not loaded, else +-FLT_MAX), so clip_graph_gemma4v::build_mm always emits
  clamp, mul_mat, clamp. GEMMA4UV: mm.input_projection and v.patch_norm.{1,2,3}.
- clip.cpp build_vit with RMS norms (the v rms_norm of GEMMA4V, ls_out), models/gemma4v.cpp (the
  input scaled to [-1, 1], a bias-free conv2d, two get_rows position lookups, NEOX 2-D RoPE, kq scale
  1, the average pool by n_merge scaled by sqrt(n_embd), the optional standardisation, an RMS norm
  and the projection) and models/gemma4uv.cpp (im2col with a dummy kernel, layer norms around the
  patch matmul, the position lookups, a layer norm, RMS norm, projection).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from gguf import MODEL_TENSOR, Keys, VisionProjectorType

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from runtime.engine.clip import SiglipGraph, cast, conv2d
from runtime.engine.clip_hparams import (
    ClipHParams,
    UnsupportedProjector,
    ffn_unary,
    name,
    projector_type,
    reading_keys,
    required_tensor,
    tower_figures,
)
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
CV = Keys.ClipVision
GEMMA4V = VisionProjectorType.GEMMA4V
GEMMA4UV = "gemma4uv"                 # clip-impl.h PROJECTOR_TYPE_GEMMA4UV (not in gguf-py's enum)
GEMMA4_TYPES = frozenset({GEMMA4V, GEMMA4UV})
GEMMA4_AUDIO_TYPES = frozenset({VisionProjectorType.GEMMA4A, "gemma4ua"})   # clip_gemma4a.py
GEMMA4_POOL = 3                       # load_hparams: pooling_kernel_size unless the file says otherwise
GEMMA4_WARMUP_TOKENS = 256            # load_hparams' set_warmup_n_tokens ("avoid OOM on warmup")
GEMMA4_ROPE_THETA = 100.0             # load_hparams: hparams.rope_theta
GEMMA4UV_NORM_EPS = 1e-5              # gemma4uv.cpp: pytorch LayerNorm's default eps
CLAMP_SUFFIXES = ("input_max", "input_min", "output_max", "output_min")
_LAYER = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O, T.V_ENC_ATTN_Q_NORM, T.V_ENC_ATTN_K_NORM,
          T.V_ENC_INPUT_NORM, T.V_ENC_POST_ATTN_NORM, T.V_ENC_ATTN_POST_NORM, T.V_ENC_FFN_POST_NORM,
          T.V_ENC_FFN_UP, T.V_ENC_FFN_GATE, T.V_ENC_FFN_DOWN, T.V_LAYER_OUT_SCALE)
_LINEAR = (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V, T.V_ENC_ATTN_O, T.V_ENC_FFN_UP, T.V_ENC_FFN_GATE,
           T.V_ENC_FFN_DOWN)


def patch_norm(i: int, suffix: str = "weight") -> str:
    """clip-impl.h TN_PATCH_NORM (the unified embedder's three layer norms)."""
    return f"v.patch_norm.{i}.{suffix}"


def read_gemma4_hparams(model: ModelFile) -> ClipHParams:
    meta, proj = model.metadata, projector_type(model)
    audio = meta.get(Keys.ClipAudio.PROJECTOR_TYPE) if meta.get(Keys.Clip.HAS_AUDIO_ENCODER) else None
    if audio is not None and audio not in GEMMA4_AUDIO_TYPES:
        # clip_init loads and warms up the audio encoder as a second context (clip_reserve adds the
        # Gemma 4 ones); another type's is not modelled
        raise UnsupportedProjector(model.path, f"{proj} with a {audio} audio encoder")
    out = required_tensor(model, proj, name(T.V_MM_INP_PROJ))
    with reading_keys(model):
        patch, merge = int(meta[CV.PATCH_SIZE]), int(meta.get(CV.Projector.SCALE_FACTOR, GEMMA4_POOL))
        if proj == GEMMA4UV:      # the token merging is the patch embedder's own conv
            patch, merge = patch * merge, 1
        hp = ClipHParams(proj, **tower_figures(meta), image_size=int(meta[CV.IMAGE_SIZE]), patch_size=patch,
                         n_merge=merge, ffn_op=ffn_unary(meta), n_mmproj_embd=out.shape[1],
                         warmup_image_size=math.isqrt(GEMMA4_WARMUP_TOKENS) * patch * merge)
    if merge < 1:
        raise BadInput(f"{model.path}: a {proj} projector pooling by {merge}")
    return hp


def gemma4_tensor_names(hp: ClipHParams) -> list[str]:
    """What load_tensors asks for, plus the clamp scalars it reads from the file alone."""
    if hp.projector == GEMMA4UV:
        return [name(T.V_ENC_EMBD_PATCH), name(T.V_ENC_EMBD_PATCH, None, "bias"), name(T.V_ENC_EMBD_POS),
                *(patch_norm(i, s) for i in (1, 2, 3) for s in ("weight", "bias")), name(T.V_MM_INP_PROJ)]
    names = [name(T.V_ENC_EMBD_PATCH), name(T.V_ENC_EMBD_POS), name(T.V_STD_BIAS, None, None),
             name(T.V_STD_SCALE, None, None), name(T.V_MM_INP_PROJ)]
    names += [name(k, il) for il in range(hp.n_layer) for k in _LAYER]
    linears = [name(k, il) for il in range(hp.n_layer) for k in _LINEAR] + [name(T.V_MM_INP_PROJ)]
    return names + [w.removesuffix("weight") + s for w in linears for s in CLAMP_SUFFIXES]


class Gemma4VGraph(SiglipGraph):
    """clip_graph_gemma4v::build at the warmup size."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        super().__init__(hp, w, flash_attn)
        n = hp.n_patches_side ** 2
        self.pos_x = g.new_tensor(GGMLType.I32, (n,), "pos_x", TensorFlag.INPUT)
        self.pos_y = g.new_tensor(GGMLType.I32, (n,), "pos_y", TensorFlag.INPUT)

    def mm(self, w: Tensor, x: Tensor) -> Tensor:
        """build_mm (Gemma4ClippableLinear): every loaded weight has bounds, so always clamped."""
        x = Tensor(x.type, x.ne, op=Op.CLAMP, src=[x])
        y = g.mul_mat(w, x)
        return Tensor(y.type, y.ne, op=Op.CLAMP, src=[y])

    def lookup_positions(self, x: Tensor) -> Tensor:
        """The x and y tables (two views of v.position_embd), a get_rows each, added."""
        pos, e = self.w[name(T.V_ENC_EMBD_POS)], self.hp.n_embd
        n = pos.ne[1]
        for i, ids in enumerate((self.pos_x, self.pos_y)):
            tbl = g.view(pos, (e, n), (pos.nb[0], pos.nb[1]), i * n * pos.nb[1])
            x = g.add(x, g.get_rows(tbl, ids))
        return x

    def inp(self) -> Tensor:
        hp, side = self.hp, self.hp.warmup_image_size
        raw = g.new_tensor(GGMLType.F32, (side, side, 3, 1), "inp_raw", TensorFlag.INPUT)
        raw = g.scale(raw, 2.0)          # ggml_scale_bias: patches * 2 - 1
        y = conv2d(self.w[name(T.V_ENC_EMBD_PATCH)], raw, hp.n_patches_side)
        y = g.cont(g.transpose(g.reshape(y, (hp.n_patches_side ** 2, hp.n_embd, 1))))
        return self.lookup_positions(y)

    def rope2d(self, t: Tensor) -> Tensor:
        half = t.ne[0] // 2
        for ids in (self.pos_x, self.pos_y):
            t = g.rope(t, ids, half, 2, GEMMA4_ROPE_THETA)
        return t

    def attention(self, x: Tensor, il: int) -> Tensor:
        """build_vit's separate q/k/v (clamped), per-head RMS q/k norms after the reshape, 2-D RoPE on
        q and k, the weightless RMS norm on v, build_attn with kq scale 1."""
        hp, n_pos = self.hp, self.n_pos
        d_head = hp.n_embd // hp.n_head
        q, k, v = (g.reshape(self.mm(self.w[name(kind, il)], x), (d_head, hp.n_head, n_pos, 1))
                   for kind in (T.V_ENC_ATTN_Q, T.V_ENC_ATTN_K, T.V_ENC_ATTN_V))
        q = self.rope2d(self.weighted(g.rms_norm(q, hp.eps), T.V_ENC_ATTN_Q_NORM, il))
        k = self.rope2d(self.weighted(g.rms_norm(k, hp.eps), T.V_ENC_ATTN_K_NORM, il))
        v = g.rms_norm(v, hp.eps)
        for t in (q, k, v):
            self.graph.expand(t)
        q, k = g.permute(q, (0, 2, 1, 3)), g.permute(k, (0, 2, 1, 3))
        if self.flash_attn:
            v = g.permute(v, (0, 2, 1, 3))
            out = g.flash_attn_ext(q, cast(k, GGMLType.F16), cast(v, GGMLType.F16), None, 1.0)
            out = g.reshape(out, (out.ne[0] * out.ne[1], out.ne[2] * out.ne[3]))
        else:
            v = g.cont(g.permute(v, (1, 2, 0, 3)))
            kq = g.soft_max_ext(g.mul_mat(k, q), None, 1.0)
            kqv = g.permute(g.mul_mat(v, kq), (0, 2, 1, 3))
            out = g.cont(kqv, (kqv.ne[0] * kqv.ne[1], kqv.ne[2] * kqv.ne[3]))
        return self.mm(self.w[name(T.V_ENC_ATTN_O, il)], out)

    def weighted(self, x: Tensor, kind: MODEL_TENSOR, il: int | None = None) -> Tensor:
        wt = self._opt(name(kind, il))
        return g.mul(x, wt) if wt is not None else x

    def rms_w(self, x: Tensor, kind: MODEL_TENSOR, il: int | None = None) -> Tensor:
        """build_norm with NORM_TYPE_RMS and a weight only (absent: no norm at all for the post norms)."""
        return self.weighted(g.rms_norm(x, self.hp.eps), kind, il)

    def ffn(self, x: Tensor, il: int) -> Tensor:
        up = self.mm(self.w[name(T.V_ENC_FFN_UP, il)], x)
        gate = self.mm(self.w[name(T.V_ENC_FFN_GATE, il)], x)
        y = Tensor(gate.type, gate.ne, op=Op.GLU, src=[gate, up], op_params={"glu": self.hp.ffn_op})
        return self.mm(self.w[name(T.V_ENC_FFN_DOWN, il)], y)

    def vit(self, x: Tensor) -> Tensor:
        hp = self.hp
        x = g.reshape(x, (hp.n_embd, self.n_pos))
        for il in range(hp.n_layer):
            y = self.attention(self.rms_w(x, T.V_ENC_INPUT_NORM, il), il)
            if self._opt(name(T.V_ENC_ATTN_POST_NORM, il)) is not None:
                y = self.rms_w(y, T.V_ENC_ATTN_POST_NORM, il)
            x = g.add(y, x)
            y = self.ffn(self.rms_w(x, T.V_ENC_POST_ATTN_NORM, il), il)
            if self._opt(name(T.V_ENC_FFN_POST_NORM, il)) is not None:
                y = self.rms_w(y, T.V_ENC_FFN_POST_NORM, il)
            x = g.add(x, y)
            x = self.weighted(x, T.V_LAYER_OUT_SCALE, il)
        return g.reshape(x, (hp.n_embd, self.n_pos, 1))

    def pool_project(self, x: Tensor) -> Tensor:
        """Gemma4VisionPooler, the standardisation, Gemma4MultimodalEmbedder."""
        hp, side, k = self.hp, self.hp.n_patches_side, self.hp.n_merge
        x = g.cont(g.transpose(x), (side, side, hp.n_embd, 1))
        out = side // k                   # ggml_calc_pool_output_size, stride = kernel, no padding
        x = Tensor(GGMLType.F32, (out, out, hp.n_embd, 1), op=Op.POOL_2D, src=[x], op_params={"k": k, "s": k})
        x = g.cont(g.transpose(g.reshape(x, (out * out, hp.n_embd, 1))))
        x = g.scale(x, math.sqrt(hp.n_embd))
        bias, scale = self._opt(name(T.V_STD_BIAS, None, None)), self._opt(name(T.V_STD_SCALE, None, None))
        if bias is not None and scale is not None:
            x = g.mul(Tensor(x.type, x.ne, op=Op.SUB, src=[x, bias]), scale)
        return self.mm(self.w[name(T.V_MM_INP_PROJ)], g.rms_norm(x, hp.eps))

    def build(self) -> Graph:
        self.graph.expand(self.pool_project(self.vit(self.inp())))
        return self.graph


class Gemma4UVGraph(Gemma4VGraph):
    """clip_graph_gemma4uv::build: no transformer, the patch embedder and the projection."""

    def layer_norm(self, x: Tensor, i: int) -> Tensor:
        x = Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": GEMMA4UV_NORM_EPS})
        return g.add(g.mul(x, self.w[patch_norm(i)]), self.w[patch_norm(i, "bias")])

    def build(self) -> Graph:
        hp, side, p = self.hp, self.hp.warmup_image_size, self.hp.patch_size
        n_side = hp.n_patches_side
        raw = g.new_tensor(GGMLType.F32, (side, side, 3, 1), "inp_raw", TensorFlag.INPUT)
        kernel = g.new_tensor(GGMLType.F32, (p, p, 3), "kernel")      # a dummy: im2col reads its shape
        col = Tensor(GGMLType.F32, (3 * p * p, n_side, n_side, 1), op=Op.IM2COL, src=[kernel, raw])
        x = self.layer_norm(g.reshape(col, (col.ne[0], n_side * n_side)), 1)
        x = g.add(g.mul_mat(self.w[name(T.V_ENC_EMBD_PATCH)], x), self.w[name(T.V_ENC_EMBD_PATCH, None, "bias")])
        x = self.layer_norm(self.lookup_positions(self.layer_norm(x, 2)), 3)
        x = g.mul_mat(self.w[name(T.V_MM_INP_PROJ)], g.rms_norm(x, hp.eps))
        self.graph.expand(x)
        return self.graph
