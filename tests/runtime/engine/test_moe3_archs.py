"""qwen3vlmoe, granitemoe, cohere2moe and bailingmoe2 on tiny files (planner/synth/shapes_moe3.py): the
reserve's node count and CPU compute buffer against llama.cpp's, and the compute simulated.

Expected figures come from the pinned llama-fit-params -v on these very files ("graph: nodes = N" and
"CPU compute buffer size = X MiB"); the peer test compares every node (op, shape, strides) with
fitplan-dump-nodes' graph of 4 tokens.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.synth.shapes_moe3 import TINY_SPECS
from runtime.engine.builder import BatchShape
from runtime.engine.fused import FUSED_ARCHS
from runtime.engine.hparams import MoeGating, read_hparams
from runtime.engine.runner import ModelRunner
from tests.support.nodes import node_shapes
from tests.support.reserve_checks import assert_reserve_equals

FLAGS = ("-c 256", "-c 256 -fa off", "-c 512 -np 2 -ub 64", "-c 256 -ctk q8_0 -ctv q8_0")
# llama-fit-params -v on each file of TINY_SPECS, per FLAGS: (nodes, CPU compute MiB)
LLAMA_CPP_RESERVE: dict[str, tuple[tuple[int, float], ...]] = {
    "qwen3vlmoe": ((165, 2.64), (180, 4.01), (171, 0.66), (201, 2.67)),
    "granitemoe": ((155, 1.63), (170, 2.75), (161, 0.41), (191, 1.66)),
    "granitemoe-shared": ((170, 2.11), (185, 2.75), (176, 0.53), (206, 2.14)),
    "cohere2moe": ((193, 2.76), (218, 3.51), (203, 0.69), (253, 2.57)),
    "cohere2moe-shared-ln": ((217, 2.76), (242, 3.51), (227, 0.69), (277, 2.57)),
    "cohere2moe-nextn": ((193, 2.76), (218, 3.51), (203, 0.69), (253, 2.57)),
    "bailingmoe2": ((179, 2.38), (194, 2.75), (185, 0.60), (215, 2.41)),
    "bailingmoe2-nextn": ((179, 2.38), (194, 2.75), (185, 0.60), (215, 2.41)),
}
ROWS = [(name, flags, *fig) for name, figs in LLAMA_CPP_RESERVE.items() for flags, fig in zip(FLAGS, figs, strict=True)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("moe3")
    paths = {}
    for name, spec in TINY_SPECS.items():
        [paths[name]] = spec().write(d / f"{name}.gguf")
    return paths


@pytest.mark.parametrize(("name", "flags", "n_nodes", "compute_mib"), ROWS)
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(name: str, flags: str, n_nodes: int, compute_mib: float,
                                                          tiny: dict[str, Path]) -> None:
    assert_reserve_equals(tiny[name], flags, n_nodes, compute_mib)


@pytest.mark.parametrize("arch", list(TINY_SPECS))
def test_compute_is_simulated(arch: str, tiny: dict[str, Path]) -> None:
    assert estimate(model_context(str(tiny[arch])), ["-c", "4096"]).compute_model == "simulated"


def test_qwen3vlmoe_is_built_by_the_fused_builder() -> None:
    """The M-RoPE positions and deepstack inputs are the fused builder's (it is keyed on the mrope fact)."""
    assert "qwen3vlmoe" in FUSED_ARCHS


# (gating, norm_w, w_scale, moe layers) as each graph passes them to build_moe_ffn for its tiny file, read off
# src/models/<arch>.cpp: qwen3vlmoe and granite-moe (granite.cpp's graph) hard-code softmax with normalisation
# and pass expert_weights_scale, which their loaders never read (0: no scale node); cohere2moe the file's gating
# (none written: sigmoid), expert_weights_norm (false) and scale (none), block 0 dense (leading_dense_block_count 1);
# bailingmoe2 the file's sigmoid, norm and scale 2.5, block 0 dense
ROUTING = {
    "qwen3vlmoe": (MoeGating.SOFTMAX, True, 0.0, (True, True, True)),
    "granitemoe": (MoeGating.SOFTMAX, True, 0.0, (True, True, True)),
    "cohere2moe": (MoeGating.SIGMOID, False, 0.0, (False, True, True, True, True)),
    "bailingmoe2": (MoeGating.SIGMOID, True, 2.5, (False, True, True)),
}


@pytest.mark.parametrize("arch", list(ROUTING))
def test_routing_as_the_loader_reads_it(arch: str, tiny: dict[str, Path]) -> None:
    r = read_hparams(read_model(str(tiny[arch]))).routing
    assert r is not None
    assert (r.gating, r.norm_w, r.w_scale, r.moe_layers) == ROUTING[arch]


def test_granitemoe_scales_from_the_file(tiny: dict[str, Path]) -> None:
    """The tiny file's embedding 12, residual 0.22, attention 1/64 and logit 6 multipliers."""
    hp = read_hparams(read_model(str(tiny["granitemoe"])))
    assert (hp.embd_scale_f, hp.residual_scale, hp.kq_scale, hp.logit_scale) == pytest.approx((12.0, 0.22, 1 / 64, 6.0))


# --- node for node against llama.cpp ----------------------------------------------------------------------
# ggml names a unary node by its function (ggml_op_desc); the runtime's op is UNARY with the function a parameter
UNARY_NAMES = frozenset({"SIGMOID", "SILU", "GELU", "TANH", "RELU", "EXP", "SOFTPLUS"})


DUMP_KINDS = {**dict.fromkeys(UNARY_NAMES, "UNARY"), "SWIGLU": "GLU"}


@pytest.mark.peer
@pytest.mark.parametrize("name", list(TINY_SPECS))
def test_every_node_equals_llama_cpp(llama_tools: Path, name: str, tiny: dict[str, Path], tmp_path: Path) -> None:
    subprocess.run([str(llama_tools / "fitplan-dump-nodes"), str(tiny[name]), str(tmp_path), "256", "4", "1", "2",
                    "3", "4"], check=True, capture_output=True, timeout=300)
    runner = ModelRunner.load(str(tiny[name]), parse_llama_flags(["-c", "256"]), weights=False, reserve=False)
    assert runner.kv is not None
    full = tuple((k, runner.kv.tables[k].size) for k in runner.kv.kind_order())
    ours = [(n.op.value, tuple(n.ne), tuple(n.nb)) for n in runner._graph(BatchShape(4, 1, full)).graph.nodes]
    assert node_shapes(tmp_path / "step0.bin", DUMP_KINDS) == ours


def test_bailingmoe2_selects_experts_within_groups(tiny: dict[str, Path]) -> None:
    """expert_group_count 4 and expert_group_used_count 2 reach build_moe_ffn (bailingmoe2 lifts the refusal
    the other architectures keep: tests/runtime/engine/test_moe_archs.py)."""
    r = read_hparams(read_model(str(tiny["bailingmoe2"]))).routing
    assert r is not None
    assert (r.n_groups, r.n_group_used) == (4, 2)


@pytest.mark.parametrize(("with_mtp", "trunk_only"), [("cohere2moe-nextn", "cohere2moe")])
def test_the_mtp_block_is_neither_loaded_nor_run(with_mtp: str, trunk_only: str, tiny: dict[str, Path]) -> None:
    """cohere2moe.cpp skips the MTP block's tensors unless MTP is loaded: the file with it sizes as the file
    without it (model, context and compute), its trunk being the same five blocks."""
    a = estimate(model_context(str(tiny[with_mtp])), ["-c", "4096"]).totals
    b = estimate(model_context(str(tiny[trunk_only])), ["-c", "4096"]).totals
    assert a == b
