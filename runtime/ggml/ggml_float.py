"""float32 arithmetic as ggml-cpu's x86-64 build does it: fused multiply-adds, the horizontal
sums of 8-lane AVX registers in their order, and the C library's float functions.

A fused multiply-add is emulated in float64: the product of two float32 values is exact there
and the sum rounds to float32 as vfmadd does, except in double-rounding ties (rare enough to
ignore: runtime/ggml/exact.py reproduces llama.cpp's Gemma 3 graphs bit for bit with it).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

F16, F32, F64 = np.float16, np.float32, np.float64


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 a*b + c with one rounding (vfmadd)."""
    return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


def hsum8(x: np.ndarray) -> np.ndarray:
    """Sum of 8 float32 lanes as hsum_float_8 / tinyBLAS hsum add them: halves, then pairs."""
    t = x[..., 4:] + x[..., :4]
    return (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])


def reduce_f32x8(acc: np.ndarray) -> np.ndarray:
    """GGML_F32x8_REDUCE over 4 accumulators [..., 4, 8]: a0+a2, a1+a3, then the two, then
    the 128-bit halves and two horizontal adds."""
    y = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])
    t = y[..., :4] + y[..., 4:]
    return (t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])


@functools.cache
def _libm() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    for fn in ("expf", "cosf", "sinf", "tanhf"):
        getattr(lib, fn).restype = ctypes.c_float
        getattr(lib, fn).argtypes = [ctypes.c_float]
    return lib


def libm_f32(fn: str, x: np.ndarray) -> np.ndarray:
    """The C library's float function on each element: ggml calls expf/cosf/sinf/tanhf, whose
    last bit differs from numpy's own float32 (and from rounding the double) now and then."""
    x = np.asarray(x, F32)
    values, inverse = np.unique(x, return_inverse=True)
    f = getattr(_libm(), fn)
    out = np.fromiter((f(float(v)) for v in values), F32, count=values.size)
    return out[inverse].reshape(x.shape)


def expf(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        x = np.asarray(x, F32)
        out = np.zeros(x.shape, F32)          # expf(-inf) = 0
        live = ~np.isneginf(x)
        out[live] = libm_f32("expf", x[live])
        return out
