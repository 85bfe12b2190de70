"""Qwen3-ASR's and Qwen3-Omni's audio projector (PROJECTOR_TYPE_QWEN3A: tools/mtmd/models/qwen3a.cpp
clip_graph_qwen3a::build), as clip.cpp builds it for its warmup clip.

Sources (llama.cpp in llama-cpp-python 0.3.36, tools/mtmd):
- clip.cpp load_hparams: the whisper-enc group's audio keys (erf GELU, an optional stack factor that
  qwen3a.cpp never reads); clip-model.h warmup_audio_size: 3000 frames x n_mel_bins.
- clip.cpp load_tensors (QWEN3A): the audio tower (clip_whisper.audio_tower_names), a.conv2d.1..3 with
  biases, a.conv_out (its bias is never loaded), mm.a.mlp.1 and .2 with biases; clip_n_mmproj_embd:
  mm.a.mlp.2's output width.
- qwen3a.cpp: the clip cut into 100-frame chunks (a 4-D view and cont: 30 chunks at the warmup), three
  stride-2 ggml_conv_2d (padding 1) each with a reshaped bias and erf GELU, the features regrouped
  (permute, cont, reshape) and projected by conv_out, the first 13 rows of the position table
  repeated per chunk (view, ggml_repeat, add), build_vit with layer norms, then the erf-GELU MLP.
"""
from __future__ import annotations

from gguf import MODEL_TENSOR

from planner.gguf.reader import ModelFile
from runtime.engine.clip_hparams import AudioHParams, ClipHParams, name
from runtime.engine.clip_whisper import AudioVit, audio_tower_names, read_audio_hparams
from runtime.ggml import build as g
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor, TensorFlag

T = MODEL_TENSOR
QWEN3A_CHUNK = 100            # qwen3a.cpp: chunk_size, n_window x 2
_MM = tuple(name(T.A_MMPROJ, i, s) for i in (1, 2) for s in ("weight", "bias"))


def read_qwen3a_hparams(model: ModelFile) -> AudioHParams:
    return read_audio_hparams(model, name(T.A_MMPROJ, 2), False)


def qwen3a_tensor_names(hp: ClipHParams) -> list[str]:
    convs = [name(T.A_ENC_CONV2D, i, s) for i in (1, 2, 3) for s in ("weight", "bias")]
    return audio_tower_names(hp) + convs + [name(T.A_ENC_CONV_OUT), *_MM]


def conv2d_s2p1(kernel: Tensor, x: Tensor) -> Tensor:
    """ggml_conv_2d with stride 2, padding 1, dilation 1: im2col (f16, f32 for a bf16 kernel) to
    [IC x KH x KW, OW, OH, N], a matmul against the flattened kernel, reshape_4d [OW, OH, N, OC],
    permute (0, 1, 3, 2) and cont -> [OW, OH, OC, N]."""
    kw, kh, ic, oc = kernel.ne
    if x.ne[2] != ic:
        raise ValueError(f"conv_2d: {kernel.name} {kernel.ne} cannot read {x.ne}")
    ow, oh = (x.ne[0] + 2 - (kw - 1) - 1) // 2 + 1, (x.ne[1] + 2 - (kh - 1) - 1) // 2 + 1
    col_type = GGMLType.F32 if kernel.type == GGMLType.BF16 else GGMLType.F16
    col = Tensor(col_type, (ic * kh * kw, ow, oh, x.ne[3]), op=Op.IM2COL, src=[kernel, x],
                 op_params={"s0": 2, "s1": 2, "p0": 1, "p1": 1})
    y = g.mul_mat(g.reshape(col, (col.ne[0], col.ne[3] * col.ne[2] * col.ne[1])),
                  g.reshape(kernel, (kw * kh * ic, oc)))
    y = g.reshape(y, (ow, oh, x.ne[3], oc))
    return g.cont(g.permute(y, (0, 1, 3, 2)))


class Qwen3AGraph(AudioVit):
    """clip_graph_qwen3a::build for the 3000-frame warmup clip."""

    def build(self) -> Graph:
        hp = self.audio
        n_frames, n_mel = hp.warmup_image_size, hp.n_mel_bins
        if n_frames % QWEN3A_CHUNK:
            raise ValueError(f"a {n_frames}-frame clip is not whole {QWEN3A_CHUNK}-frame chunks")
        n_chunks = n_frames // QWEN3A_CHUNK
        raw = g.new_tensor(GGMLType.F32, (n_frames, n_mel, 1, 1), "inp_raw", TensorFlag.INPUT)
        x = g.view(raw, (QWEN3A_CHUNK, n_mel, 1, n_chunks), (4, n_frames * 4, QWEN3A_CHUNK * 4, QWEN3A_CHUNK * 4))
        x = g.cont(x)
        for i in (1, 2, 3):
            x = conv2d_s2p1(self.w[name(T.A_ENC_CONV2D, i)], x)
            bias = g.reshape(self.w[name(T.A_ENC_CONV2D, i, "bias")], (1, 1, x.ne[2], 1))
            x = g.unary(g.add(x, bias), "GELU_ERF")
        x = g.cont(g.permute(x, (2, 0, 1, 3)))
        x = g.reshape(x, (x.ne[0] * x.ne[1], x.ne[2] * x.ne[3]))
        x = g.mul_mat(self.w[name(T.A_ENC_CONV_OUT)], x)
        n_pos = x.ne[1]
        table = self.w[name(T.A_ENC_EMBD_POS)]
        per_chunk = n_pos // n_chunks
        pos = g.view(table, (table.ne[0], per_chunk), (table.nb[0], table.nb[1]), 0)
        x = g.add(x, Tensor(pos.type, (table.ne[0], n_pos), op=Op.REPEAT, src=[pos]))
        x = self.vit(x, n_pos, None, False)
        self.graph.expand(self.ffn(x, name(T.A_MMPROJ, 1), None, name(T.A_MMPROJ, 2), "GELU_ERF"))
        return self.graph

