"""runtime/engine/clip_conformer.py: LFM2-Audio's conformer graph, node by node, counted by hand from
tools/mtmd/models/conformer.cpp and clip.cpp (build_norm, build_ffn)."""
from __future__ import annotations

import pytest

from planner.core.errors import BadInput
from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import lfm2a_mmproj_spec, write_mmproj
from runtime.engine.clip_conformer import ConformerGraph, conformer_tensor_names, read_conformer_hparams
from runtime.engine.clip_hparams import load_weights
from runtime.ggml.graph import Op

# the clip transposed (transpose, cont) 2; conv2d (7) + bias + ReLU in place 9; depthwise + bias 2,
# pointwise + bias + ReLU 3, twice; permute, cont, reshape_2d, pre_encode.out + bias 5 = 26
PRE = 26
# two half-step FFNs (norm 3, FFN 5, scale, add) 20; attention: norm 3, q 3, q+u and q+v (add, permute)
# 4, k and v (mm, bias, reshape, permute, cont) 10, ac (mul_mat, permute, cont) 3, p (mm, reshape,
# permute) 3, bd 3, the shift (pad, reshape, view, cont) 4, view, add, scale, soft_max, kqv, permute,
# cont 7, out 2 = 42, its residual 1; the conv module: norm 3, pw1 2, the gate (2 views, sigmoid, mul,
# transpose, cont) 6, pad, roll, pad, ssm_conv, bias 5, batch norm 2, silu, pw2 2 = 21, residual 1;
# the output norm 3
LAYER = 20 + 42 + 1 + 21 + 1 + 3
ADAPTER = 8         # norm 3, mm.1 + bias, erf GELU, mm.3 + bias


@pytest.mark.parametrize("n_layer, logged", [(2, 210), (17, None)])
def test_node_count_and_tokens(tmp_path, n_layer, logged):
    """`logged`: the node count the pinned llama-server printed for the same file (flash attention on or
    off: the graph has no flash-attention node)."""
    model = read_model(str(write_mmproj(tmp_path, lfm2a_mmproj_spec(n_text_embd=640, n_layer=n_layer), "c")))
    hp = read_conformer_hparams(model)
    graph = ConformerGraph(hp, load_weights(model, hp, conformer_tensor_names(hp)), True).build()
    assert len(graph.nodes) == PRE + n_layer * LAYER + ADAPTER
    assert logged is None or len(graph.nodes) == logged
    # 3000 frames halve three times: 375 tokens of the text width (the position table's ne[0])
    assert graph.nodes[-1].ne[:2] == (640, 375) and hp.n_mmproj_embd == 640
    shifts = [t for t in graph.nodes if t.op is Op.PAD and t.ne[0] == 750]
    assert len(shifts) == n_layer and shifts[0].ne[:3] == (750, 375, 8)   # 749 relative positions, padded by one
    assert not any(t.op is Op.FLASH_ATTN_EXT for t in graph.nodes)
    relus = [t for t in graph.nodes if t.op is Op.UNARY and t.op_params["unary"] == "RELU"]
    assert len(relus) == 3 and all(t.view_src is t.src[0] for t in relus)   # in place: no memory of their own


def test_short_position_table_is_refused(tmp_path):
    spec = lfm2a_mmproj_spec(n_text_embd=640, n_layer=1, n_audio_vocab=1000)
    with pytest.raises(BadInput, match="1000 rows"):
        read_conformer_hparams(read_model(str(write_mmproj(tmp_path, spec, "short"))))
