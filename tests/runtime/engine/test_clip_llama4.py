"""runtime/engine/clip_llama4.py: Llama 4's projector graph, node by node, counted by hand from
tools/mtmd/models/llama4.cpp and clip.cpp build_vit / build_attn / build_rope_2d; the 2-layer totals
are also what the pinned llama-server logs for that file (reserve_compute_meta)."""
from __future__ import annotations

import pytest

from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import llama4_mmproj_spec, write_mmproj
from runtime.engine.clip_hparams import load_weights
from runtime.engine.clip_llama4 import Llama4Graph, llama4_tensor_names, read_llama4_hparams
from runtime.ggml.graph import Op

# inp: the kernel reshape, im2col, mul_mat, reshape_2d, the class token's concat = 5; build_vit: the
# position add, reshape_2d, pre_ln (norm, mul, add) = 5
INP = 5 + 5
# ln1 3; q/k/v matmul + bias 6, reshapes 3; 2-D RoPE on q and k 4; out matmul + bias 2; residual; ln2 3;
# fc1 + bias, GELU, fc2 + bias 5; residual
LAYER = 3 + 6 + 3 + 4 + 2 + 1 + 3 + 5 + 1
ATTN_FA, ATTN_SOFTMAX = 7, 9
# post_ln 3, reshape_3d; the class token's view; the shuffle (reshape, permute, cont_4d, cont_2d);
# mlp.1, GELU, mlp.2, GELU, the projection
TAIL = 4 + 1 + 4 + 5


@pytest.mark.parametrize("n_layer, fa, logged", [(2, True, 94), (2, False, 98), (34, True, None)])
def test_llama4_node_count(tmp_path, n_layer, fa, logged):
    model = read_model(str(write_mmproj(tmp_path, llama4_mmproj_spec(n_layer=n_layer), "l4")))
    hp = read_llama4_hparams(model)
    graph = Llama4Graph(hp, load_weights(model, hp, llama4_tensor_names(hp)), fa).build()
    expected = INP + n_layer * (LAYER + (ATTN_FA if fa else ATTN_SOFTMAX)) + TAIL
    assert len(graph.nodes) == expected
    if logged is not None:
        assert expected == logged
    # 24 x 24 patches + the class token through the tower; 12 x 12 tokens of the text width out
    [cat] = [t for t in graph.nodes if t.op is Op.CONCAT]
    assert cat.ne[:2] == (1408, 24 * 24 + 1)
    assert graph.nodes[-1].ne[:2] == (640, 144)
    ropes = [t for t in graph.nodes if t.op is Op.ROPE]
    assert len(ropes) == 4 * n_layer and ropes[0].op_params["n_dims"] == 1408 // 16 // 2
