"""runtime/engine/clip_gemma4a.py: Gemma 4's audio projector graphs, node by node, counted by hand from
tools/mtmd/models/gemma4a.cpp and gemma4ua.cpp; the totals are also what the pinned llama-server logs for
those files (reserve_compute_meta: 272 nodes for 2 layers, 1412 for 12, 4 for gemma4ua)."""
from __future__ import annotations

import pytest
from gguf import Keys

from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import (
    gemma4_e4b_mmproj_spec,
    gemma4a_mmproj_spec,
    gemma4ua_mmproj_spec,
    gemma4v_mmproj_spec,
    write_mmproj,
)
from runtime.engine.clip_gemma4a import Gemma4AGraph, Gemma4UAGraph, gemma4a_tensor_names, read_gemma4a_hparams
from runtime.engine.clip_hparams import UnsupportedProjector, load_weights
from runtime.engine.clip_reserve import reserve_projector
from runtime.ggml.graph import Op

# transpose, cont; per subsampling conv: conv2d (7), the channel LayerNorm (permute, cont, norm, mul, permute,
# cont), ReLU; the flatten (permute, cont, reshape); the clamped input projection (3)
INP = 2 + 2 * (7 + 6 + 1) + 3 + 3
FFN = 2 + 3 + 1 + 3 + 2 + 1 + 1        # norm, clamped up, SiLU, clamped down, post norm, scale, residual
# pre norm 2, clamped q/k/v 9, reshapes 3, q and k scale + per-dim scale (reshape, mul) 6, q blocked (pad,
# reshape, permute, cont) 4, k and v windows (pad, view, cont, permute, cont) 10, q.k 1, the relative
# positions 13, softcap 3, mask 1, soft_max 1, x.v 1, permute + cont 2, cont_2d 1, the trim (view, cont) 2,
# clamped out 3, post norm 2, residual 1
ATTN = 2 + 9 + 3 + 6 + 4 + 10 + 1 + 13 + 3 + 1 + 1 + 1 + 2 + 1 + 2 + 3 + 2 + 1
# norm 2, clamped pw1 3, the GLU (view, cont, sigmoid, view, mul, transpose, cont) 7, pad, ssm_conv, norm 2,
# SiLU, clamped pw2 3, residual
CONV = 2 + 3 + 7 + 1 + 1 + 2 + 1 + 3 + 1
LAYER = FFN + ATTN + CONV + FFN + 2
TAIL = 3 + 1 + 1 + 3                   # clamped output projection + bias, rms norm, clamped embedder


@pytest.mark.parametrize("n_layer, logged", [(2, 272), (12, 1412)])
def test_gemma4a_node_count(tmp_path, n_layer, logged):
    model = read_model(str(write_mmproj(tmp_path, gemma4a_mmproj_spec(n_layer=n_layer), "g4a")))
    hp = read_gemma4a_hparams(model)
    graph = Gemma4AGraph(hp, load_weights(model, hp, gemma4a_tensor_names(hp)), True).build()
    assert len(graph.nodes) == INP + n_layer * LAYER + TAIL == logged
    # 3000 frames subsampled by 4: 750 positions, 63 chunks of 12 with 24-frame windows
    [mask] = [t for t in graph.leafs if t.name == "kq_mask"]
    assert mask.ne[:3] == (24, 12, 63)
    assert graph.nodes[-1].ne[:2] == (640, 750)
    assert sum(t.op is Op.SSM_CONV for t in graph.nodes) == n_layer


def test_gemma4ua_graph(tmp_path):
    """permute, cont, rms_norm, an unclamped mul_mat over 3000 frames of 640 samples."""
    model = read_model(str(write_mmproj(tmp_path, gemma4ua_mmproj_spec(), "g4ua")))
    hp = read_gemma4a_hparams(model)
    graph = Gemma4UAGraph(hp, load_weights(model, hp, gemma4a_tensor_names(hp)), True).build()
    assert [t.op for t in graph.nodes] == [Op.PERMUTE, Op.CONT, Op.RMS_NORM, Op.MUL_MAT]
    assert graph.nodes[-1].ne[:2] == (640, 3000)


def test_clamp_scalars_are_read_not_loaded_as_graph_inputs(tmp_path):
    plain = read_model(str(write_mmproj(tmp_path, gemma4a_mmproj_spec(n_layer=1), "a")))
    clipped = read_model(str(write_mmproj(tmp_path, gemma4a_mmproj_spec(n_layer=1, clipped=True), "b")))
    assert reserve_projector(clipped, None).n_nodes == reserve_projector(plain, None).n_nodes


def test_a_file_with_the_vision_tower_too_is_refused(tmp_path):
    spec = gemma4a_mmproj_spec(n_layer=1)
    spec.metadata[Keys.Clip.HAS_VISION_ENCODER] = True
    model = read_model(str(write_mmproj(tmp_path, spec, "mixed")))
    with pytest.raises(UnsupportedProjector, match="vision encoder in the same file"):
        reserve_projector(model, None)


def test_a_file_with_both_encoders_adds_the_two_contexts(tmp_path):
    """clip_init loads the vision tower and the audio conformer as two contexts on the same backend: the
    weights and compute buffers add up, and so do the graphs (134 + 272 = 406 nodes with flash attention,
    as the pinned llama-server logs for this 2 + 2-layer file)."""
    both = read_model(str(write_mmproj(tmp_path, gemma4_e4b_mmproj_spec(n_layer=2, n_audio_layer=2), "e4b")))
    vision = read_model(str(write_mmproj(tmp_path, gemma4v_mmproj_spec(n_layer=2), "v")))
    sound = read_model(str(write_mmproj(tmp_path, gemma4a_mmproj_spec(n_layer=2), "a")))
    r, v, a = (reserve_projector(m, None, "on") for m in (both, vision, sound))
    assert r.n_nodes == v.n_nodes + a.n_nodes == 406
    assert r.weight_bytes == v.weight_bytes + a.weight_bytes
    assert r.compute_bytes["CPU"] == v.compute_bytes["CPU"] + a.compute_bytes["CPU"]
