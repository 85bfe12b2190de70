"""The generation-path flash attention (f16 V accumulator) against references written here."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.ggml.attention import flash_attn_f16_rows

F16, F32 = np.float16, np.float32


def _cell_by_cell(q, k, v, mask, scale):
    """The accumulator cell by cell with explicit f16 round trips, the running maximum, ms, vs
    and the denominator computed as the kernel documents them (vectorised over the scores)."""
    q = q.astype(F16).astype(F32)
    s = (q[0] @ np.swapaxes(k[0], -1, -2)) * F32(scale) + mask[0]
    live = np.flatnonzero(np.isfinite(s).any(axis=(0, 1)))
    s = s[:, :, live]
    running = np.maximum.accumulate(s, axis=-1)
    before = np.concatenate([np.full(s.shape[:-1] + (1,), -np.inf, F32), running[..., :-1]], axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        grew = running > before
        ms = np.where(grew, np.exp(before - running), F32(1)).astype(F32)
        vs = np.where(np.isfinite(s), np.exp(s - running), F32(0)).astype(F32)
    later = np.concatenate([ms[..., 1:], np.ones_like(ms[..., :1])], axis=-1)
    total = (vs * np.flip(np.cumprod(np.flip(later, axis=-1), axis=-1), axis=-1)).sum(axis=-1, keepdims=True)
    acc = np.zeros(q.shape[1:3] + (v.shape[-1],), F16)
    values = v[0][:, live, :]
    for i in range(len(live)):
        a = acc.astype(F32)
        if grew[..., i].any():
            a = (a * ms[..., i:i + 1]).astype(F16).astype(F32)
        a = a + values[:, i:i + 1, :] * vs[..., i:i + 1]
        acc = a.astype(F16)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (acc.astype(F32) / total)[None]


def _inputs(seed, n_head=3, n_tok=4, n_kv=40, d=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, n_head, n_tok, d)).astype(F32)
    k = rng.standard_normal((1, n_head, n_kv, d)).astype(F16).astype(F32)  # an f16 cache read as f32
    # cells 20.. grow along q's direction: their scores rise, so the running maximum moves
    # (a rescale) many times over
    k[0, :, 20:] += (np.linspace(0.2, 3, n_kv - 20)[:, None] * q[0, :, :1]).astype(F16).astype(F32)
    v = (rng.standard_normal((1, n_head, n_kv, d)) * 4).astype(F16).astype(F32)
    mask = np.zeros((1, 1, n_tok, n_kv), F32)
    mask[..., 5:9] = -np.inf                        # cells masked for every row (skipped)
    for t in range(n_tok):                           # causal-like tail, per row
        mask[0, 0, t, n_kv - n_tok + t + 1:] = -np.inf
    return q, k, v, mask


def test_f16_accumulator_is_bit_identical_to_the_cell_by_cell_reference():
    for seed in range(4):
        q, k, v, mask = _inputs(seed)
        got = flash_attn_f16_rows(q, k, v, mask, 0.25)
        want = _cell_by_cell(q, k, v, mask, 0.25)
        assert got.dtype == F32 and got.shape == (1, 3, 4, 16)
        np.testing.assert_array_equal(got, want)


def test_one_token_many_cells_bit_identical():
    q, k, v, mask = _inputs(7, n_head=4, n_tok=1, n_kv=300, d=32)
    np.testing.assert_array_equal(flash_attn_f16_rows(q, k, v, mask, 0.0625),
                                  _cell_by_cell(q, k, v, mask, 0.0625))


def test_close_to_exact_softmax_attention():
    """Softmax in f64 from the definition: the f16 accumulator is the only difference."""
    q, k, v, mask = _inputs(11)
    got = flash_attn_f16_rows(q, k, v, mask, 0.25)[0]
    q16 = q[0].astype(F16).astype(np.float64)
    s = q16 @ np.swapaxes(k[0], -1, -2).astype(np.float64) * 0.25 + mask[0]
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    want = (p / p.sum(axis=-1, keepdims=True)) @ v[0].astype(np.float64)
    np.testing.assert_allclose(got, want, atol=1e-2)   # |v| ~ 4: a few f16 ulps of 4 (2^-8)
    assert np.abs(got - want).max() > 0   # the f16 rounding is there


def test_rescale_path_is_taken():
    """The inputs do move the running maximum after the first live cell (else the rescale
    branch would go untested)."""
    q, k, _v, mask = _inputs(0)
    s = (q[0].astype(F16).astype(F32) @ np.swapaxes(k[0], -1, -2)) * F32(0.25) + mask[0]
    s = s[..., np.isfinite(s).any(axis=(0, 1))]
    running = np.maximum.accumulate(s, axis=-1)
    assert (running[..., 1:] > running[..., :-1]).any(axis=(0, 1)).sum() > 5


def test_tiny_values_round_like_f16_subnormals():
    """V around 1e-6: the accumulator lives in f16's subnormal range (steps of 2^-24)."""
    q, k, v, mask = _inputs(5)
    v = (v * 2e-7).astype(F16).astype(F32)
    got = flash_attn_f16_rows(q, k, v, mask, 0.25)
    np.testing.assert_array_equal(got, _cell_by_cell(q, k, v, mask, 0.25))
    assert np.count_nonzero(got) > got.size // 2


def test_values_near_f16_max_overflow_to_inf_like_f16():
    """Sums past 65504 become inf in an f16 accumulator; the kernel must keep that."""
    q, k, v, mask = _inputs(6)
    k, v = k[:, :1], np.full_like(v[:, :1], 30000.0)    # one KV head shared by the three
    got = flash_attn_f16_rows(q, k, v, mask, 0.25)
    with np.errstate(over="ignore"):
        want = _cell_by_cell(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), mask, 0.25)
    np.testing.assert_array_equal(got, want)
    assert np.isinf(want).any()


@pytest.mark.parametrize("n_head,n_head_kv", [(4, 1), (4, 2), (6, 3)])
def test_shared_kv_heads_equal_repeated_heads(n_head, n_head_kv):
    """GQA: K and V heads shared by n_head / n_head_kv query heads each, as llama.cpp's graph
    passes them; the reference gets them repeated head by head."""
    q, k, v, mask = _inputs(21 + n_head_kv, n_head=n_head, n_tok=3, n_kv=50, d=16)
    k, v = k[:, :n_head_kv], v[:, :n_head_kv]
    rep = n_head // n_head_kv
    want = _cell_by_cell(q, np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1), mask, 0.25)
    np.testing.assert_array_equal(flash_attn_f16_rows(q, k, v, mask, 0.25), want)


def test_accumulator_reaching_f16_max_midway_still_matches(monkeypatch):
    """Even attention over 1200 cells of V ~ 60: the f16 sum passes 65504 (inf) after ~1090
    cells; the first batch of cells runs the fast rounding, the later ones the f16 one."""
    from runtime.ggml import attention as kernels

    slow_batches = []
    real = kernels.f16_steps_cast
    monkeypatch.setattr(kernels, "f16_steps_cast", lambda *a: slow_batches.append(1) or real(*a))
    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 2, 1, 8)).astype(F32)
    k = np.zeros((1, 2, 1200, 8), F32)                      # every score 0: no rescale after the first
    v = (60 + rng.standard_normal((1, 2, 1200, 8))).astype(F16).astype(F32)
    mask = np.zeros((1, 1, 1, 1200), F32)
    got = flash_attn_f16_rows(q, k, v, mask, 0.5)
    with np.errstate(over="ignore", invalid="ignore"):
        want = _cell_by_cell(q, k, v, mask, 0.5)
    np.testing.assert_array_equal(got, want)
    assert np.isinf(want).all()
    assert 0 < len(slow_batches) < -(-1200 // kernels.FA_BATCH_CELLS)   # some batches fast, some not


def test_f16_v_gives_the_same_as_its_f32_values():
    """The kernel takes V straight from an f16 cache and converts only the cells it reads."""
    q, k, v, mask = _inputs(13)
    np.testing.assert_array_equal(flash_attn_f16_rows(q, k, v.astype(F16), mask, 0.25),
                                  _cell_by_cell(q, k, v, mask, 0.25))
