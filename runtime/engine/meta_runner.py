"""The runner's meta backend for `-sm tensor`: the placement's one `Meta()` device made of its
members (planner/llama/placement.meta_device), weights split as llama_meta_device_get_split_state
splits a llama-shaped model (runtime/engine/tensor_split.py), timed per split and counting the
AllReduces it ran, so validate can report bytes moved per token and reduce points per layer.

The members' own buffers hold one graph's slices at a time (runtime/ggml/meta_device.py), not the
weights for good, so they get no budget of their own: the meta device's buffer, which holds the
full images, is the one measured against the `Meta()` row's budget (llama.cpp's get_alloc_size of
the meta buffer type is the largest member's for the full tensor as well).
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runtime.engine.hparams import HParams
from runtime.engine.tensor_split import LlamaTensorSplit
from runtime.ggml.backend import Backend
from runtime.ggml.graph import Tensor
from runtime.ggml.meta_device import MetaBackend, MetaDevice
from runtime.ggml.profiles import BackendProfile


@dataclass(frozen=True)
class ReduceCount:
    """The AllReduces of one decode step: how many, and the bytes their steps pushed between members."""

    n_reduces: int
    bytes_moved: int


class TimedMetaBackend(MetaBackend):
    """A meta backend that records the time of each split and the AllReduces it ran since `clear`."""

    def __init__(self, device: MetaDevice, static: LlamaTensorSplit) -> None:
        super().__init__(device, static)
        self.split_seconds: list[float] = []
        self.n_reduces = 0
        self.bytes_moved = 0

    def clear(self) -> None:
        self.split_seconds, self.n_reduces, self.bytes_moved = [], 0, 0

    def compute(self, nodes: Sequence[Tensor]) -> None:
        t0 = time.perf_counter()
        super().compute(nodes)
        self.split_seconds.append(time.perf_counter() - t0)
        assert self.last_run is not None
        self.n_reduces += len(self.last_run.reduces)
        self.bytes_moved += self.last_run.reduced_bytes

    def count(self) -> ReduceCount:
        return ReduceCount(self.n_reduces, self.bytes_moved)


def make_meta_backend(name: str, members: Sequence[Backend], capacity: int, profile: BackendProfile | None,
                      compute_capability: int | None, hp: HParams, weights: Mapping[str, Tensor],
                      tensor_split: Sequence[float] = ()) -> TimedMetaBackend:
    """llama.cpp's one backend over `members` (ggml_backend_meta_device): `weights` is the runner's
    dict, read by the split callback when a graph runs (it is filled after this is built). -ts
    weights the slices as it weights llama.cpp's (all zeros: even)."""
    device = MetaDevice(members, name=name, capacity=capacity, profile=profile,
                        compute_capability=compute_capability)
    ts = list(tensor_split[:len(members)])
    weighted = ts if any(ts) and len(ts) == len(members) else None
    return TimedMetaBackend(device, LlamaTensorSplit(hp, weights, len(members), weighted))
