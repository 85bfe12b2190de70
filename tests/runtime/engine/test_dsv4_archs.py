"""hy_v4's builder (runtime/engine/hy_v4.py) on planner/synth/shapes_dsv4's tiny files: four blocks (the first
dense), MLA of kv_lora 128 + rope 32, 4 iHC streams; "hy-v4" with the DSA indexer on blocks 0 and 2, "hy-v4-full"
the full-attention checkpoint (no indexer). deepseek4's (runtime/engine/deepseek4.py) on deepseek4_tiny: four
blocks (no compression, CSA, HCA, CSA), the first hash-routed. Expected figures are llama-fit-params -v on these
very files (pinned build): "graph: nodes = N" and "CPU compute buffer size = X MiB".
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from planner.core.errors import BadInput
from planner.gguf.reader import read_model
from planner.hardware.inventory import HostSpec, Inventory
from planner.hardware.vulkan_devices import LAVAPIPE, vulkan_device_spec
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.memory.coverage import Status, architecture_coverage
from planner.memory.estimate import estimate
from planner.synth.lora_factory import lora_layout, write_lora
from planner.synth.shapes_dsv4 import deepseek4_tiny, hy_v4_tiny
from runtime.engine.builder import BatchShape
from runtime.engine.runner import ModelRunner
from runtime.ggml.graph import Op
from tests.support.nodes import read_records
from tests.support.reserve_checks import assert_reserve_equals


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dsv4")
    [dsa] = hy_v4_tiny(True).write(d / "hy-v4.gguf")
    [full] = hy_v4_tiny(False).write(d / "hy-v4-full.gguf")
    [ds4] = deepseek4_tiny().write(d / "deepseek4.gguf")
    return {"hy-v4": dsa, "hy-v4-full": full, "deepseek4": ds4}


# llama-fit-params -v on the tiny files: (graph nodes, CPU compute buffer MiB)
LLAMA_CPP_RESERVE = {
    "hy-v4": {"-c 4096": (844, 22.89), "-c 4096 -fa off": (852, 66.89), "-c 8192 -np 4": (850, 14.89),
              "-c 4096 -ub 128": (844, 5.72), "-c 4096 -ctk q8_0 -ctv q8_0": (844, 22.89)},
    # the full-attention checkpoint: no indexer and no top-k masks
    "hy-v4-full": {"-c 4096": (778, 13.03), "-c 4096 -fa off": (786, 47.78), "-c 8192 -np 4": (782, 11.03),
                   "-c 4096 -ub 128": (778, 3.26), "-c 4096 -ctk q8_0 -ctv q8_0": (778, 13.03)},
    # q8_0 caches add the raw and compressed caches' Hadamard rotations (the indexer's is always there)
    "deepseek4": {"-c 4096": (745, 12.37), "-c 4096 -fa off": (765, 32.16), "-c 8192 -np 4": (754, 10.13),
                  "-c 4096 -ub 128": (745, 2.86), "-c 4096 -ctk q8_0 -ctv q8_0": (790, 11.56),
                  "-c 2048 -np 2 -fa off": (774, 18.41), "-c 4096 -ub 64 -np 3": (754, 1.65)},
}


@pytest.mark.parametrize("name, flags", [(n, f) for n, rows in LLAMA_CPP_RESERVE.items() for f in rows])
def test_dsv4_family_reserve_nodes_and_compute_buffer_equal_llama_cpp(name: str, flags: str,
                                                                  models: dict[str, Path]) -> None:
    n_nodes, mib = LLAMA_CPP_RESERVE[name][flags]
    assert_reserve_equals(models[name], flags, n_nodes, mib)


def test_hy_v4_is_simulated(models: dict[str, Path]) -> None:
    row = architecture_coverage("hy_v4")
    assert (row.status, row.kv, row.compute) == (Status.SIMULATED, "exact", "simulated")
    assert estimate(model_context(str(models["hy-v4"])), ["-c", "4096"]).compute_model == "simulated"


def test_hy_v4_decode_is_refused(models: dict[str, Path]) -> None:
    """Sigmoid expert gating has no kernel in the runtime: it sizes the graphs and refuses to run them."""
    runner = ModelRunner.load(str(models["hy-v4-full"]), parse_llama_flags(["-c", "256"]), weights=False)
    with pytest.raises(BadInput, match="SIGMOID"):
        runner.decode([1, 2, 3])


def test_deepseek4_is_simulated(models: dict[str, Path]) -> None:
    row = architecture_coverage("deepseek4")
    assert (row.status, row.kv, row.compute) == (Status.SIMULATED, "exact", "simulated")
    assert estimate(model_context(str(models["deepseek4"])), ["-c", "4096"]).compute_model == "simulated"


# llama-server -np 1 --lora on the tiny file (its warmup reserve, adapters applied): "graph: nodes = 777" (745 plus 4
# per pair: mul_mat, mul_mat, scale, add) and "CPU compute buffer size = 12.37 MiB"
LORA_PAIRS = ("blk.1.attn_q_a.weight", "blk.1.attn_kv.weight", "blk.1.attn_compressor_kv.weight",
              "blk.2.ffn_up_shexp.weight", "blk.1.indexer.proj.weight", "blk.3.attn_output_b.weight",
              "blk.0.ffn_gate_inp.weight", "blk.2.attn_compressor_gate.weight")


def test_deepseek4_lora_pairs_join_the_graph_where_llama_cpp_applies_them(models: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    shapes = {t.name: tuple(t.shape) for t in read_model(str(models["deepseek4"])).tensors}
    lora = write_lora(tmp_path / "lora.gguf", "deepseek4", lora_layout([(n, shapes[n]) for n in LORA_PAIRS], 8))
    assert_reserve_equals(models["deepseek4"], f"-c 4096 -np 1 --lora {lora}", 777, 12.37)


# llama-fit-params -v of the Vulkan build on lavapipe (GGML_VK_VISIBLE_DEVICES=0), tiny file: nodes, splits,
# "Vulkan0 compute buffer size" and "Vulkan_Host compute buffer size". Its 8-lane subgroups have no DSV4_HC_COMB
# pipeline (the unfused Sinkhorn mixer) and no lightning indexer for 64-wide heads (the scores on the CPU).
LAVAPIPE_RESERVE = {"-c 4096": (2225, 6, 9.57, 5.55), "-c 4096 -fa off": (2245, 6, 30.10, 7.55),
                    "-c 4096 -np 4": (2234, 6, 8.07, 2.55)}


@pytest.mark.parametrize("flags", LAVAPIPE_RESERVE)
def test_deepseek4_reserve_on_lavapipe_equals_llama_cpp(models: dict[str, Path], flags: str) -> None:
    inventory = Inventory((vulkan_device_spec(LAVAPIPE),), HostSpec(64 * 2**30, 64 * 2**30, 0, ""), source="lavapipe")
    settings = resolve_settings(model_context(str(models["deepseek4"])), parse_llama_flags(flags.split()), inventory)
    report = ModelRunner.from_settings(settings, weights=False).reserve_report
    assert report is not None
    mib = {k: round(v / 2**20, 2) for k, v in report.compute_bytes.items()}
    assert (report.n_nodes_pp, report.n_splits_pp, mib["Vulkan0"], mib["CPU"]) == LAVAPIPE_RESERVE[flags]


def test_deepseek4_decode_is_refused(models: dict[str, Path]) -> None:
    runner = ModelRunner.load(str(models["deepseek4"]), parse_llama_flags(["-c", "256"]), weights=False)
    with pytest.raises(BadInput, match="does not run them"):
        runner.decode([1, 2, 3])


# --- against llama.cpp itself ------------------------------------------------------------------------

@pytest.mark.peer
def test_deepseek4_ops_in_llama_cpp_order(llama_tools: Path, models: dict[str, Path], tmp_path: Path) -> None:
    """A 4-token decode's nodes (views included) are deepseek4.cpp's, one for one in its order. Their sizes are
    the decode's own plans (its completed blocks, its used cells), not the reserve's, so only the ops compare."""
    subprocess.run([str(llama_tools / "fitplan-dump-nodes"), str(models["deepseek4"]), str(tmp_path), "4096", "4",
                    "1", "2", "3", "4"], check=True, capture_output=True, timeout=300)
    theirs = [r.op for r in read_records(tmp_path / "step0.bin")]
    runner = ModelRunner.load(str(models["deepseek4"]), parse_llama_flags(["-c", "4096"]), weights=False,
                              reserve=False)
    assert runner.kv is not None
    full = tuple((k, runner.kv.tables[k].size) for k in runner.kv.kind_order())
    nodes = runner._graph(BatchShape(4, 1, full)).graph.nodes
    ours = [n.op_params["unary"] if n.op is Op.UNARY else n.op_params["glu"] if n.op is Op.GLU else n.op.value
            for n in nodes]
    # the builder makes ggml_swiglu_clamp as the GLU node it sizes the same (B.swiglu)
    assert ["SWIGLU" if op == "SWIGLU_CLAMP" else op for op in theirs] == ours


# llama-fit-params -v on deepseek4_tiny over two rpc-servers (-c 4096 -ts 1,1): "fused DeepSeek V4 HC pre / comb /
# post enabled", "graph: nodes = 745" and the compute buffers (MiB). deepseek4.cpp names each layer's last
# hyper-connection "l_last", which graph_get_cb pins to the layer's device as it pins "norm": the post at a CPU
# layer's end is not pulled onto the next device, so resolve_fused_ops keeps it (unpinned: 1369 nodes, RPC0 +27 MiB)
RPC_LAYER_BOUNDARY = {"-ngl 1": {"RPC0": 5.04, "RPC1": 0.0, "CPU": 12.37},
                      "-ngl 2": {"RPC0": 9.87, "RPC1": 10.0, "CPU": 12.36},
                      "-ngl 3": {"RPC0": 10.1, "RPC1": 10.0, "CPU": 12.36}}


@pytest.mark.peer
@pytest.mark.parametrize("ngl", RPC_LAYER_BOUNDARY)
def test_deepseek4_keeps_fused_hc_post_at_a_layer_boundary(rpc_pair: list[str], models: dict[str, Path],
                                                           ngl: str) -> None:
    flags = parse_llama_flags(["--rpc", ",".join(rpc_pair), "-c", "4096", "-ts", "1,1", *ngl.split()])
    runner = ModelRunner.load(str(models["deepseek4"]), flags, weights=False)
    assert runner.unfused == set()
    report = runner.reserve_report
    assert report is not None and report.n_nodes_pp == 745
    assert {k: round(v / 2**20, 2) for k, v in report.compute_bytes.items()} == RPC_LAYER_BOUNDARY[ngl]
