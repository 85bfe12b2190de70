"""The Whisper-encoder audio projectors (tools/mtmd/models/whisper-enc.cpp clip_graph_whisper_enc::build):
Ultravox, Qwen2-Audio, Voxtral, GLM-ASR, MERaLiON and Music Flamingo, as clip.cpp builds them for
its warmup clip.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams (audio): clip.audio.* keys, n_mel_bins; these types require
  clip.audio.projector.stack_factor (ULTRAVOX, VOXTRAL, MERALION, GLMA; optional for the others) and
  run their FFNs with erf GELU; clip-model.h: warmup_audio_size 3000 frames, so get_dummy_batch's
  "image" is 3000 x n_mel_bins whatever the file says.
- clip.cpp load_tensors (prefix "a"): the position table, optional pre/post norms, per layer
  q/k/v/out, ln1/ln2, ffn up/gate/down, each with an optional bias; a.conv1d.1/2 and each type's
  mm.a.* (MM_TENSORS); clip-model.h audio_has_avgpool (QWEN2A, VOXTRAL, MUSIC_FLAMINGO) and
  audio_has_stack_frames (ULTRAVOX, VOXTRAL, MERALION).
- whisper-enc.cpp: two ggml_conv_1d_ph (stride 1, then 2) with a bias and erf GELU each, the
  transpose, build_vit with layer norms and the first n_frames/2 rows of the position table,
  build_vit's average pool (kernel 2) for the avgpool types, build_stack (a 1-D view and ggml_pad
  when the rows do not divide, then a 2-D view), then the type's projector.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gguf import MODEL_TENSOR, Keys, VisionProjectorType

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from runtime.engine.clip import attn_core
from runtime.engine.clip_hparams import (
    WARMUP_AUDIO_FRAMES,
    AudioHParams,
    ClipHParams,
    audio_projector_type,
    name,
    reading_keys,
    required_tensor,
    tower_figures,
)
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
CA = Keys.ClipAudio
P = VisionProjectorType
ULTRAVOX_NORM_EPS = 1e-6       # whisper-enc.cpp: Ultravox's pre and mid RMS norms


def _mm(i: int, suffix: str = "weight") -> str:
    return name(T.A_MMPROJ, i, suffix)


@dataclass(frozen=True)
class WhisperHead:
    """What a whisper-enc type adds: its mm.a.* tensors (load_tensors), the tensor and dimension
    clip_n_mmproj_embd reads the output width from, whether build_vit pools by 2 and whether
    build_stack runs before the projector (clip-model.h), and whether load_hparams requires the
    stack factor."""

    tensors: tuple[str, ...]
    width_tensor: str
    avgpool: bool = False
    stacks: bool = False
    requires_stack: bool = False


_MLP12 = (_mm(1), _mm(1, "bias"), _mm(2), _mm(2, "bias"))
_NORM_PRE = (name(T.A_MM_NORM_PRE), name(T.A_MM_NORM_PRE, None, "bias"))
WHISPER_HEADS: dict[str, WhisperHead] = {
    P.ULTRAVOX: WhisperHead((_mm(1), _mm(2), name(T.A_MM_NORM_PRE), name(T.A_MM_NORM_MID)), _mm(2),
                            stacks=True, requires_stack=True),
    P.QWEN2A: WhisperHead((name(T.A_MMPROJ_FC), name(T.A_MMPROJ_FC, None, "bias")), name(T.A_MMPROJ_FC),
                          avgpool=True),
    P.VOXTRAL: WhisperHead((_mm(1), _mm(2)), _mm(2), avgpool=True, stacks=True, requires_stack=True),
    P.MUSIC_FLAMINGO: WhisperHead(_MLP12, _mm(2), avgpool=True),
    P.MERALION: WhisperHead((*(_mm(i, s) for i in range(4) for s in ("weight", "bias")), *_NORM_PRE), _mm(3),
                            stacks=True, requires_stack=True),
    # boi / eoi: clip-impl.h TN_TOK_BOI / TN_TOK_EOI ("v.boi", "v.eoi" even in an audio file)
    P.GLMA: WhisperHead((*_MLP12, *_NORM_PRE, "v.boi", "v.eoi"), _mm(2), requires_stack=True),
}


def read_audio_hparams(model: ModelFile, width_tensor: str, requires_stack: bool) -> AudioHParams:
    """The audio encoder's keys (clip.audio.*), shared by whisper-enc's and qwen3a's types."""
    meta, proj = model.metadata, audio_projector_type(model)
    if not meta.get(Keys.Clip.HAS_AUDIO_ENCODER):
        raise BadInput(f"{model.path}: a {proj} projector without clip.has_audio_encoder")
    width = required_tensor(model, proj, width_tensor)
    with reading_keys(model):
        stack = int(meta[CA.Projector.STACK_FACTOR]) if requires_stack else int(meta.get(CA.Projector.STACK_FACTOR, 0))
        # load_hparams sets FFN_GELU_ERF for every whisper-enc and qwen3a type, whatever use_gelu says
        return AudioHParams(proj, **tower_figures(meta, CA), image_size=0, patch_size=1, n_merge=1, ffn_op="GELU_ERF",
                            n_mmproj_embd=width.shape[1], warmup_image_size=WARMUP_AUDIO_FRAMES,
                            n_mel_bins=int(meta[CA.NUM_MEL_BINS]), stack_factor=stack)


def read_whisper_hparams(model: ModelFile) -> AudioHParams:
    head = WHISPER_HEADS[audio_projector_type(model)]
    hp = read_audio_hparams(model, head.width_tensor, head.requires_stack)
    if not 0 < hp.n_mel_bins <= 256:    # get_dummy_batch's check
        raise BadInput(f"{model.path}: n_mel_bins {hp.n_mel_bins} is outside [1, 256]")
    return hp


_LAYER = (T.A_ENC_ATTN_Q, T.A_ENC_ATTN_K, T.A_ENC_ATTN_V, T.A_ENC_OUTPUT, T.A_ENC_INPUT_NORM, T.A_ENC_OUTPUT_NORM,
          T.A_ENC_FFN_UP, T.A_ENC_FFN_GATE, T.A_ENC_FFN_DOWN)


def audio_tower_names(hp: ClipHParams) -> list[str]:
    """load_tensors' generic audio tensors: the position table, pre/post norms, the layers."""
    names = [name(T.A_ENC_EMBD_POS)]
    names += [name(k, None, s) for k in (T.A_PRE_NORM, T.A_POST_NORM) for s in ("weight", "bias")]
    return names + [name(k, il, s) for il in range(hp.n_layer) for k in _LAYER for s in ("weight", "bias")]


def whisper_tensor_names(hp: ClipHParams) -> list[str]:
    convs = [name(T.A_ENC_CONV1D, i, s) for i in (1, 2) for s in ("weight", "bias")]
    return audio_tower_names(hp) + convs + list(WHISPER_HEADS[hp.projector].tensors)


class AudioVit:
    """clip.cpp build_vit over an audio tower (layer norms, the a.* tensors) and build_ffn."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        if not isinstance(hp, AudioHParams):
            raise TypeError(f"{type(self).__name__} needs an audio reader's figures (AudioHParams)")
        self.hp, self.audio, self.w, self.fa = hp, hp, w, flash_attn
        self.graph = Graph()

    def _opt(self, n: str) -> Tensor | None:
        return self.w.get(n)

    def norm(self, x: Tensor, kind: MODEL_TENSOR, il: int | None = None, eps: float | None = None) -> Tensor:
        """build_norm, NORM_TYPE_NORMAL: ggml_norm, times the weight, plus the bias (each when present)."""
        x = Tensor(x.type, x.ne, op=Op.NORM, src=[x], op_params={"eps": self.hp.eps if eps is None else eps})
        wt, b = self._opt(name(kind, il)), self._opt(name(kind, il, "bias"))
        x = g.mul(x, wt) if wt is not None else x
        return g.add(x, b) if b is not None else x

    def linear(self, x: Tensor, weight: str, bias: str | None = None) -> Tensor:
        x = g.mul_mat(self.w[weight], x)
        b = self._opt(bias) if bias is not None else None
        return g.add(x, b) if b is not None else x

    def ffn(self, x: Tensor, up: str, gate: str | None, down: str, op: str) -> Tensor:
        """build_ffn: up (+bias), an optional gate (+bias) joined by the op's GLU, else the op, down (+bias)."""
        y = self.linear(x, up, _bias(up))
        if gate is not None and self._opt(gate) is not None:
            gx = self.linear(x, gate, _bias(gate))
            y = Tensor(gx.type, gx.ne, op=Op.GLU, src=[gx, y], op_params={"glu": op})
        else:
            y = g.unary(y, op)
        return self.linear(y, down, _bias(down))

    def attention(self, x: Tensor, il: int, n_pos: int) -> Tensor:
        """build_vit's separate q/k/v (biases where present) and build_attn."""
        hp = self.hp
        d_head = hp.n_embd // hp.n_head
        qkv = []
        for kind in (T.A_ENC_ATTN_Q, T.A_ENC_ATTN_K, T.A_ENC_ATTN_V):
            t = self.linear(x, name(kind, il), name(kind, il, "bias"))
            t = g.reshape(t, (d_head, hp.n_head, n_pos, 1))
            self.graph.expand(t)      # build_attn's ggml_build_forward_order: q, k, v in this order
            qkv.append(t)
        out = attn_core(qkv[0], qkv[1], qkv[2], None, d_head ** -0.5, self.fa)
        return self.linear(out, name(T.A_ENC_OUTPUT, il), name(T.A_ENC_OUTPUT, il, "bias"))

    def vit(self, x: Tensor, n_pos: int, pos: Tensor | None, avgpool: bool) -> Tensor:
        """build_vit with layer norms: positions, the layers, the optional average pool, post norm."""
        hp = self.hp
        x = g.add(x, pos) if pos is not None else x
        x = g.reshape(x, (hp.n_embd, n_pos))
        if self._opt(name(T.A_PRE_NORM)) is not None:
            x = self.norm(x, T.A_PRE_NORM)
        for il in range(hp.n_layer):
            x = g.add(self.attention(self.norm(x, T.A_ENC_INPUT_NORM, il), il, n_pos), x)
            y = self.ffn(self.norm(x, T.A_ENC_OUTPUT_NORM, il), name(T.A_ENC_FFN_UP, il),
                         name(T.A_ENC_FFN_GATE, il), name(T.A_ENC_FFN_DOWN, il), hp.ffn_op)
            x = g.add(x, y)
        if avgpool:     # transpose, cont, ggml_pool_1d (avg, kernel 2, stride 2), transpose, cont
            x = g.cont(g.transpose(x))
            x = Tensor(GGMLType.F32, ((x.ne[0] - 2) // 2 + 1, *x.ne[1:]), op=Op.POOL_1D, src=[x],
                       op_params={"k": 2, "s": 2})
            x = g.cont(g.transpose(x))
        if self._opt(name(T.A_POST_NORM)) is not None:
            x = self.norm(x, T.A_POST_NORM)
        return g.reshape(x, (hp.n_embd, x.ne[1], 1))


def _bias(weight: str) -> str:
    return weight[: -len("weight")] + "bias"


def conv1d_ph(kernel: Tensor, x: Tensor, stride: int) -> Tensor:
    """ggml_conv_1d_ph: ggml_conv_1d with padding K/2 and dilation 1 -> im2col (f16, f32 for a bf16
    kernel), a matmul against the flattened kernel, a reshape to [OL, OC, N]."""
    k, ic, oc = kernel.ne[0], kernel.ne[1], kernel.ne[2]
    if x.ne[1] != ic:
        raise ValueError(f"conv_1d: {kernel.name} {kernel.ne} cannot read {x.ne}")
    ol = (x.ne[0] + 2 * (k // 2) - (k - 1) - 1) // stride + 1
    col_type = GGMLType.F32 if kernel.type == GGMLType.BF16 else GGMLType.F16
    col = Tensor(col_type, (ic * k, ol, x.ne[2], 1), op=Op.IM2COL, src=[kernel, x], op_params={"s0": stride})
    y = g.mul_mat(g.reshape(col, (col.ne[0], col.ne[2] * col.ne[1])), g.reshape(kernel, (k * ic, oc)))
    return g.reshape(y, (ol, oc, x.ne[2]))


class WhisperEncGraph(AudioVit):
    """clip_graph_whisper_enc::build for the warmup clip (n_frames = 3000, one batch)."""

    def __init__(self, hp: ClipHParams, w: Mapping[str, Tensor], flash_attn: bool) -> None:
        super().__init__(hp, w, flash_attn)
        self.head = WHISPER_HEADS[hp.projector]
        self.n_frames, self.n_mel = self.audio.warmup_image_size, self.audio.n_mel_bins

    def convs(self) -> Tensor:
        raw = g.new_tensor(GGMLType.F32, (self.n_frames, self.n_mel, 1, 1), "inp_raw", TensorFlag.INPUT)
        x = raw
        for i, stride in ((1, 1), (2, 2)):
            x = conv1d_ph(self.w[name(T.A_ENC_CONV1D, i)], x, stride)
            x = g.unary(g.add(x, self.w[name(T.A_ENC_CONV1D, i, "bias")]), "GELU_ERF")
        return g.cont(g.transpose(x))

    def stack(self, x: Tensor, factor: int) -> Tensor:
        """build_stack: rows of n_embd x factor, the tail padded with zeros (a 1-D view and ggml_pad)
        to GGML_PAD(total, stride) — ggml.h's bit-mask rounding, exact only for powers of two, so the
        padding may not complete a row and the view keeps padded // stride rows."""
        if factor <= 1:
            return x
        total, stride = x.n_elements, self.hp.n_embd * factor
        padded = (total + stride - 1) & ~(stride - 1)
        if padded > total:
            x = g.view(x, (total,))
            x = Tensor(x.type, (padded,), op=Op.PAD, src=[x])
        return g.view(x, (stride, padded // stride), (x.nb[0], x.nb[0] * stride), 0)

    def build(self) -> Graph:
        hp, head = self.audio, self.head
        x = self.convs()
        n_pos = self.n_frames // 2
        table = self.w[name(T.A_ENC_EMBD_POS)]
        if table.ne[1] < n_pos:
            raise ValueError(f"the position table has {table.ne[1]} rows, the warmup clip needs {n_pos}")
        pos = g.view(table, (table.ne[0], n_pos), (table.nb[0], table.nb[1]), 0)
        x = self.vit(x, n_pos, pos, head.avgpool)
        if head.stacks:
            x = self.stack(x, hp.stack_factor)
        heads = {P.ULTRAVOX: self.ultravox, P.QWEN2A: self.qwen2a, P.VOXTRAL: self.mlp12,
                 P.MUSIC_FLAMINGO: self.mlp12, P.MERALION: self.meralion, P.GLMA: self.glma}
        self.graph.expand(heads[hp.projector](x))
        return self.graph

    def ultravox(self, x: Tensor) -> Tensor:
        """RMS norm (pre), mm.a.mlp.1, SwiGLU on the halves (swapped), RMS norm (mid), mm.a.mlp.2."""
        x = g.mul(g.rms_norm(x, ULTRAVOX_NORM_EPS), self.w[name(T.A_MM_NORM_PRE)])
        x = g.mul_mat(self.w[_mm(1)], x)
        x = Tensor(x.type, (x.ne[0] // 2, *x.ne[1:]), op=Op.GLU, src=[x], op_params={"glu": "SWIGLU", "swapped": 1})
        x = g.mul(g.rms_norm(x, ULTRAVOX_NORM_EPS), self.w[name(T.A_MM_NORM_MID)])
        return g.mul_mat(self.w[_mm(2)], x)

    def qwen2a(self, x: Tensor) -> Tensor:
        return self.linear(x, name(T.A_MMPROJ_FC), name(T.A_MMPROJ_FC, None, "bias"))

    def mlp12(self, x: Tensor) -> Tensor:
        """build_ffn with mm.a.mlp.1 / .2 (biases where loaded) and erf GELU."""
        return self.ffn(x, _mm(1), None, _mm(2), "GELU_ERF")

    def meralion(self, x: Tensor) -> Tensor:
        """Layer norm, mm.0 + SiLU, then silu(mm.1) x mm.2, then mm.3 (each with its bias)."""
        x = self.norm(x, T.A_MM_NORM_PRE)
        x = g.silu(self.linear(x, _mm(0), _mm(0, "bias")))
        gate = g.silu(self.linear(x, _mm(1), _mm(1, "bias")))
        x = g.mul(gate, self.linear(x, _mm(2), _mm(2, "bias")))
        return self.linear(x, _mm(3), _mm(3, "bias"))

    def glma(self, x: Tensor) -> Tensor:
        """Layer norm, build_stack, the erf-GELU MLP, then boi before and eoi after (two concats)."""
        x = self.stack(self.norm(x, T.A_MM_NORM_PRE), self.audio.stack_factor)
        x = self.mlp12(x)
        boi, eoi = self.w["v.boi"], self.w["v.eoi"]
        x = Tensor(x.type, (x.ne[0], x.ne[1] + 1, 1, 1), op=Op.CONCAT, src=[boi, x], op_params={"dim": 1})
        return Tensor(x.type, (x.ne[0], x.ne[1] + 1, 1, 1), op=Op.CONCAT, src=[x, eoi], op_params={"dim": 1})
