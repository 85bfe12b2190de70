"""numpy kernels against values worked out from each op's definition."""
from __future__ import annotations

import math

import numpy as np

from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Graph
from runtime.ggml.sched import Scheduler

F32, I32, I64 = GGMLType.F32, GGMLType.I32, GGMLType.I64


def _run(cpu, out, inputs):
    Scheduler([cpu]).compute(Graph.build(out), inputs=inputs)
    return out.get_data()


def test_rope_rotates_pairs_by_position_times_frequency(cpu):
    x = B.new_input(F32, [4, 1, 1], "x")  # head_dim 4, one head, one token
    pos = B.new_input(I32, [1], "pos")
    vals = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    # normal mode: pairs (0,1) at frequency 1, (2,3) at 100^(-2/4) = 0.1; position 1
    got = _run(cpu, B.rope(x, pos, 4, mode=0, freq_base=100.0), {x: vals, pos: [1]})
    c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.1), math.sin(0.1)
    want = [1 * c1 - 2 * s1, 1 * s1 + 2 * c1, 3 * c2 - 4 * s2, 3 * s2 + 4 * c2]
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-6)


def test_rope_neox_pairs_i_with_i_plus_half(cpu):
    x = B.new_input(F32, [4, 1, 1], "x")
    pos = B.new_input(I32, [1], "pos")
    got = _run(cpu, B.rope(x, pos, 4, mode=2, freq_base=100.0), {x: np.array([1, 2, 3, 4], np.float32), pos: [1]})
    c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.1), math.sin(0.1)
    want = [1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 1 * s1 + 3 * c1, 2 * s2 + 4 * c2]
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-6)


def test_flash_attention_is_softmax_of_scaled_scores_times_v(cpu):
    rng = np.random.default_rng(3)
    d, n_tok, n_head, n_kv = 4, 2, 2, 3
    q = B.new_input(F32, [d, n_tok, n_head], "q")
    k = B.new_input(F32, [d, n_kv, 1], "k")  # one KV head shared by both query heads (GQA)
    v = B.new_input(F32, [d, n_kv, 1], "v")
    mask = B.new_input(F32, [n_kv, n_tok], "mask")
    qv, kv, vv = (rng.standard_normal(shape).astype(np.float32) for shape in ((n_head, n_tok, d), (n_kv, d), (n_kv, d)))
    mv = np.array([[0, -np.inf, -np.inf], [0, 0, -np.inf]], np.float32)  # causal
    got = _run(cpu, B.flash_attn_ext(q, k, v, mask, 0.5), {q: qv, k: kv, v: vv, mask: mv})
    assert got.shape == (n_tok, n_head, d)  # ggml: [d, n_head, n_tok]
    for h in range(n_head):
        for t in range(n_tok):
            s = qv[h, t] @ kv.T * 0.5 + mv[t]
            p = np.exp(s - s.max())
            np.testing.assert_allclose(got[t, h], (p / p.sum()) @ vv, rtol=1e-5)


def test_mul_mat_broadcasts_a_over_b_batches(cpu):
    a = B.new_input(F32, [3, 2], "a")  # [K=3, M=2]
    b = B.new_input(F32, [3, 1, 2], "b")  # [K=3, N=1, batch 2]
    av = np.array([[1, 0, 0], [0, 1, 1]], np.float32)
    got = _run(cpu, B.mul_mat(a, b), {a: av, b: np.array([[[1, 2, 3]], [[4, 5, 6]]], np.float32)})
    np.testing.assert_array_equal(got.reshape(2, 2), [[1, 5], [4, 11]])


def test_get_rows_and_set_rows(cpu):
    table = B.new_input(F32, [2, 4], "table")
    idx = B.new_input(I32, [3], "idx")
    tv = np.arange(8, dtype=np.float32).reshape(4, 2)
    np.testing.assert_array_equal(_run(cpu, B.get_rows(table, idx), {table: tv, idx: [3, 0, 3]}),
                                  [[6, 7], [0, 1], [6, 7]])
    dst = B.new_input(F32, [2, 4], "dst")
    rows = B.new_input(F32, [2, 2], "rows")
    where = B.new_input(I64, [2], "where")
    got = _run(cpu, B.set_rows(dst, rows, where), {dst: np.zeros((4, 2), np.float32),
                                                  rows: [[1, 2], [3, 4]], where: [2, 0]})
    np.testing.assert_array_equal(got, [[3, 4], [0, 0], [1, 2], [0, 0]])


def test_swiglu_and_rms_norm(cpu):
    a, b = B.new_input(F32, [2], "a"), B.new_input(F32, [2], "b")
    got = _run(cpu, B.swiglu(a, b), {a: [0.0, 1.0], b: [5.0, 2.0]})
    np.testing.assert_allclose(got, [0.0, 2.0 / (1 + math.exp(-1))], rtol=1e-6)
    x = B.new_input(F32, [2], "x")
    got = _run(cpu, B.rms_norm(x, 0.0), {x: [3.0, 4.0]})  # rms = sqrt((9 + 16) / 2)
    np.testing.assert_allclose(got, [3 / math.sqrt(12.5), 4 / math.sqrt(12.5)], rtol=1e-6)
