"""runtime/engine/clip_mobilenetv5.py: Gemma 3n's MobileNetV5 projector graph against models/mobilenetv5.cpp,
op by op from the block list, and the node totals the pinned llama-server logs (reserve_compute_meta)."""
from __future__ import annotations

from collections import Counter

import pytest

from planner.gguf.reader import read_model
from planner.synth.mmproj_factory import MNV5_300M_STAGES, gemma3nv_mmproj_spec, write_mmproj
from runtime.engine.clip_hparams import UnsupportedProjector, load_weights
from runtime.engine.clip_mobilenetv5 import MobileNetV5Graph, mobilenet_tensor_names, read_mobilenet_hparams
from runtime.engine.clip_reserve import reserve_projector
from runtime.ggml.graph import Op

TINY = ((("er", 3, 2, 4, 16), ("er", 3, 1, 4, 16)),
        (("uir", 3, 5, 2, 2, 32), ("uir", 0, 0, 1, 2, 32)),
        (("uir", 5, 5, 2, 2, 48), ("mqa", 2, 2, 8, 48), ("uir", 0, 0, 1, 2, 48)),
        (("uir", 5, 5, 2, 2, 64), ("mqa", 2, 1, 8, 64), ("uir", 0, 0, 1, 2, 64)))


def _graph(tmp_path, stages, stem):
    model = read_model(str(write_mmproj(tmp_path, gemma3nv_mmproj_spec(stages=stages, stem=stem), "g3n")))
    hp = read_mobilenet_hparams(model)
    return hp, MobileNetV5Graph(hp, load_weights(model, hp, mobilenet_tensor_names(hp)), True).build()


def _expected_ops(stages) -> Counter:
    """Per block, the convs (CONV_2D), depthwise convs (IM2COL), SAME pads (PAD: every stride-2 conv on
    an even grid) and soft_maxes mobilenetv5.cpp builds; + the stem, the MSFA and its upscale."""
    ops = Counter({Op.CONV_2D: 1 + 2, Op.PAD: 1, Op.UPSCALE: 1, Op.CONCAT: 1, Op.POOL_2D: 1})
    for blocks in stages:
        for b, blk in enumerate(blocks):
            if blk[0] == "er":
                ops[Op.CONV_2D] += 2
                ops[Op.PAD] += b == 0
            elif blk[0] == "uir":
                ops[Op.CONV_2D] += 2
                ops[Op.IM2COL] += (blk[1] > 0) + (blk[2] > 0)
                ops[Op.PAD] += b == 0 and blk[2] > 0
            else:
                ops[Op.CONV_2D] += 4
                ops[Op.IM2COL] += 2 * (blk[2] > 1)
                ops[Op.PAD] += 2 * (blk[2] > 1)
                ops[Op.SOFT_MAX] += 1
    return ops


@pytest.mark.parametrize("stages, stem, total", [(TINY, 16, 351), (MNV5_300M_STAGES, 64, 2503)])
def test_mobilenetv5_graph(tmp_path, stages, stem, total):
    hp, graph = _graph(tmp_path, stages, stem)
    assert len(hp.blocks) == sum(len(s) for s in stages) and len(hp.stage_ends) == 4
    counts = Counter(t.op for t in graph.nodes)
    for op, n in _expected_ops(stages).items():
        assert counts[op] == n, op
    assert len(graph.nodes) == total          # llama-server's "nodes =" for the same file
    out = graph.nodes[-1]
    assert (out.op, out.ne[:2]) == (Op.RMS_NORM, (2048, 256))   # 16 x 16 tokens of the text width


def test_mobilenetv5_pools_the_fused_grid_to_16(tmp_path):
    _, graph = _graph(tmp_path, MNV5_300M_STAGES, 64)
    [pool] = [t for t in graph.nodes if t.op is Op.POOL_2D]
    [cat] = [t for t in graph.nodes if t.op is Op.CONCAT]
    assert cat.ne[:3] == (48, 48, 640 + 1280) and pool.ne[:3] == (16, 16, 2048)


def test_tensors_clip_leaves_in_the_file_are_not_weights(tmp_path):
    """A real Gemma 3n mmproj also carries the hard-token embedding, its norm and the audio conformer;
    clip.cpp loads none of them for GEMMA3NV (the pinned llama-server logs 351 nodes and the same compute
    for such a tiny file, its model size line counting them): the weights buffer is the plain file's."""
    plain = read_model(str(write_mmproj(tmp_path, gemma3nv_mmproj_spec(stages=TINY, stem=16), "plain")))
    full = read_model(str(write_mmproj(tmp_path, gemma3nv_mmproj_spec(stages=TINY, stem=16, unloaded=True), "full")))
    a, b = reserve_projector(plain, None), reserve_projector(full, None)
    assert (b.weight_bytes, b.n_nodes, dict(b.compute_bytes)) == (a.weight_bytes, a.n_nodes, dict(a.compute_bytes))
    assert sum(t.n_bytes for t in full.tensors) > sum(t.n_bytes for t in plain.tensors)


def test_a_tensor_clip_would_not_load_is_refused(tmp_path):
    spec = gemma3nv_mmproj_spec(stages=TINY, stem=16)
    spec.tensors.append(("v.unknown.weight", spec.tensors[-1][1], (2048,)))
    model = read_model(str(write_mmproj(tmp_path, spec, "odd")))
    with pytest.raises(UnsupportedProjector, match="v.unknown.weight"):
        reserve_projector(model, None)
