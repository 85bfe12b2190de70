"""LFM2-Audio's projector (PROJECTOR_TYPE_LFM2A: a FastConformer encoder, tools/mtmd/models/conformer.cpp
clip_graph_conformer::build), as clip.cpp builds it for its warmup clip.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams: the audio keys (n_mel_bins); clip-model.h warmup_audio_size: 3000 frames.
- clip.cpp load_tensors (LFM2A): the generic audio layer tensors (q/k/v/out, ln1 = the attention norm,
  ln2 = the layer's output norm, ffn_up/down = the first feed-forward) and the conformer's own
  (ffn_norm, ffn_norm_1, ffn_up_1, ffn_down_1, pos_bias_u/v, norm_conv, linear_pos, conv_norm, conv_dw,
  conv_pw1, conv_pw2), a.conv1d.{0,2,3,5,6} (the pre-encode convolutions), a.pre_encode.out, mm.a.mlp.0
  (a norm), .1 and .3; clip_n_mmproj_embd: the position table's ne[0] (the audio-output embedding the
  converter maps there), which the graph asserts has at least n_frames / 2 rows.
- conformer.cpp: the transposed clip through a stride-2 conv2d, two depthwise (stride 2) + pointwise
  convolutions with ReLUs in place, the channels flattened into pre_encode.out; per layer two half-step
  feed-forwards (SiLU) around relative-position attention (scores = (q + u) k + shifted (q + v) p,
  the shift a pad, reshape, view and cont; soft_max without flash attention) and the convolution
  module (pointwise, sigmoid gate, pad / roll / pad, ggml_ssm_conv as the depthwise conv, the folded
  batch norm, SiLU, pointwise), then the adapter (norm, erf-GELU MLP).
"""
from __future__ import annotations

import math

from gguf import MODEL_TENSOR, Keys

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from runtime.engine.clip_hparams import (
    WARMUP_AUDIO_FRAMES,
    AudioHParams,
    ClipHParams,
    audio_projector_type,
    name,
    reading_keys,
    tower_figures,
)
from runtime.engine.clip_qwen3a import conv2d_s2p1
from runtime.engine.clip_whisper import AudioVit
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag
from runtime.ggml.ssm import ssm_conv

T = MODEL_TENSOR
CA = Keys.ClipAudio
CONFORMER_NORM_EPS = 1e-5       # conformer.cpp: every norm uses 1e-5
CONFORMER_POS_EMB_WIDTH = 512   # conformer.cpp: the relative-position input is 512 wide
PRE_ENCODE_OUT = "a.pre_encode.out"     # clip-impl.h TN_PRE_ENCODE_OUT
_LAYER_KINDS = (T.A_ENC_ATTN_Q, T.A_ENC_ATTN_K, T.A_ENC_ATTN_V, T.A_ENC_OUTPUT, T.A_ENC_INPUT_NORM,
                T.A_ENC_OUTPUT_NORM, T.A_ENC_FFN_UP, T.A_ENC_FFN_DOWN, T.A_ENC_FFN_NORM, T.A_ENC_FFN_NORM_1,
                T.A_ENC_FFN_UP_1, T.A_ENC_FFN_DOWN_1, T.A_ENC_NORM_CONV, T.A_ENC_CONV_NORM, T.A_ENC_CONV_DW,
                T.A_ENC_CONV_PW1, T.A_ENC_CONV_PW2)


def read_conformer_hparams(model: ModelFile) -> AudioHParams:
    meta, proj = model.metadata, audio_projector_type(model)
    table = model.tensor(name(T.A_ENC_EMBD_POS))
    if table is None or not meta.get(Keys.Clip.HAS_AUDIO_ENCODER):
        raise BadInput(f"{model.path}: a {proj} projector without an audio encoder or {name(T.A_ENC_EMBD_POS)}")
    with reading_keys(model):
        hp = AudioHParams(proj, **tower_figures(meta, CA), image_size=0, patch_size=1, n_merge=1, ffn_op="SILU",
                          n_mmproj_embd=table.shape[0], warmup_image_size=WARMUP_AUDIO_FRAMES,
                          n_mel_bins=int(meta[CA.NUM_MEL_BINS]), stack_factor=0)
    if table.shape[1] < hp.warmup_image_size // 2:     # conformer.cpp's assertion
        raise BadInput(f"{model.path}: the position table has {table.shape[1]} rows, the warmup clip needs "
                       f"{hp.warmup_image_size // 2}")
    return hp


def conformer_tensor_names(hp: ClipHParams) -> list[str]:
    names = [name(T.A_ENC_EMBD_POS), *(name(T.A_ENC_CONV1D, i, s) for i in (0, 2, 3, 5, 6) for s in ("weight", "bias"))]
    names += [f"{PRE_ENCODE_OUT}.weight", f"{PRE_ENCODE_OUT}.bias"]
    names += [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER_KINDS for s in ("weight", "bias")]
    names += [name(k, il, None) for il in range(hp.n_layer) for k in (T.A_ENC_POS_BIAS_U, T.A_ENC_POS_BIAS_V)]
    names += [name(T.A_ENC_LINEAR_POS, il) for il in range(hp.n_layer)]
    return names + [name(T.A_MMPROJ, i, s) for i in (0, 1, 3) for s in ("weight", "bias")]


def _inplace(a: Tensor, kind: str) -> Tensor:
    """ggml_*_inplace of a unary op: the result is a view of a's storage."""
    return Tensor(a.type, a.ne, name=f"{a.name} ({kind.lower()})", op=Op.UNARY, src=[a], view_src=a, nb=a.nb,
                  op_params={"unary": kind})


def _conv_out(size: int, k: int, s: int, p: int) -> int:
    return (size + 2 * p - (k - 1) - 1) // s + 1


class ConformerGraph(AudioVit):
    """clip_graph_conformer::build for the 3000-frame warmup clip (flash attention is never used)."""

    def conv(self, i: int) -> Tensor:
        return self.w[name(T.A_ENC_CONV1D, i)]

    def conv_bias(self, x: Tensor, i: int) -> Tensor:
        return g.add(x, self.w[name(T.A_ENC_CONV1D, i, "bias")])

    def depthwise(self, x: Tensor, i: int) -> Tensor:
        """ggml_conv_2d_dw_direct, stride 2, padding 1: [W', H', C, N] in x's type."""
        k = self.conv(i)
        ne = (_conv_out(x.ne[0], k.ne[0], 2, 1), _conv_out(x.ne[1], k.ne[1], 2, 1), x.ne[2], x.ne[3])
        return self.conv_bias(Tensor(x.type, ne, op=Op.CONV_2D_DW, src=[k, x]), i)

    def pointwise(self, x: Tensor, i: int) -> Tensor:
        """ggml_conv_2d_direct with a 1 x 1 kernel: [W, H, OC, N]."""
        k = self.conv(i)
        return self.conv_bias(Tensor(x.type, (x.ne[0], x.ne[1], k.ne[3], x.ne[3]), op=Op.CONV_2D, src=[k, x]), i)

    def pre_encode(self) -> Tensor:
        raw = g.new_tensor(GGMLType.F32, (self.audio.warmup_image_size, self.audio.n_mel_bins, 1, 1), "inp_raw",
                           TensorFlag.INPUT)
        x = g.cont(g.transpose(raw))
        x = _inplace(self.conv_bias(conv2d_s2p1(self.conv(0), x), 0), "RELU")
        x = _inplace(self.pointwise(self.depthwise(x, 2), 3), "RELU")
        x = _inplace(self.pointwise(self.depthwise(x, 5), 6), "RELU")
        x = g.cont(g.permute(x, (0, 2, 1, 3)))
        x = g.reshape(x, (x.ne[0] * x.ne[1], x.ne[2]))
        return self.linear(x, f"{PRE_ENCODE_OUT}.weight", f"{PRE_ENCODE_OUT}.bias")

    def cnorm(self, x: Tensor, kind: MODEL_TENSOR, il: int | None = None) -> Tensor:
        return self.norm(x, kind, il, CONFORMER_NORM_EPS)

    def half_ffn(self, residual: Tensor, norm: MODEL_TENSOR, up: MODEL_TENSOR, down: MODEL_TENSOR, il: int) -> Tensor:
        y = self.ffn(self.cnorm(residual, norm, il), name(up, il), None, name(down, il), "SILU")
        return g.add(residual, g.scale(y, 0.5))

    def attention(self, x: Tensor, il: int, n_pos: int) -> Tensor:
        hp = self.hp
        dh = hp.n_embd // hp.n_head
        def heads(kind: MODEL_TENSOR) -> Tensor:
            return g.reshape(self.linear(x, name(kind, il), name(kind, il, "bias")), (dh, hp.n_head, n_pos))

        q = heads(T.A_ENC_ATTN_Q)
        q_u = g.permute(g.add(q, self.w[name(T.A_ENC_POS_BIAS_U, il, None)]), (0, 2, 1, 3))
        q_v = g.permute(g.add(q, self.w[name(T.A_ENC_POS_BIAS_V, il, None)]), (0, 2, 1, 3))
        k = g.cont(g.permute(heads(T.A_ENC_ATTN_K), (0, 2, 1, 3)))
        v = g.cont(g.permute(heads(T.A_ENC_ATTN_V), (1, 2, 0, 3)))
        ac = g.cont(g.permute(g.mul_mat(q_u, k), (1, 0, 2, 3)))
        p = g.mul_mat(self.w[name(T.A_ENC_LINEAR_POS, il)], self.pos_emb)
        p = g.permute(g.reshape(p, (dh, hp.n_head, p.ne[1])), (0, 2, 1, 3))
        bd = g.cont(g.permute(g.mul_mat(q_v, p), (1, 0, 2, 3)))
        pos_len, q_len, h = bd.ne[0], bd.ne[1], bd.ne[2]
        bd = Tensor(bd.type, (pos_len + 1, q_len, h, 1), op=Op.PAD, src=[bd])       # ggml_pad_ext, 1 on the left
        bd = g.reshape(bd, (q_len, pos_len + 1, h))
        bd = g.view(bd, (q_len, pos_len, h), (bd.nb[0], bd.nb[1], bd.nb[2]), bd.nb[0] * q_len)
        bd = g.cont(bd, (pos_len, q_len, h))
        bd = g.view(bd, (ac.ne[0], bd.ne[1], bd.ne[2]), (bd.nb[0], bd.nb[1], bd.nb[2]), 0)
        scores = g.scale(g.add(ac, bd), 1.0 / math.sqrt(dh))
        attn = g.soft_max_ext(scores, None, 1.0)
        out = g.permute(g.mul_mat(attn, v), (2, 0, 1, 3))
        out = g.cont(out, (out.ne[0] * out.ne[1], out.ne[2]))
        return self.linear(out, name(T.A_ENC_OUTPUT, il), name(T.A_ENC_OUTPUT, il, "bias"))

    def conv_module(self, x: Tensor, il: int) -> Tensor:
        x = self.linear(x, name(T.A_ENC_CONV_PW1, il), name(T.A_ENC_CONV_PW1, il, "bias"))
        d = x.ne[0] // 2
        half0 = g.view(x, (d, x.ne[1]), (x.nb[0], x.nb[1]), 0)
        gate = g.unary(g.view(x, (d, x.ne[1]), (x.nb[0], x.nb[1]), d * x.nb[0]), "SIGMOID")
        x = g.cont(g.transpose(g.mul(half0, gate)))
        x = Tensor(x.type, (x.ne[0] + 4, *x.ne[1:]), op=Op.PAD, src=[x])
        x = Tensor(x.type, x.ne, op=Op.ROLL, src=[x], op_params={"shift0": 4})
        x = Tensor(x.type, (x.ne[0] + 4, *x.ne[1:]), op=Op.PAD, src=[x])
        x = ssm_conv(x, self.w[name(T.A_ENC_CONV_DW, il)])
        x = g.add(x, self.w[name(T.A_ENC_CONV_DW, il, "bias")])
        x = g.add(g.mul(x, self.w[name(T.A_ENC_CONV_NORM, il)]), self.w[name(T.A_ENC_CONV_NORM, il, "bias")])
        x = g.silu(x)
        return self.linear(x, name(T.A_ENC_CONV_PW2, il), name(T.A_ENC_CONV_PW2, il, "bias"))

    def build(self) -> Graph:
        hp = self.audio
        n_frames = hp.warmup_image_size
        n_pos_embd = ((((n_frames + 1) // 2 + 1) // 2 + 1) // 2) * 2 - 1
        self.pos_emb = g.new_tensor(GGMLType.F32, (CONFORMER_POS_EMB_WIDTH, n_pos_embd), "pos_emb", TensorFlag.INPUT)
        self.graph.expand(self.pos_emb)
        x = self.pre_encode()
        n_pos = x.ne[1]
        for il in range(hp.n_layer):
            residual = self.half_ffn(x, T.A_ENC_FFN_NORM, T.A_ENC_FFN_UP, T.A_ENC_FFN_DOWN, il)
            residual = g.add(residual, self.attention(self.cnorm(residual, T.A_ENC_INPUT_NORM, il), il, n_pos))
            residual = g.add(residual, self.conv_module(self.cnorm(residual, T.A_ENC_NORM_CONV, il), il))
            residual = self.half_ffn(residual, T.A_ENC_FFN_NORM_1, T.A_ENC_FFN_UP_1, T.A_ENC_FFN_DOWN_1, il)
            x = self.cnorm(residual, T.A_ENC_OUTPUT_NORM, il)
        x = self.norm(x, T.A_MMPROJ, 0, CONFORMER_NORM_EPS)
        self.graph.expand(self.ffn(x, name(T.A_MMPROJ, 1), None, name(T.A_MMPROJ, 3), "GELU_ERF"))
        return self.graph
