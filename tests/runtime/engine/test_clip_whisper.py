"""runtime/engine/clip_whisper.py: the whisper-enc audio projectors' graphs, node by node, counted by
hand from tools/mtmd/models/whisper-enc.cpp and clip.cpp (build_vit, build_attn, build_ffn,
build_stack); the 32-layer totals are the node counts the pinned llama-server logs for these files.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import Keys

from planner.core.errors import BadInput
from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import (
    glma_mmproj_spec,
    meralion_mmproj_spec,
    musicflamingo_mmproj_spec,
    qwen2a_mmproj_spec,
    ultravox_mmproj_spec,
    voxtral_mmproj_spec,
    write_mmproj,
)
from runtime.engine.clip_hparams import UnsupportedProjector, load_weights
from runtime.engine.clip_reserve import read_projector, reserve_projector
from runtime.engine.clip_whisper import WhisperEncGraph, read_whisper_hparams, whisper_tensor_names
from runtime.ggml.graph import GGMLType, Op

# the two convolutions: ggml_conv_1d_ph = im2col, 2 reshapes, mul_mat, reshape; + bias add, erf GELU
# = 7 each; transpose, cont = 16. The position table's view, its add, reshape_2d = 19.
INP = 19
# a layer: ln1 (norm, mul, add) 3, q (mm, bias, reshape) 3, k (mm, reshape; no bias) 2, v 3, attention
# 7 (3 permutes, 2 casts, flash_attn_ext, reshape) or 9 (3 permutes, cont, kq, soft_max, kqv, permute,
# cont_2d), out mm + bias 2, residual 1, ln2 3, FFN (up + bias, gelu, down + bias) 5, residual 1
LAYER, ATTN_FA, ATTN_SOFTMAX = 23, 7, 9
TAIL = 4            # post_ln (norm, mul, add), reshape_3d
AVGPOOL = 5         # transpose, cont, pool_1d, transpose, cont
STACK_PAD = 3       # build_stack: view_1d, pad, view_2d (a view alone when GGML_PAD adds nothing)
HEADS = {  # type spec -> (nodes after the tower's tail, output rows at the 3000-frame warmup)
    # 1500 x 1280 values in rows of 1280 x 8 padded to GGML_PAD(1920000, 10240) = 1921024: 187 rows;
    # rms, mul, mm.1, swiglu, rms, mul, mm.2
    ultravox_mmproj_spec: (STACK_PAD + 7, 187),
    qwen2a_mmproj_spec: (AVGPOOL + 2, 750),                  # pooled to 750; mm.a.fc + bias
    # pooled to 750, stacked by 4: GGML_PAD(960000, 5120) = 960512 -> 187 rows; mm.1, gelu, mm.2
    voxtral_mmproj_spec: (AVGPOOL + STACK_PAD + 3, 187),
    musicflamingo_mmproj_spec: (AVGPOOL + 5, 750),           # mm.1 + bias, gelu, mm.2 + bias
    # stacked by 15: GGML_PAD(1920000, 19200) = 1938432 -> 100 rows; norm 3, mm.0 + bias + silu 3,
    # mm.1 + bias + silu 3, mm.2 + bias 2, mul, mm.3 + bias 2
    meralion_mmproj_spec: (STACK_PAD + 14, 100),
    # norm 3, stack by 4 (5120 is a power of two times 5, and 1920000 a multiple: a view alone), MLP 5,
    # boi and eoi concatenated: 375 + 2 rows
    glma_mmproj_spec: (3 + 1 + 5 + 2, 377),
}


def _graph(tmp_path: Path, spec, fa: bool, file_name: str = "a"):
    model = read_model(str(write_mmproj(tmp_path, spec, file_name)))
    hp = read_whisper_hparams(model)
    return hp, WhisperEncGraph(hp, load_weights(model, hp, whisper_tensor_names(hp)), fa).build()


@pytest.mark.parametrize("spec", list(HEADS), ids=lambda s: s.__name__.split("_")[0])
@pytest.mark.parametrize("n_layer, fa", [(2, True), (2, False), (32, True)])
def test_node_counts_and_tokens(tmp_path, spec, n_layer, fa):
    hp, graph = _graph(tmp_path, spec(n_text_embd=640, n_layer=n_layer), fa)
    head, rows = HEADS[spec]
    per_layer = LAYER + (ATTN_FA if fa else ATTN_SOFTMAX)
    assert len(graph.nodes) == INP + n_layer * per_layer + TAIL + head
    assert graph.nodes[-1].ne[:2] == (640, rows)
    assert hp.n_mmproj_embd == 640


def test_llama_server_node_counts(tmp_path):
    """The totals llama-server logged for the 32-layer files (flash attention on): 994 for Voxtral,
    990 for Qwen2-Audio, 1000 for MERaLiON."""
    for spec, total in ((voxtral_mmproj_spec, 994), (qwen2a_mmproj_spec, 990), (meralion_mmproj_spec, 1000)):
        _, graph = _graph(tmp_path, spec(n_text_embd=640), True, spec.__name__)
        assert len(graph.nodes) == total


def test_input_and_convolutions(tmp_path):
    """get_dummy_batch's 3000-frame clip of 128 mel bins; im2col rows of K x IC (f16), the second
    convolution halving the frames."""
    _, graph = _graph(tmp_path, qwen2a_mmproj_spec(n_text_embd=640, n_layer=1), True)
    [raw] = [t for t in graph.leafs if t.name == "inp_raw"]
    assert raw.ne == (3000, 128, 1, 1) and raw.type == GGMLType.F32
    cols = [t for t in graph.nodes if t.op is Op.IM2COL]
    assert [c.ne for c in cols] == [(3 * 128, 3000, 1, 1), (3 * 1280, 1500, 1, 1)]
    assert all(c.type == GGMLType.F16 for c in cols)
    [pool] = [t for t in graph.nodes if t.op is Op.POOL_1D]
    assert pool.ne[:2] == (750, 1280)


def test_weights_are_every_tensor(tmp_path):
    """The weights buffer holds every tensor of the file (F16 2-D, F32 1-D and the position table), summed by hand for a
    one-layer Qwen2-Audio projector."""
    path = write_mmproj(tmp_path, qwen2a_mmproj_spec(n_text_embd=640, n_layer=1), "w")
    e, ff = 1280, 5120
    f16 = 3 * 128 * e + 3 * e * e + 4 * e * e + 2 * e * ff + e * 640
    f32 = 2 * e + e * 1500 + 3 * e + 4 * e + ff + e + 2 * e + 640    # the position table is F32
    r = reserve_projector(read_model(str(path)), None)
    # every tensor is padded to 32 bytes in the buffer (ggml's CPU alignment): the 1-D ones all divide
    assert r.weight_bytes == 2 * f16 + 4 * f32
    assert r.image_size == 3000


def test_stack_factor_required(tmp_path):
    spec = ultravox_mmproj_spec(n_text_embd=640, n_layer=1)
    del spec.metadata[Keys.ClipAudio.Projector.STACK_FACTOR]
    with pytest.raises(BadInput, match="stack_factor"):
        read_projector(read_model(str(write_mmproj(tmp_path, spec, "nostack"))))


def test_unknown_tensor_is_refused(tmp_path):
    spec = qwen2a_mmproj_spec(n_text_embd=640, n_layer=1)
    spec.tensors.append(("a.blk.0.attn_k.bias", spec.tensors[-1][1], (1280,)))
    spec.tensors.append(("mm.a.extra.weight", spec.tensors[-1][1], (1280,)))
    with pytest.raises(UnsupportedProjector, match="mm.a.extra"):
        reserve_projector(read_model(str(write_mmproj(tmp_path, spec, "extra"))), None)


def test_mel_bins_checked(tmp_path):
    spec = qwen2a_mmproj_spec(n_text_embd=640, n_layer=1)
    spec.metadata[Keys.ClipAudio.NUM_MEL_BINS] = 300
    with pytest.raises(BadInput, match="n_mel_bins"):
        read_projector(read_model(str(write_mmproj(tmp_path, spec, "mel"))))
