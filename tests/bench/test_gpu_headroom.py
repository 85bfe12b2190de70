"""Issue 42's consumer-card matrix on its smallest card (bench/bench_gpu_headroom.py runs all four): every
plan leaves at least its overhead plus the default margin of the card's free memory unused."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.bench_gpu_headroom import matrix
from planner.core.units import MiB
from planner.hardware.budgets import DEFAULT_DEVICE_MARGIN
from planner.llama.overhead import FIGURES, ProcessKind
from runtime.ggml.profiles import Backend

CUDA_OVERHEAD = FIGURES[Backend.CUDA, ProcessKind.LLAMA][0]


@pytest.fixture(scope="module")
def cells(tmp_path_factory) -> list:
    return matrix(Path(tmp_path_factory.mktemp("headroom")), cards=("rtx3060",))


def test_every_plan_leaves_overhead_and_margin(cells):
    assert len(cells) == 12
    planned = [c for c in cells if c.n_ctx]
    assert len(planned) == 12, [c for c in cells if not c.n_ctx]   # partial offload: every model plans on 12 GiB
    for c in planned:
        assert c.overhead_bytes == CUDA_OVERHEAD, c
        # the card's free memory (the catalog's 12 GiB) holds the rows, the overhead and the margin
        assert c.free_bytes - c.total_bytes - c.overhead_bytes >= DEFAULT_DEVICE_MARGIN, \
            (c, (c.free_bytes - c.total_bytes - c.overhead_bytes) / MiB)
        assert c.n_ctx >= (c.ctx or 1), c
