"""runtime/engine/clip_minicpmv.py: MiniCPM-V's resampler graph, node by node, counted by hand from
tools/mtmd/models/minicpmv.cpp and clip.cpp (build_inp, build_vit, build_attn, build_norm)."""
from __future__ import annotations

import pytest
from gguf import GGUFValueType

from planner.core.errors import BadInput
from planner.gguf.reader import read_model
from planner.synth.gguf_factory import Typed
from planner.synth.mmproj_factory import minicpmv_mmproj_spec, write_mmproj
from runtime.engine.clip_hparams import load_weights
from runtime.engine.clip_minicpmv import MiniCPMVGraph, minicpmv_tensor_names, read_minicpmv_hparams
from runtime.ggml.graph import Op

# build_inp 11 (conv2d 7, reshape, transpose, cont, patch bias), the gathered positions (get_rows, add),
# reshape_2d = 14; a layer 24 + attention 7 (flash) or 9; post_ln and reshape_3d 4
INP, LAYER, TAIL = 14, 24, 4
# kv mm 1, ln_q 3, ln_kv 3, the sin/cos positions (repeat; mul, sin, cos, concat per axis; concat) 10,
# k = v + positions 1, Q/K/V (mm, bias, reshape) 9, out (mm, bias) 2, ln_post 3, proj 1 = 33 + attention
RESAMPLER = 33


def _graph(tmp_path, spec, fa: bool):
    model = read_model(str(write_mmproj(tmp_path, spec, "m")))
    hp = read_minicpmv_hparams(model)
    return hp, MiniCPMVGraph(hp, load_weights(model, hp, minicpmv_tensor_names(hp)), fa).build()


@pytest.mark.parametrize("n_layer, fa, logged", [(2, True, 120), (2, False, 126), (27, True, None)])
def test_node_count_and_queries(tmp_path, n_layer, fa, logged):
    """`logged`: the node count the pinned llama-server printed for the same file."""
    hp, graph = _graph(tmp_path, minicpmv_mmproj_spec(n_text_embd=640, n_layer=n_layer), fa)
    attn = 7 if fa else 9
    total = INP + n_layer * (LAYER + attn) + TAIL + RESAMPLER + attn
    assert len(graph.nodes) == total
    assert logged is None or total == logged
    assert graph.nodes[-1].ne[:2] == (640, 64)        # 64 queries of the text width
    [rows] = [t for t in graph.nodes if t.op is Op.GET_ROWS]
    assert rows.ne[:2] == (1152, (448 // 14) ** 2)     # the 70 x 70 table, 32 x 32 rows picked


def test_query_num_defaults_by_version(tmp_path):
    """load_hparams: without clip.minicpmv_query_num, version 2 files have 96 queries."""
    spec = minicpmv_mmproj_spec(n_text_embd=640, n_layer=1, query_num=96, version=2)
    del spec.metadata["clip.minicpmv_query_num"]
    hp, graph = _graph(tmp_path, spec, True)
    assert hp.query_num == 96 and graph.nodes[-1].ne[:2] == (640, 96)


def test_width_must_be_whole_heads(tmp_path):
    spec = minicpmv_mmproj_spec(n_text_embd=600, n_layer=1)
    spec.metadata["clip.minicpmv_version"] = Typed(3, GGUFValueType.INT32)
    with pytest.raises(BadInput, match="heads of 128"):
        read_minicpmv_hparams(read_model(str(write_mmproj(tmp_path, spec, "w600"))))
