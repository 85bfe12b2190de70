"""Row-split matrix-vector products: blocks on ROW_ALIGN boundaries, bit-identical to one call."""
from __future__ import annotations

import numpy as np
import pytest

from runtime.ggml import build as B
from runtime.ggml import threads
from runtime.ggml.graph import GGMLType, Graph
from runtime.ggml.sched import Scheduler


@pytest.fixture
def split_everything(monkeypatch):
    """Two threads and no size threshold, so even test-sized products are split."""
    monkeypatch.setattr(threads, "MIN_SPLIT_ELEMENTS", 0)
    monkeypatch.setattr(threads, "MIN_TRY_ELEMENTS", 0)
    before = threads.n_threads()
    threads.set_threads(2)
    yield
    threads.set_threads(before)


def test_row_blocks_start_on_aligned_rows():
    assert threads.row_blocks(640, 2) == [(0, 320), (320, 640)]            # 10 units of 64: 5 + 5
    assert threads.row_blocks(1000, 2) == [(0, 512), (512, 1000)]          # 16 units: 8 + 8, the last one short
    assert threads.row_blocks(262144, 3) == [(0, 87360), (87360, 174720), (174720, 262144)]  # 4096 units
    assert threads.row_blocks(100, 2) == [(0, 64), (64, 100)]
    assert threads.row_blocks(64, 4) == [(0, 64)]                           # one unit: no split


@pytest.mark.parametrize("m,k", [(262144 // 64, 640), (2048, 640), (1024, 640), (640, 2048), (640, 1024),
                                 (1000, 256)])
def test_split_matvec_equals_the_whole_product(split_everything, m, k):
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal(k).astype(np.float32)
    np.testing.assert_array_equal(threads.matvec(a, x), a @ x)


def test_split_column_major_matvec_equals_the_whole_product(split_everything):
    """kernels.column_major's layout (sgemv's N kernel), at an output-matrix-like shape."""
    rng = np.random.default_rng(5)
    a = np.asfortranarray(rng.standard_normal((262144 // 16, 640)).astype(np.float32))
    x = rng.standard_normal(640).astype(np.float32)
    np.testing.assert_array_equal(threads.matvec(a, x), a @ x)


def test_mul_mat_kernel_splits_without_changing_a_bit(cpu, split_everything):
    rng = np.random.default_rng(1)
    w, x = B.new_input(GGMLType.F32, [96, 1000], "w"), B.new_input(GGMLType.F32, [96], "x")
    wv, xv = rng.standard_normal((1000, 96)).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    out = B.mul_mat(w, x)
    Scheduler([cpu]).compute(Graph.build(out), inputs={w: wv, x: xv})
    np.testing.assert_array_equal(out.get_data().reshape(-1), wv @ xv)


def test_one_thread_never_uses_the_pool(monkeypatch):
    monkeypatch.setattr(threads, "MIN_SPLIT_ELEMENTS", 0)
    monkeypatch.setattr(threads, "MIN_TRY_ELEMENTS", 0)
    before = threads.n_threads()
    threads.set_threads(1)
    try:
        monkeypatch.setattr(threads, "_pool", lambda: pytest.fail("pool used with one thread"))
        a = np.arange(256 * 8, dtype=np.float32).reshape(256, 8)
        np.testing.assert_array_equal(threads.matvec(a, np.ones(8, np.float32)), a.sum(axis=1))
    finally:
        threads.set_threads(before)


def test_thresholds_whole_tuned_always_split(monkeypatch):
    """Weights under MIN_TRY_ELEMENTS: one call; from MIN_SPLIT_ELEMENTS: always two blocks
    (one on the pool); in between: whole the first time, split the second (the tuner times
    both ways before it chooses); a column-major weight in between: always whole."""
    monkeypatch.setattr(threads, "MIN_TRY_ELEMENTS", 1000)
    monkeypatch.setattr(threads, "MIN_SPLIT_ELEMENTS", 4000)
    monkeypatch.setattr(threads, "_tuner", threads._Tuner())
    before = threads.n_threads()
    threads.set_threads(2)
    try:
        real_pool, used = threads._pool, []
        monkeypatch.setattr(threads, "_pool", lambda: used.append(1) or real_pool())
        x = np.ones(3, np.float32)

        def pool_calls(a: np.ndarray) -> int:
            used.clear()
            np.testing.assert_array_equal(threads.matvec(a, x), a.sum(axis=1))
            return len(used)

        def weight(rows: int, order: str = "C") -> np.ndarray:
            return np.array(np.arange(rows * 3, dtype=np.float32).reshape(rows, 3), order=order)

        assert pool_calls(weight(256)) == 0            # 768 elements
        assert pool_calls(weight(512)) == 0            # 1536: tuned, first call whole
        assert pool_calls(weight(512)) == 1            # second call split
        assert pool_calls(weight(512, "F")) == 0       # column-major: not tuned
        assert pool_calls(weight(2048)) == 1           # 6144: always split
        assert pool_calls(weight(2048, "F")) == 1
    finally:
        threads.set_threads(before)


def test_tuner_times_both_ways_then_keeps_the_faster_and_retries_the_other():
    tuner, key = threads._Tuner(), (2048, 640, 1)
    assert tuner.pick(key) is False            # call 1: nothing timed yet, whole first
    tuner.record(key, False, 2.0)
    assert tuner.pick(key) is True             # call 2: split not timed yet
    tuner.record(key, True, 1.0)
    picks = [tuner.pick(key) for _ in range(3, 33)]   # calls 3..32: split is faster
    assert [i + 3 for i, p in enumerate(picks) if not p] == [16, 32]   # the other way every 16th call
    for _ in range(8):                          # the machine gets busy: split now takes 3.0
        tuner.record(key, True, 3.0)
    # running mean of split: 1.0 moved a quarter of the way to 3.0 eight times = 3 - 2 * 0.75^8
    assert tuner.stats[key][1] == pytest.approx(3 - 2 * 0.75 ** 8)
    assert tuner.pick(key) is False            # call 33: whole (2.0) is now the faster
