"""Matrix products with quantized weights as ggml-cpu's x86-64 (AVX2) build computes them.

Every kernel llama.cpp can pick forms exact integer dot products of weight codes and 8-bit
activation codes (per SIMD lane, per sub-block or per 256-value block) and then accumulates them
in float32 with per-block scales, block after block. The integer parts are reproduced here with
BLAS on integer-valued floats (exact: the sums stay below 2**24, or run in float64); the float
part follows the kernel's order and roundings. Which kernel runs (ggml-cpu.c mul_mat):

| weight | rows | kernel | float accumulation per output |
|---|---|---|---|
| Q8_0, Q5_0 | 1 | ggml_vec_dot_q*_0_q8_0 | 8 lanes of 4-value sums, FMA per 32-block, hsum |
| Q8_0, Q5_0 | >= 2 | llamafile tinyBLAS_Q0_AVX | the same |
| Q4_K (CPU_REPACK) | groups of 4 / rest | ggml_{gemm,gemv}_q4_K_8x8_q8_K | FMA per sub-block pair / per 256-block (*) |
| Q6_K | < 8 | ggml_vec_dot_q6_K_q8_K | 8 lanes (offset term per 32-run), FMA per 256-block, hsum |
| Q6_K | >= 8 | tiled K-quant kernel | d_w*sum rounded, then FMA with d_x per 256-block |

(*) scale and min terms accumulated apart.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from runtime.ggml.f16 import f16_to_f32
from runtime.ggml.ggml_float import F16, F32, F64, fma32, hsum8
from runtime.ggml.graph import Tensor

_Q = GGMLQuantizationType

# --- weights as integer codes -------------------------------------------------------------

@dataclass(frozen=True)
class Codes:
    """A quantized weight [R, K] as ggml's kernels see it: integer codes q (float32, exact),
    per-block scales, per-sub-block integer scales and mins where the type has them."""

    q: np.ndarray                 # [R, K] codes (Q4_K: 0..15, Q6_K: -32..31, Q5_0: -16..15, Q8_0)
    d: np.ndarray                 # [R, nb] block scale (f16 values as float32)
    dmin: np.ndarray | None       # [R, nb] Q4_K
    sc: np.ndarray | None         # [R, nb, n_sub] integer sub-block scales (Q4_K 8, Q6_K 16)
    m: np.ndarray | None          # [R, nb, 8] Q4_K mins


def _field(values: np.ndarray | None, what: str) -> np.ndarray:
    """A Codes field that the kernel's weight type has (its decoder in _DECODE always sets it)."""
    if values is None:
        raise ValueError(f"quantized weight codes without {what}")
    return values


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian f16 fields [..., 2 bytes] as float32."""
    return f16_to_f32(np.ascontiguousarray(raw).view(np.uint16)[..., 0])


def _codes_q8_0(b: np.ndarray) -> Codes:   # b: [R, nb, 34]
    q = b[..., 2:].view(np.int8).astype(F32)
    return Codes(q.reshape(b.shape[0], -1), _f16(b[..., :2]), None, None, None)


def _codes_q5_0(b: np.ndarray) -> Codes:   # [R, nb, 22]: d, qh (32 bits), 16 nibble pairs
    qh = np.ascontiguousarray(b[..., 2:6]).view(np.uint32)[..., 0]
    qs = b[..., 6:22]
    lo = (qs & 0x0F) | (((qh[..., None] >> np.arange(16, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
    hi = (qs >> 4) | (((qh[..., None] >> np.arange(16, 32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
    q = np.concatenate([lo, hi], axis=-1).astype(F32) - 16
    return Codes(q.reshape(b.shape[0], -1), _f16(b[..., :2]), None, None, None)


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12-byte packing of eight 6-bit scales and mins (Q4_K, Q5_K)."""
    s = s.astype(np.int32)
    sc = np.empty(s.shape[:-1] + (8,), np.int32)
    mn = np.empty_like(sc)
    sc[..., :4], mn[..., :4] = s[..., 0:4] & 63, s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def _codes_q4_k(b: np.ndarray) -> Codes:   # [R, nb, 144]: d, dmin, scales[12], qs[128]
    sc, mn = _scale_min_k4(b[..., 4:16])
    qs = b[..., 16:].reshape(b.shape[:2] + (4, 32))          # 4 chunks of 64 values
    q = np.stack([qs & 0x0F, qs >> 4], axis=-2)               # [R, nb, 4, 2, 32]
    return Codes(q.reshape(b.shape[0], -1).astype(F32), _f16(b[..., 0:2]), _f16(b[..., 2:4]), sc, mn)


def _codes_q6_k(b: np.ndarray) -> Codes:   # [R, nb, 210]: ql[128], qh[64], scales[16], d
    ql = b[..., :128].reshape(b.shape[:2] + (2, 64))
    qh = b[..., 128:192].reshape(b.shape[:2] + (2, 32))
    parts = [(ql[..., :32] & 0x0F) | ((qh & 3) << 4), (ql[..., 32:] & 0x0F) | (((qh >> 2) & 3) << 4),
             (ql[..., :32] >> 4) | (((qh >> 4) & 3) << 4), (ql[..., 32:] >> 4) | (((qh >> 6) & 3) << 4)]
    q = np.stack(parts, axis=-2).astype(F32) - 32              # [R, nb, 2 halves, 4, 32]
    sc = b[..., 192:208].view(np.int8).astype(np.int32)
    return Codes(q.reshape(b.shape[0], -1), _f16(b[..., 208:210]), None, sc, None)


_DECODE: dict[GGMLQuantizationType, Callable[[np.ndarray], Codes]] = {
    _Q.Q8_0: _codes_q8_0, _Q.Q5_0: _codes_q5_0, _Q.Q4_K: _codes_q4_k, _Q.Q6_K: _codes_q6_k,
}
_CODES: weakref.WeakKeyDictionary[Tensor, Codes] = weakref.WeakKeyDictionary()

# Weights llama.cpp keeps in its CPU_REPACK buffer (repack.cpp: Q4_K with rows % 8 == 0 on
# AVX2): their products run the interleaved 8x8 kernels. The runner registers them.
REPACKED: weakref.WeakSet[Tensor] = weakref.WeakSet()


def codes(t: Tensor) -> Codes:
    got = _CODES.get(t)
    if got is None:
        raw = t.raw_bytes().reshape(t.ne[1], -1, GGML_QUANT_SIZES[t.type][1])
        got = _CODES[t] = _DECODE[t.type](raw)
    return got


# --- activations quantized as ggml-cpu quantizes them --------------------------------------

def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q8_0 (AVX2): blocks of 32, d = amax/127 stored as f16, codes rint(x*127/amax)."""
    b = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(axis=-1)
    d = (amax / F32(127)).astype(F16).astype(F32)
    inv = np.divide(F32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    return np.rint(b * inv[..., None]).reshape(x.shape), d


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q8_K: blocks of 256, iscale = -127/(the signed value of largest magnitude),
    codes min(127, rint(iscale*x)), d = 1/iscale (float32)."""
    b = x.reshape(x.shape[0], -1, 256)
    idx = np.abs(b).argmax(axis=-1)
    mx = np.take_along_axis(b, idx[..., None], axis=-1)[..., 0]
    iscale = np.divide(F32(-127), mx, out=np.zeros_like(mx), where=mx != 0)
    q = np.minimum(F32(127), np.rint(iscale[..., None] * b))
    d = np.divide(F32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return q.reshape(x.shape), d


# --- matrix products ----------------------------------------------------------------------

def _group_dots(w: np.ndarray, a: np.ndarray, size: int, dtype=F32) -> np.ndarray:
    """Integer dot products over consecutive groups of `size` values: w [R, K], a [T, K] ->
    [T, R, K/size]. Exact: the codes are integers and the sums stay below 2**24 (or float64)."""
    g = w.shape[1] // size
    wg = w.reshape(w.shape[0], g, size).transpose(1, 0, 2).astype(dtype, copy=False)   # [G, R, s]
    ag = a.reshape(a.shape[0], g, size).transpose(1, 2, 0).astype(dtype, copy=False)   # [G, s, T]
    return np.matmul(wg, ag).transpose(2, 1, 0)                                       # [T, R, G]


def _mm_q0(c: Codes, x: np.ndarray) -> np.ndarray:
    """Q8_0/Q5_0 x q8_0: ggml_vec_dot_q{8,5}_0_q8_0 (one row) and tinyBLAS_Q0_AVX (batches) do the
    same per output: 8 lanes of 4-value integer sums per 32-block, lane += d_w*d_x * sum (FMA)
    block after block, then hsum_float_8."""
    qx, dx = quantize_q8_0(x)
    lanes = _group_dots(c.q, qx, 4)                                       # [T, R, nb*8]
    t, r = lanes.shape[:2]
    lanes = lanes.reshape(t, r, -1, 8)
    d = c.d[None] * dx[:, None, :]                                        # [T, R, nb] f32
    acc = np.zeros((t, r, 8), F32)
    for ib in range(lanes.shape[2]):
        acc = fma32(d[:, :, ib, None], lanes[:, :, ib], acc)
    return hsum8(acc)


def _mm_q6_k_vec(c: Codes, qx: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_q6_K_q8_K (AVX2): per 256-block, lane l holds sum(scale*(q+32)*x) over values
    4l..4l+3 of each 32-run, minus 32*(bsum*scale) over the 16-runs 2l and 2l+1; acc += d*lane."""
    r, k = c.q.shape
    nb = k // 256
    t = qx.shape[0]
    sub_scales = _field(c.sc, "sub-block scales")
    scale = np.repeat(sub_scales, 16, axis=-1).reshape(r, k).astype(F64)  # scale of each value
    w = (c.q + 32) * scale                                                # unsigned code x scale
    # lane of value e inside its block: (e % 32) // 4
    wl = w.reshape(r, nb, 8, 8, 4).transpose(0, 1, 3, 2, 4).reshape(r, nb * 8 * 32)
    xl = qx.reshape(t, nb, 8, 8, 4).transpose(0, 1, 3, 2, 4).reshape(t, nb * 8 * 32)
    main = _group_dots(wl, xl, 32, F64).reshape(t, r, nb, 8)
    bsum = qx.reshape(t, nb, 16, 16).sum(axis=-1).astype(F64)             # [T, nb, 16]
    sc = sub_scales.astype(F64).reshape(r, nb, 8, 2)
    corr = 32 * np.einsum("tbls,rbls->trbl", bsum.reshape(t, nb, 8, 2), sc)
    lanes = (main - corr).astype(F32)
    d = dx[:, None, :] * c.d[None]                                        # y.d * x.d, f32
    acc = np.zeros((t, r, 8), F32)
    for ib in range(nb):
        acc = fma32(d[:, :, ib, None], lanes[:, :, ib], acc)
    return hsum8(acc)


def _q6_k_block_sums(c: Codes, qx: np.ndarray) -> np.ndarray:
    r, k = c.q.shape
    scale = np.repeat(_field(c.sc, "sub-block scales"), 16, axis=-1).reshape(r, k).astype(F64)
    return _group_dots(c.q * scale, qx, 256, F64)                         # [T, R, nb] exact


def _mm_q6_k_tiled(c: Codes, qx: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """The tiled K-quant kernel (8 rows and more): per 256-block the exact integer sum s,
    res = d_w*s (float32), out += res*d_x (FMA), blocks in order."""
    sums = _q6_k_block_sums(c, qx).astype(F32)
    out = np.zeros(sums.shape[:2], F32)
    for ib in range(sums.shape[2]):
        res = c.d[None, :, ib] * sums[:, :, ib]
        out = fma32(res, dx[:, None, ib], out)
    return out


def _mm_q4_k_repacked(c: Codes, qx: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """ggml_gemm_q4_K_8x8_q8_K for whole groups of 4 rows, ggml_gemv_q4_K_8x8_q8_K for the rest
    (repack.cpp forward_mul_mat). Both form exact integer sums sum(scale*q*x) and sum(min*bsum32)
    and accumulate acc += float(isum)*(d_w*d_x), acc_min += float(imin)*(dmin_w*d_x) with FMAs,
    result acc - acc_min; the gemm does it per pair of 32-value sub-blocks, the gemv per 256-block."""
    r, k = c.q.shape
    nb = k // 256
    t = qx.shape[0]
    sub_scales, mins, dmin = _field(c.sc, "sub-block scales"), _field(c.m, "mins"), _field(c.dmin, "dmin")
    sub = _group_dots(c.q, qx, 32).reshape(t, r, nb, 8).astype(F64)       # [T, R, nb, 8]
    isum = (sub * sub_scales.astype(F64)[None]).reshape(t, r, nb, 4, 2).sum(axis=-1)  # per pair
    bsum = qx.reshape(t, nb, 8, 32).sum(axis=-1).astype(F64)                 # [T, nb, 8]
    imin = (bsum[:, None] * mins.astype(F64)[None]).reshape(t, r, nb, 4, 2).sum(axis=-1)
    n_gemm = t - t % 4
    if n_gemm < t:      # the gemv's leftover rows: one FMA per 256-block of the pair sums' total
        isum[n_gemm:, :, :, 0] = isum[n_gemm:].sum(axis=-1)
        imin[n_gemm:, :, :, 0] = imin[n_gemm:].sum(axis=-1)
        isum[n_gemm:, :, :, 1:] = 0
        imin[n_gemm:, :, :, 1:] = 0
    acc = np.zeros((t, r), F32)
    acc_min = np.zeros((t, r), F32)
    for ib in range(nb):
        scale = c.d[None, :, ib] * dx[:, None, ib]
        scale_min = dmin[None, :, ib] * dx[:, None, ib]
        for sp in range(4):
            if sp and n_gemm == 0:
                break
            rows = slice(None) if sp == 0 else slice(0, n_gemm)
            acc[rows] = fma32(isum[rows, :, ib, sp].astype(F32), scale[rows], acc[rows])
            acc_min[rows] = fma32(imin[rows, :, ib, sp].astype(F32), scale_min[rows], acc_min[rows])
    return acc - acc_min


TILED_MIN_ROWS = 8   # tiled.cpp ggml_tiled_min_batch


def mm_rows(w: Tensor, x: np.ndarray) -> np.ndarray | None:
    """[T, K] activations times weight w -> [T, R] as ggml-cpu computes it, or None where this
    module has no bit-exact model of the kernel."""
    if w.type not in _DECODE or w.ne[2] != 1 or w.ne[3] != 1:
        return None
    c = codes(w)
    if w.type in (_Q.Q8_0, _Q.Q5_0):
        return _mm_q0(c, x)
    qx, dx = quantize_q8_k(x)
    if w.type is _Q.Q6_K:
        return _mm_q6_k_tiled(c, qx, dx) if x.shape[0] >= TILED_MIN_ROWS else _mm_q6_k_vec(c, qx, dx)
    if w in REPACKED:
        return _mm_q4_k_repacked(c, qx, dx)
    return None
