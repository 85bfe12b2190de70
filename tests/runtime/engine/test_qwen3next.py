"""qwen3next's graph builder (runtime/engine/qwen3next.py) on a tiny file: the reserve's node counts
and CPU compute buffer against llama.cpp's, the node order of a Gated DeltaNet layer and of a gated
attention layer, the recurrent states' sizes, decode's refusal and the estimate's compute model.

Expected figures come from llama.cpp on this very file (pinned build): llama-fit-params -v
("graph: nodes = N", "CPU compute buffer size", 2 decimals), and fitplan-dump-nodes for the node
lists (its -c 256 run of 4 tokens printed 365 nodes and the buffer as 1.6475 MiB; the peer test
below re-checks every node's op, shape and strides).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gguf import Keys

from planner.core.errors import BadInput
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.synth.gguf_factory import ModelSpec, add_tokenizer
from planner.synth.qwen3next_factory import qwen3next_spec
from runtime.engine.builder import BatchShape
from runtime.engine.runner import ModelRunner
from tests.support.nodes import node_shapes
from tests.support.reserve_checks import assert_reserve_equals

MIB = 2**20


def tiny() -> ModelSpec:
    """4 layers (DeltaNet, DeltaNet, DeltaNet, attention), 128 wide; DeltaNet: 2 key / 4 value heads of
    32, conv 4; attention: 4 heads / 2 KV of 64; 8 experts (2 used) of 64 and a shared expert of 64."""
    spec = qwen3next_spec()
    add_tokenizer(spec, 512, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    return spec


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    [path] = tiny().write(tmp_path_factory.mktemp("qwen3next") / "tiny.gguf")
    return path


# llama-fit-params -v on the tiny file
LLAMA_CPP_RESERVE = {
    "-c 256": (365, 1.65),
    "-c 256 -fa off": (370, 2.77),
    "-c 256 -np 2": (367, 1.65),
    "-c 512 -np 3 -ub 64": (367, 0.45),
    "-c 256 -ctk q8_0 -ctv q8_0": (377, 1.68),
}


@pytest.mark.parametrize("flags", list(LLAMA_CPP_RESERVE))
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(flags: str, model: Path) -> None:
    assert_reserve_equals(model, flags, *LLAMA_CPP_RESERVE[flags])


def test_compute_buffer_equals_llama_cpp_to_the_last_digit(model: Path) -> None:
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"]), weights=False)
    assert runner.reserve_report is not None
    assert round(runner.reserve_report.compute_bytes["CPU"] / MIB, 4) == 1.6475


# fitplan-dump-nodes, 4 tokens at -c 256 (ggml_op_desc prints unary and GLU nodes by their kind).
# Layer 0, a DeltaNet layer: the input norm; the conv state's build_rs, the qkv projection and the new
# conv state; the SSM state's build_rs; conv, L2-normed and repeated Q and K, V; beta and gate from
# ssm_ba; the fused op and the state write; the gated norm with z, ssm_out; the residual, the experts,
# the shared expert and its gate, the residual; layer 1's input norm.
LLAMA_CPP_DELTANET_OPS = [
    "GET_ROWS", "RMS_NORM", "MUL", "RESHAPE", "VIEW", "SCALE", "VIEW", "GET_ROWS", "VIEW", "GET_ROWS", "VIEW",
    "CPY", "RESHAPE", "MUL_MAT", "RESHAPE", "TRANSPOSE", "CONCAT", "VIEW", "VIEW", "CPY", "RESHAPE", "VIEW",
    "SCALE", "GET_ROWS", "GET_ROWS", "VIEW", "CPY", "SSM_CONV", "SILU", "VIEW", "RMS_NORM", "SCALE", "RESHAPE",
    "REPEAT", "RESHAPE", "VIEW", "RMS_NORM", "SCALE", "RESHAPE", "REPEAT", "RESHAPE", "VIEW", "MUL_MAT", "RESHAPE",
    "VIEW", "CONT", "ADD", "SOFTPLUS", "MUL", "RESHAPE", "VIEW", "CONT", "SIGMOID", "RESHAPE", "RESHAPE",
    "GATED_DELTA_NET", "VIEW", "VIEW", "CPY", "VIEW", "RMS_NORM", "MUL", "MUL_MAT", "RESHAPE", "SILU", "MUL",
    "RESHAPE", "MUL_MAT", "RESHAPE", "ADD", "RMS_NORM", "MUL", "MUL_MAT", "SOFT_MAX", "RESHAPE", "ARGSORT", "VIEW",
    "GET_ROWS", "RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE", "RESHAPE", "MUL_MAT_ID", "MUL_MAT_ID", "SWIGLU",
    "MUL_MAT_ID", "MUL", "VIEW", "VIEW", "ADD", "MUL_MAT", "MUL_MAT", "SWIGLU", "MUL_MAT", "MUL_MAT", "SIGMOID",
    "MUL", "ADD", "ADD", "RMS_NORM", "MUL",
]
# Layer 3, the attention layer (nodes 299-328): Q with its gate, V, K (build_attn expands q, v, k),
# the cache writes, flash attention, the sigmoid gate, attn_output.
LLAMA_CPP_ATTENTION_OPS = [
    "MUL_MAT", "RESHAPE", "VIEW", "RMS_NORM", "MUL", "ROPE", "MUL_MAT", "RESHAPE", "MUL_MAT", "RESHAPE", "RMS_NORM",
    "MUL", "ROPE", "VIEW", "SET_ROWS", "VIEW", "SET_ROWS", "VIEW", "PERMUTE", "VIEW", "PERMUTE", "VIEW", "PERMUTE",
    "FLASH_ATTN_EXT", "RESHAPE", "VIEW", "CONT", "SIGMOID", "MUL", "MUL_MAT",
]
RUNTIME_OP = {"SILU": "UNARY", "SIGMOID": "UNARY", "SOFTPLUS": "UNARY", "SWIGLU": "GLU"}


def _graph_nodes(model: Path, n_tokens: int):
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"]), weights=False, reserve=False)
    assert runner.kv is not None
    full = tuple((k, runner.kv.tables[k].size) for k in runner.kv.kind_order())
    return runner._graph(BatchShape(n_tokens, 1, full)).graph.nodes


def test_layers_nodes_in_llama_cpp_order(model: Path) -> None:
    ops = [n.op.value for n in _graph_nodes(model, 4)]
    assert len(ops) == 365
    assert ops[:103] == [RUNTIME_OP.get(op, op) for op in LLAMA_CPP_DELTANET_OPS]
    assert ops[299:329] == [RUNTIME_OP.get(op, op) for op in LLAMA_CPP_ATTENTION_OPS]


def test_fused_delta_net_holds_output_and_state(model: Path) -> None:
    """GATED_DELTA_NET: [S_v * H_v, n_tokens + S_v] = [32 * 4, 4 + 32] for one sequence, K = 1."""
    gdn = next(n for n in _graph_nodes(model, 4) if n.op.value == "GATED_DELTA_NET")
    assert gdn.ne == (128, 36, 1, 1)
    assert [s.ne for s in gdn.src[:3]] == [(32, 4, 4, 1)] * 3


def test_recurrent_states_have_llama_cpp_sizes(model: Path) -> None:
    """r: (d_conv - 1) * (d_inner + 2 n_group d_state) = 3 * (128 + 128) = 768; s: d_state * d_inner =
    32 * 128 = 4096 f32 per sequence (llama_hparams::n_embd_r / n_embd_s); none for layer 3."""
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256", "-np", "2"]), weights=False)
    assert sorted(runner.states.r) == [0, 1, 2]
    assert all(runner.states.r[il].ne[:2] == (768, 2) and runner.states.s[il].ne[:2] == (4096, 2)
               for il in (0, 1, 2))


def test_decode_refuses_recurrent_layers(model: Path) -> None:
    runner = ModelRunner.load(str(model), parse_llama_flags(["-c", "256"]), weights=False)
    with pytest.raises(BadInput, match="recurrent"):
        runner.decode([1, 2, 3])


def test_estimate_simulates_qwen3next(model: Path) -> None:
    assert estimate(str(model), ["-c", "256"]).compute_model == "simulated"


# --- against llama.cpp itself ------------------------------------------------------------------------

@pytest.mark.peer
def test_every_node_equals_llama_cpp(llama_tools: Path, model: Path, tmp_path: Path) -> None:
    subprocess.run([str(llama_tools / "fitplan-dump-nodes"), str(model), str(tmp_path), "256", "4", "1", "2", "3", "4"],
                   check=True, capture_output=True, timeout=300)
    theirs = node_shapes(tmp_path / "step0.bin", RUNTIME_OP)
    ours = [(n.op.value, tuple(n.ne), tuple(n.nb)) for n in _graph_nodes(model, 4)]
    assert theirs == ours
