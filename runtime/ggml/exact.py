"""Kernels that reproduce ggml-cpu bit for bit: the x86-64-v3 build (AVX2, FMA, F16C, the
GGML_NATIVE=OFF default), host CPU buffers, the ops the decoder graphs use (docs/internals/runtime.md).

The default kernels (kernels.py) agree with llama.cpp to float32 rounding, which is not enough for its logprobs:
Gemma 3's activations pass through many roundings that amplify 1-ulp differences (8-bit activations before every
matrix product, the f16 KV cache, the f16 GELU table, flash attention's f16 accumulator). This table replaces the
kernels whose result feeds such a rounding with ones that do ggml-cpu's arithmetic in ggml-cpu's order:
- matrix products with quantized weights: each SIMD lane's integer dot products, then the float accumulation
  across blocks as the kernel llama.cpp picks does it (ggml_vec_dot_* for one row, llamafile's tinyBLAS for
  Q8_0/Q5_0 batches, the repacked Q4_K 8x8 gemv/gemm, the tiled K-quant kernel for batches of 8 rows and more);
- RMS norm with its double sum; RoPE with its running theta and the C library's cosf/sinf; GEGLU through ggml's
  f16 GELU table; flash attention's small-batch path (f16 dot products in AVX's lane order, the online softmax
  cell by cell, V accumulated in f16).
GCC's default -ffp-contract=fast makes a*b + c one FMA in ggml's scalar code; which products are fused was
settled node by node against llama.cpp's own tensors (the eval-callback dump in scripts/). Kernel choices follow
ggml-cpu (ggml-cpu.c mul_mat, llamafile/sgemm.cpp, repack.cpp, tiled/) at the pin in DESIGN.md; nothing is
translated from it. Other weight types, non-repacked Q4_K, RoPE frequency factors and large flash-attention
batches run the default kernel.

Use: ModelRunner.load(..., kernels="ggml-avx2"). Slow (every product per lane): for checking, not for speed.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType

from runtime.ggml.attention import FA_TILE_Q
from runtime.ggml.exact_matmul import mm_rows
from runtime.ggml.ggml_float import F16, F32, F64, expf, fma32, libm_f32, reduce_f32x8
from runtime.ggml.graph import Op, Tensor
from runtime.ggml.kernels import KERNELS, read_f32

_Q = GGMLQuantizationType


def _mul_mat(node: Tensor) -> None:
    w, xt = node.source(0), node.source(1)
    x = read_f32(xt)
    out = None if node.name == "result_output" else mm_rows(w, x.reshape(-1, x.shape[-1]))
    if out is None:      # logits feed no further rounding: the default kernel is exact enough
        KERNELS[Op.MUL_MAT](node)
        return
    node.numpy()[...] = out.reshape(node.numpy().shape)


# --- element-wise and attention -----------------------------------------------------------

def _rms_norm(node: Tensor) -> None:
    """ggml_compute_forward_rms_norm_f32: squares in float32 summed in double, mean rounded to
    float, scale = 1/sqrtf(mean + eps), y = x*scale."""
    x = read_f32(node.source(0))
    mean = ((x * x).astype(F64).sum(axis=-1, keepdims=True) / x.shape[-1]).astype(F32)
    scale = F32(1) / np.sqrt(mean + F32(node.op_params["eps"]))
    node.numpy()[...] = (x * scale).reshape(node.numpy().shape)


@functools.lru_cache(maxsize=4096)
def _rope_row(p: int, n_dims: int, freq_base: float, freq_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """ggml_rope_cache_init for one position: theta starts at p and is multiplied by
    theta_scale = powf(base, -2/n_dims) once per pair, in float32; cosf/sinf of freq_scale*theta."""
    theta_scale = F32(np.power(F64(F32(freq_base)), F64(F32(-2.0) / F32(n_dims))))
    theta = np.empty(n_dims // 2, F32)
    cur = F32(p)
    for i in range(n_dims // 2):
        theta[i] = cur
        cur = F32(cur * theta_scale)
    theta = F32(freq_scale) * theta
    return libm_f32("cosf", theta), libm_f32("sinf", theta)


def rope_cache(pos: np.ndarray, n_dims: int, freq_base: float,
               freq_scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [n_tokens, n_dims/2] for the positions."""
    rows = [_rope_row(int(p), n_dims, float(freq_base), float(freq_scale)) for p in pos]
    return np.stack([c for c, _ in rows]), np.stack([s for _, s in rows])


def _rope(node: Tensor) -> None:
    if node.src[2] is not None or node.op_params.get("ext_factor", 0.0):   # frequency factors, YaRN:
        KERNELS[Op.ROPE](node)                                             # no bit-exact model
        return
    x = read_f32(node.source(0)).copy()                     # (a3, n_tokens, n_head, head_dim)
    pos = node.source(1).numpy()[0, 0, 0]
    p = node.op_params
    cos, sin = rope_cache(pos, p["n_dims"], p["freq_base"], p.get("freq_scale", 1.0))
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    n = p["n_dims"]
    if p["mode"] & 2:
        i0, i1 = np.arange(n // 2), np.arange(n // 2) + n // 2
    else:
        i0, i1 = np.arange(0, n, 2), np.arange(1, n, 2)
    x0, x1 = x[..., i0].copy(), x[..., i1].copy()
    x[..., i0] = fma32(x0, cos, -(x1 * sin))   # rotate_pairs: x0*cos - x1*sin, the first product fused
    x[..., i1] = fma32(x0, sin, x1 * cos)
    node.numpy()[...] = x.reshape(node.numpy().shape)


def dot_f16(q16: np.ndarray, k16: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16 (AVX, F16C): products of f16 values are exact in float32; four
    accumulators of 8 lanes take 32 values per step; GGML_F32x8_REDUCE. q16 [N, D], k16 [C, D]
    -> [N, C]."""
    n, dim = q16.shape
    prod = q16.astype(F32)[:, None, :] * k16.astype(F32)[None, :, :]        # [N, C, D] exact
    prod = prod.reshape(n, k16.shape[0], dim // 32, 4, 8)
    acc = np.zeros((n, k16.shape[0], 4, 8), F32)
    for i in range(dim // 32):
        acc = acc + prod[:, :, i]
    return reduce_f32x8(acc)


def _flash_attn_ext(node: Tensor) -> None:
    """ggml-cpu's flash attention for f16 K/V below GGML_FA_TILE_Q (64) query rows, where it runs
    ggml_compute_forward_flash_attn_ext_f16_one_chunk row by row; other shapes: default kernel."""
    qt, kt, vt, mt = node.source(0), node.source(1), node.source(2), node.src[3]
    if (kt.type is not _Q.F16 or vt.type is not _Q.F16 or node.src[4] is not None or qt.ne[1] >= FA_TILE_Q
            or qt.ne[3] != 1 or node.op_params.get("softcap", 0.0)):
        KERNELS[Op.FLASH_ATTN_EXT](node)
        return
    q = read_f32(qt)[0]                            # (H, T, D)
    k = kt.numpy()[0].astype(F16)                  # (Hkv, KV, D) f16
    v = vt.numpy()[0].astype(F16)
    h, t, dim = q.shape
    rep = h // k.shape[0]
    mask = read_f32(mt)[0, 0, :t, :] if mt is not None else None   # (T, KV)
    scale = F32(node.op_params["scale"])
    out = np.zeros((h, t, v.shape[-1]), F32)
    for hk in range(k.shape[0]):
        heads = slice(hk * rep, (hk + 1) * rep)
        qq = q[heads].reshape(-1, dim).astype(F16)                          # (rep*T, D)
        s = dot_f16(qq, k[hk]) * scale                                      # (rep*T, KV)
        if mask is not None:
            s = s + np.tile(mask, (rep, 1))
        out[heads] = _online_softmax_v(s, v[hk]).reshape(rep, t, -1)
    node.numpy()[...] = np.swapaxes(out[None], 1, 2).reshape(node.numpy().shape)


def _online_softmax_v(s: np.ndarray, v16: np.ndarray) -> np.ndarray:
    """The cell loop: a new maximum rescales the f16 accumulator (ggml_vec_scale_f16), every live
    cell adds v*exp(s-M) with one FMA rounded to float32 then f16 (ggml_vec_mad_f16); the sum S
    follows; out = acc * (1/S). s [N, C] float32 with -inf for masked cells."""
    n = s.shape[0]
    acc = np.zeros((n, v16.shape[-1]), F16)
    m = np.full(n, -np.inf, F32)
    total = np.zeros(n, F32)
    for c in np.flatnonzero(np.isfinite(s).any(axis=0)):
        sc = s[:, c]
        live = np.isfinite(sc)
        grew = live & (sc > m)
        ms = np.where(grew, expf(m - np.where(grew, sc, m)), F32(1)).astype(F32)
        m = np.where(grew, sc, m)
        vs = np.where(live, np.where(grew, F32(1), expf(sc - m)), F32(0)).astype(F32)
        a32 = acc.astype(F32)
        a32 = np.where(grew[:, None], (a32 * ms[:, None]).astype(F16).astype(F32), a32)
        upd = fma32(v16[c].astype(F32)[None, :], vs[:, None], a32).astype(F16)
        acc = np.where(live[:, None], upd, acc)
        new_total = fma32(total, ms, vs)          # S = S*ms + vs, contracted
        total = np.where(live, new_total, total)
    inv = np.divide(F32(1), total, out=np.zeros_like(total), where=total != 0)
    return acc.astype(F32) * inv[:, None]


GELU_COEF_A = F32(0.044715)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)


@functools.cache
def gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16: for every f16 input, f16 of 0.5x(1 + tanhf(sqrt(2/pi) x (1 + a x^2)))
    computed in float32 with the inner 1 + (a x) x contracted to one FMA."""
    x = np.arange(1 << 16, dtype=np.uint16).view(F16).astype(F32)
    with np.errstate(all="ignore"):
        inner = fma32(GELU_COEF_A * x, x, F32(1))
        t = libm_f32("tanhf", (SQRT_2_OVER_PI * x) * inner)
        return ((F32(0.5) * x) * (F32(1) + t)).astype(F16).astype(F32)


def _glu(node: Tensor) -> None:
    if node.op_params["glu"] != "GEGLU":
        KERNELS[Op.GLU](node)
        return
    x, g = read_f32(node.source(0)), read_f32(node.source(1))
    looked = gelu_table()[x.astype(F16).view(np.uint16)]
    y = np.where(x <= -10, F32(0), np.where(x >= 10, x * g, looked * g))
    node.numpy()[...] = y.reshape(node.numpy().shape)


EXACT_KERNELS: dict[Op, Callable[[Tensor], None]] = {
    **KERNELS,
    Op.MUL_MAT: _mul_mat,
    Op.RMS_NORM: _rms_norm,
    Op.ROPE: _rope,
    Op.GLU: _glu,
    Op.FLASH_ATTN_EXT: _flash_attn_ext,
}
