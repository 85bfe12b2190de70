"""step35, mimo2 and hy_v3 on tiny files (planner/synth/shapes_moe26.py): their KV facts,
the MTP-block weights the pinned llama.cpp allocates without --spec-type draft-mtp, and the reserve's node
count and CPU compute buffer against llama.cpp's.

Expected figures come from the pinned llama-fit-params on these very files (`--fit-print on` context
column; -v "graph: nodes = N" and "CPU compute buffer size = X MiB") or are derived here by hand.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from planner.core.units import MiB
from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.synth.shapes_moe26 import TINY_SPECS
from runtime.engine.hparams import MoeGating, read_hparams
from runtime.engine.runner import ModelRunner
from tests.runtime.engine.test_lfm2 import _graph_nodes
from tests.support.nodes import node_shapes
from tests.support.reserve_checks import assert_reserve_equals

# llama-fit-params --fit-print on -c 4096, context column (MiB) of each tiny file
LLAMA_CPP_CONTEXT_MIB = {
    "hy_v3": 6,   # 3 trunk blocks x 4096 cells x 2 KV heads x 64 x f16 x (K + V); the MTP block has no cache
}
# llama-fit-params -v "llama_kv_cache: size = X MiB" lines (the full and the sliding-window cache), summed in bytes
LLAMA_CPP_CONTEXT_BYTES = {
    # full: 4096 cells x 1 KV head x (64 + 32) x f16; SWA: 768 cells x 3 blocks x 2 KV heads x (64 + 32) x f16
    ("mimo2", "-c 4096"): 786432 + 884736,
    ("mimo2", "-c 4096 -np 4"): 786432 + 3538944,
    ("mimo2", "-c 8192 -ctk q8_0 -ctv q8_0 -fa on"): 835584 + 470016,
    # full: 4096 cells x 2 KV heads x 64 x f16 x (K + V); SWA: 768 cells x 3 blocks x the same
    ("step35", "-c 4096"): 2097152 + 1179648,
    ("step35", "-c 4096 -np 4"): 2097152 + 4718592,
    ("step35", "-c 8192 -ctk q8_0 -ctv q8_0 -fa on"): 2228224 + 626688,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("moe26")
    paths = {}
    for arch, spec in TINY_SPECS.items():
        [paths[arch]] = spec().write(d / f"{arch}.gguf")
    return paths


@pytest.mark.parametrize("arch", list(LLAMA_CPP_CONTEXT_MIB))
def test_context_equals_llama_cpp(arch: str, tiny: dict[str, Path]) -> None:
    [host] = estimate(model_context(str(tiny[arch])), ["-c", "4096"]).devices
    assert host.context_bytes == LLAMA_CPP_CONTEXT_MIB[arch] * MiB


def test_step35_mtp_tensors_loaded_without_draft_mtp(tiny: dict[str, Path]) -> None:
    """step35.cpp's load_block_mtp creates the Q/K norms, the head gate and the FFN with TENSOR_NOT_REQUIRED
    only: llama.cpp allocates them for the skipped MTP block; the rest it logs as unused."""
    ctx = model_context(str(tiny["step35"]))
    loaded = {s.name for s in ctx.loaded_slots(parse_llama_flags([]))}
    mtp = {s.name for s in ctx.slots if s.layer == 4}
    assert mtp & loaded == {f"blk.4.{t}.weight" for t in ("attn_q_norm", "attn_k_norm", "attn_gate", "ffn_gate",
                                                          "ffn_down", "ffn_up")}


@pytest.mark.parametrize(("arch", "flags"), list(LLAMA_CPP_CONTEXT_BYTES))
def test_context_bytes_equal_llama_cpp(arch: str, flags: str, tiny: dict[str, Path]) -> None:
    [host] = estimate(model_context(str(tiny[arch])), flags.split()).devices
    assert host.context_bytes == LLAMA_CPP_CONTEXT_BYTES[arch, flags]


def test_hy_v3_mtp_ffn_is_loaded_without_draft_mtp(tiny: dict[str, Path]) -> None:
    """hy-v3.cpp's load_block creates the FFN, router, experts and shared expert with TENSOR_NOT_REQUIRED
    only: llama.cpp allocates the MTP block's (a dense FFN in this file) even when the block is skipped; its
    attention, norms and eh_proj carry the skip (llama.cpp logs them as unused)."""
    ctx = model_context(str(tiny["hy_v3"]))
    loaded = {s.name for s in ctx.loaded_slots(parse_llama_flags([]))}
    mtp = {s.name for s in ctx.slots if s.layer == 3}
    assert mtp & loaded == {"blk.3.ffn_gate.weight", "blk.3.ffn_down.weight", "blk.3.ffn_up.weight"}
    assert mtp <= {s.name for s in ctx.loaded_slots(parse_llama_flags(["--spec-type", "draft-mtp"]))}


FLAGS = ("-c 256", "-c 256 -fa off", "-c 512 -np 2 -ub 64", "-c 256 -ctk q8_0 -ctv q8_0")
# llama-fit-params -v on each tiny file, per FLAGS: (nodes, CPU compute MiB)
LLAMA_CPP_RESERVE: dict[str, tuple[tuple[int, float], ...]] = {
    "hy_v3": ((156, 2.13), (171, 2.75), (162, 0.53), (192, 2.41)),
    "mimo2": ((185, 2.64), (206, 3.01), (193, 0.66), (209, 2.67)),
    "step35": ((247, 2.26), (267, 4.02), (255, 0.57), (295, 2.32)),
    "mimo2-fused": ((177, 2.51), (198, 2.76), (185, 0.63), (201, 2.67)),
}
ROWS = [(arch, flags, *fig) for arch, figs in LLAMA_CPP_RESERVE.items() for flags, fig in zip(FLAGS, figs, strict=True)]


@pytest.mark.parametrize(("arch", "flags", "n_nodes", "compute_mib"), ROWS)
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(arch: str, flags: str, n_nodes: int, compute_mib: float,
                                                          tiny: dict[str, Path]) -> None:
    assert_reserve_equals(tiny[arch], flags, n_nodes, compute_mib)


@pytest.mark.parametrize("arch", list(LLAMA_CPP_RESERVE))
def test_compute_is_simulated(arch: str, tiny: dict[str, Path]) -> None:
    assert estimate(model_context(str(tiny[arch])), ["-c", "4096"]).compute_model == "simulated"


def test_hy_v3_routing_as_the_loader_reads_it(tiny: dict[str, Path]) -> None:
    """hy-v3.cpp: sigmoid unless the file names another gating, the file's expert_weights_norm (true) and scale
    (2.5); block 0 of the tiny file has no ffn_gate_inp, so build_ffn runs there."""
    r = read_hparams(read_model(str(tiny["hy_v3"]))).routing
    assert r is not None
    assert (r.gating, r.norm_w, r.w_scale, r.moe_layers) == (MoeGating.SIGMOID, True, 2.5, (False, True, True))


def test_mimo2_hparams_as_the_loader_reads_them(tiny: dict[str, Path]) -> None:
    """mimo2.cpp: K heads of 64 and V heads of 32 (key_length, value_length), the value scale 0.707 (not 1), the
    graph's hard-coded sigmoid gating with normalised weights and no scale; block 0 has no router."""
    hp = read_hparams(read_model(str(tiny["mimo2"])))
    assert (hp.head_dim, hp.hd_v, hp.n_head_kv, hp.swa) == (64, 32, (1, 2, 2, 2), (False, True, True, True))
    assert hp.attn_value_scale == pytest.approx(0.707)
    assert hp.routing is not None
    r = hp.routing
    assert (r.gating, r.norm_w, r.w_scale, r.moe_layers) == (MoeGating.SIGMOID, True, 0.0, (False, True, True, True))


def test_step35_hparams_as_the_loader_reads_them(tiny: dict[str, Path]) -> None:
    """step35.cpp: 4 heads in the full-attention block, 6 in the sliding-window ones; 64 dims roped in the
    sliding-window blocks (rope.dimension_count, no _swa key) and half of them in the full one (the builder
    halves); the file's clamps; sigmoid gating with the file's norm and scale; block 0 has no router."""
    hp = read_hparams(read_model(str(tiny["step35"])))
    assert (hp.n_heads, hp.n_rot, hp.n_rot_swa) == ((4, 6, 6, 6), 64, 64)
    assert (hp.swiglu_clamp_exp, hp.swiglu_clamp_shexp) == ((0.0, 0.0, 7.0, 0.0), (7.0, 0.0, 0.0, 7.0))
    assert hp.routing is not None
    r = hp.routing
    assert (r.gating, r.norm_w, r.w_scale, r.moe_layers) == (MoeGating.SIGMOID, True, 3.0, (False, True, True, True))


# fitplan-dump-nodes names the unary and GLU ops; the runtime's graph their families
DUMP_OPS = {"SWIGLU": "GLU", "SIGMOID": "UNARY", "SILU": "UNARY"}


@pytest.mark.peer
@pytest.mark.parametrize("arch", list(LLAMA_CPP_RESERVE))
def test_every_node_equals_llama_cpp(arch: str, llama_tools: Path, tiny: dict[str, Path], tmp_path: Path) -> None:
    """fitplan-dump-nodes on 4 tokens at -c 256: every node's op, shape and strides, in llama.cpp's order."""
    subprocess.run([str(llama_tools / "fitplan-dump-nodes"), str(tiny[arch]), str(tmp_path), "256", "4",
                    "1", "2", "3", "4"], check=True, capture_output=True, timeout=300)
    theirs = node_shapes(tmp_path / "step0.bin", DUMP_OPS)
    ours = [(n.op.value, tuple(n.ne), tuple(n.nb)) for n in _graph_nodes(tiny[arch], 4, [])]
    assert theirs == ours


@pytest.mark.parametrize("arch", list(LLAMA_CPP_RESERVE))
def test_decode_runs_the_graph(arch: str, tiny: dict[str, Path]) -> None:
    """The runtime executes each graph (sigmoid routers and gates, clamps, the padded V), not only sizes it."""
    runner = ModelRunner.load(str(tiny[arch]), parse_llama_flags(["-c", "256", "-fa", "off"]))
    logits = runner.decode([1, 2, 3, 4])
    assert logits.shape == (4, 1000)
    assert np.isfinite(logits).all()
