"""deepseek4's compressors as ggml ops and graph inputs (src/models/deepseek4.cpp; the reserve plans of
src/llama-kv-cache-dsv4.cpp dsv4_build_reserve_comp_plan, the inputs of src/llama-graph.cpp
dsv4_build_comp_inputs). The builder (runtime/engine/deepseek4.py) adds the weights, norms and RoPE around them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner.gguf.reader import row_size
from planner.model.arch import DSV4_CSA_RATIO
from runtime.engine.deepseek2 import concat
from runtime.engine.deepseek4_hparams import STATE_ROWS
from runtime.engine.hy_v4 import _scale_bias
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Op, Tensor

I32, I64, F16, F32 = GGMLType.I32, GGMLType.I64, GGMLType.F16, GGMLType.F32


@dataclass(frozen=True)
class CompInputs:
    """dsv4_build_comp_inputs for one compressor (csa, hca or lid) under the reserve plan."""

    state_pos: Tensor
    persist_src: Tensor
    persist_dst: Tensor
    read_idxs: Tensor
    write_idxs: Tensor
    write_pos: Tensor
    mask: Tensor
    k_rot: Tensor | None


def comp_inputs(name: str, ratio: int, n_tokens: int, n_stream: int, n_kv: int, mask_f16: bool) -> CompInputs:
    """One compressor's inputs under dsv4_build_reserve_comp_plan's sizes: n_tokens / ratio + n_stream blocks,
    min(n_tokens, state rows) persisted rows, ratio gathered rows per block (twice for the overlapping CSA
    windows), and a mask over the whole compressed cache (F16 with flash attention, and always for the
    fused indexer's)."""
    t, ns = n_tokens, n_stream
    n_blocks = t // ratio + ns
    n_persist = min(t, STATE_ROWS[ratio] * ns)

    def inp(ggml_type: GGMLType, n: int, what: str) -> Tensor:
        return B.new_input(ggml_type, (n,), f"dsv4_{name}_{what}")

    return CompInputs(
        inp(I32, t, "state_pos"), inp(I32, n_persist, "state_persist_src_idxs"),
        inp(I32, n_persist, "state_persist_dst_idxs"),
        inp(I32, (2 if ratio == DSV4_CSA_RATIO else 1) * ratio * n_blocks, "state_read_idxs"),
        inp(I64, n_blocks, "state_write_idxs"), inp(I32, n_blocks, "state_write_pos"),
        B.new_input(F16 if mask_f16 else F32, (n_kv, t // ns, 1, ns), f"dsv4_{name}_kq_mask"), None)


def with_rot(inp: CompInputs, rot: int) -> CompInputs:
    """The inputs with their cache's Hadamard matrix (build_input_k_rot), made after all three plans'."""
    if not rot:
        return inp
    return replace(inp, k_rot=B.new_input(F32, (rot, rot), "attn_inp_k_rot"))


def _append_row(t: Tensor, neg_inf: bool) -> Tensor:
    """dsv4_append_zero_row: t's first row scaled to 0 (or to -inf: scale 0, bias -inf), appended as a row."""
    row = B.view(t, (t.ne[0],), (t.nb[0],), 0)
    row = _scale_bias(row, 0.0, -math.inf, "") if neg_inf else B.scale(row, 0.0)
    return concat(t, B.reshape(row, (t.ne[0], 1)), 1)


def state_all(state: Tensor) -> Tensor:
    """llama_dsv4_comp_state::get_kv_all / get_score_all: every stream's rows, one matrix."""
    return B.view(state, (state.ne[0], state.ne[1] * state.ne[2]), (state.nb[0], state.nb[1]), 0)


def pool_blocks(src_kv: Tensor, src_score: Tensor, inp: CompInputs, width: int, ratio: int) -> Tensor:
    """build_overlap_compressed_kv_from_state (ratio 4: CSA and the indexer; a zero / -inf row appended for
    the first block's previous window) or build_hca_compressed_kv_from_state, up to the norm: each block's
    rows gathered, soft-maxed by score over the window and summed, [width, 1, n_blocks]."""
    hd, r = width, ratio
    n_blocks = inp.write_pos.ne[0]
    if ratio == DSV4_CSA_RATIO:
        src_kv = _append_row(src_kv, False)
        src_score = _append_row(src_score, True)
        n_read = r * n_blocks
        parts = []
        for src in (src_kv, src_score):
            rows = B.get_rows(src, inp.read_idxs)
            prev = B.cont(B.view(rows, (hd, n_read), (rows.nb[0], rows.nb[1]), 0))
            cur = B.cont(B.view(rows, (hd, n_read), (rows.nb[0], rows.nb[1]),
                                n_read * rows.nb[1] + row_size(rows.type, hd)))
            parts.append((B.reshape(prev, (hd, r, n_blocks)), B.reshape(cur, (hd, r, n_blocks))))
        values = concat(parts[0][0], parts[0][1], 1)
        scores = concat(parts[1][0], parts[1][1], 1)
    else:
        values = B.reshape(B.get_rows(src_kv, inp.read_idxs), (hd, r, n_blocks))
        scores = B.reshape(B.get_rows(src_score, inp.read_idxs), (hd, r, n_blocks))
    values = B.cont(B.permute(values, (1, 0, 2, 3)))
    scores = B.cont(B.permute(scores, (1, 0, 2, 3)))
    weights = B.soft_max_ext(scores, None, 1.0)
    comp = B._node(Op.SUM_ROWS, (1, *values.ne[1:]), [B.mul(values, weights)], "comp")
    return B.cont(B.permute(comp, (1, 0, 2, 3)))
