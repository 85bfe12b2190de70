"""runtime/engine/clip_glm4v.py: GLM-4V's projector graph, node by node, counted by hand from
tools/mtmd/models/glm4v.cpp and clip.cpp build_vit / build_attn / build_ffn; the 2-layer totals are also
what the pinned llama-server logs for that file (reserve_compute_meta)."""
from __future__ import annotations

import pytest

from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import glm4v_mmproj_spec, write_mmproj
from runtime.engine.clip_glm4v import Glm4VGraph, glm4v_tensor_names, read_glm4v_hparams
from runtime.engine.clip_hparams import load_weights
from runtime.ggml.graph import Op

# two conv2d (7 each), their sum, the 2x2 regrouping (permute, cont_4d, reshape_4d, permute, cont_3d);
# the patch bias; the post-conv RMS norm (2); the positions resized (5) and regrouped (4), added;
# build_vit's reshape_2d
INP = 14 + 1 + 5 + 1 + 2 + 9 + 1 + 1
# ln1 2, fused qkv 1, its three views, M-RoPE on q and k 2, out 1, residual, ln2 2, SwiGLU FFN 4, residual
LAYER = 2 + 1 + 3 + 2 + 1 + 1 + 2 + 4 + 1
ATTN_FA, ATTN_SOFTMAX = 7, 9
# post_ln 2, reshape_3d; the merger: reshape_4d, permute, cont, conv2d (7), reshape_2d, bias; fc; layer
# norm (3); GELU; the SwiGLU FFN (4)
TAIL = 3 + 3 + 7 + 2 + 1 + 3 + 1 + 4


@pytest.mark.parametrize("n_layer, fa, logged", [(2, True, 106), (2, False, 110), (24, True, None)])
def test_glm4v_node_count(tmp_path, n_layer, fa, logged):
    model = read_model(str(write_mmproj(tmp_path, glm4v_mmproj_spec(n_layer=n_layer), "glm")))
    hp = read_glm4v_hparams(model)
    graph = Glm4VGraph(hp, load_weights(model, hp, glm4v_tensor_names(hp)), fa).build()
    expected = INP + n_layer * (LAYER + (ATTN_FA if fa else ATTN_SOFTMAX)) + TAIL
    assert len(graph.nodes) == expected
    if logged is not None:
        assert expected == logged
    # 46 x 46 merged tokens: a 1288 px image, 92 x 92 patches, the 24 x 24 table resized to them
    assert hp.warmup_image_size == 46 * 14 * 2
    [up] = [t for t in graph.nodes if t.op is Op.UPSCALE]
    assert up.ne[:3] == (92, 92, 1536)
    assert graph.nodes[-1].ne[:2] == (640, 46 * 46)
