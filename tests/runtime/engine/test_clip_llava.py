"""runtime/engine/clip_llava.py: LLaVA's MLP projector graph, node by node, counted by hand from
tools/mtmd/models/llava.cpp and clip.cpp (build_inp, build_attn, build_ffn)."""
from __future__ import annotations

import pytest

from planner.gguf.reader import read_model
from planner.synth.gguf_factory import Q
from planner.synth.mmproj_factory import llava_mmproj_spec, write_mmproj
from runtime.engine.clip_hparams import UnsupportedProjector, load_weights
from runtime.engine.clip_llava import LlavaGraph, llava_tensor_names, read_llava_hparams
from runtime.ggml.graph import Op

# build_inp without a patch bias 10, the class token's concat 1, the gathered positions (get_rows, add)
# 2, the pre-norm 3
INP = 16
# a layer: ln1 3, q/k/v (mm, bias, reshape) 9, attention 7 or 9, out 2, residual, ln2 3, FFN 5, residual
LAYER = 24
HEAD = 7            # reshape_2d, get_rows (the patches), mm.0 + bias, gelu, mm.2 + bias


@pytest.mark.parametrize("n_layer, fa, logged", [(3, True, 85), (3, False, 89), (23, True, None)])
def test_node_count_and_tokens(tmp_path, n_layer, fa, logged):
    """The graph runs n_layer - 1 layers (llava.cpp's il_last). `logged`: the pinned llama-server's count
    for the same file."""
    model = read_model(str(write_mmproj(tmp_path, llava_mmproj_spec(n_text_embd=640, n_layer=n_layer), "l")))
    hp = read_llava_hparams(model)
    graph = LlavaGraph(hp, load_weights(model, hp, llava_tensor_names(hp)), fa).build()
    total = INP + (n_layer - 1) * (LAYER + (7 if fa else 9)) + HEAD
    assert len(graph.nodes) == total and (logged is None or total == logged)
    assert graph.nodes[-1].ne[:2] == (640, 24 * 24)          # 576 patches, the class token dropped
    [concat] = [t for t in graph.nodes if t.op is Op.CONCAT]
    assert concat.ne[:2] == (1024, 577)


def test_mlp_norm_is_refused(tmp_path):
    spec = llava_mmproj_spec(n_text_embd=640, n_layer=2)
    spec.tensors.append(("mm.3.weight", Q.F16, (640, 640)))
    with pytest.raises(UnsupportedProjector, match="MLP_NORM"):
        read_llava_hparams(read_model(str(write_mmproj(tmp_path, spec, "yi"))))
