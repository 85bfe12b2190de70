"""planner/running/tool_runs.py parse_clip_log on the lines the pinned llama-server logs for a projector file
with two encoders (Gemma 4 E4B's vision tower and audio conformer, 2 layers each, -fa off, host only):
two clip contexts, each with its backend, the file's model size and its own reserve."""
from __future__ import annotations

from planner.core.units import MiB
from planner.running.tool_runs import parse_clip_log

ONE = """\
0.03.179.034 I clip_ctx: CLIP using CPU backend
0.03.179.393 I load_hparams: model size:         203.22 MiB
0.03.471.841 I reserve_compute_meta:        CPU compute buffer size =   276.77 MiB
0.03.471.858 I reserve_compute_meta: graph splits = 1, nodes = 138
0.03.471.864 I warmup: flash attention is disabled
"""
TWO = """\
0.03.471.887 I clip_ctx: CLIP using CPU backend
0.03.481.377 I load_hparams: model size:         203.22 MiB
0.03.723.627 I reserve_compute_meta:        CPU compute buffer size =   101.19 MiB
0.03.723.633 I reserve_compute_meta: graph splits = 1, nodes = 272
0.03.723.641 I warmup: flash attention is disabled
"""


def test_one_context_as_logged():
    clip = parse_clip_log(ONE)
    assert clip is not None
    assert clip.buffers == {("CPU", "model"): round(203.22 * MiB), ("CPU", "compute"): round(276.77 * MiB)}
    assert (clip.n_nodes, clip.n_splits, clip.flash_attn) == (138, 1, False)


def test_two_contexts_add_their_compute_and_graphs():
    """The model size line is the whole file's in both contexts (counted once); the compute buffers
    (276.77 + 101.19 MiB) and the graphs (138 + 272 nodes, one split each) add up."""
    clip = parse_clip_log(ONE + TWO)
    assert clip is not None
    assert clip.buffers == {("CPU", "model"): round(203.22 * MiB),
                            ("CPU", "compute"): round(276.77 * MiB) + round(101.19 * MiB)}
    assert (clip.n_nodes, clip.n_splits) == (410, 2)


def test_a_log_without_a_projector_has_no_clip_figures():
    """A llama-server log that loaded no projector (a drafter's two models, say) parses to None."""
    log = "llama_model_loader: loaded meta data\nload_tensors: CPU model buffer size = 1.00 MiB\n"
    assert parse_clip_log(log) is None
