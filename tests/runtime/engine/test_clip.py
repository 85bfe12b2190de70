"""runtime/engine/clip.py: the projector graphs' shape, node by node, counted by hand from
tools/mtmd/clip.cpp (build_inp, build_vit, build_attn, build_ffn, build_patch_merge_permute) and
models/siglip.cpp; the 27- and 12-layer totals are the node counts the pinned llama-server logs.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import (
    gemma3_mmproj_spec,
    idefics3_mmproj_spec,
    internvl_mmproj_spec,
    janus_pro_mmproj_spec,
    lfm2_mmproj_spec,
    phi4_mmproj_spec,
    pixtral_mmproj_spec,
    qwen2vl_mmproj_spec,
    qwen3vl_mmproj_spec,
    qwen25vl_mmproj_spec,
    write_mmproj,
)
from runtime.engine.clip import SiglipGraph
from runtime.engine.clip_hparams import load_weights, read_clip_hparams
from runtime.engine.clip_pixtral import PixtralGraph, pixtral_tensor_names, read_pixtral_hparams
from runtime.engine.clip_qwen2vl import Qwen2VLGraph, Qwen3VLGraph, qwen2vl_tensor_names, read_qwen2vl_hparams
from runtime.ggml.graph import GGMLType, Op

# inp: im2col, 2 reshapes, mul_mat, reshape, permute, cont (ggml_conv_2d) + reshape, transpose, cont,
# bias add = 11; + position add, reshape = 13. A layer: norm x3, q/k/v (matmul, bias, reshape) x3,
# attention, out matmul + bias, residual, norm x3, up + bias, gelu, down + bias, residual = 24 + the
# attention's 7 (3 permutes, 2 casts, flash_attn_ext, reshape) or 9 (3 permutes, cont, kq, soft_max,
# kqv, permute, cont_2d). Then post_ln x3 and the reshape_3d.
INP, LAYER, ATTN_FA, ATTN_SOFTMAX, TAIL = 13, 24, 7, 9, 4
GEMMA3_HEAD = 11    # transpose, cont_4d, pool_2d, reshape, transpose, cont, rms_norm, mul, transpose, cont, mul_mat
IDEFICS3_HEAD = 7   # reshape_3d x2, permute, cont_3d, permute, cont_2d, mul_mat
LFM2_HEAD = 14      # the same unshuffle (6), norm, mul, add, mm.1 matmul + bias, gelu, mm.2 matmul + bias
MLP_HEAD = 5       # matmul + bias, gelu, matmul + bias (Janus-Pro, Phi-4)
RESIZE = 5          # resize_position_embeddings: reshape_3d, permute, interpolate (UPSCALE), permute, cont_2d


def _graph(tmp_path: Path, spec, flash_attn: bool, image_max_tokens: int = -1):
    model = read_model(str(write_mmproj(tmp_path, spec, "p")))
    hp = read_clip_hparams(model, image_max_tokens)
    return hp, SiglipGraph(hp, load_weights(model, hp), flash_attn).build()


@pytest.mark.parametrize("n_layer, fa", [(2, True), (2, False), (27, True), (27, False)])
def test_gemma3_node_count(tmp_path, n_layer, fa):
    _, graph = _graph(tmp_path, gemma3_mmproj_spec(n_layer=n_layer), fa)
    per_layer = LAYER + (ATTN_FA if fa else ATTN_SOFTMAX)
    assert len(graph.nodes) == INP + n_layer * per_layer + TAIL + GEMMA3_HEAD
    if n_layer == 27:
        assert len(graph.nodes) == (865 if fa else 919)   # llama-server's reserve_compute_meta line


def test_idefics3_node_count_and_output(tmp_path):
    hp, graph = _graph(tmp_path, idefics3_mmproj_spec(), True)
    assert len(graph.nodes) == INP + 12 * (LAYER + ATTN_FA) + TAIL + IDEFICS3_HEAD == 396
    out = graph.nodes[-1]
    # 32 x 32 patches unshuffled by 4: 64 tokens of the text width
    assert (out.op, out.ne[:2]) == (Op.MUL_MAT, (hp.n_mmproj_embd, 64))


def test_gemma3_tokens_and_input(tmp_path):
    hp, graph = _graph(tmp_path, gemma3_mmproj_spec(n_layer=1), True)
    out = graph.nodes[-1]
    assert out.ne[:2] == (640, (896 // 14 // 4) ** 2)              # 256 image tokens
    [raw] = [t for t in graph.leafs if t.name == "inp_raw"]
    assert raw.ne == (896, 896, 3, 1) and raw.type == GGMLType.F32
    [col] = [t for t in graph.nodes if t.op is Op.IM2COL]
    assert col.ne == (14 * 14 * 3, 64, 64, 1) and col.type == GGMLType.F16   # ggml_conv_2d's im2col


@pytest.mark.parametrize("max_tokens, side, resized", [(-1, 512, True), (64, 256, False)])
def test_lfm2_node_count_and_positions(tmp_path, max_tokens, side, resized):
    """LFM2's warmup image is sqrt(tokens) x 16 x 2 px; its 16 x 16 position table is interpolated to
    the image's patch grid unless they match (llama-server logs 408 and 403 nodes)."""
    hp, graph = _graph(tmp_path, lfm2_mmproj_spec(), True, max_tokens)
    assert hp.warmup_image_size == side
    expected = INP + RESIZE * resized + 12 * (LAYER + ATTN_FA) + TAIL + LFM2_HEAD
    assert len(graph.nodes) == expected == (408 if resized else 403)
    [up] = [t for t in graph.nodes if t.op is Op.UPSCALE] or [None]
    assert (up is not None) is resized
    if up is not None:
        assert up.ne == (side // 16, side // 16, 768, 1)
    assert graph.nodes[-1].ne[:2] == (640, (side // 32) ** 2)


@pytest.mark.parametrize("spec, n_layer, resized, total", [
    (janus_pro_mmproj_spec, 24, False, 766),   # 384 px = its own 24 x 24 table
    (phi4_mmproj_spec, 27, True, 864),         # a 224 px warmup image: the 32 x 32 table shrinks to 16 x 16
])
def test_mlp_head_node_counts(tmp_path, spec, n_layer, resized, total):
    _, graph = _graph(tmp_path, spec(), True)
    assert len(graph.nodes) == INP + RESIZE * resized + n_layer * (LAYER + ATTN_FA) + TAIL + MLP_HEAD == total


@pytest.mark.parametrize("fa, total", [(True, 1119), (False, 1154)])
def test_qwen25vl_node_count(tmp_path, fa, total):
    """qwen2vl.cpp by hand: two conv2d (7 each), their sum and the 2x2 regrouping (5) = 20; the window
    prelude (mask cast with flash attention, reshape, get_rows, reshape); a layer = norm 2, q/k 4 each
    (with M-RoPE), v 3, attention 7 (+1: the mask cast again in a windowed layer) or 9 without flash
    attention, out 2, residual, norm 2, SwiGLU FFN 7, residual; post norm 2, merger 6, window undo 3."""
    model = read_model(str(write_mmproj(tmp_path, qwen25vl_mmproj_spec(), "q")))
    hp = read_qwen2vl_hparams(model)
    graph = Qwen2VLGraph(hp, load_weights(model, hp, qwen2vl_tensor_names(hp)), fa).build()
    n_full, n_window = 32 // 8, 32 - 32 // 8
    attn = (7, 8) if fa else (9, 9)
    layers = n_full * (26 + attn[0]) + n_window * (26 + attn[1])
    assert len(graph.nodes) == 20 + (4 if fa else 3) + layers + 2 + 6 + 3 == total
    assert graph.nodes[-1].ne[:2] == (640, 46 * 46)


@pytest.mark.parametrize("fa, total", [(True, 1085), (False, 1149)])
def test_qwen2vl_node_count(tmp_path, fa, total):
    """Qwen2-VL: no windows; layer norms with biases (3 nodes), a gateless quick-GELU FFN (5)."""
    model = read_model(str(write_mmproj(tmp_path, qwen2vl_mmproj_spec(), "q2")))
    hp = read_qwen2vl_hparams(model)
    graph = Qwen2VLGraph(hp, load_weights(model, hp, qwen2vl_tensor_names(hp)), fa).build()
    layer = 3 + 11 + (7 if fa else 9) + 2 + 1 + 3 + 5 + 1
    assert len(graph.nodes) == 20 + 32 * layer + 3 + 6 == total


def test_qwen_legacy_ffn_names_are_swapped_back(tmp_path):
    """Files that store the FFN as {n_embd, n_ff} under ffn_down (load_tensors' is_ffn_swapped)."""
    spec = qwen2vl_mmproj_spec(n_layer=1)
    spec.tensors = [(n.replace("ffn_up", "FFN_X").replace("ffn_down", "ffn_up").replace("FFN_X", "ffn_down"), q, sh)
                    for n, q, sh in spec.tensors]
    model = read_model(str(write_mmproj(tmp_path, spec, "legacy")))
    hp = read_qwen2vl_hparams(model)
    graph = Qwen2VLGraph(hp, load_weights(model, hp, qwen2vl_tensor_names(hp)), True).build()
    assert graph.nodes[-1].ne[:2] == (640, 46 * 46)


@pytest.mark.parametrize("fa, total", [(True, 823), (False, 871)])
def test_internvl_node_count(tmp_path, fa, total):
    """internvl.cpp by hand: the inp's 11, the class token (repeat, concat), positions (add, reshape);
    layers with two layer-scale muls each; no post norm, the reshape_3d; the head: view, cont, the
    shuffle (reshape, permute, cont, permute, cont), norm, mul, add, mlp.1 + bias, gelu, mlp.3 + bias."""
    _, graph = _graph(tmp_path, internvl_mmproj_spec(), fa)
    layer = LAYER + 2 + (ATTN_FA if fa else ATTN_SOFTMAX)
    assert len(graph.nodes) == 11 + 2 + 2 + 24 * layer + 1 + 15 == total
    assert graph.nodes[-1].ne[:2] == (640, 16 * 16)


@pytest.mark.parametrize("fa, total", [(True, 703), (False, 751)])
def test_pixtral_node_count(tmp_path, fa, total):
    """pixtral.cpp by hand: the conv (7), rows (reshape, transpose, cont), no position table, reshape,
    RMS pre-norm (2); a layer = RMS norm 2, q and k (matmul, reshape, 2 RoPEs), v 2, attention, out,
    residual, norm 2, gated FFN 4, residual; reshape_3d; the merger 9 (norm, mul, reshape, permute, cont,
    the kernel view, im2col, reshape, matmul), the MLP 3, the [IMG_BREAK] rows 5."""
    model = read_model(str(write_mmproj(tmp_path, pixtral_mmproj_spec(), "px")))
    hp = read_pixtral_hparams(model)
    graph = PixtralGraph(hp, load_weights(model, hp, pixtral_tensor_names(hp)), fa).build()
    layer = 2 + 10 + (ATTN_FA if fa else ATTN_SOFTMAX) + 1 + 1 + 2 + 4 + 1
    assert len(graph.nodes) == 13 + 24 * layer + 1 + 9 + 3 + 5 == total
    assert graph.nodes[-1].ne[:2] == (640, 16 * 16 + 15)     # 256 tokens and a break after each row but the last


@pytest.mark.parametrize("fa, total", [(True, 766), (False, 814)])
def test_qwen3vl_node_count(tmp_path, fa, total):
    """qwen3vl.cpp by hand: Qwen2-VL's 20-node input, the patch bias, the position table resized (5),
    regrouped (4) and added; a layer = norm 3, fused qkv (matmul, bias, 3 views) + 2 M-RoPEs, attention,
    out 2, residual, norm 3, GELU FFN 5, residual; a deepstack layer adds reshape, norm 3, fc1 2, gelu,
    fc2 2 (and a concat after the first); post norm 3, reshape, merger 5, the final concat."""
    model = read_model(str(write_mmproj(tmp_path, qwen3vl_mmproj_spec(), "q3")))
    hp = read_qwen2vl_hparams(model)
    assert (hp.warmup_image_size, hp.n_mmproj_embd) == (46 * 16 * 2, 640)
    graph = Qwen3VLGraph(hp, load_weights(model, hp, qwen2vl_tensor_names(hp)), fa).build()
    layer = 3 + 7 + (ATTN_FA if fa else ATTN_SOFTMAX) + 2 + 1 + 3 + 5 + 1
    assert len(graph.nodes) == 20 + 1 + 10 + 24 * layer + 3 * 9 + 2 + 3 + 1 + 5 + 1 == total
    assert graph.nodes[-1].ne[:2] == (640, 46 * 46)
