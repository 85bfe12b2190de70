"""runtime/engine/clip_gemma4.py: Gemma 4's projector graphs, node by node, counted by hand from
tools/mtmd/models/gemma4v.cpp, gemma4uv.cpp and clip.cpp build_vit / build_attn / build_ffn; the
tiny files' totals are also what the pinned llama-server logs for them (reserve_compute_meta)."""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import Keys

from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import gemma4uv_mmproj_spec, gemma4v_mmproj_spec, write_mmproj
from runtime.engine.clip_gemma4 import (
    Gemma4UVGraph,
    Gemma4VGraph,
    gemma4_tensor_names,
    read_gemma4_hparams,
)
from runtime.engine.clip_hparams import UnsupportedProjector, load_weights
from runtime.engine.clip_reserve import reserve_projector
from runtime.ggml.graph import Op

# inp: scale_bias, ggml_conv_2d (im2col, 2 reshapes, mul_mat, reshape, permute, cont), reshape,
# transpose, cont = 11; the two position lookups (view, get_rows, add) = 6; build_vit's reshape_2d.
INP = 11 + 6 + 1
# a layer: ln1 (rms, mul); q/k/v clamped matmuls (3 x 3) and their reshapes (3); q and k per-head
# norms (rms, mul: 4) and 2-D RoPE (2 ropes each: 4); v's rms norm; attention; out (3); post-attention
# norm (2); residual; ln2 (2); up and gate (3 each), GLU, down (3); post-FFN norm (2); residual; out_scale
LAYER = 2 + 9 + 3 + 4 + 4 + 1 + 3 + 2 + 1 + 2 + 10 + 2 + 1 + 1
ATTN_FA, ATTN_SOFTMAX = 7, 9
# reshape_3d; the pooler (transpose, cont_4d, pool_2d, reshape, transpose, cont, scale); rms norm; the
# clamped projection (3)
TAIL = 1 + 7 + 1 + 3


def _gemma4v(tmp_path: Path, fa: bool, **kw):
    model = read_model(str(write_mmproj(tmp_path, gemma4v_mmproj_spec(**kw), "g4v")))
    hp = read_gemma4_hparams(model)
    return hp, Gemma4VGraph(hp, load_weights(model, hp, gemma4_tensor_names(hp)), fa).build()


@pytest.mark.parametrize("n_layer, fa, total", [(2, True, 134), (2, False, 138), (16, True, None), (16, False, None)])
def test_gemma4v_node_count(tmp_path, n_layer, fa, total):
    _, graph = _gemma4v(tmp_path, fa, n_layer=n_layer)
    expected = INP + n_layer * (LAYER + (ATTN_FA if fa else ATTN_SOFTMAX)) + TAIL
    assert len(graph.nodes) == expected
    if total is not None:       # llama-server's count for the 2-layer file
        assert expected == total


def test_gemma4v_warmup_and_output(tmp_path):
    """256 warmup tokens after the 3 x 3 pool: a 48 x 48 patch grid of a 768 px image."""
    hp, graph = _gemma4v(tmp_path, True, n_layer=1)
    assert hp.warmup_image_size == 16 * 16 * 3
    [pool] = [t for t in graph.nodes if t.op is Op.POOL_2D]
    assert pool.ne == (16, 16, 768, 1)
    assert graph.nodes[-1].ne[:2] == (640, 256) and graph.nodes[-1].op is Op.CLAMP
    ropes = [t for t in graph.nodes if t.op is Op.ROPE]
    assert len(ropes) == 4 and all(t.op_params["n_dims"] == 32 for t in ropes)


def test_gemma4v_standardize_and_clamp_scalars(tmp_path):
    """v.std_bias / v.std_scale add a sub and a mul; the clamp scalars are read, not graph inputs."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, plain = _gemma4v(tmp_path / "a", True, n_layer=1)
    _, std = _gemma4v(tmp_path / "b", True, n_layer=1, standardize=True, clipped=True)
    assert len(std.nodes) == len(plain.nodes) + 2
    assert [t.op for t in std.nodes if t.op is Op.SUB] == [Op.SUB]


def test_gemma4uv_graph(tmp_path):
    """gemma4uv.cpp: im2col, reshape, layer norm (3), matmul + bias, layer norm (3), the position
    lookups (6), layer norm (3), rms norm, projection = 21 (as llama-server logs); 48 px patches."""
    model = read_model(str(write_mmproj(tmp_path, gemma4uv_mmproj_spec(), "g4uv")))
    hp = read_gemma4_hparams(model)
    assert (hp.patch_size, hp.n_merge, hp.warmup_image_size) == (48, 1, 768)
    graph = Gemma4UVGraph(hp, load_weights(model, hp, gemma4_tensor_names(hp)), True).build()
    assert len(graph.nodes) == 21
    assert graph.nodes[-1].ne[:2] == (640, 256)


def test_gemma4uv_keeps_flash_attention_auto(tmp_path):
    """No attention node: -fa auto stays enabled whatever the backend."""
    model = read_model(str(write_mmproj(tmp_path, gemma4uv_mmproj_spec(), "g4uv")))
    assert reserve_projector(model, None, "auto").flash_attn


def test_a_file_with_another_audio_encoder_is_refused_by_name(tmp_path):
    """clip_init would load a second context for the audio encoder; Gemma 4's own (gemma4a, gemma4ua)
    are added (clip_reserve), another type is refused, naming it."""
    spec = gemma4v_mmproj_spec(n_layer=1)
    spec.metadata.update({Keys.Clip.HAS_AUDIO_ENCODER: True, Keys.ClipAudio.PROJECTOR_TYPE: "ultravox"})
    model = read_model(str(write_mmproj(tmp_path, spec, "mixed")))
    with pytest.raises(UnsupportedProjector, match="gemma4v with a ultravox audio encoder"):
        reserve_projector(model, None)
