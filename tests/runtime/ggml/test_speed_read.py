"""read_f32's fast paths: f16 by table, tall quantized matrices in column-major memory, and the
f16 rounding flash attention does in f32 arithmetic."""
from __future__ import annotations

import numpy as np
from gguf.quants import quantize

from runtime.ggml.backend import alloc_tensors
from runtime.ggml.f16 import F16Grid
from runtime.ggml.graph import BufferUsage, GGMLType, Tensor
from runtime.ggml.kernels import read_f32


def test_f16_read_equals_astype_for_every_bit_pattern(cpu):
    t = Tensor(GGMLType.F16, [256, 256], name="all_f16")
    alloc_tensors(cpu.buffer_type, [t])
    patterns = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    t.numpy()[...] = patterns.view(np.float16)
    got = read_f32(t)
    assert got.dtype == np.float32 and got.shape == (1, 1, 256, 256)
    want = patterns.view(np.float16).astype(np.float32)   # numpy's own conversion, NaN payloads included
    np.testing.assert_array_equal(got[0, 0].view(np.uint32), want.view(np.uint32))


def _q8_weight(cpu, rows, cols, seed):
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    t = Tensor(GGMLType.Q8_0, [cols, rows], name=f"w{rows}x{cols}")
    alloc_tensors(cpu.buffer_type, [t], BufferUsage.WEIGHTS)
    t.set_data(quantize(values, GGMLType.Q8_0))
    # Q8_0 from its definition: per 32 values d = amax / 127 stored as f16, q = round(x / d)
    blocks = values.reshape(rows, cols // 32, 32)
    d = (np.abs(blocks).max(axis=-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    return t, d


def test_tall_quantized_matrix_reads_column_major_with_the_same_values(cpu):
    t, d = _q8_weight(cpu, 1024, 64, seed=1)           # 1024 rows >= 16 x 64 columns
    got = read_f32(t)
    assert got.shape == (1, 1, 1024, 64) and got[0, 0].flags.f_contiguous
    q = got[0, 0].reshape(1024, 2, 32) / d          # every value a whole multiple of its block scale
    np.testing.assert_allclose(q, np.rint(q), atol=1e-3)
    assert np.abs(q).max() <= 127.5


def test_wide_quantized_matrix_stays_row_major(cpu):
    t, _ = _q8_weight(cpu, 992, 64, seed=2)            # 992 rows < 16 x 64 columns
    assert read_f32(t)[0, 0].flags.c_contiguous


def test_f16_grid_rounds_like_a_conversion_to_f16():
    """Every 1009th f32 bit pattern up to 65504 (F16_MAX) and all around f16's subnormal limit,
    both signs: equal bits to astype(float16).astype(float32), signed zeros included."""
    top = int(np.float32(65504).view(np.uint32))
    u = np.concatenate([np.arange(0, top + 1, 1009, dtype=np.uint32),
                        np.arange(0x38000000, 0x39000000, 61, dtype=np.uint32)])  # 2^-15 .. 2^-13
    for sign in (0, 0x80000000):
        x = (u | np.uint32(sign)).view(np.float32)
        want = x.astype(np.float16).astype(np.float32)
        got = x.copy()
        F16Grid(got).round()
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_cached_views_follow_a_tensor_into_a_new_buffer(cpu):
    t = Tensor(GGMLType.F32, [4, 2], name="moved")
    first = alloc_tensors(cpu.buffer_type, [t])[0]
    t.set_data(np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(read_f32(t).reshape(-1), np.arange(8))
    alloc_tensors(cpu.buffer_type, [t])          # the allocator moves it (a new compute buffer)
    t.set_data(np.full(8, 5, np.float32))
    np.testing.assert_array_equal(read_f32(t).reshape(-1), np.full(8, 5))
    first.free()
    assert first.storage is not None             # a freed buffer's storage is made anew on touch:
    u = Tensor(GGMLType.F32, [4, 2], name="in_first")
    u.buffer, u.offset = first, 0
    np.testing.assert_array_equal(read_f32(u).reshape(-1), np.zeros(8))   # not the old view's bytes


def test_a_dropped_buffer_takes_its_views_along(cpu):
    import gc

    from runtime.ggml import kernels

    t = Tensor(GGMLType.F32, [16], name="short_lived")
    buffer = alloc_tensors(cpu.buffer_type, [t])[0]
    read_f32(t)
    assert id(buffer) in kernels._VIEWS
    key = id(buffer)
    t.buffer = None
    del buffer
    gc.collect()
    assert key not in kernels._VIEWS


def test_vec_dot_memo_reuses_only_identical_activations():
    """_mul_mat's memo of the activation rounding: same bits give the stored rounding, any
    other bits (a sign of zero included) a fresh one; compared with as_vec_dot itself."""
    from runtime.ggml.kernels import _as_vec_dot_memo, as_vec_dot

    rng = np.random.default_rng(4)
    b1 = rng.standard_normal((1, 1, 2, 64)).astype(np.float32)
    b2 = b1.copy()
    b2[0, 0, 1, 5] = np.nextafter(b2[0, 0, 1, 5], np.float32(9))      # one ulp apart
    b3 = np.zeros_like(b1)
    b4 = b3.copy()
    b4[0, 0, 0, 0] = -0.0
    for b in (b1, b1.copy(), b2, b1, b3, b4, b3):
        for wt in (GGMLType.Q5_0, GGMLType.Q4_1, GGMLType.F16):
            got = _as_vec_dot_memo(b, wt)
            np.testing.assert_array_equal(got.view(np.uint32), as_vec_dot(b, wt).view(np.uint32))
    b1[...] = 7.0                                   # the caller's array changes afterwards:
    np.testing.assert_array_equal(_as_vec_dot_memo(b1, GGMLType.Q5_0), as_vec_dot(b1, GGMLType.Q5_0))
