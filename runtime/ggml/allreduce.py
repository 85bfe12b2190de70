"""The generic AllReduce of the meta backend: a butterfly over N members' buffers.

Derived from ggml-backend-meta.cpp ggml_backend_meta_graph_compute (its allreduce_fallback,
used when the backend registry offers no native ggml_backend_comm_allreduce_tensor, e.g. NCCL):

- P is the largest power of two not above N. When N > P the excess members N-P.. first fold:
  member j pushes its buffer to member j - P, which adds it in place.
- Then one exchange per stride s = P/2, ..., 1: every member j < P pushes to j XOR s, and each
  receiver adds what it got. All pushes of a step land before any add of that step.
- Each push lands in a temporary buffer of the receiver that belongs to that step, so the copies
  of different steps cannot alias; there are ceil(log2 N) of them per member, the fold (when N is
  not a power of two) using the first.
- Finally the excess members get the result copied back from their partner.

A member whose slice was not computed joins with its buffer scaled by 0 first (ggml uses a SCALE
by 0, noting that 0 * NaN is still NaN; the same holds here).

`reduce_schedule` gives the steps without data, for the throughput model; `allreduce` runs them
over numpy buffers and returns the same steps.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from runtime.ggml.sched_errors import SchedulerError


class StepKind(enum.Enum):
    FOLD = "fold"           # excess members add into the lower ones
    EXCHANGE = "exchange"   # the butterfly proper: j and j XOR stride swap and add
    UNFOLD = "unfold"       # the result copied back to the excess members


@dataclass(frozen=True)
class ReduceStep:
    """One step: its (source, destination) pushes, the bytes they move, and the per-step temporary
    buffer index receivers use (None for the copy-back, which writes the result directly)."""

    kind: StepKind
    stride: int
    pushes: tuple[tuple[int, int], ...]
    bytes_moved: int
    tmp_buffer: int | None


def n_reduce_steps(n_devices: int) -> int:
    """ceil(log2 N): the steps that add (fold included), and the temporary buffers per member."""
    return math.ceil(math.log2(n_devices)) if n_devices > 1 else 0


def _largest_power_of_two(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def reduce_schedule(n_devices: int, nbytes: int) -> tuple[ReduceStep, ...]:
    """The butterfly's steps for N members reducing a tensor of `nbytes`."""
    if n_devices < 1:
        raise SchedulerError(f"an AllReduce needs at least one member, got {n_devices}")
    if n_devices == 1:
        return ()
    p = _largest_power_of_two(n_devices)
    steps: list[ReduceStep] = []
    excess = tuple((j, j - p) for j in range(p, n_devices))
    if excess:
        steps.append(ReduceStep(StepKind.FOLD, p, excess, len(excess) * nbytes, 0))
    stride = p // 2
    while stride >= 1:
        pushes = tuple((j, j ^ stride) for j in range(p))
        steps.append(ReduceStep(StepKind.EXCHANGE, stride, pushes, len(pushes) * nbytes, len(steps)))
        stride //= 2
    if excess:
        back = tuple((dst, src) for src, dst in excess)
        steps.append(ReduceStep(StepKind.UNFOLD, p, back, len(back) * nbytes, None))
    return tuple(steps)


class StepBuffers:
    """Each member's temporary buffers, one per adding step, grown to the largest tensor reduced
    (the meta backend keeps them across graphs: bcj.bufs sized to max_tmp_size)."""

    def __init__(self, n_devices: int) -> None:
        self.n_devices = n_devices
        self._bufs: list[list[np.ndarray]] = [[] for _ in range(n_devices)]

    def get(self, member: int, step: int, like: np.ndarray) -> np.ndarray:
        bufs = self._bufs[member]
        while len(bufs) <= step:
            bufs.append(np.empty(0, dtype=np.uint8))
        if bufs[step].nbytes < like.nbytes:
            bufs[step] = np.empty(like.nbytes, dtype=np.uint8)
        return bufs[step][:like.nbytes].view(like.dtype).reshape(like.shape)

    def n_buffers(self, member: int) -> int:
        """How many of the member's step buffers a reduce has used so far."""
        return sum(1 for b in self._bufs[member] if b.nbytes)


def _check(buffers: Sequence[np.ndarray]) -> None:
    if any(b.shape != buffers[0].shape or b.dtype != buffers[0].dtype for b in buffers):
        raise SchedulerError("AllReduce over buffers of different shapes or types")
    if any(not b.flags.c_contiguous for b in buffers):
        raise SchedulerError("AllReduce needs contiguous buffers (ggml asserts ggml_is_contiguous)")


def allreduce(buffers: Sequence[np.ndarray], computed: Sequence[bool] | None = None,
              scratch: StepBuffers | None = None) -> tuple[ReduceStep, ...]:
    """Sum `buffers` (one per member, same shape and dtype, contiguous) in place on every member."""
    if not buffers:
        raise SchedulerError("an AllReduce needs at least one member")
    _check(buffers)
    if computed is not None:
        for b, c in zip(buffers, computed, strict=True):
            if not c:
                b *= 0   # an uncomputed slice contributes nothing
    steps = reduce_schedule(len(buffers), buffers[0].nbytes)
    scratch = scratch if scratch is not None else StepBuffers(len(buffers))
    for step in steps:
        if step.tmp_buffer is None:
            for src, dst in step.pushes:
                buffers[dst][...] = buffers[src]
            continue
        landed = []
        for src, dst in step.pushes:   # every copy of the step before any add
            tmp = scratch.get(dst, step.tmp_buffer, buffers[dst])
            tmp[...] = buffers[src]
            landed.append((dst, tmp))
        for dst, tmp in landed:
            buffers[dst] += tmp
    return steps
