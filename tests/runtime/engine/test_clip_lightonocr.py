"""runtime/engine/clip_lightonocr.py: LightOnOCR on Pixtral's graph without the [IMG_BREAK] rows; node
counts by hand from tools/mtmd/models/pixtral.cpp (as tests/runtime/engine/test_clip.py counts Pixtral's)."""
from __future__ import annotations

import pytest

from planner.gguf.reader import read_model
from planner.synth.gguf_factory import Q
from planner.synth.mmproj_factory import lightonocr_mmproj_spec, write_mmproj
from runtime.engine.clip_hparams import UnsupportedProjector
from runtime.engine.clip_reserve import reserve_projector

# build_inp without a patch bias (conv2d 7, reshape, transpose, cont) 10, reshape_2d, the pre-norm (rms,
# mul) = 13; a layer: rms+mul 2, q and k (mm, reshape, two ROPE) 8, v (mm, reshape) 2, attention 7 or
# 9, out 1, residual, rms+mul 2, the SiLU-gated FFN (up, gate, glu, down) 4, residual = 21 + attention;
# build_vit's reshape_3d, the merger (rms, mul, reshape, permute, cont, the dummy kernel's view,
# im2col, reshape, mm) 9, the MLP (mm.1, gelu, mm.2) 3; no [IMG_BREAK] rows
INP, LAYER, HEAD = 13, 21, 13


@pytest.mark.parametrize("fa, logged", [("auto", 82), ("off", 86)])
def test_node_count(tmp_path, fa, logged):
    """`logged`: the pinned llama-server's count for the 2-layer file."""
    model = read_model(str(write_mmproj(tmp_path, lightonocr_mmproj_spec(n_text_embd=640, n_layer=2), "lo")))
    r = reserve_projector(model, None, fa)
    assert r.n_nodes == INP + 2 * (LAYER + (7 if fa == "auto" else 9)) + HEAD == logged
    assert r.image_size == 16 * 14 * 2


def test_img_break_is_not_loaded(tmp_path):
    """load_tensors never asks LIGHTONOCR for the [IMG_BREAK] embedding: a file with one is refused."""
    spec = lightonocr_mmproj_spec(n_text_embd=640, n_layer=1)
    spec.tensors.append(("v.token_embd.img_break", Q.F32, (640,)))
    with pytest.raises(UnsupportedProjector, match="img_break"):
        reserve_projector(read_model(str(write_mmproj(tmp_path, spec, "brk"))), None)
