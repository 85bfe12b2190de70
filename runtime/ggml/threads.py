"""Large matrix-vector products split by weight rows over a persistent pool of Python threads.

numpy's OpenBLAS stays on one thread (execute.limit_blas_threads: a second BLAS thread made
every small product slower on a shared 2-core machine); instead a product whose weight is
large is cut into contiguous row blocks, one per thread, each a single-threaded BLAS call
(numpy releases the GIL inside BLAS). Small products stay whole in the calling thread, where a
hand-off would cost more than it saves (bench/bench_runtime_speed.py).

Numerics: a row's result depends only on that row, the vector and the BLAS kernel the row
goes through. OpenBLAS's sgemv handles rows in groups, so blocks start on a multiple of
ROW_ALIGN rows: measured with this numpy's OpenBLAS 0.3.31 (Haswell kernels), a split at a
multiple of 16 rows gives bit-identical outputs and a split elsewhere does not (row-major
weights; _product says why column-major ones split by size only; test_speed_threads.py
checks). Products with several activation rows (a prompt) are not split: OpenBLAS picks its
sgemm kernels by size, and a split 256 x 640 weight times 9 rows, or 1024 x 640 times 2, came
out different in the last bit.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypedDict

import numpy as np

ROW_ALIGN = 64
# Weights of at least MIN_SPLIT_ELEMENTS are always split: Gemma 3 270M's 262144 x 640 output
# matrix took 22 ms split against 34 ms whole on an idle 2-core machine, and lost nothing with
# the other core busy. Weights under MIN_TRY_ELEMENTS stay whole: a hand-off to a worker and
# back costs 50-80 us. In between (a decode step's FFN and attention matrices, 0.15-0.5 ms
# each) the gain depends on whether the other core is free, which on a shared machine changes
# by the minute (measured: 2048 x 640 split 222 us against 414 us whole when idle, 386 us
# against 361 us when busy, and slower split between a decode step's other ops, where the
# worker wakes from idle), so each shape's two ways are timed as they run and the faster one
# is used (_Tuner); the results are bit-identical either way.
MIN_SPLIT_ELEMENTS = 1 << 22
MIN_TRY_ELEMENTS = 1 << 19
MAX_THREADS = 8   # memory-bound products stop gaining long before this

_lock = threading.Lock()
class _PoolState(TypedDict):
    n: int | None           # threads for split products; None until set_threads runs
    pool: ThreadPoolExecutor | None
    pid: int | None         # the process that made the pool


_state: _PoolState = {"n": None, "pool": None, "pid": None}


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
    return int(_state["n"])  # type: ignore[arg-type]  # set_threads has set it


def _pool() -> ThreadPoolExecutor:
    with _lock:
        pool = _state["pool"]
        if pool is None or _state["pid"] != os.getpid():  # a forked child has no worker threads
            n = int(_state["n"])  # type: ignore[arg-type]  # set: _run comes after _product's n_threads()
            pool = ThreadPoolExecutor(max_workers=max(1, n - 1), thread_name_prefix="fitplan-matmul")
            _state["pool"], _state["pid"] = pool, os.getpid()
        return pool


def row_blocks(n_rows: int, n_parts: int, align: int = ROW_ALIGN) -> list[tuple[int, int]]:
    """[start, stop) blocks covering n_rows, every start but the first a multiple of align,
    as even as that allows; fewer than n_parts blocks when the rows are few."""
    units = -(-n_rows // align)
    parts = max(1, min(n_parts, units))
    cuts = [min(n_rows, (units * i // parts) * align) for i in range(parts + 1)]
    return [(lo, hi) for lo, hi in itertools.pairwise(cuts) if hi > lo]


class _Tuner:
    """Per product shape, the running mean time of computing it whole and split; picks the
    faster, and every TRY_EVERY-th call the other, so a change in the machine's load is seen."""

    TRY_EVERY = 16
    WEIGHT = 0.25       # of the newest time in the running mean
    MAX_SHAPES = 4096

    def __init__(self) -> None:
        self.stats: dict[tuple[int, ...], list[float]] = {}   # shape -> [whole s, split s, calls]

    def pick(self, key: tuple[int, ...]) -> bool:
        st = self.stats.get(key)
        if st is None:
            if len(self.stats) >= self.MAX_SHAPES:
                self.stats.clear()
            st = self.stats[key] = [-1.0, -1.0, 0.0]
        st[2] += 1
        if st[0] < 0 or st[1] < 0:
            return st[0] >= 0           # time each way once: whole first
        favour = st[1] < st[0]
        return favour != (st[2] % self.TRY_EVERY == 0)

    def record(self, key: tuple[int, ...], split: bool, seconds: float) -> None:
        st = self.stats[key]
        i = 1 if split else 0
        st[i] = seconds if st[i] < 0 else st[i] + self.WEIGHT * (seconds - st[i])


_tuner = _Tuner()


def _product(a: np.ndarray, whole: Callable[[], np.ndarray], split: Callable[[int], np.ndarray]) -> np.ndarray:
    n = n_threads()
    if n == 1 or a.shape[0] < 2 * ROW_ALIGN or a.size < MIN_TRY_ELEMENTS:
        return whole()
    if a.size >= MIN_SPLIT_ELEMENTS:
        return split(n)
    if not a.flags.c_contiguous:
        # sgemv's N kernel (column-major weights) sums a small matrix's rows in an order that
        # depends on the row count (1000 x 256 split in two differed), so only the size rule,
        # which every run applies alike, decides for those
        return whole()
    key = a.shape
    use_split = _tuner.pick(key)
    t0 = time.perf_counter()
    out = split(n) if use_split else whole()
    _tuner.record(key, use_split, time.perf_counter() - t0)
    return out


def matvec(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """a @ x for a (M, K) weight and a (K,) vector; rows split over threads when that pays."""

    def split(parts: int) -> np.ndarray:
        out = np.empty(a.shape[0], dtype=np.result_type(a, x))
        _run([(lambda lo=lo, hi=hi: np.matmul(a[lo:hi], x, out=out[lo:hi]))
              for lo, hi in row_blocks(a.shape[0], parts)])
        return out

    return _product(a, lambda: a @ x, split)


def _run(jobs: list) -> None:
    """The first job in the calling thread, the others on the pool; returns when all are done."""
    futures: list[Future] = [_pool().submit(job) for job in jobs[1:]]
    try:
        jobs[0]()
    finally:
        for f in futures:
            f.result()
