"""llama.cpp's AllReduce bytes (ggml-backend-meta.cpp allreduce_fallback), counted by hand per member
count: P the largest power of two <= N; N - P folds, log2 P butterfly steps of P pushes, N - P copies back."""
from __future__ import annotations

import pytest

from planner.checking.allreduce_report import allreduce_report, llama_cpp_bytes_per_reduce
from runtime.ggml.allreduce import reduce_schedule


@pytest.mark.parametrize("n, tensors", [(1, 0), (2, 2), (3, 1 + 2 + 1), (4, 4 + 4), (5, 1 + 4 + 4 + 1),
                                        (6, 2 + 4 + 4 + 2), (8, 8 * 3)])
def test_bytes_per_reduce_follow_the_fold_butterfly_and_copy_back(n: int, tensors: int) -> None:
    assert llama_cpp_bytes_per_reduce(n, 1000) == tensors * 1000
    # the runtime's schedule (runtime/ggml/allreduce.py, derived separately) moves the same
    if n > 1:
        assert sum(s.bytes_moved for s in reduce_schedule(n, 1000)) == tensors * 1000


def test_a_token_reduces_its_residual_twice_per_layer() -> None:
    # 32 layers of 4096 floats over 2 members: 64 reduces of 16 KiB, each pushed both ways
    r = allreduce_report(2, 32, 4096, reduces_per_token=64, bytes_per_token=64 * 2 * 16384)
    assert (r.llama_cpp_reduces_per_layer, r.llama_cpp_bytes_per_token) == (2, 64 * 2 * 16384)
    assert r.reduces_per_layer == 2
