"""numpy kernels, one table entry per op: `KERNELS[op](node)` writes `node` from its sources.

Every backend (the CPU and the virtual devices) executes with these, so a split graph and a
single-device graph compute the same numbers. A device supports an op only if it has a
kernel here (devices.py), so adding an op is: add a constructor in build.py, a function here,
and one line in `KERNELS`. Kernels compute into a temporary and then assign, which keeps the
allocator's in-place reuse (ggml_op_can_inplace) safe.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from planner.core.errors import BadInput
from runtime.ggml import dequant, threads
from runtime.ggml.attention import FA_TILE_Q, flash_attn_f16_rows, flash_attn_f32
from runtime.ggml.exact_matmul import quantize_q8_0, quantize_q8_k
from runtime.ggml.f16 import f16_to_f32
from runtime.ggml.graph import BufferUsage, Op, Tensor, numpy_dtype

# Dequantized weights: float32 copies in a bounded cache (runtime/ggml/dequant.py), the others
# dequantized per row band as a product reads them (bench/bench_runtime_speed.py: dequantizing
# the Gemma 3 270M output matrix per token would cost more than the whole rest of a generation
# step, so what fits is kept). Weights copied into a compute buffer for another device are
# dequantized per use.


# A block-quantized matrix with at least this many times more rows than columns is dequantized
# into column-major memory: in practice only the output (vocabulary) matrix.
COLUMN_MAJOR_MIN_RATIO = 16


def column_major(t: Tensor) -> bool:
    """Whether a block-quantized matrix is dequantized into column-major memory. Its
    matrix-vector product then runs as OpenBLAS's sgemv 'N' kernel, which streams memory far
    faster than the 'T' kernel a row-major matrix gets with a short K (measured on this 2-core
    machine: Gemma 3 270M's 262144 x 640 output matrix 34 ms instead of 59 ms). Its sums come
    in another order, a float32 rounding apart: for the output matrix that is all it moves,
    whereas inside the layers such differences flip activation rounding (as_vec_dot) and GELU's
    f16 table and so grow (with the FFN matrices column-major too, 2 of 64 top-1 tokens in
    tests/peer/test_validate_peer.py went the other way), so layer matrices stay row-major.
    Decided by type and shape only, so every device computes a matrix the same way."""
    return (numpy_dtype(t.type) is None and t.ne[2] == 1 and t.ne[3] == 1
            and t.ne[1] >= COLUMN_MAJOR_MIN_RATIO * t.ne[0])


def _dequantize(t: Tensor) -> np.ndarray:
    if t.ne[2] == 1 and t.ne[3] == 1 and t.ne[1] > 1:
        return _dequantize_matrix(t)
    raw = t.raw_bytes().reshape(t.ne[3], t.ne[2], t.ne[1], t.nb[1])
    with np.errstate(all="ignore"):  # staged expert copies hold garbage outside the used experts
        values = dequantize(raw, t.type).astype(np.float32, copy=False)
    if column_major(t):  # same shape and values, Fortran order in the last two axes
        values = np.ascontiguousarray(values[0, 0].T).T[None, None]
    return values


def _dequantize_matrix(t: Tensor) -> np.ndarray:
    """A whole matrix filled a row band at a time: gguf-py's dequantize holds temporaries several
    times its output (a 2 GiB output matrix peaked at gigabytes more), a band's are bounded. Blocks
    never cross rows, so the values are those of one call."""
    out = np.empty((t.ne[1], t.ne[0]), dtype=np.float32, order="F" if column_major(t) else "C")
    for r0, r1 in dequant.row_bands(t.ne[1], t.ne[0] * 4, 1):
        raw = t.raw_bytes()[r0 * t.nb[1]:r1 * t.nb[1]].reshape(r1 - r0, t.nb[1])
        with np.errstate(all="ignore"):
            out[r0:r1] = dequantize(raw, t.type)
    return out[None, None]


# numpy views of tensors, per buffer and (offset, type, shape, strides): making an ndarray
# costs more than a lookup, and a Gemma 3 270M decode step views ~1800 tensors. Buffers are
# looked up by id (a WeakKeyDictionary lookup costs a weakref per call); an entry goes when its
# buffer does, and a view is reused only while it still looks at its buffer's storage.
_VIEWS: dict[int, tuple[weakref.ref, dict[tuple[object, ...], np.ndarray]]] = {}
_VIEWS_PER_BUFFER = 1 << 14   # forget a buffer's views past this (graphs come and go)


def _views_of(buffer: object) -> dict[tuple[object, ...], np.ndarray]:
    key = id(buffer)
    entry = _VIEWS.get(key)
    if entry is not None and entry[0]() is buffer:
        return entry[1]
    views: dict[tuple[object, ...], np.ndarray] = {}
    _VIEWS[key] = (weakref.ref(buffer, lambda _ref: _VIEWS.pop(key, None)), views)
    return views


def _view(t: Tensor) -> np.ndarray:
    """t.numpy(), cached."""
    buffer, offset = t.storage()
    if buffer is None:
        return t.numpy()  # raises its error
    views = _views_of(buffer)
    key = (offset, t.type, t.ne, t.nb)
    view = views.get(key)
    if view is None or view.base is not buffer.storage:
        if len(views) >= _VIEWS_PER_BUFFER:
            views.clear()
        view = views[key] = t.numpy()
    return view


def _cached_weight(t: Tensor) -> tuple[object, tuple[object, ...]] | None:
    """(buffer, key) of a block-quantized weight the dequant cache may hold; None for other tensors."""
    if numpy_dtype(t.type) is not None or not t.is_contiguous():
        return None
    buffer, offset = t.storage()
    if buffer is None or buffer.usage is not BufferUsage.WEIGHTS:
        return None
    return buffer, (offset, t.type, t.ne)


def _drop_pages(t: Tensor, start: int = 0, n_bytes: int | None = None) -> None:
    """A mapped weight's file pages are evictable once read (runtime/ggml/mapped.py MappedBuffer;
    named by its method: backend.py imports this module, so mapped.py cannot be imported here)."""
    drop = getattr(t.buffer, "drop_pages", None)
    if drop is not None:
        drop(t.offset + start, t.nbytes() - start if n_bytes is None else n_bytes)


def prefetch_f32(t: Tensor) -> bool:
    """Dequantize a weight into the cache now, if it has room; whether it is there."""
    where = _cached_weight(t)
    if where is None:
        return False
    c = dequant.cache()
    if c.get(*where) is not None:
        return True
    if not c.fits(t.n_elements * 4):
        return False
    c.put(*where, _dequantize(t))
    _drop_pages(t)
    return True


def read_f32(t: Tensor) -> np.ndarray:
    """The tensor's values as float32 in numpy order (ne3, ne2, ne1, ne0); dequantizes blocks."""
    if t.type is GGMLQuantizationType.F16:
        return f16_to_f32(_view(t))
    if t.type is GGMLQuantizationType.F32:
        return _view(t)
    if numpy_dtype(t.type) is not None:
        return t.numpy().astype(np.float32, copy=False)
    if not t.is_contiguous():
        raise ValueError(f"{t.name}: reading a non-contiguous {t.type.name} tensor is not supported")
    where = _cached_weight(t)
    if where is None:
        return _dequantize(t)
    if prefetch_f32(t):
        cached = dequant.cache().get(*where)
        assert cached is not None
        return cached
    values = _dequantize(t)   # a weight past the cache's room, read whole by an op that cannot band
    _drop_pages(t)
    return values


def _banded(t: Tensor) -> bool:
    """Whether a product reads this weight in row bands: a block-quantized matrix the cache has no
    room for."""
    return (t.ne[2] == 1 and t.ne[3] == 1 and _cached_weight(t) is not None
            and not prefetch_f32(t))


def _band_f32(t: Tensor, r0: int, r1: int) -> np.ndarray:
    """Rows [r0, r1) of a block-quantized matrix as float32 (M, K), in the memory order the whole
    matrix gets (column_major), so each band's product is the whole product's rows."""
    raw = t.raw_bytes()[r0 * t.nb[1]:r1 * t.nb[1]].reshape(r1 - r0, t.nb[1])
    with np.errstate(all="ignore"):
        values = dequantize(raw, t.type).astype(np.float32, copy=False)
    _drop_pages(t, r0 * t.nb[1], (r1 - r0) * t.nb[1])
    return _in_weight_order(t, values)


def _in_weight_order(t: Tensor, values: np.ndarray) -> np.ndarray:
    """Rows of a block-quantized matrix, contiguous in the memory order its whole matrix gets (column_major)."""
    return np.ascontiguousarray(values.T).T if column_major(t) else np.ascontiguousarray(values)


def _mul_mat_banded(node: Tensor, weight: Tensor, b: np.ndarray) -> None:
    """The product of a weight read a band of rows at a time: each band's output rows written as
    they come (threads.ROW_ALIGN: bands start where a split product's blocks may start)."""
    _write(node, _product_in_bands(b.reshape(-1, b.shape[-1]), weight, lambda r0, r1: _band_f32(weight, r0, r1)))


def _product_in_bands(rows: np.ndarray, weight: Tensor, band: Callable[[int, int], np.ndarray]) -> np.ndarray:
    """rows @ weight.T computed one band of the weight's rows at a time (dequant.row_bands), `band(r0, r1)`
    giving a band's float32 values in the memory order the whole matrix gets. With several activation rows a
    weight read band by band and the same weight whole in the cache both go through here, so both make the
    same BLAS calls and get the same bits: a gemm's sums depend on its shape (OpenBLAS chooses blocking and
    edge kernels by size, per CPU), so a band of a product equals the whole product's rows only on some CPUs
    (on this project's first machine from 256-row bands up, on an AMD EPYC one not at 256 nor 320). One row
    is a gemv, each output its own dot product whatever the band."""
    out = np.empty((rows.shape[0], weight.ne[1]), dtype=np.float32)
    for r0, r1 in dequant.row_bands(weight.ne[1], weight.ne[0] * 4, threads.ROW_ALIGN):
        values = band(r0, r1)
        out[:, r0:r1] = threads.matvec(values, rows[0])[None] if rows.shape[0] == 1 else rows @ values.T
    return out


def _band_of(t: Tensor, whole: np.ndarray) -> Callable[[int, int], np.ndarray]:
    """Bands of a cached whole matrix, each copied into the memory order _band_f32 gives a band read apart."""
    return lambda r0, r1: _in_weight_order(t, whole[r0:r1])


def _write(node: Tensor, values: np.ndarray) -> None:
    target = _view(node)
    target[...] = values.reshape(target.shape)


def _tile_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml_repeat semantics: b's dims divide the target's; numpy broadcasting only covers 1s."""
    return np.tile(b, tuple(s // d for s, d in zip(shape, b.shape, strict=True)))


def _add(node: Tensor) -> None:
    a, b = read_f32(node.source(0)), read_f32(node.source(1))
    _write(node, a + _tile_to(b, a.shape))


def _mul(node: Tensor) -> None:
    a, b = read_f32(node.source(0)), read_f32(node.source(1))
    _write(node, a * _tile_to(b, a.shape))


def _scale(node: Tensor) -> None:
    _write(node, read_f32(node.source(0)) * np.float32(node.op_params["scale"]))


def _rms_norm(node: Tensor) -> None:
    x = read_f32(node.source(0))
    eps = node.op_params["eps"]
    _write(node, x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "SILU": _silu,
    "GELU": lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3))),
    "RELU": lambda x: np.maximum(x, 0.0),
    "TANH": np.tanh,
    "SIGMOID": lambda x: 1.0 / (1.0 + np.exp(-x)),   # moe26: sigmoid routers and step35's head gate
}


def _gelu_exact(x: np.ndarray) -> np.ndarray:
    """ggml's tanh approximation of GELU (GELU_COEF_A = 0.044715, ggml-cpu/vec.h)."""
    x = x.astype(np.float32)
    return 0.5 * x * (1.0 + np.tanh(np.float32(np.sqrt(2.0 / np.pi)) * x * (1.0 + np.float32(0.044715) * x * x)))


_GELU_F16_TABLE: list[np.ndarray] = []


def _gelu(x: np.ndarray) -> np.ndarray:
    """GELU as ggml-cpu computes it (GGML_GELU_FP16, vec.h): 0 below -10, identity above 10,
    otherwise a table indexed by the f16 input holding f16 results."""
    if not _GELU_F16_TABLE:
        all_f16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
        with np.errstate(all="ignore"):
            _GELU_F16_TABLE.append(_gelu_exact(all_f16).astype(np.float16).astype(np.float32))
    looked_up = _GELU_F16_TABLE[0][x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10.0, np.float32(0), np.where(x >= 10.0, x, looked_up))


def _unary(node: Tensor) -> None:
    kind, x = node.op_params["unary"], read_f32(node.source(0))
    _write(node, _xielu(x, node.op_params) if kind == "XIELU" else _UNARY[kind](x))


def _xielu(x: np.ndarray, p: Mapping[str, float]) -> np.ndarray:
    """op_xielu (ggml-cpu/unary-ops.cpp) with ggml_xielu's op params: alpha_p * x^2 + beta * x above 0,
    (expm1(min(x, eps)) - x) * alpha_n + beta * x elsewhere."""
    a_n, a_p, beta, eps = (np.float32(p[k]) for k in ("alpha_n", "alpha_p", "beta", "eps"))
    neg = (np.expm1(np.minimum(x, eps)) - x) * a_n + beta * x
    return np.where(x > 0, a_p * x * x + beta * x, neg).astype(np.float32)


def _sqr(node: Tensor) -> None:
    x = read_f32(node.source(0))
    _write(node, x * x)


_GLU: dict[str, Callable[[np.ndarray], np.ndarray]] = {"SWIGLU": _silu, "GEGLU": _gelu}


def _swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """ggml_compute_forward_swiglu_oai_f32 (ggml-cpu/ops.cpp): the gate capped above, the up clamped,
    x * sigmoid(alpha * x) * (y + 1)."""
    x = np.minimum(gate, np.float32(limit))
    y = np.clip(up, np.float32(-limit), np.float32(limit))
    return (x / (np.float32(1) + np.exp(np.float32(alpha) * -x))) * (y + np.float32(1))


def _glu(node: Tensor) -> None:
    """Split GLU: act(src0) * src1 (ggml_swiglu_split, ggml_geglu_split), or gpt-oss's SWIGLU_OAI."""
    kind = node.op_params["glu"]
    if kind == "SWIGLU_OAI":
        p = node.op_params
        _write(node, _swiglu_oai(read_f32(node.source(0)), read_f32(node.source(1)), p["alpha"], p["limit"]))
        return
    act = _GLU.get(kind)
    if act is None:
        raise ValueError(f"GLU {kind} has no kernel")
    if len(node.src) < 2 or node.src[1] is None:   # ggml_swiglu: the first half gates the second
        x = read_f32(node.source(0))
        half = x.shape[-1] // 2
        _write(node, act(x[..., :half]) * x[..., half:])
        return
    _write(node, act(read_f32(node.source(0))) * read_f32(node.source(1)))


# ggml-cpu's type_traits_cpu[weight].vec_dot_type: the CPU quantizes a matmul's activations to
# this type before the dot products (ggml-cpu.c). Rounding them the same way here keeps the
# logits within llama.cpp's own rounding of the CPU result (tests/peer/test_validate_peer.py).
_Q = GGMLQuantizationType
VEC_DOT_TYPE: dict[GGMLQuantizationType, GGMLQuantizationType] = {
    **{t: _Q.Q8_0 for t in (_Q.Q4_0, _Q.Q5_0, _Q.Q8_0, _Q.IQ4_NL, _Q.MXFP4)},
    **{t: _Q.Q8_1 for t in (_Q.Q4_1, _Q.Q5_1)},
    **{t: _Q.Q8_K for t in (_Q.Q2_K, _Q.Q3_K, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K, _Q.IQ2_XXS, _Q.IQ2_XS, _Q.IQ2_S,
                            _Q.IQ3_XXS, _Q.IQ3_S, _Q.IQ1_S, _Q.IQ1_M, _Q.IQ4_XS, _Q.TQ1_0, _Q.TQ2_0)},
    _Q.F16: _Q.F16, _Q.BF16: _Q.BF16,
}


def _round_q8_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0 then dequantize (exact_matmul.quantize_q8_0: the codes times the f16 scale)."""
    q, d = quantize_q8_0(x.reshape(-1, x.shape[-1]))
    return (q.reshape(-1, 32) * d.reshape(-1, 1)).reshape(x.shape)


def _round_q8_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K then dequantize (exact_matmul.quantize_q8_k: the codes times 1/iscale)."""
    q, d = quantize_q8_k(x.reshape(-1, x.shape[-1]))
    return (q.reshape(-1, 256) * d.reshape(-1, 1)).reshape(x.shape)


def as_vec_dot(b: np.ndarray, weight_type: GGMLQuantizationType) -> np.ndarray:
    """Activations rounded as the CPU backend rounds them for a weight of this type."""
    target = VEC_DOT_TYPE.get(weight_type)
    if target is None:
        return b
    if target is _Q.F16:
        return b.astype(np.float16).astype(np.float32)
    if target is _Q.BF16:
        return (b.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    block = 256 if target is _Q.Q8_K else 32
    if b.shape[-1] % block:
        return b
    return _round_q8_k(b) if target is _Q.Q8_K else _round_q8_0(b)


# The last activations rounded per vec_dot type, kept with a copy of what was rounded: a
# layer's Q, K and V products share their activations, and so do its FFN gate and up, so the
# next product reuses the rounding when its activations are the same bits (a memo of a pure
# function: the results cannot change).
_LAST_VEC_DOT: dict[object, tuple[tuple[object, ...], bytes, np.ndarray]] = {}


def _as_vec_dot_memo(b: np.ndarray, weight_type: GGMLQuantizationType) -> np.ndarray:
    target = VEC_DOT_TYPE.get(weight_type)
    if target is None:
        return b
    bits, form = b.tobytes(), (b.shape, b.dtype)
    last = _LAST_VEC_DOT.get(target)
    if last is not None and last[0] == form and last[1] == bits:
        return last[2]
    rounded = as_vec_dot(b, weight_type)
    if rounded is not b:  # a rounded copy (unrounded b is a view of a buffer that gets reused)
        _LAST_VEC_DOT[target] = (form, bits, rounded)
    return rounded


def _mul_mat(node: Tensor) -> None:
    weight, acts = node.source(0), node.source(1)
    if _banded(weight):
        _mul_mat_banded(node, weight, _as_vec_dot_memo(read_f32(acts), weight.type))
        return
    a, b = read_f32(weight), _as_vec_dot_memo(read_f32(acts), weight.type)  # (a3, a2, M, K), (b3, b2, N, K)
    if a.shape[:2] == (1, 1):  # one weight matrix: a single BLAS call, no broadcast copy
        rows = b.reshape(-1, b.shape[-1])
        if rows.shape[0] == 1:
            # one token: matrix-vector (gemv) reads the weight once, faster than a 1-column gemm;
            # a large weight's rows may be shared between threads (threads.py: same results)
            _write(node, threads.matvec(a[0, 0], rows[0]))
        elif _cached_weight(weight) is not None:
            # a weight that could be read in bands: the products of its bands, as when it is
            _write(node, _product_in_bands(rows, weight, _band_of(weight, a[0, 0])))
        else:
            _write(node, rows @ a[0, 0].T)
        return
    if b.shape[0] != a.shape[0]:
        a = np.repeat(a, b.shape[0] // a.shape[0], axis=0)
    if b.shape[1] != a.shape[1]:
        a = np.repeat(a, b.shape[1] // a.shape[1], axis=1)
    _write(node, b @ np.swapaxes(a, -1, -2))


def _mul_mat_id(node: Tensor) -> None:
    """Only the experts the router selected are read: a staged copy holds only those (seed 000)."""
    experts_t, b_t, ids_t = node.source(0), node.source(1), node.source(2)
    ids = ids_t.numpy()[0, 0]  # (n_tokens, n_used)
    b = as_vec_dot(read_f32(b_t), experts_t.type)[0]  # (n_tokens, n_used or 1, K)
    out = np.empty((ids.shape[0], ids.shape[1], experts_t.ne[1]), dtype=np.float32)
    for e in np.unique(ids):
        w = _expert_f32(experts_t, int(e))  # (M, K)
        tok, slot = np.nonzero(ids == e)
        x = b[tok, slot if b.shape[1] > 1 else 0]
        out[tok, slot] = x @ w.T
    _write(node, out)


def _expert_f32(experts: Tensor, e: int) -> np.ndarray:
    if numpy_dtype(experts.type) is not None:
        return experts.numpy()[0, e].astype(np.float32)
    raw = experts.raw_bytes()[e * experts.nb[2]:(e + 1) * experts.nb[2]]
    return dequantize(raw.reshape(experts.ne[1], experts.nb[1]), experts.type).astype(np.float32)


def _get_rows(node: Tensor) -> None:
    a, rows = node.source(0), node.source(1)
    idx = rows.numpy()  # (1, r2, r1, n)
    where = _cached_weight(a)
    if where is not None and dequant.cache().get(*where) is None:   # a token embedding: only the rows asked for
        _write(node, _rows_f32(a, idx).reshape(node.ne[::-1]).astype(numpy_dtype(node.type), copy=False))
        return
    values = a.numpy() if numpy_dtype(a.type) is not None else read_f32(a)
    out = np.empty(node.ne[::-1], dtype=numpy_dtype(node.type))
    for i2 in range(idx.shape[1]):
        for i1 in range(idx.shape[2]):
            out[i2, i1] = values[i2 % values.shape[0], i1 % values.shape[1], idx[0, i2, i1]]
    _write(node, out)


def _rows_f32(a: Tensor, idx: np.ndarray) -> np.ndarray:
    """Rows `idx` of a block-quantized matrix, dequantized alone (blocks never cross rows)."""
    flat = idx.reshape(-1).astype(np.int64)
    raw = a.raw_bytes().reshape(a.ne[1], a.nb[1])[flat]
    with np.errstate(all="ignore"):
        return dequantize(raw, a.type).astype(np.float32, copy=False)


def _soft_max(node: Tensor) -> None:
    x = read_f32(node.source(0)) * np.float32(node.op_params["scale"])
    mask = node.src[1]
    if node.op_params.get("max_bias", 0.0) != 0.0:
        raise ValueError("SOFT_MAX with ALiBi max_bias has no kernel")
    if mask is not None:
        m = read_f32(mask)[:, :, : x.shape[2], :]
        x = x + _tile_to(m, (m.shape[0] * (x.shape[0] // m.shape[0]), x.shape[1], x.shape[2], x.shape[3]))
    sinks = read_f32(node.src[2]).reshape(1, -1, 1, 1) if len(node.src) > 2 and node.src[2] is not None else None
    top = x.max(axis=-1, keepdims=True)
    if sinks is not None:   # one extra logit per head (src[2], ggml_soft_max_add_sinks) in max and sum
        top = np.maximum(top, sinks)
    e = np.exp(x - top)
    total = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks - top)
    _write(node, e / total)


def _rope(node: Tensor) -> None:
    """Mode 0 rotates adjacent pairs, mode 2 (NEOX) rotates (i, i + n_dims/2), as ggml-cpu."""
    if node.op_params.get("ext_factor", 0.0):
        raise BadInput(f"{node.name}: RoPE with YaRN scaling has no kernel (the runtime sizes such models, "
                       f"validate --reserve-only; it does not decode them)")
    x = read_f32(node.source(0)).copy()  # (a3, n_tokens, n_head, head_dim)
    pos = node.source(1).numpy()[0, 0, 0].astype(np.float64) * node.op_params.get("freq_scale", 1.0)
    n_dims, mode = node.op_params["n_dims"], node.op_params["mode"]
    inv = node.op_params["freq_base"] ** (-np.arange(0, n_dims, 2) / n_dims)
    if node.src[2] is not None:
        inv = inv / read_f32(node.src[2]).reshape(-1)[: n_dims // 2]
    theta = pos[:, None] * inv[None, :]  # (n_tokens, n_dims/2)
    cos, sin = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    if mode & 2:
        i0, i1 = np.arange(n_dims // 2), np.arange(n_dims // 2) + n_dims // 2
    else:
        i0, i1 = np.arange(0, n_dims, 2), np.arange(1, n_dims, 2)
    x0, x1 = x[..., i0].copy(), x[..., i1].copy()
    x[..., i0] = x0 * cos - x1 * sin
    x[..., i1] = x0 * sin + x1 * cos
    _write(node, x)


def _flash_attn_ext(node: Tensor) -> None:
    if node.op_params.get("max_bias", 0.0) != 0.0:   # embed: jina-bert-v2's ALiBi, as _soft_max refuses it
        raise ValueError("FLASH_ATTN_EXT with ALiBi max_bias has no kernel")
    q, k = read_f32(node.source(0)), read_f32(node.source(1))  # (1, H, T, D), (1, Hkv, KV, D); V: (1, Hkv, KV, Dv)
    mask = read_f32(node.src[3])[:, :, : q.shape[2], :] if node.src[3] is not None else None
    sinks = read_f32(node.src[4]) if node.src[4] is not None else None
    scale, softcap = node.op_params["scale"], node.op_params.get("softcap", 0.0)
    f16 = GGMLQuantizationType.F16
    small = q.shape[2] < FA_TILE_Q and node.source(1).type == f16 and node.source(2).type == f16
    if small and sinks is None and not softcap and q.shape[0] == 1:
        # K/V heads broadcast, V left f16 (converted only where the mask lets a cell through)
        out = flash_attn_f16_rows(q, k, _view(node.source(2)), mask, scale)
    else:
        v = read_f32(node.source(2))
        rep = q.shape[1] // k.shape[1]
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        out = flash_attn_f32(q, k, v, mask, scale, sinks, softcap)
    _write(node, np.swapaxes(out, 1, 2))


def _copy_values(src: Tensor, node: Tensor) -> None:
    values = src.numpy() if numpy_dtype(src.type) is not None else read_f32(src)
    target = node.numpy()
    target[...] = np.ascontiguousarray(values).reshape(target.shape).astype(target.dtype)


def _cont(node: Tensor) -> None:
    _copy_values(node.source(0), node)


def _set_rows(node: Tensor) -> None:
    rows, idx = read_f32(node.source(0)), node.source(1).numpy()  # (r3, r2, n, K), (1, c2, c1, n)
    target = node.numpy()
    for i3 in range(rows.shape[0]):
        for i2 in range(rows.shape[1]):
            sel = idx[0, i3 % idx.shape[1], i2 % idx.shape[2]]
            target[i3, i2, sel] = rows[i3, i2].astype(target.dtype)


def _add_id(node: Tensor) -> None:
    """ggml_add_id: row ids[t, u] of src1 added to src0[t, u] (per-expert biases)."""
    a, b, ids = read_f32(node.source(0)), read_f32(node.source(1)), node.source(2).numpy()  # ids (1, 1, T, U)
    _write(node, a + b[0, 0][ids[0, 0]][None])


def _div(node: Tensor) -> None:
    a, b = read_f32(node.source(0)), read_f32(node.source(1))
    _write(node, a / _tile_to(b, a.shape))


def _clamp(node: Tensor) -> None:
    _write(node, np.clip(read_f32(node.source(0)), node.op_params["min"], node.op_params["max"]))


def _sum_rows(node: Tensor) -> None:
    _write(node, read_f32(node.source(0)).sum(axis=-1, keepdims=True))


def _argsort(node: Tensor) -> None:
    """Row-wise argsort; DESC as ggml_argsort_top_k asks (a stable sort keeps ties in index order)."""
    x = read_f32(node.source(0))
    key = -x if node.op_params.get("order", "ASC") == "DESC" else x
    _write(node, np.argsort(key, axis=-1, kind="stable").astype(np.int32))


KERNELS: dict[Op, Callable[[Tensor], None]] = {
    Op.DIV: _div,
    Op.CLAMP: _clamp,
    Op.SUM_ROWS: _sum_rows,
    Op.ARGSORT: _argsort,
    Op.ADD: _add,
    Op.ADD_ID: _add_id,
    Op.MUL: _mul,
    Op.SCALE: _scale,
    Op.RMS_NORM: _rms_norm,
    Op.UNARY: _unary,
    Op.SQR: _sqr,
    Op.GLU: _glu,
    Op.MUL_MAT: _mul_mat,
    Op.MUL_MAT_ID: _mul_mat_id,
    Op.GET_ROWS: _get_rows,
    Op.SOFT_MAX: _soft_max,
    Op.ROPE: _rope,
    Op.FLASH_ATTN_EXT: _flash_attn_ext,
    Op.DUP: _cont,
    Op.CONT: _cont,
    Op.CPY: _cont,
    Op.SET_ROWS: _set_rows,
}
