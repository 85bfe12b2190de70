"""minimax-m3 (MiniMax Sparse Attention) and glm5-next on tiny files: caches and reserves against llama.cpp's.

Expected figures are llama-fit-params -v on these very files (pinned build): the two "llama_kv_cache: size =
..." lines of llama_kv_cache_msa (main cache, then the indexer's), "graph: nodes = N" and "CPU compute buffer
size = X MiB".
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.memory.coverage import coverage_table
from planner.memory.estimate import estimate
from planner.model.arch import model_facts
from planner.synth.shapes_glm5 import tiny_minimax_m3


@pytest.fixture(scope="module")
def minimax_m3(tmp_path_factory) -> Path:
    [path] = tiny_minimax_m3().write(tmp_path_factory.mktemp("glm5") / "minimax-m3.gguf")
    return path


@pytest.mark.parametrize("flags, expected", [
    # llama-fit-params -v: main "0.38 MiB (256 cells, 3 layers)" and indexer "0.09 MiB (256 cells, 2 layers),
    # K 0.03, V 0.06"; by hand: 3 x 256 x (2 x 64 + 2 x 64) x 2 B, then 2 x 256 x (32 + 64) x 2 B
    ("-c 256", (3 * 256 + 2 * 96) * 256 * 2),
    ("-c 256 -fa off", (3 * 256 + 2 * 96) * 256 * 2),    # one V head: transposed or not, the same width
    # q8_0 rows are 34 B per 32 values, both caches; two streams of 256 cells ("0.40 MiB", "0.10 MiB")
    ("-c 512 -np 2 -ctk q8_0 -ctv q8_0", (3 * 256 + 2 * 96) * 256 * 2 * 34 // 32),
    ("-c 1024 -np 4", (3 * 256 + 2 * 96) * 256 * 4 * 2),   # "1.50 MiB" and "0.38 MiB"
])
def test_minimax_m3_context_bytes(flags: str, expected: int, minimax_m3: Path) -> None:
    est = estimate(model_context(str(minimax_m3)), flags.split())
    assert [d.context_bytes for d in est.devices if d.name == "Host"] == [expected]


def test_minimax_m3_indexer_cache_skips_the_leading_dense_block(minimax_m3: Path) -> None:
    facts = model_facts(read_model(str(minimax_m3)))
    assert [(lf.index_k, lf.index_v) for lf in facts.layers] == [(0, 0), (32, 64), (32, 64)]


def test_minimax_m3_kv_is_exact_in_the_coverage_table() -> None:
    row = next(r for r in coverage_table() if r.name == "minimax-m3")
    assert row.kv == "exact"
