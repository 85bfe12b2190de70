"""Fixtures for the runtime tests: fresh devices per test (devices account their memory)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from planner.core.units import GiB
from runtime.ggml.backend import Backend, alloc_tensors, make_cpu, make_virtual
from runtime.ggml.graph import BufferUsage, GGMLType, Tensor
from runtime.ggml.sched import Scheduler


@pytest.fixture
def cpu() -> Backend:
    return make_cpu(capacity=1 * GiB)


@pytest.fixture
def gpu() -> Backend:
    return make_virtual("GPU0", 1 * GiB)


@pytest.fixture
def gpu1() -> Backend:
    return make_virtual("GPU1", 1 * GiB)


WeightFactory = Callable[..., Tensor]


@pytest.fixture
def weight() -> WeightFactory:
    """weight(home, ne, name, usage=WEIGHTS, seed=None): a tensor allocated on `home`'s
    buffer type, filled with reproducible random values when seed is given."""

    def make(home: Backend, ne: Sequence[int], name: str, usage: BufferUsage = BufferUsage.WEIGHTS,
             seed: int | None = None, ggml_type: GGMLType = GGMLType.F32) -> Tensor:
        t = Tensor(ggml_type, ne, name=name)
        alloc_tensors(home.buffer_type, [t], usage)
        if seed is not None:
            t.set_data(np.random.default_rng(seed).standard_normal(t.ne[::-1]).astype(np.float32))
        return t

    return make


@pytest.fixture
def splits_of() -> Callable[[Scheduler], list[tuple[str, int, int, tuple[str, ...]]]]:
    """The scheduler's split list as (backend, i_start, i_end, input names)."""
    return lambda s: [(sp.backend, sp.i_start, sp.i_end, sp.input_names) for sp in s.splits]
