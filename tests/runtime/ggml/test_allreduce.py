"""The butterfly AllReduce over N numpy members. Expected schedules written out by hand from the
definition (seed 000 "Subgraphs, and the AllReduce between them"; ggml-backend-meta.cpp
allreduce_fallback): P = the largest power of two <= N; the excess folds into j - P; exchanges at
strides P/2 .. 1 between j and j XOR s; the excess gets the result back."""
from __future__ import annotations

import math

import numpy as np
import pytest

from runtime.ggml.allreduce import StepBuffers, StepKind, allreduce, n_reduce_steps, reduce_schedule

NB = 6 * 4 * 8   # a [6, 4] float64 buffer

F, X, U = StepKind.FOLD, StepKind.EXCHANGE, StepKind.UNFOLD

# (kind, stride, pushes, tmp buffer) per step, by hand
SCHEDULES = {
    2: [(X, 1, ((0, 1), (1, 0)), 0)],
    3: [(F, 2, ((2, 0),), 0),
        (X, 1, ((0, 1), (1, 0)), 1),
        (U, 2, ((0, 2),), None)],
    4: [(X, 2, ((0, 2), (1, 3), (2, 0), (3, 1)), 0),
        (X, 1, ((0, 1), (1, 0), (2, 3), (3, 2)), 1)],
    5: [(F, 4, ((4, 0),), 0),
        (X, 2, ((0, 2), (1, 3), (2, 0), (3, 1)), 1),
        (X, 1, ((0, 1), (1, 0), (2, 3), (3, 2)), 2),
        (U, 4, ((0, 4),), None)],
}


def _members(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # small integers in float64: every order of summation gives the exact same sum
    return [rng.integers(-50, 50, size=(6, 4)).astype(np.float64) for _ in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_every_member_ends_with_the_plain_sum(n):
    bufs = _members(n)
    expected = sum(b.copy() for b in bufs)
    allreduce(bufs)
    for j, b in enumerate(bufs):
        assert np.array_equal(b, expected), f"member {j}"


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_steps_pushes_and_bytes_per_step(n):
    steps = allreduce(_members(n))
    got = [(s.kind, s.stride, s.pushes, s.tmp_buffer) for s in steps]
    assert got == SCHEDULES[n]
    # each push moves the whole tensor once
    assert [s.bytes_moved for s in steps] == [len(p) * NB for _, _, p, _ in SCHEDULES[n]]
    adding = [s for s in steps if s.kind is not StepKind.UNFOLD]
    assert len(adding) == math.ceil(math.log2(n)) == n_reduce_steps(n)
    assert reduce_schedule(n, NB) == steps   # the data-free schedule is the one that ran


def test_bytes_moved_totals_by_hand():
    # N = 3: fold 1 push, one exchange of 2, copy back 1 -> 4 tensors; N = 5: 1 + 4 + 4 + 1 = 10
    assert sum(s.bytes_moved for s in reduce_schedule(3, 100)) == 4 * 100
    assert sum(s.bytes_moved for s in reduce_schedule(5, 100)) == 10 * 100
    assert sum(s.bytes_moved for s in reduce_schedule(4, 100)) == 8 * 100
    assert reduce_schedule(1, 100) == ()


def test_each_adding_step_lands_in_its_own_buffer():
    scratch = StepBuffers(5)
    bufs = _members(5)
    allreduce(bufs, scratch=scratch)
    # member 0 receives in the fold and both exchanges: three buffers; member 4 only gets the copy back
    assert [scratch.n_buffers(j) for j in range(5)] == [3, 2, 2, 2, 0]
    like = bufs[0]
    views = [scratch.get(0, k, like) for k in range(3)]
    assert not any(np.shares_memory(a, b) for i, a in enumerate(views) for b in views[i + 1:])


def test_an_uncomputed_member_joins_with_zeros():
    bufs = _members(3)
    bufs[1][...] = 1e6   # garbage in a slice that was never computed
    expected = bufs[0] + bufs[2]
    allreduce(bufs, computed=[True, False, True])
    for b in bufs:
        assert np.array_equal(b, expected)


def test_the_zero_scaling_keeps_nan_as_ggml_notes():
    bufs = _members(2)
    bufs[1][0, 0] = np.nan
    allreduce(bufs, computed=[True, False])
    assert np.isnan(bufs[0][0, 0]) and np.isnan(bufs[1][0, 0])   # 0 * NaN == NaN (ggml's FIXME)
