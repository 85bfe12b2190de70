"""Gemma 4's audio projectors (PROJECTOR_TYPE_GEMMA4A, the conformer of Gemma 4 E2B/E4B; PROJECTOR_TYPE_GEMMA4UA,
the unified models' encoder-free embedder), as clip.cpp builds them at its warmup clip, for files that
carry the audio encoder alone, and the audio context of a Gemma 4 file with both encoders (clip_reserve._plus_audio).

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams: clip.audio.* keys; the warmup clip is warmup_audio_size (3000) frames of
  n_mel_bins (GEMMA4UA: 640 raw samples per frame); eps is 1e-6 whatever the file says.
- clip.cpp load_tensors (GEMMA4A): the generic audio layer set (q/k/v/out, ffn up/down, ln1/ln2, the
  post-attention and post-FFN norms), a.conv1d.{0,1} with their norms, a.input_projection,
  a.pre_encode.out, mm.a.soft_emb_norm, mm.a.input_projection, and per layer ffn_norm, attn_pre_norm,
  per_dim_scale, per_dim_k_scale, attn_k_rel, the light conv (conv_norm / norm_conv, conv_pw1, conv_dw,
  conv_pw2) and the second FFN (ffn_norm_1, ffn_up_1, ffn_down_1, ffn_post_norm_1); every loaded
  .weight gets clamp bounds, so build_mm is clamp, mul_mat, clamp. GEMMA4UA: mm.a.input_projection.
- models/gemma4a.cpp: two stride-2 conv2d with LayerNorm over channels and ReLU, the flatten and input
  projection, then per layer a half-step FFN, chunked local attention (chunks of 12 with 12 frames of
  left context, the blocks padded and cut from overlapping views, relative positions through
  attn_k_rel and a blocked relative shift, a tanh softcap, the blocked mask), the light conv (GLU,
  causal depthwise ssm_conv, RMS norm, SiLU), the second half-step FFN and the output norm; then the
  output projection and the embedder (RMS norm, projection). models/gemma4ua.cpp: permute, RMS norm,
  projection (unclamped).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from gguf import MODEL_TENSOR, Keys, VisionProjectorType

from planner.gguf.reader import ModelFile
from runtime.engine.clip_hparams import (
    WARMUP_AUDIO_FRAMES,
    AudioHParams,
    ClipHParams,
    UnsupportedProjector,
    name,
    projector_type,
    reading_keys,
    required_tensor,
)
from runtime.ggml import build as g
from runtime.ggml.fused_ops import clamp, norm, pad
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag
from runtime.ggml.ssm import ssm_conv

T = MODEL_TENSOR
CA = Keys.ClipAudio
GEMMA4A = VisionProjectorType.GEMMA4A
GEMMA4UA = "gemma4ua"                   # clip-impl.h PROJECTOR_TYPE_GEMMA4UA (not in gguf-py's enum)
GEMMA4A_EPS = 1e-6                      # load_hparams hard-codes it ("a mistake in the original conversion")
GEMMA4UA_FRAME = 640                    # load_hparams: n_mel_bins = 640 raw samples per frame
CHUNK, PAST = 12, 12                    # gemma4a.cpp: chunk_size, max_past_horizon (context_left - 1)
SOFTCAP = 50.0
CONV_LEFT_PAD = 4                       # gemma4a.cpp: the causal depthwise conv's left padding
CLAMP_SUFFIXES = ("input_max", "input_min", "output_max", "output_min")


def audio(kind: str, il: int | None = None, suffix: str = "weight") -> str:
    """clip-impl.h's audio tensor names (prefix "a"): a.blk.N.<kind>.<suffix>, or a.<kind>.<suffix>."""
    return f"a.blk.{il}.{kind}.{suffix}" if il is not None else f"a.{kind}.{suffix}"


# the per-layer tensors load_tensors asks for (generic loop and GEMMA4A's own), weights and biases
_LAYER = ("attn_q", "attn_k", "attn_v", "attn_out", "ln1", "ln2", "attn_post_norm", "ffn_post_norm", "ffn_up",
          "ffn_down", "ffn_norm", "attn_pre_norm", "per_dim_scale", "per_dim_k_scale", "attn_k_rel", "conv_norm",
          "norm_conv", "conv_pw1", "conv_dw", "conv_pw2", "ffn_norm_1", "ffn_up_1", "ffn_down_1", "ffn_post_norm_1")
_MODEL = ("conv1d.0", "conv1d.0.norm", "conv1d.1", "conv1d.1.norm", "input_projection", "pre_encode.out")


def read_gemma4a_hparams(model: ModelFile, audio_type: str | None = None) -> AudioHParams:
    """The audio context's hparams: of a file whose clip.projector_type is gemma4a / gemma4ua, or
    (`audio_type`: its clip.audio.projector_type) the audio half of a file with both encoders."""
    meta, proj = model.metadata, audio_type or projector_type(model)
    if audio_type is None and meta.get(Keys.Clip.HAS_VISION_ENCODER):
        raise UnsupportedProjector(model.path, f"{proj} with a vision encoder in the same file")
    out = required_tensor(model, proj, name(T.A_MM_INP_PROJ))
    with reading_keys(model):
        n_embd = int(meta[CA.EMBEDDING_LENGTH])
        if proj == GEMMA4UA:
            n_head, n_ff, n_layer, mel = 0, 0, 0, GEMMA4UA_FRAME
        else:
            n_head, n_ff = int(meta[CA.Attention.HEAD_COUNT]), int(meta[CA.FEED_FORWARD_LENGTH])
            n_layer, mel = int(meta[CA.BLOCK_COUNT]), int(meta[CA.NUM_MEL_BINS])
    return AudioHParams(proj, n_embd, n_head, n_ff, n_layer, GEMMA4A_EPS, 0, 1, 1, "SILU", out.shape[1],
                        WARMUP_AUDIO_FRAMES, mel)


def is_audio_tensor(tensor: str) -> bool:
    """The audio encoder's tensors in a file with both (clip.cpp's "a" prefix and mm.a.*)."""
    return tensor.startswith(("a.", "mm.a."))


def gemma4a_tensor_names(hp: ClipHParams) -> list[str]:
    """What load_tensors asks for, plus the clamp scalars it reads from the file alone."""
    if hp.projector == GEMMA4UA:
        return [name(T.A_MM_INP_PROJ)]
    names = [audio(k, None, s) for k in _MODEL for s in ("weight", "bias")]
    names += [audio(k, il, s) for il in range(hp.n_layer) for k in _LAYER for s in ("weight", "bias")]
    names += [name(T.A_MM_SOFT_EMB_NORM), name(T.A_MM_INP_PROJ)]
    return names + [n.removesuffix("weight") + s for n in names if n.endswith(".weight") for s in CLAMP_SUFFIXES]


class Gemma4AGraph:
    """clip_graph_gemma4a::build for the warmup clip."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        del flash_attn        # the chunked attention is written out with soft_max: no flash attention
        if not isinstance(hp, AudioHParams):
            raise TypeError("Gemma4AGraph needs read_gemma4a_hparams' figures")
        self.hp, self.w = hp, w
        self.graph = Graph()
        self.d_head = hp.n_embd // hp.n_head if hp.n_head else 0

    def _opt(self, n: str) -> Tensor | None:
        return self.w.get(n)

    def mm(self, w: Tensor, x: Tensor) -> Tensor:
        """build_mm (ClippableLinear): every loaded .weight has bounds, so always clamped."""
        return clamp(g.mul_mat(w, clamp(x, -math.inf, math.inf)), -math.inf, math.inf)

    def rms(self, x: Tensor, weight: str) -> Tensor:
        wt = self._opt(weight)
        x = g.rms_norm(x, self.hp.eps)
        return g.mul(x, wt) if wt is not None else x

    def inp(self) -> Tensor:
        hp = self.hp
        raw = g.new_tensor(GGMLType.F32, (hp.warmup_image_size, hp.n_mel_bins, 1, 1), "inp_raw", TensorFlag.INPUT)
        x = g.cont(g.transpose(raw))
        for i in range(2):
            x = conv2d_pad1(self.w[audio(f"conv1d.{i}")], x)
            b = self._opt(audio(f"conv1d.{i}", None, "bias"))
            x = g.add(x, b) if b is not None else x
            nw = self._opt(audio(f"conv1d.{i}.norm"))
            if nw is not None:
                x = g.mul(norm(g.cont(g.permute(x, (1, 2, 0, 3))), GEMMA4A_EPS), nw)
                x = g.cont(g.permute(x, (2, 0, 1, 3)))
            x = g.unary(x, "RELU")
        x = g.cont(g.permute(x, (1, 2, 0, 3)))
        x = g.reshape(x, (x.ne[0] * x.ne[1], x.ne[2]))
        x = self.mm(self.w[audio("input_projection")], x)
        b = self._opt(audio("input_projection", None, "bias"))
        return g.add(x, b) if b is not None else x

    def half_ffn(self, x: Tensor, il: int, sfx: str) -> Tensor | None:
        up, down = self._opt(audio("ffn_up" + sfx, il)), self._opt(audio("ffn_down" + sfx, il))
        if self._opt(audio("ffn_norm" + sfx, il)) is None or up is None or down is None:
            return None
        y = self.mm(down, g.unary(self.mm(up, self.rms(x, audio("ffn_norm" + sfx, il))), "SILU"))
        if self._opt(audio("ffn_post_norm" + sfx, il)) is not None:
            y = self.rms(y, audio("ffn_post_norm" + sfx, il))
        return g.add(x, g.scale(y, 0.5))

    def blocks(self, t: Tensor, n_pos: int, n_blk: int) -> Tensor:
        """extract_blocks: pad P frames left and up to S x B right, overlapping windows (stride C), cont."""
        s = CHUNK + PAST
        t = Tensor(t.type, (t.ne[0], t.ne[1], s * n_blk, t.ne[3]), op=Op.PAD, src=[t])
        t = g.view(t, (t.ne[0], t.ne[1], s, n_blk), (t.nb[0], t.nb[1], t.nb[2], CHUNK * t.nb[2]), 0)
        return g.cont(t)

    def attention(self, res: Tensor, il: int, pos_emb: Tensor, mask: Tensor) -> Tensor:
        d, h = self.d_head, self.hp.n_head
        n_pos = res.ne[1]
        n_blk = -(-n_pos // CHUNK)
        s, r = CHUNK + PAST, PAST + 1
        pre = audio("attn_pre_norm", il) if self._opt(audio("attn_pre_norm", il)) is not None else audio("ln1", il)
        cur = self.rms(res, pre) if self._opt(pre) is not None else res
        q, k, v = (g.reshape(self.mm(self.w[audio(kind, il)], cur), (d, h, n_pos))
                   for kind in ("attn_q", "attn_k", "attn_v"))
        q = g.scale(q, 1.0)
        if self._opt(audio("per_dim_scale", il)) is not None:
            q = g.mul(q, g.reshape(self.w[audio("per_dim_scale", il)], (d, 1, 1)))
        k = g.scale(k, 1.0)
        if self._opt(audio("per_dim_k_scale", il)) is not None:
            k = g.mul(k, g.reshape(self.w[audio("per_dim_k_scale", il)], (d, 1, 1)))
        q = pad(q, (0, 0, n_blk * CHUNK - n_pos))
        q = g.cont(g.permute(g.reshape(q, (d, h, CHUNK, n_blk)), (0, 3, 1, 2)))
        kb = g.cont(g.permute(self.blocks(k, n_pos, n_blk), (0, 3, 1, 2)))
        vb = g.cont(g.permute(self.blocks(v, n_pos, n_blk), (1, 3, 0, 2)))
        scores = g.mul_mat(kb, q)
        k_rel = self._opt(audio("attn_k_rel", il))
        if k_rel is not None:
            p = g.cont(g.permute(g.reshape(g.mul_mat(k_rel, pos_emb), (d, h, r)), (0, 2, 1, 3)))
            bd = g.mul_mat(p, g.reshape(q, (d, CHUNK * n_blk, h)))
            bd = pad(g.reshape(bd, (r, CHUNK, n_blk, h)), (s + 1 - r,))
            bd = g.reshape(bd, ((s + 1) * CHUNK, n_blk, h))
            bd = g.cont(g.view(bd, (CHUNK * s, n_blk, h), (bd.nb[0], bd.nb[1], bd.nb[2]), 0))
            scores = g.add(scores, g.reshape(bd, (s, CHUNK, n_blk, h)))
        scores = g.scale(g.unary(g.scale(scores, 1.0 / SOFTCAP), "TANH"), SOFTCAP)
        attn = g.soft_max_ext(g.add(scores, mask), None, 1.0)
        x = g.cont(g.permute(g.mul_mat(vb, attn), (0, 2, 3, 1)))
        x = g.cont(x, (d * h, CHUNK * n_blk))
        if n_blk * CHUNK > n_pos:
            x = g.cont(g.view(x, (d * h, n_pos), (x.nb[0], x.nb[1]), 0))
        x = self.mm(self.w[audio("attn_out", il)], x)
        b = self._opt(audio("attn_out", il, "bias"))
        x = g.add(x, b) if b is not None else x
        if self._opt(audio("attn_post_norm", il)) is not None:
            x = self.rms(x, audio("attn_post_norm", il))
        return g.add(res, x)

    def light_conv(self, res: Tensor, il: int) -> Tensor:
        """The conformer's convolution module: GLU over conv_pw1, causal ssm_conv, RMS norm, SiLU, conv_pw2."""
        x = self.mm(self.w[audio("conv_pw1", il)], self.rms(res, audio("conv_norm", il)))
        half = x.ne[0] // 2
        gate = g.unary(g.cont(g.view(x, (half, x.ne[1]), (x.nb[0], x.nb[1]), half * x.nb[0])), "SIGMOID")
        x = g.cont(g.transpose(g.mul(g.view(x, (half, x.ne[1]), (x.nb[0], x.nb[1]), 0), gate)))
        x = Tensor(x.type, (x.ne[0] + CONV_LEFT_PAD, x.ne[1], x.ne[2], x.ne[3]), op=Op.PAD, src=[x])
        x = ssm_conv(x, self.w[audio("conv_dw", il)])
        b = self._opt(audio("conv_dw", il, "bias"))
        x = g.add(x, b) if b is not None else x
        if self._opt(audio("norm_conv", il)) is not None:
            x = self.rms(x, audio("norm_conv", il))
        x = self.mm(self.w[audio("conv_pw2", il)], g.unary(x, "SILU"))
        return g.add(res, x)

    def build(self) -> Graph:
        hp = self.hp
        cur = self.inp()
        n_blk = -(-cur.ne[1] // CHUNK)
        pos_emb = g.new_tensor(GGMLType.F32, (hp.n_embd, PAST + 1), "pos_emb", TensorFlag.INPUT)
        mask = g.new_tensor(GGMLType.F32, (CHUNK + PAST, CHUNK, n_blk), "kq_mask", TensorFlag.INPUT)
        for il in range(hp.n_layer):
            ffn = self.half_ffn(cur, il, "")
            res = ffn if ffn is not None else cur
            if all(self._opt(audio(k, il)) is not None for k in ("attn_q", "attn_k", "attn_v", "attn_out")):
                res = self.attention(res, il, pos_emb, mask)
            if all(self._opt(audio(k, il)) is not None for k in ("conv_norm", "conv_pw1", "conv_dw", "conv_pw2")):
                res = self.light_conv(res, il)
            ffn = self.half_ffn(res, il, "_1")
            res = ffn if ffn is not None else res
            cur = self.rms(res, audio("ln2", il)) if self._opt(audio("ln2", il)) is not None else res
        out = self._opt(audio("pre_encode.out"))
        if out is not None:
            cur = self.mm(out, cur)
            b = self._opt(audio("pre_encode.out", None, "bias"))
            cur = g.add(cur, b) if b is not None else cur
        cur = self.rms(cur, name(T.A_MM_SOFT_EMB_NORM))
        self.graph.expand(self.mm(self.w[name(T.A_MM_INP_PROJ)], cur))
        return self.graph


class Gemma4UAGraph(Gemma4AGraph):
    """clip_graph_gemma4ua::build: the raw frames permuted, RMS norm, the projection (a plain mul_mat:
    this builder keeps clip_graph's build_mm)."""

    def build(self) -> Graph:
        hp = self.hp
        raw = g.new_tensor(GGMLType.F32, (hp.warmup_image_size, hp.n_mel_bins, 1, 1), "inp_raw", TensorFlag.INPUT)
        x = g.rms_norm(g.cont(g.permute(raw, (1, 0, 2, 3))), hp.eps)
        self.graph.expand(g.mul_mat(self.w[name(T.A_MM_INP_PROJ)], x))
        return self.graph


def conv2d_pad1(kernel: Tensor, x: Tensor) -> Tensor:
    """ggml_conv_2d with stride 2 and padding 1 over one [W, H, C, 1] map: im2col (f16, f32 for a bf16
    kernel), a matmul against the flattened kernel, reshape_4d, permute, cont -> [OW, OH, OC, 1]."""
    k0, k1, ic, oc = kernel.ne
    ow, oh = (x.ne[0] + 2 - k0) // 2 + 1, (x.ne[1] + 2 - k1) // 2 + 1
    col_type = GGMLType.F32 if kernel.type == GGMLType.BF16 else GGMLType.F16
    col = Tensor(col_type, (ic * k1 * k0, ow, oh, 1), op=Op.IM2COL, src=[kernel, x])
    y = g.mul_mat(g.reshape(col, (col.ne[0], oh * ow)), g.reshape(kernel, (k0 * k1 * ic, oc)))
    return g.cont(g.permute(g.reshape(y, (ow, oh, 1, oc)), (0, 1, 3, 2)))
