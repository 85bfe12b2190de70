"""runtime/engine/fused.py on tiny files of each architecture it builds: the reserve's node counts and CPU
compute buffer against llama.cpp's, and the estimate's compute model.

Expected figures come from llama.cpp on these very files (pinned build): llama-fit-params -v
("graph: nodes = N" and "CPU compute buffer size = X MiB", two decimals), and fitplan-dump-nodes for
every node's op, shape and strides (the peer test at the end). K-quant rows need 256-wide rows, so the
tiny files are 256 wide.
"""
from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.synth.gguf_factory import ModelSpec
from planner.synth.shapes_fused import (
    cohere_spec,
    olmo_spec,
    phi3_spec,
    qwen3vl_spec,
    stablelm_spec,
    starcoder2_spec,
)
from runtime.engine.builder import BatchShape
from runtime.engine.runner import ModelRunner
from tests.support.nodes import node_shapes
from tests.support.reserve_checks import assert_reserve_equals

TINY: dict[str, Callable[[], ModelSpec]] = {
    # 4 heads of 64, 48 of them roped (partial RoPE), fused QKV and up/gate, long/short factor tables
    "phi3": lambda: phi3_spec(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_vocab=512, n_rot=48),
    "command-r": lambda: cohere_spec("command-r", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=256,
                                     n_vocab=512, n_ctx=4096, logit_scale=0.0625),
    # 64 layers: command-r.cpp's per-head LayerNorms of Q and K (created from 64 layers on)
    "command-r-64": lambda: cohere_spec("command-r", n_layer=64, n_embd=256, n_head=4, n_head_kv=2, n_ff=256,
                                        n_vocab=512, n_ctx=4096, logit_scale=0.0625),
    # layers 0-2 slide over 128 and are roped, layer 3 is global and NoPE
    "cohere2": lambda: cohere_spec("cohere2", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_vocab=512,
                                   n_ctx=4096, logit_scale=0.25, window=128),
    # 16 of 64 head dims roped, LayerNorms and Q/K/V with biases
    "stablelm": lambda: stablelm_spec(n_layer=2, n_embd=256, n_head=4, n_head_kv=4, n_ff=256, n_vocab=512, n_rot=16),
    # StableLM 2 12B's layer: per-head Q/K LayerNorms, no ffn_norm (parallel residual)
    "stablelm-parallel": lambda: stablelm_spec(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_vocab=512,
                                               n_rot=16, qkv_bias=False, parallel=True),
    "starcoder2": lambda: starcoder2_spec(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=512),
    # no norm weights, Q/K/V clamped to +-8
    "olmo": lambda: olmo_spec(n_layer=2, n_embd=256, n_head=4, n_head_kv=4, n_ff=256, n_vocab=512),
    # M-RoPE sections 12/10/10 of 32 rotated pairs; layers 0-2 add the deepstack slices 1-3
    "qwen3vl": lambda: qwen3vl_spec(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=256,
                                    n_vocab=512, sections=(12, 10, 10, 0), n_deepstack=3),
    "qwen3vl-no-deepstack": lambda: qwen3vl_spec(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64,
                                                 n_ff=256, n_vocab=512, sections=(12, 10, 10, 0), n_deepstack=0),
}

# llama-fit-params -v on each tiny file: (nodes, CPU compute buffer MiB)
LLAMA_CPP_RESERVE: dict[str, dict[str, tuple[int, float]]] = {
    "phi3": {
        "-c 256": (64, 1.63),
        "-c 256 -fa off": (74, 2.25),
        "-c 512 -np 2": (68, 3.26),
        "-c 256 -ctk q8_0 -ctv q8_0": (88, 1.66),
    },
    "command-r": {
        "-c 256": (66, 1.63),
        "-c 256 -fa off": (76, 2.75),
        "-c 512 -np 2": (70, 3.26),
        "-c 256 -ctk q8_0 -ctv q8_0": (90, 1.66),
    },
    "command-r-64": {
        "-c 256": (2120, 1.63),
        "-c 256 -fa off": (2440, 2.75),
    },
    "cohere2": {
        "-c 256": (122, 1.76),
        "-c 256 -fa off": (142, 3.26),
        "-c 512 -np 2": (130, 3.52),
        "-c 256 -ctk q8_0 -ctv q8_0": (170, 1.82),
    },
    "stablelm": {
        "-c 256": (79, 1.63),
        "-c 256 -fa off": (89, 3.00),
        "-c 512 -np 2": (83, 3.26),
        "-c 256 -ctk q8_0 -ctv q8_0": (103, 1.66),
    },
    "stablelm-parallel": {
        "-c 256": (76, 1.63),
        "-c 256 -fa off": (86, 2.75),
        "-c 512 -np 2": (80, 3.26),
        "-c 256 -ctk q8_0 -ctv q8_0": (100, 1.66),
    },
    "starcoder2": {
        "-c 256": (83, 1.63),
        "-c 256 -fa off": (93, 2.75),
        "-c 512 -np 2": (87, 3.26),
        "-c 256 -ctk q8_0 -ctv q8_0": (107, 1.66),
    },
    "olmo": {
        "-c 256": (69, 1.63),
        "-c 256 -fa off": (79, 3.00),
        "-c 512 -np 2": (73, 3.26),
        "-c 256 -ctk q8_0 -ctv q8_0": (93, 1.66),
    },
    "qwen3vl": {
        "-c 256": (154, 3.13),
        "-c 256 -fa off": (174, 4.51),
        "-c 512 -np 2": (162, 6.27),
        "-c 256 -ctk q8_0 -ctv q8_0": (202, 3.17),
    },
    "qwen3vl-no-deepstack": {
        "-c 256": (76, 1.38),
        "-c 256 -fa off": (86, 2.76),
        "-c 512 -np 2": (80, 2.77),
        "-c 256 -ctk q8_0 -ctv q8_0": (100, 1.42),
    },
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fused")


def _tiny(name: str, directory: Path) -> Path:
    path = directory / f"{name}.gguf"
    if not path.exists():
        TINY[name]().write(path)
    return path


@pytest.mark.parametrize(("arch", "flags"), [(a, f) for a, rows in LLAMA_CPP_RESERVE.items() for f in rows])
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(arch: str, flags: str, tiny_dir: Path) -> None:
    assert_reserve_equals(_tiny(arch, tiny_dir), flags, *LLAMA_CPP_RESERVE[arch][flags])


@pytest.mark.parametrize("arch", list(TINY))
def test_estimate_simulates(arch: str, tiny_dir: Path) -> None:
    assert estimate(str(_tiny(arch, tiny_dir)), ["-c", "256"]).compute_model == "simulated"


# --- against llama.cpp itself ------------------------------------------------------------------------

# ggml_op_desc prints a GLU or UNARY node as its kind
OP_DESC = {"SWIGLU": "GLU", "GEGLU": "GLU", "GELU": "UNARY"}


@pytest.mark.peer
@pytest.mark.parametrize("arch", list(TINY))
def test_every_node_equals_llama_cpp(arch: str, llama_tools: Path, tiny_dir: Path, tmp_path: Path) -> None:
    """A 4-token batch at -c 256: llama.cpp's nodes and the runtime's, op, shape and strides, one for one."""
    model = _tiny(arch, tiny_dir)
    subprocess.run([str(llama_tools / "fitplan-dump-nodes"), str(model), str(tmp_path), "256", "4", "1", "2", "3", "4"],
                   check=True, capture_output=True, timeout=300)
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"]), weights=False, reserve=False)
    assert runner.kv is not None
    full = tuple((k, runner.kv.tables[k].size) for k in runner.kv.kind_order())
    ours = [(n.op.value, tuple(n.ne), tuple(n.nb)) for n in runner._graph(BatchShape(4, 1, full)).graph.nodes]
    assert node_shapes(tmp_path / "step0.bin", OP_DESC) == ours
