"""runtime/engine/clip_kimivl.py: Kimi-VL's, Kimi-K2.5's and PaddleOCR-VL's graphs, node by node, counted by hand
from tools/mtmd/models/kimivl.cpp, kimik25.cpp and clip.cpp (build_inp, build_vit, build_rope_2d,
build_patch_merge_permute, build_ffn)."""
from __future__ import annotations

import pytest

from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import kimik25_mmproj_spec, kimivl_mmproj_spec, paddleocr_mmproj_spec, write_mmproj
from runtime.engine.clip_hparams import UnsupportedProjector, load_weights
from runtime.engine.clip_kimivl import KimiK25Graph, KimiVLGraph, PaddleOCRGraph, kimi_tensor_names, read_kimi_hparams
from runtime.ggml.graph import Op

INP = 11            # build_inp: conv2d 7, reshape, transpose, cont, patch bias
RESIZE = 5          # resize_position_embeddings: reshape_3d, permute, interpolate, permute, cont_2d
# a layer: ln1 3, q and k (mm, bias, reshape, two ROPE) 10, v 3, out 2, residual, ln2 3, FFN 5, residual
KIMIVL_LAYER = 28
# K2.5: ln1 3, the fused qkv (mm, bias) 2, q and k (view, two ROPE) 6, v view 1, out 2, residual, ln2 3,
# FFN 5, residual
KIMIK25_LAYER = 24
TAIL = 4 + 16       # post_ln, reshape_3d; merger 6, view, norm (norm, mul, add), view, MLP 5


def _graph(tmp_path, spec, builder, fa: bool, image_max_tokens: int = -1):
    model = read_model(str(write_mmproj(tmp_path, spec, "k")))
    hp = read_kimi_hparams(model, image_max_tokens)
    return hp, builder(hp, load_weights(model, hp, kimi_tensor_names(hp)), fa).build()


@pytest.mark.parametrize("n_layer, fa, logged", [(2, True, 108), (2, False, 112), (27, True, None)])
def test_kimivl_node_count(tmp_path, n_layer, fa, logged):
    """The warmup image is 16 x 16 merged tokens (448 px) whatever the file's 896 px; its 64 x 64 table
    is resized to 32 x 32. `logged`: the pinned llama-server's count for the same file."""
    hp, graph = _graph(tmp_path, kimivl_mmproj_spec(n_text_embd=640, n_layer=n_layer), KimiVLGraph, fa)
    assert hp.warmup_image_size == 448
    total = INP + RESIZE + 2 + n_layer * (KIMIVL_LAYER + (7 if fa else 9)) + TAIL
    assert len(graph.nodes) == total and (logged is None or total == logged)
    assert graph.nodes[-1].ne[:2] == (640, 16 * 16)
    assert sum(t.op is Op.ROPE for t in graph.nodes) == 4 * n_layer


@pytest.mark.parametrize("patch_limit, side, resized, logged", [
    (1024, 448, True, 99),        # 32 x 32 patches: the 64 x 64 table interpolated (2 layers: 99 logged)
    (4096, 896, False, None),     # 64 x 64: the table as it is, one cont_2d
    (16384, 1792, True, None),    # Kimi-K2.5's in_patch_limit: 128 x 128 patches
])
def test_kimik25_warmup_and_node_count(tmp_path, patch_limit, side, resized, logged):
    hp, graph = _graph(tmp_path, kimik25_mmproj_spec(n_text_embd=640, n_layer=2, patch_limit=patch_limit),
                       KimiK25Graph, True)
    assert hp.warmup_image_size == side
    total = INP + (4 if resized else 1) + 2 + 2 * (KIMIK25_LAYER + 7) + TAIL
    assert len(graph.nodes) == total and (logged is None or total == logged)
    assert graph.nodes[-1].ne[:2] == (640, (side // 28) ** 2)


def test_kimik25_without_pixel_keys_follows_the_token_limit(tmp_path):
    """Without image_min/max_pixels: set_limit_image_tokens(2, 4096), --image-max-tokens replacing 4096."""
    spec = kimik25_mmproj_spec(n_text_embd=640, n_layer=1, patch_limit=None)
    hp, _ = _graph(tmp_path, spec, KimiK25Graph, True)
    assert hp.warmup_image_size == 64 * 28
    hp, graph = _graph(tmp_path, spec, KimiK25Graph, True, image_max_tokens=256)
    assert hp.warmup_image_size == 16 * 28 and graph.nodes[-1].ne[:2] == (640, 256)


def test_odd_grid_is_refused(tmp_path):
    """A grid the merge does not divide is padded by build_patch_merge_permute (not modelled): 111
    tokens make a 294 px image, 21 x 21 patches."""
    spec = kimik25_mmproj_spec(n_text_embd=640, n_layer=1, patch_limit=None)
    with pytest.raises(UnsupportedProjector, match="merging 2x2"):
        _graph(tmp_path, spec, KimiK25Graph, True, image_max_tokens=111)


@pytest.mark.parametrize("fa, logged", [(True, 102), (False, 106)])
def test_paddleocr_node_count(tmp_path, fa, logged):
    """PaddleOCR-VL: 28 x 28 merged tokens (784 px, 56 x 56 patches, the 27 x 27 table resized); a layer
    with one M-RoPE node on q and k (26 + attention); the head: norm 3, merger 6, MLP 5. `logged`: the
    pinned llama-server's count for the 2-layer file."""
    hp, graph = _graph(tmp_path, paddleocr_mmproj_spec(n_text_embd=640, n_layer=2), PaddleOCRGraph, fa)
    assert (hp.warmup_image_size, hp.n_merge) == (784, 2)
    total = INP + RESIZE + 2 + 2 * (26 + (7 if fa else 9)) + 4 + 14
    assert len(graph.nodes) == total == logged
    assert graph.nodes[-1].ne[:2] == (640, 28 * 28)
    [pos] = [t for t in graph.leafs if t.name == "positions"]
    assert pos.ne[0] == 4 * 56 * 56
