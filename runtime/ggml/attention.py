"""Flash attention on arrays, as ggml-cpu computes it: the f32 formula of its tiled path and the
small-batch path's online softmax with an f16 V accumulator (kernels.py reads the tensors)."""
from __future__ import annotations

import numpy as np

from runtime.ggml.f16 import F16_MAX, F16Grid, f16_to_f32

# ggml-cpu's flash attention (ops.cpp): batches of at least GGML_FA_TILE_Q rows take the tiled
# path (f32 Q, K, V and accumulators, which the plain f32 formula below matches); smaller ones,
# generation included, convert Q to K's type and accumulate V in f16 with an online softmax,
# cell by cell. The f16 accumulator moves Gemma 3's logprobs by ~0.1, so it is followed here.
FA_TILE_Q = 64


def flash_attn_f32(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float,
                    sinks: np.ndarray | None, softcap: float = 0.0) -> np.ndarray:
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(scale)  # (1, H, T, KV)
    if softcap:   # ggml-cpu: s = softcap * tanh(s * scale / softcap), before the mask
        s = np.float32(softcap) * np.tanh(s / np.float32(softcap))
    if mask is not None:
        s = s + mask
    m = s.max(axis=-1, keepdims=True)
    if sinks is not None:  # attention sinks: one extra logit per head in the denominator
        m = np.maximum(m, sinks.reshape(1, -1, 1, 1))
    e = np.exp(s - m)
    denom = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        denom = denom + np.exp(sinks.reshape(1, -1, 1, 1) - m)
    return (e / denom) @ v  # (1, H, T, Dv)


def flash_attn_f16_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                         scale: float) -> np.ndarray:
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for f16 K/V: online softmax over the
    cells, V accumulated in f16 (ggml_vec_scale_f16 / ggml_vec_mad_f16), masked cells skipped.

    The running maximum and the factors ms (rescale on a new maximum) and vs (this cell's
    weight) follow from the scores alone, so they are computed for all cells at once; only the
    f16 accumulator, whose rounding depends on its own history, is updated cell by cell. A
    skipped cell has ms = 1 and vs = 0, which leaves an f16 accumulator exactly as it was.
    K and V may have fewer heads than Q (GQA: each shared by H / Hkv query heads); they are
    broadcast, each head's product the same BLAS call as on repeated heads. V may be f16.
    """
    n_head, n_tok, n_head_kv = q.shape[1], q.shape[2], k.shape[1]
    q = q.astype(np.float16).astype(np.float32)[0].reshape(n_head_kv, n_head // n_head_kv, n_tok, q.shape[-1])
    scores = (q @ np.swapaxes(k[0], -1, -2)[:, None]).reshape(n_head, n_tok, -1) * np.float32(scale)  # (H, T, KV)
    if mask is not None:
        scores = scores + mask[0]
    live = np.flatnonzero(np.isfinite(scores).any(axis=(0, 1)))
    s = scores[:, :, live]
    running = np.maximum.accumulate(s, axis=-1)
    before = np.concatenate([np.full(s.shape[:-1] + (1,), -np.inf, dtype=np.float32), running[..., :-1]], axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        grew = running > before
        ms = np.where(grew, np.exp(before - running), np.float32(1)).astype(np.float32)
        vs = np.where(np.isfinite(s), np.exp(s - running), np.float32(0)).astype(np.float32)
    total = (vs * np.flip(np.cumprod(np.flip(np.concatenate([ms[..., 1:], np.ones_like(ms[..., :1])], axis=-1),
                                             axis=-1), axis=-1), axis=-1)).sum(axis=-1, keepdims=True)
    rescale = np.asarray(grew.any(axis=(0, 1)))  # numpy types this scalar-or-array; it is (cells,)
    values = v[0][:, live, :]                                           # (Hkv, cells, Dv)
    if values.dtype == np.float16:
        values = f16_to_f32(values)
    acc = f16_accumulate(values, ms, vs, rescale)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (acc.astype(np.float32) / total)[None]


# Cells per batch: f32 terms are precomputed for a batch (at most FA_TERMS_ELEMENTS values),
# and whether f16 could overflow is checked once per batch.
FA_TERMS_ELEMENTS = 1 << 20
FA_BATCH_CELLS = 256
def f16_accumulate(values: np.ndarray, ms: np.ndarray, vs: np.ndarray, rescale: np.ndarray) -> np.ndarray:
    """The f16 V accumulator after every cell: acc = f16(f16(acc * ms) + v * vs) on a rescale,
    acc = f16(acc + v * vs) otherwise, each product and sum in f32 as ggml_vec_scale_f16 and
    ggml_vec_mad_f16 compute them. values (Hkv, cells, Dv) serve H / Hkv heads each. Returned
    as f32 holding f16 values."""
    h, t, n = ms.shape
    h_kv = values.shape[0]
    acc = np.zeros((h, t, values.shape[-1]), dtype=np.float32)       # (H, T, Dv)
    grid = F16Grid(acc)
    ms_cells = np.ascontiguousarray(np.moveaxis(ms, -1, 0))[..., None]  # (cells, H, T, 1)
    step = max(1, min(FA_BATCH_CELLS, FA_TERMS_ELEMENTS // max(1, acc.size)))
    v_max = np.abs(values).max(axis=(0, 2), initial=0.0)               # per cell
    vs_max = vs.max(axis=(0, 1), initial=0.0)
    for c0 in range(0, n, step):
        c1 = min(n, c0 + step)
        # terms[i] = v_i * vs_i for the cells of this batch, each a contiguous (H, T, Dv) block
        v_cells = np.moveaxis(values[:, c0:c1, :], 1, 0)[:, :, None, None, :]        # (c, Hkv, 1, 1, Dv)
        vs_cells = np.moveaxis(vs[..., c0:c1], -1, 0).reshape(c1 - c0, h_kv, h // h_kv, t, 1)
        terms = (v_cells * vs_cells).reshape(c1 - c0, h, t, -1)
        # |acc| cannot pass what it is now plus the terms' magnitudes (a rescale only shrinks
        # it), times 1 + 2^-11 per rounding; past F16_MAX / 2 (or NaN, inf), convert for real
        bound = float(np.abs(acc).max()) + float((v_max[c0:c1] * vs_max[c0:c1]).sum())
        if not bound * (1.0 + 2.0 ** -11) ** (2 * (c1 - c0)) < F16_MAX / 2:
            acc[...] = f16_steps_cast(acc, terms, ms_cells[c0:c1], rescale[c0:c1])
            continue
        add_and_round = grid.add_and_round
        for term, ms_i, rescaled in zip(terms, ms_cells[c0:c1], rescale[c0:c1].tolist(), strict=True):
            if rescaled:
                np.multiply(acc, ms_i, acc)
                add_and_round(None)
            add_and_round(term)
    return acc


def f16_steps_cast(acc: np.ndarray, terms: np.ndarray, ms_cells: np.ndarray, rescale: np.ndarray) -> np.ndarray:
    """f16_accumulate's steps through real f16 conversions (overflow to inf, NaN): one ufunc
    per step computes in f32 (dtype=float32) and rounds into the f16 output like astype."""
    acc16 = acc.astype(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(len(terms)):
            if rescale[i]:
                np.multiply(acc16, ms_cells[i], out=acc16, dtype=np.float32, casting="same_kind")
            np.add(acc16, terms[i], out=acc16, dtype=np.float32, casting="same_kind")
    return acc16.astype(np.float32)
