"""The meta device's split-state algebra: how each tensor is spread over N member devices.

A meta device wraps N devices (seed 000, "One backend that is secretly N"); every tensor on it
has a split state: split along one ggml dimension with exact per-device element counts,
MIRRORED (all of it on every member), or PARTIAL (every member holds a partial sum). Static
tensors (weights, caches) get theirs from a callback; a computed tensor's state follows from
its sources' states by a rule per op.

The stages, one module each: the values here; the per-op rules (meta_rules.py, a whitelist
table keyed by Op); the resolver that applies them with assume_sync (meta_resolve.py); the cut
at PARTIAL nodes with the delayed reduce (meta_cut.py); the butterfly AllReduce (allreduce.py);
the device, its slices and the execution (meta_device.py).

Simplification: one segment per state (`nr` repeats of it), so fused tensors that llama.cpp
splits as several segments (a fused QKV, Phi-3's fused up+gate) are not expressed.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.ggml.graph import MAX_DIMS, Tensor
from runtime.ggml.sched_errors import SchedulerError


class SplitAxis(enum.IntEnum):
    """ggml_backend_meta_split_axis (ggml-backend.h): four tensor dims, then two whole-tensor states."""

    AXIS_0 = 0
    AXIS_1 = 1
    AXIS_2 = 2
    AXIS_3 = 3
    MIRRORED = 10
    PARTIAL = 11

    @property
    def is_dim(self) -> bool:
        return self.value < MAX_DIMS


class MetaSplitError(SchedulerError):
    """A graph the meta device cannot split (ggml-backend-meta.cpp aborts: GGML_ASSERT/GGML_ABORT)."""


@dataclass(frozen=True)
class SplitState:
    """An axis and, for a tensor dim, each member's element count along it (one segment that
    repeats `nr` times along the axis, so member j holds ne[j] * nr of the axis)."""

    axis: SplitAxis
    ne: tuple[int, ...] = ()
    nr: int = 1

    def totals(self) -> tuple[int, ...]:
        """Each member's elements along the axis (all zero for a whole-tensor state)."""
        return tuple(n * self.nr for n in self.ne)

    def same_split(self, other: SplitState) -> bool:
        """split_states_equal: the same axis and the same per-member totals."""
        if self.axis != other.axis:
            return False
        a, b = self.totals(), other.totals()
        return a == b or (not any(a) and not any(b))


MIRRORED = SplitState(SplitAxis.MIRRORED)
PARTIAL = SplitState(SplitAxis.PARTIAL)


def split_along(axis: SplitAxis, ne: Sequence[int], nr: int = 1) -> SplitState:
    return SplitState(axis, tuple(int(n) for n in ne), nr)


def split_error(node: Tensor, why: str) -> MetaSplitError:
    return MetaSplitError(f"meta device: {node.op.value} node {node.name!r}: {why}")


def slice_counts(n: int, n_devices: int, granularity: int = 1, rotation: int = 0,
                 weights: Sequence[float] | None = None) -> tuple[int, ...]:
    """Split n elements over members in proportion to `weights` (even when None), each boundary
    rounded down to `granularity`, the remainder to the last; `rotation` shifts which member gets
    which piece so rounding does not always short the same one (llama-model.cpp
    llama_meta_device_get_split_state, its tensor_split scan and rotation)."""
    scan: list[float] = []
    for j in range(n_devices):
        w = 0.0 if weights is None else float(weights[(j + rotation) % n_devices])
        scan.append(w + (scan[-1] if scan else 0.0))
    out = [0] * n_devices
    low = 0
    for j in range(n_devices - 1):
        high = n * (j + 1) // n_devices if not scan or scan[-1] == 0.0 else int(n * scan[j] / scan[-1])
        high -= high % granularity
        out[(j + rotation) % n_devices] = high - low
        low = high
    out[(n_devices - 1 + rotation) % n_devices] = n - low
    return tuple(out)
