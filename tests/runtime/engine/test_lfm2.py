"""lfm2's graph builder (runtime/engine/lfm2.py) on a tiny file: the reserve's node counts and CPU
compute buffer against llama.cpp's, the node order of a short-convolution layer, the conv states'
sizes, decode's refusal and the estimate's compute model.

Expected figures come from llama.cpp on this very file (pinned build): llama-fit-params -v
("graph: nodes = N", "CPU compute buffer size"), and fitplan-dump-nodes for the node list (its
-c 256 run printed the buffer as 1.2569 MiB and every node's op, shape and strides, which the
peer test below re-checks one for one).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gguf import Keys

from planner.core.errors import BadInput
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.synth.gguf_factory import ModelSpec, add_tokenizer, lfm2_spec
from runtime.engine.builder import BatchShape
from runtime.engine.runner import ModelRunner
from tests.support.nodes import node_shapes
from tests.support.reserve_checks import assert_reserve_equals

MIB = 2**20
LAYERS = (0, 0, 2, 0)   # head_count_kv: conv, conv, attention, conv
N_EMBD, L_CACHE = 128, 3


def tiny(window: int = 0) -> ModelSpec:
    spec = lfm2_spec(n_embd=N_EMBD, n_head=4, head_count_kv=LAYERS, n_ff=256, l_cache=L_CACHE, n_vocab=512)
    add_tokenizer(spec, 512, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    if window:
        spec.metadata[Keys.Attention.SLIDING_WINDOW] = window
    return spec


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    [path] = tiny().write(tmp_path_factory.mktemp("lfm2") / "tiny.gguf")
    return path


# llama-fit-params -v on the tiny file: "graph: nodes = N" and "CPU compute buffer size = X MiB" (2 decimals)
LLAMA_CPP_RESERVE = {
    "-c 256": (142, 1.26),
    "-c 256 -fa off": (147, 2.00),
    "-c 256 -np 2": (144, 1.26),
    "-c 512 -np 3 -ub 64": (144, 0.33),
    "-c 256 -ctk q8_0 -ctv f16": (142, 1.26),
}


@pytest.mark.parametrize("flags", list(LLAMA_CPP_RESERVE))
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(flags: str, model: Path) -> None:
    assert_reserve_equals(model, flags, *LLAMA_CPP_RESERVE[flags])


# fitplan-dump-nodes, 4 tokens at -c 256: the first 44 nodes (the embeddings, layer 0's short convolution
# and FFN); layer 1's state clear and gathers come before layer 0's SSM_CONV, because build_rs expands them
# while layer 0's conv output is not yet in the graph. (ggml_op_desc prints a GLU node as its kind.)
LLAMA_CPP_FIRST_OPS = [
    "GET_ROWS",                                                                    # token embeddings
    "RESHAPE", "VIEW", "SCALE", "VIEW", "GET_ROWS", "VIEW", "GET_ROWS", "VIEW", "CPY",   # layer 0: build_rs
    "RESHAPE", "RMS_NORM", "MUL", "RESHAPE", "MUL_MAT", "VIEW", "VIEW", "MUL", "TRANSPOSE", "CONCAT",
    "VIEW", "VIEW", "CPY",                                                         # the new conv state
    "RESHAPE", "VIEW", "SCALE", "GET_ROWS", "GET_ROWS", "VIEW", "CPY", "RESHAPE",  # layer 1: build_rs
    "VIEW", "SSM_CONV", "MUL", "MUL_MAT", "RESHAPE", "ADD",                        # layer 0: conv, C, out_proj
    "RMS_NORM", "MUL", "MUL_MAT", "MUL_MAT", "GLU", "MUL_MAT", "ADD",              # layer 0: FFN
]


def _graph_nodes(model: Path, n_tokens: int, flags: list[str]):
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256", *flags]), weights=False, reserve=False)
    assert runner.kv is not None
    full = tuple((k, runner.kv.tables[k].size) for k in runner.kv.kind_order())
    return runner._graph(BatchShape(n_tokens, 1, full)).graph.nodes


def test_shortconv_layer_nodes_in_llama_cpp_order(model: Path) -> None:
    nodes = _graph_nodes(model, 4, [])
    assert [n.op.value for n in nodes[:len(LLAMA_CPP_FIRST_OPS)]] == LLAMA_CPP_FIRST_OPS
    conv = next(n for n in nodes if n.op.value == "SSM_CONV")
    assert (conv.ne[:2], conv.src[0].ne[:2]) == ((N_EMBD, 4), (L_CACHE - 1 + 4, N_EMBD))


def test_conv_states_have_llama_cpp_sizes(model: Path) -> None:
    """r: (L_cache - 1) * n_embd = 256 f32 per sequence in each conv layer (llama_hparams::n_embd_r), no s
    (n_embd_s is 0 without SSM keys), one row per sequence; the attention layer has none."""
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256", "-np", "2"]), weights=False)
    assert sorted(runner.states.r) == [0, 1, 3]
    assert all(runner.states.r[il].ne[:2] == (256, 2) and runner.states.s[il].n_elements == 0 for il in (0, 1, 3))


def test_decode_refuses_recurrent_layers(model: Path) -> None:
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"]), weights=False)
    with pytest.raises(BadInput, match="recurrent"):
        runner.decode([1, 2, 3])


def test_estimate_simulates_lfm2_and_falls_back_with_a_window(model: Path, tmp_path: Path) -> None:
    """A sliding window makes lfm2.cpp use the hybrid iSWA memory, which the builder does not build:
    the estimate says so by its compute model rather than sizing a graph llama.cpp would not make."""
    assert estimate(str(model), ["-c", "256"]).compute_model == "simulated"
    [swa] = tiny(window=64).write(tmp_path / "swa.gguf")
    assert estimate(str(swa), ["-c", "256"]).compute_model == "formula"


# --- against llama.cpp itself ------------------------------------------------------------------------

@pytest.mark.peer
def test_every_node_equals_llama_cpp(llama_tools: Path, model: Path, tmp_path: Path) -> None:
    subprocess.run([str(llama_tools / "fitplan-dump-nodes"), str(model), str(tmp_path), "256", "4", "1", "2", "3", "4"],
                   check=True, capture_output=True, timeout=300)
    theirs = node_shapes(tmp_path / "step0.bin")
    glu = {"SWIGLU": "GLU"}
    ours = [(n.op.value, tuple(n.ne), tuple(n.nb)) for n in _graph_nodes(model, 4, [])]
    assert [(glu.get(op, op), ne, nb) for op, ne, nb in theirs] == ours
