"""glm5-next's graph builder (runtime/engine/glm5next.py) on the tiny file of planner/synth/shapes_glm5.py (KDA, MLA,
KDA, MLA; block 0 dense): the reserve's node counts and CPU compute buffer against llama.cpp's, every node of a
prompt graph against fitplan-dump-nodes, the indexer's sizes and the estimate's compute model.

Expected figures come from llama.cpp on this very file (pinned build): llama-fit-params -v ("graph (pp bs=N,
tg bs=M): nodes = P / T" and "CPU compute buffer size = X MiB"). The prompt graph scatters the indexer's selection
into a mask; the one-token graph gathers the selected latents (at most 16 tokens over more cells than selected),
so the two graphs differ in size.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from planner.core.errors import BadInput, GGUFError
from planner.gguf.keys import LLM_KV_ATTENTION_INDEXER_TYPES, LLM_KV_HC_COUNT
from planner.hardware.inventory import HostSpec, Inventory
from planner.hardware.vulkan_devices import LAVAPIPE, vulkan_device_spec
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.synth.shapes_glm5 import tiny_glm5_next
from runtime.engine.builder import BatchShape
from runtime.engine.glm5next import KpoolShape, kpool_pad
from runtime.engine.runner import ModelRunner
from runtime.ggml.graph import Op
from tests.support.nodes import node_shapes

MIB = 2**20


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    [path] = tiny_glm5_next().write(tmp_path_factory.mktemp("glm5next") / "tiny.gguf")
    return path


# llama-fit-params -v on the tiny file: prompt and token graphs' node counts, CPU compute buffer (2 decimals)
LLAMA_CPP_RESERVE = {
    "-c 256": (636, 594, 4.39),
    "-c 256 -fa off": (638, 594, 4.52),
    "-c 1024": (636, 594, 9.72),
    "-c 1024 -fa off": (638, 594, 20.72),
    "-c 512 -np 2": (640, 598, 8.84),
    "-c 1024 -np 4 -fa off": (642, 598, 9.22),
    "-c 512 -ctk q8_0 -ctv q8_0": (636, 594, 9.09),
    "-c 4096 -ub 64": (636, 594, 5.73),
    "-c 300 -ub 8": (594, 594, 0.67),    # an 8-token prompt gathers too
}


@pytest.mark.parametrize("flags", list(LLAMA_CPP_RESERVE))
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(flags: str, model: Path) -> None:
    n_pp, n_tg, mib = LLAMA_CPP_RESERVE[flags]
    runner = ModelRunner.load(str(model), parse_llama_flags(flags.split()), weights=False)
    report = runner.reserve_report
    assert report is not None
    assert (report.n_nodes_pp, report.n_nodes_tg) == (n_pp, n_tg)
    assert round(report.compute_bytes["CPU"] / MIB, 2) == mib


# the graphs llama.cpp builds once resolve_fused_ops turned hyper-connection ops off, -c 256 (llama-fit-params -v):
# post off over two rpc-servers at -ngl 2; comb off on lavapipe (no 16-lane subgroups for its shader); both off on
# lavapipe at -ngl 2
UNFUSED_NODES = [
    ({Op.DSV4_HC_POST}, (1260, 1218)),
    ({Op.DSV4_HC_COMB}, (2116, 2074)),
    ({Op.DSV4_HC_COMB, Op.DSV4_HC_POST}, (2740, 2698)),
]


@pytest.mark.parametrize(("unfused", "nodes"), UNFUSED_NODES)
def test_unfused_hyper_connections_have_llama_cpp_node_counts(unfused: set[Op], nodes: tuple[int, int],
                                                              model: Path) -> None:
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"]), weights=False, reserve=False)
    runner.unfused.update(unfused)
    report = runner.reserve()
    assert (report.n_nodes_pp, report.n_nodes_tg) == nodes


# attention.indexer.types [1, 1, 1, 0]: block 3 reuses block 1's selection (no indexer of its own)
LLAMA_CPP_RESERVE_SHARED = {
    "-c 256": (562, 542, 4.33),
    "-c 1024 -fa off": (565, 542, 20.60),
    "-c 512 -np 2": (565, 545, 8.72),
}


@pytest.mark.parametrize("flags", list(LLAMA_CPP_RESERVE_SHARED))
def test_shared_indexer_reserve_equals_llama_cpp(flags: str, tmp_path: Path) -> None:
    spec = tiny_glm5_next()
    spec.metadata[LLM_KV_ATTENTION_INDEXER_TYPES.format(arch="glm5-next")] = [1, 1, 1, 0]
    [path] = spec.write(tmp_path / "shared.gguf")
    n_pp, n_tg, mib = LLAMA_CPP_RESERVE_SHARED[flags]
    report = ModelRunner.load(str(path), parse_llama_flags(flags.split()), weights=False).reserve_report
    assert report is not None
    assert (report.n_nodes_pp, report.n_nodes_tg, round(report.compute_bytes["CPU"] / MIB, 2)) == (n_pp, n_tg, mib)


# llama-fit-params -v of the Vulkan build on lavapipe: ggml-vulkan has no DSV4_HC_COMB pipeline for 8-lane
# subgroups (resolve_fused_ops turns comb off) and its lightning indexer shader takes heads of 128 only (the tiny
# file's 64-wide one runs on the CPU): "Vulkan0 compute buffer size" and "Vulkan_Host compute buffer size"
LAVAPIPE_COMPUTE = {
    "-c 256": (3.20, 0.93),
    "-c 256 -ngl 2": (4.13, 0.93),      # the post at the boundary off too
    "-c 1024 -fa off": (17.65, 4.18),
}


@pytest.mark.parametrize("flags", list(LAVAPIPE_COMPUTE))
def test_lavapipe_compute_equals_llama_cpp(flags: str, model: Path) -> None:
    inventory = Inventory((vulkan_device_spec(LAVAPIPE),), HostSpec(64 * 2**30, 64 * 2**30, 0, ""), source="lavapipe")
    est = estimate(str(model), flags.split(), inventory)
    assert tuple(round(d.compute_bytes / MIB, 2) for d in est.devices) == LAVAPIPE_COMPUTE[flags]


def test_kpool_shape_at_reserve(model: Path) -> None:
    """-c 256, kpool 4, top_k 64: 64 pools of one sequence, padded to 128 (kpool_pad: one more, then to 64); the
    top 16 pools' 64 cells plus a 3-cell tail; a 1-token ubatch over 256 cells gathers, a 256-token one does not."""
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"]), weights=False, reserve=False)
    hp = runner.hp
    assert (kpool_pad(63), kpool_pad(64), kpool_pad(0)) == (64, 128, 64)
    assert KpoolShape.reserve(hp, 256, 1, 256, 256) == KpoolShape(128, 64, 16, 67, False)   # type: ignore[arg-type]
    assert KpoolShape.reserve(hp, 256, 1, 256, 1).gather                                    # type: ignore[arg-type]
    # the indexer cache: key | gate | pooled per cell (3 x 64) for the two MLA layers, none for KDA
    assert [None if t is None else t.ne[:2] for t in runner.index_cache] == [None, (192, 256), None, (192, 256)]


def test_decode_is_refused(model: Path) -> None:
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"]), weights=False)
    with pytest.raises(BadInput, match="only sizes"):
        runner.decode([1, 2, 3])


def test_estimate_simulates_glm5_next(model: Path, tmp_path: Path) -> None:
    assert estimate(str(model), ["-c", "256"]).compute_model == "simulated"
    spec = tiny_glm5_next()
    spec.metadata[LLM_KV_HC_COUNT.format(arch="glm5-next")] = 2
    [other] = spec.write(tmp_path / "hc2.gguf")
    with pytest.raises(GGUFError, match="hyper_connection.count other than 4"):
        ModelRunner.load(str(other), parse_llama_flags(["-c", "256"]), weights=False)


# --- against llama.cpp itself ------------------------------------------------------------------------

@pytest.mark.peer
def test_every_prompt_node_equals_llama_cpp(llama_tools: Path, model: Path, tmp_path: Path) -> None:
    """A 256-token prompt at -c 256 fills the cache: its pools (64, padded to 128, all new) are the reserve's,
    so every node's op, shape and strides must be llama.cpp's (ggml_op_desc prints unary and GLU kinds)."""
    tokens = [str(t) for t in range(1, 257)]
    subprocess.run([str(llama_tools / "fitplan-dump-nodes"), str(model), str(tmp_path), "256", "256", *tokens],
                   check=True, capture_output=True, timeout=300)
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"]), weights=False, reserve=False)
    assert runner.kv is not None
    full = tuple((k, runner.kv.tables[k].size) for k in runner.kv.kind_order())
    nodes = runner._graph(BatchShape(256, 1, full)).graph.nodes

    def desc(op: str, params: dict) -> str:
        return str(params["unary"]) if op == "UNARY" else str(params["glu"]) if op == "GLU" else op

    ours = [(desc(n.op.value, n.op_params), tuple(n.ne), tuple(n.nb)) for n in nodes]
    assert ours == node_shapes(tmp_path / "step0.bin")


@pytest.mark.peer
def test_layer_boundary_turns_fused_hc_post_off(llama_tools: Path, rpc_pair: list[str], model: Path) -> None:
    """-ngl 2 over two rpc-servers: llama-fit-params -v logs "layer 2 is assigned to device CPU but fused DeepSeek
    V4 HC post is assigned to device RPC0 ... set to disabled" (pre and comb stay enabled) and reserves RPC0 17.29,
    RPC1 1.23 and CPU 3.83 MiB with the unfused post."""
    flags = parse_llama_flags(["--rpc", ",".join(rpc_pair), "-c", "256", "-ts", "1,1", "-ngl", "2"])
    runner = ModelRunner.load(str(model), flags, weights=False)
    assert runner.unfused == {Op.DSV4_HC_POST}
    report = runner.reserve_report
    assert report is not None
    assert {k: round(v / MIB, 2) for k, v in report.compute_bytes.items()} == {"RPC0": 17.29, "RPC1": 1.23,
                                                                                "CPU": 3.83}
