"""runtime/exact*.py and ggml_float.py: the pieces of ggml-cpu arithmetic, each on a case worked
out by hand. (That the whole reproduces llama.cpp bit for bit is the peer test
tests/peer/test_validate_peer.py::test_exact_kernels_reproduce_every_node.)"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from runtime.ggml import exact_matmul as XM
from runtime.ggml.backend import alloc_tensors, make_cpu
from runtime.ggml.exact import _online_softmax_v, dot_f16, gelu_table, rope_cache
from runtime.ggml.ggml_float import expf, fma32, hsum8, reduce_f32x8
from runtime.ggml.graph import BufferUsage, Tensor

F16, F32 = np.float16, np.float32
Q = GGMLQuantizationType


# --- float arithmetic ----------------------------------------------------------------------

def test_fma_rounds_once() -> None:
    # (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 exactly; float32 keeps 1 + 2^-11 (the 2^-24 is a tie
    # that rounds to even), so a separate multiply then add gives 0 and a fused one 2^-24
    a = F32(1 + 2.0 ** -12)
    c = F32(-(1 + 2.0 ** -11))
    assert a * a + c == 0
    assert fma32(a, a, c) == F32(2.0 ** -24)


def test_hsum8_adds_halves_then_pairs() -> None:
    # lanes 0 and 4 cancel first: (2^24 + -2^24) + ... = 6; adding left to right loses the 1s
    lanes = np.array([2 ** 24, 1, 1, 1, -2 ** 24, 1, 1, 1], F32)
    assert hsum8(lanes) == 6
    assert np.add.accumulate(lanes, dtype=F32)[-1] == 3


def test_reduce_f32x8_pairs_accumulators_then_lanes() -> None:
    # accumulators a0..a3 of 8 lanes: a0 + a2 and a1 + a3 first, then their sum, then the
    # lanes l and l+4, then (t0 + t1) + (t2 + t3)
    acc = np.zeros((4, 8), F32)
    acc[0, 0], acc[2, 0], acc[1, 1] = 2 ** 24, -(2 ** 24), 1
    acc[3, 5], acc[0, 2], acc[0, 3] = 1, 1, 1
    assert reduce_f32x8(acc) == 4


def test_expf_of_minus_infinity_is_zero_and_matches_exp() -> None:
    x = np.array([-np.inf, 0.0, 1.0, -3.5], F32)
    assert expf(x)[0] == 0 and expf(x)[1] == 1
    np.testing.assert_allclose(expf(x)[2:], np.exp(x[2:].astype(np.float64)), rtol=1e-7)


# --- activation quantization ------------------------------------------------------------------

def test_q8_0_scale_is_amax_over_127_stored_as_f16() -> None:
    x = np.zeros((1, 32), F32)
    x[0, :3] = [1.27, -0.5, 0.004]
    codes, d = XM.quantize_q8_0(x)
    assert codes[0, :3].tolist() == [127, -50, 0]          # 0.004 * 100 = 0.4 rounds to 0
    assert d[0, 0] == F32(F16(F32(1.27) / F32(127)))


def test_q8_k_takes_the_sign_of_the_extreme_value() -> None:
    x = np.zeros((2, 256), F32)
    x[0, 0], x[0, 1] = -2.54, 1.0     # extreme negative: iscale = -127 / -2.54 = +50
    x[1, 0], x[1, 1] = 2.54, 1.0      # extreme positive: iscale = -50, codes flip sign
    codes, d = XM.quantize_q8_k(x)
    assert codes[0, :2].tolist() == [-127, 50] and codes[1, :2].tolist() == [-127, -50]
    assert d[0, 0] == F32(1) / (F32(-127) / F32(-2.54)) and d[1, 0] == -d[0, 0]


# --- weight codes against gguf-py's dequantization -------------------------------------------

BLOCK = {Q.Q8_0: (32, 34), Q.Q5_0: (32, 22), Q.Q4_K: (256, 144), Q.Q6_K: (256, 210)}


def _random_weight(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int) -> Tensor:
    """Random block bytes with sane f16 scales (positive, small) where the format keeps them."""
    rng = np.random.default_rng(seed)
    n_per, size = BLOCK[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // n_per, size), dtype=np.uint8)
    scale = rng.uniform(0.001, 0.02, size=raw.shape[:2] + (2,)).astype(F16).view(np.uint8)
    if qtype is Q.Q6_K:
        raw[..., 208:210] = scale[..., 0:2]
    elif qtype is Q.Q4_K:
        raw[..., 0:4] = scale.reshape(raw.shape[:2] + (4,))
    else:
        raw[..., 0:2] = scale[..., 0:2]
    t = Tensor(qtype, (cols, rows, 1, 1), name=f"w-{qtype.name}")
    alloc_tensors(make_cpu(1 << 30).buffer_type, [t], BufferUsage.WEIGHTS)
    t.raw_bytes()[:] = raw.reshape(-1)
    return t


@pytest.mark.parametrize("qtype", list(BLOCK), ids=lambda q: q.name)
def test_codes_rebuild_gguf_py_values(qtype) -> None:
    t = _random_weight(qtype, rows=8, cols=512, seed=int(qtype))
    c = XM.codes(t)
    expected = dequantize(t.raw_bytes().reshape(8, -1), qtype).reshape(8, 512).astype(np.float64)
    n_per = BLOCK[qtype][0]
    d = np.repeat(c.d.astype(np.float64), n_per, axis=1)
    if qtype is Q.Q4_K:
        sc = np.repeat(c.sc, 32, axis=-1).reshape(8, 512)
        mn = np.repeat(c.m, 32, axis=-1).reshape(8, 512)
        dmin = np.repeat(c.dmin.astype(np.float64), 256, axis=1)
        rebuilt = d * sc * c.q - dmin * mn
    elif qtype is Q.Q6_K:
        rebuilt = d * np.repeat(c.sc, 16, axis=-1).reshape(8, 512) * c.q
    else:
        rebuilt = d * c.q
    np.testing.assert_allclose(rebuilt, expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("qtype, rows", [(Q.Q8_0, 1), (Q.Q5_0, 3), (Q.Q6_K, 2), (Q.Q6_K, 9), (Q.Q4_K, 6)],
                         ids=["q8_0 1 row", "q5_0 3 rows", "q6_K vec_dot", "q6_K tiled", "q4_K gemm+gemv"])
def test_products_equal_the_quantized_dot_product(qtype, rows) -> None:
    """Every kernel computes sum(dequantized weight * dequantized activation); only the order of
    the float additions differs, so the float64 value bounds each result to float32 rounding."""
    t = _random_weight(qtype, rows=16, cols=512, seed=7)
    if qtype is Q.Q4_K:
        XM.REPACKED.add(t)
    x = np.random.default_rng(3).standard_normal((rows, 512)).astype(F32)
    got = XM.mm_rows(t, x)
    w = dequantize(t.raw_bytes().reshape(16, -1), qtype).reshape(16, 512).astype(np.float64)
    if qtype in (Q.Q8_0, Q.Q5_0):
        codes, d = XM.quantize_q8_0(x)
        xq = codes * np.repeat(d, 32, axis=1)
    else:
        codes, d = XM.quantize_q8_k(x)
        xq = codes * np.repeat(d, 256, axis=1)
    want = xq.astype(np.float64) @ w.T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_unmodelled_weights_are_declined() -> None:
    t = _random_weight(Q.Q4_K, rows=16, cols=512, seed=1)   # Q4_K outside CPU_REPACK
    assert XM.mm_rows(t, np.ones((1, 512), F32)) is None


# --- RoPE, attention, GELU ------------------------------------------------------------------

def test_rope_theta_is_multiplied_pair_by_pair() -> None:
    # position 3, base 10000, 4 dims: theta = 3 and 3 * 10000^(-1/2) = 0.03 (in float32)
    cos, sin = rope_cache(np.array([3]), 4, 10000.0)
    assert cos.shape == (1, 2)
    np.testing.assert_allclose(cos[0], np.cos([3.0, 0.03]), rtol=1e-6)
    np.testing.assert_allclose(sin[0], np.sin([3.0, 0.03]), rtol=1e-6)


def test_dot_f16_is_the_dot_product_of_f16_values() -> None:
    q = np.arange(64, dtype=F32).reshape(1, 64).astype(F16)
    k = np.ones((2, 64), F16)
    k[1] = -1
    assert dot_f16(q, k).tolist() == [[2016.0, -2016.0]]    # 0 + 1 + ... + 63


def test_online_softmax_weights_values_and_skips_masked_cells() -> None:
    s = np.array([[0.0, np.log(3.0), -np.inf]], F32)        # weights 1 : 3, third cell masked
    v = np.array([[4.0] * 8, [8.0] * 8, [1000.0] * 8], F16)
    out = _online_softmax_v(s, v)
    np.testing.assert_allclose(out, 7.0, rtol=2e-3)          # (4 + 3*8) / 4, f16 accumulator


def test_gelu_table_is_gelu_of_every_f16_value() -> None:
    x = np.arange(1 << 16, dtype=np.uint16).view(F16).astype(np.float64)
    with np.errstate(all="ignore"):
        finite = np.isfinite(x) & (np.abs(x) < 10)
        want = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    x, want = x[finite], want[finite]
    got = gelu_table()[finite].astype(np.float64)
    # the float32 result rounded once to f16 (1e-3 relative, and f16's smallest step), where for
    # negative x the float32 1 + tanh(..) cancels: |x| * 2^-23 absolute
    assert np.all(np.abs(got - want) <= 1e-3 * np.abs(want) + np.abs(x) * 2.0 ** -23 + 6e-8)
