"""The meta device's split-state rules, one test per rule, on hand-built graphs. Expected states
are derived by hand from the definition (seed 000 "Three ways a tensor can be distributed" and
what follows; ggml-backend-meta.cpp ggml_backend_meta_get_split_state), never from the code:
a split state's per-member counts scale with the extent of the axis it lands on."""
from __future__ import annotations

import pytest

from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.meta import MIRRORED, PARTIAL, MetaSplitError, SplitAxis, SplitState, slice_counts, split_along
from runtime.ggml.meta_cut import Subgraph, cut_subgraphs
from runtime.ggml.meta_resolve import SplitResolver
from runtime.ggml.meta_rules import SPLIT_RULES

F32, I32 = GGMLType.F32, GGMLType.I32
A0, A1, A2 = SplitAxis.AXIS_0, SplitAxis.AXIS_1, SplitAxis.AXIS_2


class Leaves:
    """Static states by leaf: the test's stand-in for llama_meta_device_get_split_state."""

    def __init__(self) -> None:
        self.states: dict[Tensor, SplitState] = {}

    def __call__(self, t: Tensor) -> SplitState:
        return self.states.get(t, MIRRORED)

    def leaf(self, ne, name, state: SplitState = MIRRORED, ggml_type=F32) -> Tensor:
        t = B.new_tensor(ggml_type, ne, name)
        self.states[t] = state
        return t

    def resolver(self, n: int, **kw) -> SplitResolver:
        return SplitResolver(n, self, **kw)


@pytest.fixture
def lv() -> Leaves:
    return Leaves()


# --- matmul ---------------------------------------------------------------------------------------

def test_matmul_mirrored_times_mirrored_is_mirrored(lv):
    w, x = lv.leaf([8, 6], "w"), lv.leaf([8, 5], "x")
    assert lv.resolver(2).state(B.mul_mat(w, x, "y")) == MIRRORED


def test_matmul_column_parallel_splits_the_output_rows(lv):
    # W [K=8, M=6] split by output rows 4 + 2, x mirrored -> y [6, 5] split along dim 0, 4 + 2
    w, x = lv.leaf([8, 6], "w", split_along(A1, (4, 2))), lv.leaf([8, 5], "x")
    assert lv.resolver(2).state(B.mul_mat(w, x, "y")) == split_along(A0, (4, 2))


def test_matmul_mirrored_times_split_columns_keeps_src1s_split(lv):
    # x [8, T=5] split by tokens 2 + 3 -> y [6, 5] split by tokens 2 + 3
    w, x = lv.leaf([8, 6], "w"), lv.leaf([8, 5], "x", split_along(A1, (2, 3)))
    assert lv.resolver(2).state(B.mul_mat(w, x, "y")) == split_along(A1, (2, 3))


def test_matmul_row_parallel_is_partial_and_mirrored_once_synced(lv):
    w, x = lv.leaf([8, 6], "w", split_along(A0, (4, 4))), lv.leaf([8, 5], "x", split_along(A0, (4, 4)))
    y = B.mul_mat(w, x, "y")
    r = lv.resolver(2)
    assert r.state(y) == PARTIAL
    assert r.state(y, assume_sync=True) == MIRRORED


def test_matmul_row_parallel_with_different_splits_is_refused(lv):
    w, x = lv.leaf([8, 6], "w", split_along(A0, (4, 4))), lv.leaf([8, 5], "x", split_along(A0, (6, 2)))
    with pytest.raises(MetaSplitError, match="MUL_MAT"):
        lv.resolver(2).state(B.mul_mat(w, x, "y"))


def test_matmul_batches_split_on_dim_2(lv):
    # both split on the batch dim, or the batch split against a mirrored activation: 3 + 1 of 4 batches
    w = lv.leaf([8, 6, 4], "w", split_along(A2, (3, 1)))
    xs, xm = lv.leaf([8, 5, 4], "xs", split_along(A2, (3, 1))), lv.leaf([8, 5, 4], "xm")
    r = lv.resolver(2)
    assert r.state(B.mul_mat(w, xs, "ys")) == split_along(A2, (3, 1))
    assert r.state(B.mul_mat(w, xm, "ym")) == split_along(A2, (3, 1))


def test_matmul_without_a_rule_is_refused_by_name(lv):
    # reduced dim split on src0 only: no rule, ggml aborts naming the operands
    w, x = lv.leaf([8, 6], "w", split_along(A0, (4, 4))), lv.leaf([8, 5], "x")
    with pytest.raises(MetaSplitError, match="MUL_MAT.*AXIS_0 x src1 MIRRORED"):
        lv.resolver(2).state(B.mul_mat(w, x, "y"))


# --- per-row ops, reshape, permute ------------------------------------------------------------------

def test_per_row_ops_pass_a_row_split_through_and_refuse_a_split_row(lv):
    x = lv.leaf([8, 5], "x", split_along(A1, (3, 2)))
    assert lv.resolver(2).state(B.rms_norm(x, 1e-5, "n")) == split_along(A1, (3, 2))
    split_rows = lv.leaf([8, 5], "xr", split_along(A0, (4, 4)))
    with pytest.raises(MetaSplitError, match="RMS_NORM"):
        lv.resolver(2).state(B.rms_norm(split_rows, 1e-5, "nr"))


def test_reshape_moves_a_head_split_onto_the_head_dim(lv):
    # [12 = 3 heads x 4, 5 tokens] split 8 + 4 along dim 0 -> [4, 3, 5]: the split lands on the
    # head dim (12 elements of dim 0 = dims 0..1 of the output), 2 + 1 heads
    q = lv.leaf([12, 5], "q", split_along(A0, (8, 4)))
    assert lv.resolver(2).state(B.reshape(q, (4, 3, 5))) == split_along(A1, (2, 1))


def test_reshape_of_the_last_dim_split_and_of_a_repeated_split(lv):
    # split on the outermost dim stays outermost: [12, 5] tokens 3 + 2 -> [60]: 36 + 24 elements
    x = lv.leaf([12, 5], "x", split_along(A1, (3, 2)))
    assert lv.resolver(2).state(B.reshape(x, (60,))) == split_along(A0, (36, 24))
    # rows of 4 split 2 + 2 flattened to [12]: three repeats of a 2 + 2 segment
    y = lv.leaf([4, 3], "y", split_along(A0, (2, 2)))
    flat = lv.resolver(2).state(B.reshape(y, (12,)))
    assert flat == split_along(A0, (2, 2), nr=3) and flat.totals() == (6, 6)


def test_permute_follows_op_params(lv):
    # dim 1 goes to position 2 (ggml_permute 0, 2, 1, 3): heads 2 + 1 of 3 move to dim 2
    k = lv.leaf([4, 3, 5], "k", split_along(A1, (2, 1)))
    assert lv.resolver(2).state(B.permute(k, (0, 2, 1, 3))) == split_along(A2, (2, 1))
    assert lv.resolver(2).state(B.transpose(lv.leaf([6, 5], "t", split_along(A0, (4, 2))))) == \
        split_along(A1, (4, 2))


# --- flash attention ----------------------------------------------------------------------------

def _fa_operands(lv, q_state, kv_state, h=4, hkv=2, d=4, t=5, n_kv=6):
    q = lv.leaf([d, h, t], "q", q_state)
    k = lv.leaf([d, hkv, n_kv], "k", kv_state[0])
    v = lv.leaf([d, hkv, n_kv], "v", kv_state[1])
    mask = lv.leaf([n_kv, t], "mask")
    return [B.permute(x, (0, 2, 1, 3)) for x in (q, k, v)] + [mask]


def test_flash_attention_on_split_heads_splits_its_output_on_dim_1(lv):
    # 4 query heads 2 + 2, 2 KV heads 1 + 1: q permuted to [4, 5, 4] has heads on dim 2;
    # the output [Dv, n_head, tokens] has them on dim 1, 2 + 2
    qp, kp, vp, mask = _fa_operands(lv, split_along(A1, (2, 2)), (split_along(A1, (1, 1)),) * 2)
    fa = B.flash_attn_ext(qp, kp, vp, mask, 0.5, name="fa")
    assert lv.resolver(2).state(fa) == split_along(A1, (2, 2))


def test_flash_attention_mirrored_and_refusals(lv):
    qp, kp, vp, mask = _fa_operands(lv, MIRRORED, (MIRRORED, MIRRORED))
    assert lv.resolver(2).state(B.flash_attn_ext(qp, kp, vp, mask, 0.5, name="fa")) == MIRRORED
    lv2 = Leaves()
    qp, kp, vp, mask = _fa_operands(lv2, split_along(A1, (2, 2)), (split_along(A1, (1, 1)), MIRRORED))
    with pytest.raises(MetaSplitError, match="FLASH_ATTN_EXT"):
        lv2.resolver(2).state(B.flash_attn_ext(qp, kp, vp, mask, 0.5, name="fa"))
    lv3 = Leaves()   # Q split on head_dim instead of heads
    q = lv3.leaf([4, 5, 4], "q", split_along(A0, (2, 2)))
    k, v, mask = lv3.leaf([4, 6, 2], "k"), lv3.leaf([4, 6, 2], "v"), lv3.leaf([6, 5], "mask")
    with pytest.raises(MetaSplitError, match="heads"):
        lv3.resolver(2).state(B.flash_attn_ext(q, k, v, mask, 0.5, name="fa"))


# --- broadcasting binaries ------------------------------------------------------------------------

def test_binary_ops_broadcast_a_mirrored_operand_along_the_split(lv):
    x = lv.leaf([6, 5], "x", split_along(A0, (4, 2)))
    per_token = lv.leaf([1, 5], "g")   # broadcasts along dim 0, the split axis
    r = lv.resolver(2)
    assert r.state(B.mul(x, per_token, "xg")) == split_along(A0, (4, 2))
    bias = lv.leaf([6], "b", split_along(A0, (4, 2)))   # split like x: the generic rule agrees
    assert r.state(B.add(x, bias, "xb")) == split_along(A0, (4, 2))
    whole = lv.leaf([6, 1], "m")   # mirrored but not broadcasting along dim 0: members disagree
    with pytest.raises(MetaSplitError, match="ADD"):
        r.state(B.add(x, whole, "xm"))


def test_add_id_of_a_partial_expert_bias_keeps_the_mirrored_input(lv):
    x = lv.leaf([6, 2, 3], "x")
    bias = lv.leaf([6, 4], "ffn_down_exps.bias", PARTIAL)
    ids = lv.leaf([2, 3], "ids", ggml_type=I32)
    assert lv.resolver(2).state(B.add_id(x, bias, ids, "xb")) == MIRRORED


# --- the whitelist, assume_sync -------------------------------------------------------------------

def test_an_op_without_a_rule_aborts_by_name(lv):
    x, pos = lv.leaf([4, 3, 5], "x"), lv.leaf([5], "pos", ggml_type=I32)
    rules = {op: rule for op, rule in SPLIT_RULES.items() if op is not Op.ROPE}
    with pytest.raises(MetaSplitError, match="no split-state rule for op ROPE"):
        lv.resolver(2, rules=rules).state(B.rope(x, pos, 4, name="r"))


def test_assume_sync_reads_a_partial_source_as_mirrored(lv):
    # h = W_down . a is PARTIAL; its consumer h + x sees h after the reduce: MIRRORED + MIRRORED
    w, a = lv.leaf([8, 6], "w", split_along(A0, (4, 4))), lv.leaf([8, 5], "a", split_along(A0, (4, 4)))
    x = lv.leaf([6, 5], "x")
    h = B.mul_mat(w, a, "h")
    y = B.add(h, x, "y")
    r = lv.resolver(2)
    assert r.state(y) == MIRRORED
    assert (r.state(h, assume_sync=False), r.state(h, assume_sync=True)) == (PARTIAL, MIRRORED)


# --- the cut and the delayed reduce -------------------------------------------------------------

def _mlp(lv, x, n, il, up=None, down=None):
    """Column-parallel up, row-parallel down: [8] -> [6] -> [8]."""
    up = up or split_along(A1, (3, 3))
    down = down or split_along(A0, up.ne)
    wu = lv.leaf([8, 6], f"up{il}", up)
    wd = lv.leaf([6, 8], f"down{il}", down)
    h = B.mul_mat(wu, x, f"h{il}")
    return h, B.mul_mat(wd, h, f"o{il}")


def test_subgraphs_end_at_every_partial_node(lv):
    x = lv.leaf([8, 5], "x")
    h0, o0 = _mlp(lv, x, 2, 0)
    r0 = B.add(o0, x, "r0")
    n1 = B.rms_norm(r0, 1e-5, "n1")
    h1, o1 = _mlp(lv, n1, 2, 1)
    r1 = B.add(o1, r0, "r1")
    nodes = [h0, o0, r0, n1, h1, o1, r1]
    cut = cut_subgraphs(nodes, lv.resolver(2))
    # o0 (1) and o1 (5) are PARTIAL and their consumers read them directly: no delay
    assert cut.subgraphs == (Subgraph(0, 2, True), Subgraph(2, 6, True), Subgraph(6, 7, False))
    assert cut.tmp_bytes == 8 * 5 * 4 and cut.skipped == (frozenset(), frozenset())


def test_the_reduce_moves_past_muls_by_mirrored_factors_and_unrelated_mirrored_work(lv):
    x, g_in = lv.leaf([8, 5], "x"), lv.leaf([8, 5], "g_in")
    h, o = _mlp(lv, x, 2, 0)
    gate = B.scale(g_in, 2.0, "gate")          # mirrored, does not read o: skipped over
    g = B.mul(o, gate, "og")                   # o times a mirrored factor: absorbed
    g2 = B.mul(g, x, "og2")                    # and again
    r = B.add(g2, x, "r")                      # reads g2 with a non-MUL: the reduce stops at g2
    nodes = [h, o, gate, g, g2, r]
    cut = cut_subgraphs(nodes, lv.resolver(2))
    assert cut.subgraphs == (Subgraph(0, 5, True), Subgraph(5, 6, False))


def test_the_reduce_moves_past_the_moe_expert_sum(lv):
    # experts [K=8, M=6, 4 experts] split on K, activations split on K: PARTIAL [6, 2 used, 3 tokens];
    # times the mirrored router weights; two views (one per used expert) summed by one ADD
    experts = lv.leaf([8, 6, 4], "ffn_down_exps.weight", split_along(A0, (4, 4)))
    act = lv.leaf([8, 2, 3], "act", split_along(A0, (4, 4)))
    ids, weights, res = lv.leaf([2, 3], "ids", ggml_type=I32), lv.leaf([1, 2, 3], "wts"), lv.leaf([6, 3], "res")
    mm = B.mul_mat_id(experts, act, ids, "experts")
    w = B.mul(mm, weights, "weighted")
    views = [B.view(w, (6, 3), (w.nb[0], w.nb[2]), k * w.nb[1], name=f"e{k}") for k in range(2)]
    moe = B.add(views[0], views[1], "moe_out")
    out = B.add(moe, res, "out")
    nodes = [mm, w, *views, moe, out]
    r = lv.resolver(2)
    assert r.state(mm) == PARTIAL
    assert cut_subgraphs(nodes, r).subgraphs == (Subgraph(0, 5, True), Subgraph(5, 6, False))


def test_two_partial_branches_added_together_share_one_reduce(lv):
    # parallel attention + FFN: a and b are both PARTIAL, a + b is reduced once
    x = lv.leaf([8, 5], "x")
    ha, a = _mlp(lv, x, 2, 0)
    hb, b = _mlp(lv, x, 2, 1)
    s = B.add(a, b, "s")
    out = B.rms_norm(s, 1e-5, "out")
    cut = cut_subgraphs([ha, a, hb, b, s, out], lv.resolver(2))
    assert cut.subgraphs == (Subgraph(0, 5, True), Subgraph(5, 6, False))


def test_an_empty_slice_is_not_computed_up_to_the_delayed_reduce(lv):
    # member 2 gets no columns of up / rows of down (4 + 2 + 0): its h, o are not computed, and
    # since the reduce moves to og, neither is og
    x, gate = lv.leaf([8, 5], "x"), lv.leaf([8, 5], "gate")
    h, o = _mlp(lv, x, 3, 0, up=split_along(A1, (4, 2, 0)))
    g = B.mul(o, gate, "og")
    r = B.add(g, x, "r")
    cut = cut_subgraphs([h, o, g, r], lv.resolver(3))
    assert cut.subgraphs == (Subgraph(0, 3, True), Subgraph(3, 4, False))
    assert cut.skipped == (frozenset(), frozenset(), frozenset({0, 1, 2}))


# --- static slices ------------------------------------------------------------------------------

def test_slice_counts_round_down_to_granularity_and_rotate():
    assert slice_counts(10, 3) == (3, 3, 4)                 # boundaries 3, 6
    assert slice_counts(10, 3, rotation=1) == (4, 3, 3)     # pieces shifted one member on
    assert slice_counts(10, 3, granularity=4) == (0, 4, 6)  # boundaries 3 -> 0, 6 -> 4
    assert slice_counts(8, 2, weights=(3, 1)) == (6, 2)     # -ts 3,1: boundary 8 * 3/4


def test_a_static_split_must_cover_the_axis(lv):
    w = lv.leaf([8, 6], "w", split_along(A1, (4, 1)))
    with pytest.raises(MetaSplitError, match="does not cover"):
        lv.resolver(2).state(w)
