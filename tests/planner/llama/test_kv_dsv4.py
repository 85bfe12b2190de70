"""DeepSeek-V4's memory (llama_kv_cache_dsv4, src/llama-kv-cache-dsv4.cpp) on planner/synth/shapes_dsv4's tiny
file: 4 blocks of compress ratios 0, 4, 128, 4, K head 128, indexer keys 64, window 32.

Expected bytes are derived here from the cache's definition; llama-fit-params -v printed the same parts for
`-c 4096` ("size = 0.75 MiB (768 cells, 4 layers, 1/1 seqs)" raw, 0.50 CSA at 1024 cells, 0.06 HCA at 256, 0.25
indexer, state buffers 0.03 / 0.12 / 0.02 MiB) and for `-c 4096 -np 4` (3.00 raw at 768 cells x 4 streams, 0.50
CSA at 256, 0.25 HCA at 256, 0.25 indexer; states 0.12 / 0.50 / 0.06 MiB).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType

from planner.core.errors import FlagError, GGUFError
from planner.gguf.keys import LLM_KV_ATTENTION_COMPRESS_RATIOS
from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.llama.placement import WeightOp, tensor_slots
from planner.memory.estimate import estimate
from planner.synth.gguf_factory import Typed
from planner.synth.shapes_dsv4 import deepseek4_tiny, hy_v4_tiny

F16, F32 = 2, 4
HEAD, INDEX = 128, 64


def _expected(n_ctx_seq: int, n_seq: int, raw_cells: int, k_row: int = HEAD * F16, i_row: int = INDEX * F16) -> int:
    """Raw K of every layer at the window's cells, CSA (2 layers) and HCA (1 layer) K at ceil(n_ctx_seq / r)
    cells padded to 256, the indexer's keys at the CSA cells, and the f32 compressor states (kv and score):
    CSA 2 x 128 wide by 8 rows, HCA 128 by 128, indexer 2 x 64 by 8; all per sequence."""
    csa, hca = -(-n_ctx_seq // 4), -(-n_ctx_seq // 128)
    csa, hca = -(-csa // 256) * 256, -(-hca // 256) * 256
    k = 4 * k_row * raw_cells + 2 * k_row * csa + k_row * hca + 2 * i_row * csa
    states = 2 * (2 * (2 * HEAD * 8) + 128 * 128 + 2 * (2 * INDEX * 8)) * F32
    return (k + states) * n_seq


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    [path] = deepseek4_tiny().write(tmp_path_factory.mktemp("dsv4") / "tiny.gguf")
    return path


def _context(path: Path, flags: str) -> int:
    est = estimate(model_context(str(path)), flags.split())
    return sum(d.context_bytes for d in est.devices)


@pytest.mark.parametrize("flags, expected", [
    ("-c 4096", _expected(4096, 1, 768)),                    # window 32 + ubatch 512, padded to 256
    ("-c 4096 -np 4", _expected(1024, 4, 768)),              # one stream per sequence, n_ctx_seq 1024
    ("-c 65536 -np 2 -ctk q8_0 -ctv q8_0", _expected(32768, 2, 768, HEAD // 32 * 34, INDEX // 32 * 34)),
    ("-c 8192 --swa-full", _expected(8192, 1, 8192)),        # the raw cache takes every cell
    ("-c 131072 -np 3 -ub 256", _expected(43776, 3, 512)),   # llama.cpp's n_ctx_seq 43776 (printed)
])
def test_dsv4_context_bytes(tiny: Path, flags: str, expected: int) -> None:
    assert _context(tiny, flags) == expected


def test_dsv4_refuses_different_k_and_v_types(tiny: Path) -> None:
    # llama_init_from_model: "model does not support different K (q8_0) and V (f16) cache types" (DeepSeek-V4 by
    # name, its caches being K only)
    with pytest.raises(FlagError, match="different K"):
        estimate(model_context(str(tiny)), ["-c", "4096", "-ctk", "q8_0"])


def test_dsv4_compress_ratios_shorter_than_the_blocks_are_refused(tmp_path: Path) -> None:
    spec = deepseek4_tiny()
    spec.metadata[LLM_KV_ATTENTION_COMPRESS_RATIOS] = Typed([0, 4, 128], GGUFValueType.ARRAY, GGUFValueType.UINT32)
    [path] = spec.write(tmp_path / "short.gguf")
    with pytest.raises(GGUFError, match="compress_ratios"):
        model_context(str(path))


def test_reshaped_output_a_is_a_3d_weight(tiny: Path) -> None:
    """attn_output_a is created 3-D (deepseek4.cpp reshapes it to {.., o_lora_rank, o_groups}), so the CPU repack
    buffer, which takes 2-D matrices only, never holds it; attn_output_b stays 2-D."""
    slots = {s.name: s for s in tensor_slots(read_model(str(tiny)), 4)}
    assert (slots["blk.1.attn_output_a.weight"].n_dims, slots["blk.1.attn_output_b.weight"].n_dims) == (3, 2)


def test_routing_table_and_position_embeddings_are_tested_by_get_rows(tiny: Path) -> None:
    """llm_tensor_info_mapping tests ffn_gate_tid2eid and the compressors' APE with GGML_OP_GET_ROWS: a device's
    size limit sees 512 gathered rows, not a 512-token matmul against the whole vocabulary (on lavapipe, whose
    largest tensor is 128 MiB, llama.cpp keeps DeepSeek-V4-Flash's 3 MiB routing tables on Vulkan0)."""
    slots = {s.name: s for s in tensor_slots(read_model(str(tiny)), 4)}
    names = ("blk.0.ffn_gate_tid2eid.weight", "blk.1.attn_compressor_ape.weight", "blk.1.indexer_compressor_ape.weight")
    assert {slots[n].op for n in names} == {WeightOp.GET_ROWS}
    assert slots["blk.1.attn_compressor_kv.weight"].op is WeightOp.MUL_MAT


# hy_v4 (hy-v4.cpp): deepseek2's K-only MLA cache (kv_lora 128 + rope 32 per cell and layer, 4 layers) and, when
# the file has an indexer, llama_kv_cache_dsa's key cache of the blocks attention.indexer.types marks full (2 of
# them, 64 keys per cell). llama-fit-params -v printed "size = 5.00 MiB (4096 cells, 4 layers, 1/1 seqs)" and
# "size = 1.00 MiB (4096 cells, 2 layers, 1/1 seqs)" for -c 4096.
@pytest.mark.parametrize("dsa", [True, False])
@pytest.mark.parametrize("flags, cells, n_seq", [("-c 4096", 4096, 1), ("-c 8192 -np 2", 4096, 2)])
def test_hy_v4_context_bytes(tmp_path: Path, dsa: bool, flags: str, cells: int, n_seq: int) -> None:
    [path] = hy_v4_tiny(dsa).write(tmp_path / "hy.gguf")
    per_cell = 4 * (128 + 32) * F16 + (2 * 64 * F16 if dsa else 0)
    assert _context(path, flags) == per_cell * cells * n_seq
