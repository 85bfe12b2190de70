"""Large matrix products split by weight rows over a persistent pool of Python threads.

numpy's OpenBLAS stays on one thread (execute.limit_blas_threads: a second BLAS thread made
every small product slower on a shared 2-core machine); instead a product whose weight is
large is cut into contiguous row blocks, one per thread, each a single-threaded BLAS call
(numpy releases the GIL inside BLAS). Small products stay whole in the calling thread, where a
hand-off would cost more than it saves (bench/bench_runtime_speed.py).

Numerics: a row's result depends only on that row, the activations and the BLAS kernel the
row goes through. OpenBLAS handles the rows of a product in groups, so blocks start on a
multiple of ROW_ALIGN rows: measured with this numpy's OpenBLAS 0.3.31 (Haswell kernels), a
split at a multiple of 16 rows gives bit-identical outputs and a split elsewhere does not
(tests/runtime/test_speed_threads.py checks the split result against the whole product).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

ROW_ALIGN = 64
# Weights below this many f32 elements are multiplied whole in the calling thread: handing a
# block to a worker costs tens of microseconds, about the time such a product takes.
MIN_SPLIT_ELEMENTS = 1 << 20
MAX_THREADS = 8   # memory-bound products stop gaining long before this

_lock = threading.Lock()
_state: dict[str, object] = {"n": None, "pool": None}


def default_threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def set_threads(n: int | None) -> None:
    """Threads for the split products (None: the cores this process may run on; 1: no split)."""
    with _lock:
        want = default_threads() if n is None else max(1, min(MAX_THREADS, int(n)))
        if want == _state["n"]:
            return
        old = _state["pool"]
        _state["n"], _state["pool"] = want, None
        if isinstance(old, ThreadPoolExecutor):
            old.shutdown(wait=True)


def n_threads() -> int:
    if _state["n"] is None:
        set_threads(None)
    return int(_state["n"])  # type: ignore[call-overload]


def _pool() -> ThreadPoolExecutor:
    with _lock:
        pool = _state["pool"]
        if pool is None:
            pool = ThreadPoolExecutor(max_workers=max(1, int(_state["n"]) - 1),  # type: ignore[call-overload]
                                      thread_name_prefix="fitplan-matmul")
            _state["pool"] = pool
        return pool  # type: ignore[return-value]


def row_blocks(n_rows: int, n_parts: int, align: int = ROW_ALIGN) -> list[tuple[int, int]]:
    """[start, stop) blocks covering n_rows, every start but the first a multiple of align,
    as even as that allows; fewer than n_parts blocks when the rows are few."""
    units = -(-n_rows // align)
    parts = max(1, min(n_parts, units))
    cuts = [min(n_rows, (units * i // parts) * align) for i in range(parts + 1)]
    return [(lo, hi) for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


def _split_count(a: np.ndarray) -> int:
    n = n_threads()
    if n == 1 or a.size < MIN_SPLIT_ELEMENTS or a.shape[0] < 2 * ROW_ALIGN:
        return 1
    return n


def matvec(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """a @ x for a (M, K) weight and a (K,) vector; rows split over threads when a is large."""
    parts = _split_count(a)
    if parts == 1:
        return a @ x
    out = np.empty(a.shape[0], dtype=np.result_type(a, x))
    _run([(lambda lo=lo, hi=hi: np.matmul(a[lo:hi], x, out=out[lo:hi])) for lo, hi in row_blocks(a.shape[0], parts)])
    return out


def matmat(rows: np.ndarray, a: np.ndarray) -> np.ndarray:
    """rows @ a.T for (N, K) activations and a (M, K) weight; a's rows split over threads."""
    parts = _split_count(a)
    if parts == 1:
        return rows @ a.T
    out = np.empty((rows.shape[0], a.shape[0]), dtype=np.result_type(a, rows))
    _run([(lambda lo=lo, hi=hi: np.matmul(rows, a[lo:hi].T, out=out[:, lo:hi]))
          for lo, hi in row_blocks(a.shape[0], parts)])
    return out


def _run(jobs: list) -> None:
    """The first job in the calling thread, the others on the pool; returns when all are done."""
    futures: list[Future] = [_pool().submit(job) for job in jobs[1:]]
    try:
        jobs[0]()
    finally:
        for f in futures:
            f.result()
