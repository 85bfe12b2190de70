"""minimax-m3 (MiniMax Sparse Attention, runtime/engine/msa.py) on tiny files: caches and reserves against
llama.cpp's.

Expected figures are llama-fit-params -v on these very files (pinned build): the two "llama_kv_cache: size =
..." lines of llama_kv_cache_msa (main cache, then the indexer's), "graph: nodes = N" and "CPU compute buffer
size = X MiB".
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.core.errors import BadInput, GGUFError, ModelShapeError
from planner.gguf.keys import LLM_KV_ATTENTION_INDEXER_TYPES
from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.coverage import Status, coverage_table
from planner.memory.estimate import estimate
from planner.model.arch import model_facts
from planner.synth.gguf_factory import Q
from planner.synth.shapes_glm5 import minimax_m3_layout, tiny_glm5_next, tiny_minimax_m3
from planner.synth.shapes_moe import TINY, with_tokenizer
from runtime.engine.runner import ModelRunner
from tests.support.reserve_checks import MIB, assert_reserve_equals


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


def test_minimax_m3_is_simulated_in_the_coverage_table() -> None:
    row = next(r for r in coverage_table() if r.name == "minimax-m3")
    assert (row.status, row.kv) == (Status.SIMULATED, "exact")


# llama-fit-params -v on the tiny file: "graph (pp bs=N, tg bs=M): nodes = P / G" and "CPU compute buffer size =
# X MiB". With flash attention the sparse blocks' prompt graph (a block mask per stream) and token graph (gathered
# cells) differ; with -fa off every block attends densely and both graphs have 170 nodes.
LLAMA_CPP_MSA_RESERVE = {
    "-c 256": (266, 261, 2.39),
    "-c 256 -np 2": (372, 269, 2.39),          # two streams: two block masks and attentions, concatenated
    "-c 512 -np 3 -ub 64": (470, 269, 0.62),
    "-c 256 -ctk q8_0 -ctv q8_0": (302, 297, 2.67),   # the Hadamard rotations of a quantized cache
    "-c 2048 -ub 128": (266, 261, 6.27),
}


@pytest.mark.parametrize("flags", LLAMA_CPP_MSA_RESERVE)
def test_minimax_m3_msa_reserve_equals_llama_cpp(flags: str, minimax_m3: Path) -> None:
    pp, tg, mib = LLAMA_CPP_MSA_RESERVE[flags]
    report = ModelRunner.load(str(minimax_m3), parse_llama_flags(flags.split()), weights=False).reserve_report
    assert report is not None
    assert (report.n_nodes_pp, report.n_nodes_tg) == (pp, tg)
    assert round(report.compute_bytes["CPU"] / MIB, 2) == mib


def test_minimax_m3_dense_reserve_equals_llama_cpp(minimax_m3: Path) -> None:
    assert_reserve_equals(minimax_m3, "-c 256 -fa off", 170, 2.75)


def test_minimax_m3_runner_allocates_both_caches(minimax_m3: Path) -> None:
    runner = ModelRunner.load(str(minimax_m3), parse_llama_flags(["-c", "256"]), weights=False)
    assert runner.kv_bytes == {"CPU": (3 * 256 + 2 * 96) * 256 * 2}


def test_minimax_m3_is_sized_not_decoded(minimax_m3: Path) -> None:
    runner = ModelRunner.load(str(minimax_m3), parse_llama_flags(["-c", "256"]), weights=False)
    with pytest.raises(BadInput, match="sizes its graphs but does not run them"):
        runner.decode([1, 2, 3])


# --- glm5-next: its hybrid-idx memory (src/llama-memory-hybrid-idx.cpp) ------------------------------------------

@pytest.mark.parametrize("flags, expected", [
    # llama-fit-params -v on tiny_glm5_next (KDA, MLA, KDA, MLA): the MLA cache "0.12 MiB (256 cells, 2 layers)",
    # the recurrent states "R 0.02 MiB, S 0.12 MiB" and the indexer's "0.19 MiB (256 cells, 2 layers)"; by hand:
    # 2 x 256 x 128 x 2 B, 2 x (3 x 3 x 4 x 64 + 64 x 64 x 4) x 4 B, 2 x 256 x (3 x 64) x 2 B
    ("-c 256", 2 * 256 * 128 * 2 + 2 * (3 * 3 * 4 * 64 + 64 * 64 * 4) * 4 + 2 * 256 * 192 * 2),
    ("-c 256 -fa off", 2 * 256 * 128 * 2 + 2 * (3 * 3 * 4 * 64 + 64 * 64 * 4) * 4 + 2 * 256 * 192 * 2),
    # two streams of 256 cells and two state rows; q8_0 rows are 34 B per 32 values ("0.13", "0.29", "0.20 MiB")
    ("-c 512 -np 2 -ctk q8_0 -ctv q8_0",
     2 * 256 * 2 * 128 * 34 // 32 + 2 * 2 * (3 * 3 * 4 * 64 + 64 * 64 * 4) * 4 + 2 * 256 * 2 * 192 * 34 // 32),
])
def test_glm5_next_context_bytes(flags: str, expected: int, tmp_path: Path) -> None:
    [path] = tiny_glm5_next().write(tmp_path / "glm5-next.gguf")
    est = estimate(model_context(str(path)), flags.split())
    assert [d.context_bytes for d in est.devices if d.name == "Host"] == [expected]


def test_glm5_next_indexer_types_choose_the_indexer_caches(tmp_path: Path) -> None:
    """attention.indexer.types (one entry per trunk block) leaves block 3 sharing block 1's indexer: no cache."""
    spec = tiny_glm5_next()
    spec.metadata[LLM_KV_ATTENTION_INDEXER_TYPES.format(arch="glm5-next")] = [1, 1, 1, 0]
    [path] = spec.write(tmp_path / "glm5-next.gguf")
    facts = model_facts(read_model(str(path)))
    assert [lf.index_k for lf in facts.layers] == [0, 192, 0, 0]


def test_minimax_m3_without_indexer_keys_is_refused(tmp_path: Path) -> None:
    spec = tiny_minimax_m3()
    del spec.metadata["{arch}.attention.indexer.block_size"]
    [path] = spec.write(tmp_path / "no-block.gguf")
    with pytest.raises(GGUFError, match="missing required key minimax-m3.attention.indexer.block_size"):
        ModelRunner.load(str(path), parse_llama_flags(["-c", "256"]), weights=False)


def test_minimax_m3_needs_one_indexer_head_per_kv_group(tmp_path: Path) -> None:
    """minimax-m3.cpp asserts the indexer has one head per KV group (2 here): one head is refused by name."""
    lay = replace(TINY, n_rot=TINY.head_dim // 2, n_dense_lead=1, n_ff_shexp=TINY.n_ff_exp)
    spec = minimax_m3_layout(lay, n_index_head=1, index_dim=32, top_k=2, block=64, local=1, index_type=Q.Q8_0)
    [path] = with_tokenizer(spec, 1000, 4096, 10000.0).write(tmp_path / "one-head.gguf")
    with pytest.raises(ModelShapeError, match="one per group"):
        ModelRunner.load(str(path), parse_llama_flags(["-c", "256"]), weights=False)
