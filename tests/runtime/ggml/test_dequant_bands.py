"""Weights past the dequant cache's room are read in row bands: the same bits as the whole product
(issue #22: bounded memory, numbers unchanged), and get_rows dequantizes only the rows it takes."""
from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import quantize

from runtime.ggml import build as B
from runtime.ggml import dequant
from runtime.ggml.backend import alloc_tensors
from runtime.ggml.graph import BufferUsage, GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS


def _weight(cpu, rows: int, cols: int, seed: int) -> Tensor:
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    t = Tensor(GGMLType.Q8_0, [cols, rows], name=f"w{rows}x{cols}")
    alloc_tensors(cpu.buffer_type, [t], BufferUsage.WEIGHTS)
    t.set_data(quantize(values, GGMLType.Q8_0))
    return t


def _product(cpu, w: Tensor, x: np.ndarray, capacity: int) -> np.ndarray:
    xt = Tensor(GGMLType.F32, [x.shape[1], x.shape[0]], name="x")
    out = B.mul_mat(w, xt)
    alloc_tensors(cpu.buffer_type, [xt, out])
    xt.numpy()[...] = x.reshape(xt.numpy().shape)
    dequant.cache().clear()
    dequant.set_capacity(capacity)
    KERNELS[Op.MUL_MAT](out)
    return out.get_data().copy()


@pytest.fixture
def small_bands(monkeypatch):
    monkeypatch.setattr(dequant, "BAND_BYTES", 64 * 256 * 4)   # 64-row bands of a 256-wide matrix
    yield
    dequant.cache().clear()
    dequant.set_capacity(None)


@pytest.mark.parametrize("rows,n_tokens", [(1000, 1), (1000, 9), (4096, 1), (4096, 9)])
def test_banded_product_has_the_whole_products_bits(cpu, small_bands, rows, n_tokens):
    """1000 rows: row-major; 4096 = 16 x 256: the column-major output-matrix layout."""
    w = _weight(cpu, rows, 256, seed=rows)
    assert len(dequant.row_bands(rows, 256 * 4, 64)) >= 3
    x = np.random.default_rng(7).standard_normal((n_tokens, 256)).astype(np.float32)
    whole = _product(cpu, w, x, capacity=1 << 30)
    assert dequant.cache().used == rows * 256 * 4            # kept whole
    banded = _product(cpu, w, x, capacity=0)
    assert dequant.cache().used == 0                          # read in bands, nothing kept
    np.testing.assert_array_equal(banded.view(np.uint32), whole.view(np.uint32))


def test_get_rows_of_a_weight_past_the_cache_takes_only_its_rows(cpu, small_bands):
    w = _weight(cpu, 1000, 256, seed=3)
    idx = Tensor(GGMLType.I32, [3], name="ids")
    out = B.get_rows(w, idx)
    alloc_tensors(cpu.buffer_type, [idx, out])
    idx.numpy()[...] = np.array([5, 999, 5], dtype=np.int32).reshape(idx.numpy().shape)
    dequant.cache().clear()
    dequant.set_capacity(0)
    KERNELS[Op.GET_ROWS](out)
    assert dequant.cache().used == 0
    banded = out.get_data().copy()
    dequant.set_capacity(1 << 30)
    KERNELS[Op.GET_ROWS](out)
    np.testing.assert_array_equal(banded, out.get_data())
