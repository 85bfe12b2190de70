"""runtime/engine/clip_qwen3a.py: Qwen3-ASR's audio projector graph, node by node, counted by hand from
tools/mtmd/models/qwen3a.cpp and clip.cpp build_vit / build_attn / build_ffn."""
from __future__ import annotations

import pytest
from gguf import Keys

from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import qwen3a_mmproj_spec, write_mmproj
from runtime.engine.clip_families import family_type
from runtime.engine.clip_hparams import load_weights
from runtime.engine.clip_qwen3a import Qwen3AGraph, qwen3a_tensor_names, read_qwen3a_hparams
from runtime.engine.clip_reserve import reserve_projector
from runtime.ggml.graph import Op

# the clip as 30 chunks of 100 frames (view_4d, cont) 2; three convolutions, each ggml_conv_2d (im2col,
# 2 reshapes, mul_mat, reshape_4d, permute, cont) 7 + the bias' reshape_4d, add, erf GELU = 30; permute,
# cont, reshape_2d, conv_out mul_mat 4; the position rows' view, repeat, add 3; build_vit's reshape_2d 1
INP = 40
# a layer: ln1 3, q/k/v (mm, bias, reshape) 9, attention 7 (flash) or 9, out 2, residual, ln2 3, FFN 5,
# residual = 24 + attention
LAYER = 24
TAIL = 4 + 5        # post_ln 3, reshape_3d; the MLP (mm.1 + bias, erf GELU, mm.2 + bias)


@pytest.mark.parametrize("n_layer, fa", [(2, True), (2, False), (24, True)])
def test_node_count_and_tokens(tmp_path, n_layer, fa):
    model = read_model(str(write_mmproj(tmp_path, qwen3a_mmproj_spec(n_text_embd=640, n_layer=n_layer), "q3a")))
    hp = read_qwen3a_hparams(model)
    graph = Qwen3AGraph(hp, load_weights(model, hp, qwen3a_tensor_names(hp)), fa).build()
    assert len(graph.nodes) == INP + n_layer * (LAYER + (7 if fa else 9)) + TAIL
    if (n_layer, fa) == (2, True):
        assert len(graph.nodes) == 111     # the pinned llama-server's count for this file (-fa off: 115)
    # 128 mel bins and 100 frames halve three times (padding 1): 16 x 13 per chunk, 480 channels
    convs = [t for t in graph.nodes if t.op is Op.IM2COL]
    assert [c.ne for c in convs] == [(9, 50, 64, 30), (9 * 480, 25, 32, 30), (9 * 480, 13, 16, 30)]
    assert graph.nodes[-1].ne[:2] == (640, 13 * 30)


def test_type_read_from_the_audio_key(tmp_path):
    """Qwen3-ASR's converter writes only clip.audio.projector_type; a file with a vision encoder keeps
    its vision type (the mixed Qwen3-Omni file)."""
    spec = qwen3a_mmproj_spec(n_text_embd=640, n_layer=1)
    assert Keys.Clip.PROJECTOR_TYPE not in spec.metadata
    model = read_model(str(write_mmproj(tmp_path, spec, "audio-only")))
    assert family_type(model) == "qwen3a"
    assert reserve_projector(model, None).n_nodes == INP + LAYER + 7 + TAIL
    spec.metadata[Keys.Clip.HAS_VISION_ENCODER] = True
    spec.metadata[Keys.ClipVision.PROJECTOR_TYPE] = "qwen3vl_merger"
    assert family_type(read_model(str(write_mmproj(tmp_path, spec, "mixed")))) == "qwen3vl_merger"
