"""numpy kernels, one table entry per op: `KERNELS[op](node)` writes `node` from its sources.

Every backend (the CPU and the virtual devices) executes with these, so a split graph and a
single-device graph compute the same numbers. A device supports an op only if it has a
kernel here (devices.py), so adding an op is: add a constructor in build.py, a function here,
and one line in `KERNELS`. Kernels compute into a temporary and then assign, which keeps the
allocator's in-place reuse (ggml_op_can_inplace) safe.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf.quants import dequantize

from runtime.graph import Op, Tensor, numpy_dtype


def read_f32(t: Tensor) -> np.ndarray:
    """The tensor's values as float32 in numpy order (ne3, ne2, ne1, ne0); dequantizes blocks."""
    if numpy_dtype(t.type) is not None:
        return t.numpy().astype(np.float32, copy=False)
    if not t.is_contiguous():
        raise ValueError(f"{t.name}: reading a non-contiguous {t.type.name} tensor is not supported")
    raw = t.raw_bytes().reshape(t.ne[3], t.ne[2], t.ne[1], t.nb[1])
    with np.errstate(all="ignore"):  # staged expert copies hold garbage outside the used experts
        return dequantize(raw, t.type).astype(np.float32, copy=False)


def _write(node: Tensor, values: np.ndarray) -> None:
    target = node.numpy()
    target[...] = values.reshape(target.shape)


def _tile_to(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """ggml_repeat semantics: b's dims divide the target's; numpy broadcasting only covers 1s."""
    return np.tile(b, tuple(s // d for s, d in zip(shape, b.shape)))


def _add(node: Tensor) -> None:
    a, b = read_f32(node.src[0]), read_f32(node.src[1])
    _write(node, a + _tile_to(b, a.shape))


def _mul(node: Tensor) -> None:
    a, b = read_f32(node.src[0]), read_f32(node.src[1])
    _write(node, a * _tile_to(b, a.shape))


def _scale(node: Tensor) -> None:
    _write(node, read_f32(node.src[0]) * np.float32(node.op_params["scale"]))


def _rms_norm(node: Tensor) -> None:
    x = read_f32(node.src[0])
    eps = node.op_params["eps"]
    _write(node, x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "SILU": _silu,
    "GELU": lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3))),
    "RELU": lambda x: np.maximum(x, 0.0),
}


def _unary(node: Tensor) -> None:
    _write(node, _UNARY[node.op_params["unary"]](read_f32(node.src[0])))


def _glu(node: Tensor) -> None:
    if node.op_params["glu"] != "SWIGLU":
        raise ValueError(f"GLU {node.op_params['glu']} has no kernel")
    _write(node, _silu(read_f32(node.src[0])) * read_f32(node.src[1]))


def _mul_mat(node: Tensor) -> None:
    a, b = read_f32(node.src[0]), read_f32(node.src[1])  # (a3, a2, M, K), (b3, b2, N, K)
    a = np.repeat(np.repeat(a, b.shape[0] // a.shape[0], axis=0), b.shape[1] // a.shape[1], axis=1)
    _write(node, b @ np.swapaxes(a, -1, -2))


def _mul_mat_id(node: Tensor) -> None:
    """Only the experts the router selected are read: a staged copy holds only those (seed 000)."""
    experts_t, b_t, ids_t = node.src[0], node.src[1], node.src[2]
    ids = ids_t.numpy()[0, 0]  # (n_tokens, n_used)
    b = read_f32(b_t)[0]  # (n_tokens, n_used or 1, K)
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
    a, rows = node.src[0], node.src[1]
    values = a.numpy() if numpy_dtype(a.type) is not None else read_f32(a)
    idx = rows.numpy()  # (1, r2, r1, n)
    out = np.empty(node.ne[::-1], dtype=numpy_dtype(node.type))
    for i2 in range(idx.shape[1]):
        for i1 in range(idx.shape[2]):
            out[i2, i1] = values[i2 % values.shape[0], i1 % values.shape[1], idx[0, i2, i1]]
    _write(node, out)


def _soft_max(node: Tensor) -> None:
    x = read_f32(node.src[0]) * np.float32(node.op_params["scale"])
    mask = node.src[1]
    if node.op_params.get("max_bias", 0.0) != 0.0:
        raise ValueError("SOFT_MAX with ALiBi max_bias has no kernel")
    if mask is not None:
        m = read_f32(mask)[:, :, : x.shape[2], :]
        x = x + _tile_to(m, (m.shape[0] * (x.shape[0] // m.shape[0]), x.shape[1], x.shape[2], x.shape[3]))
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    _write(node, e / e.sum(axis=-1, keepdims=True))


def _rope(node: Tensor) -> None:
    """Mode 0 rotates adjacent pairs, mode 2 (NEOX) rotates (i, i + n_dims/2), as ggml-cpu."""
    x = read_f32(node.src[0]).copy()  # (a3, n_tokens, n_head, head_dim)
    pos = node.src[1].numpy()[0, 0, 0].astype(np.float64)
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
    q, k, v = (read_f32(node.src[i]) for i in range(3))  # (1, H, T, D), (1, Hkv, KV, D), (1, Hkv, KV, Dv)
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(node.op_params["scale"])  # (1, H, T, KV)
    if node.src[3] is not None:
        s = s + read_f32(node.src[3])[:, :, : s.shape[2], :]
    m = s.max(axis=-1, keepdims=True)
    if node.src[4] is not None:  # attention sinks: one extra logit per head in the denominator
        m = np.maximum(m, read_f32(node.src[4]).reshape(1, -1, 1, 1))
    e = np.exp(s - m)
    denom = e.sum(axis=-1, keepdims=True)
    if node.src[4] is not None:
        denom = denom + np.exp(read_f32(node.src[4]).reshape(1, -1, 1, 1) - m)
    out = (e / denom) @ v  # (1, H, T, Dv)
    _write(node, np.swapaxes(out, 1, 2))


def _copy_values(src: Tensor, node: Tensor) -> None:
    values = src.numpy() if numpy_dtype(src.type) is not None else read_f32(src)
    target = node.numpy()
    target[...] = np.ascontiguousarray(values).reshape(target.shape).astype(target.dtype)


def _cont(node: Tensor) -> None:
    _copy_values(node.src[0], node)


def _set_rows(node: Tensor) -> None:
    rows, idx = read_f32(node.src[0]), node.src[1].numpy()  # (r3, r2, n, K), (1, c2, c1, n)
    target = node.numpy()
    for i3 in range(rows.shape[0]):
        for i2 in range(rows.shape[1]):
            sel = idx[0, i3 % idx.shape[1], i2 % idx.shape[2]]
            target[i3, i2, sel] = rows[i3, i2].astype(target.dtype)


KERNELS: dict[Op, Callable[[Tensor], None]] = {
    Op.ADD: _add,
    Op.MUL: _mul,
    Op.SCALE: _scale,
    Op.RMS_NORM: _rms_norm,
    Op.UNARY: _unary,
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
