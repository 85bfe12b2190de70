"""Next-token-prediction (MTP) blocks as the pinned llama.cpp loads them (planner/llama/nextn.py).

A glm4moe file with one MTP block after a 3-block trunk. src/models/glm4-moe.cpp creates the MTP
block's tensors with TENSOR_SKIP unless the model is loaded for --spec-type draft-mtp, so its weights
are in no buffer; the block still counts as a layer when layers are placed (load_tensors assigns
devices to all n_layer_all blocks). Expected bytes are worked out here from the dimensions: Q8_0
stores 32 values in 34 bytes, F32 4 bytes a value; every tensor below is a whole number of 32-byte
alignment units, so no padding enters.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.llama.context import ModelContext, model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.nextn import nextn_loaded
from planner.memory.estimate import estimate
from planner.search.problem import layer_weights
from planner.synth.glm4moe_factory import glm4moe_spec

N_LAYER, N_EMBD, N_HEAD, N_HEAD_KV, HEAD, N_FF, N_EXPERT, N_FF_EXP, N_VOCAB = 3, 256, 4, 2, 64, 512, 8, 64, 1000
RPC = ["--rpc", "127.0.0.1:50052,127.0.0.1:50053"]


def q8(ne0: int, rows: int) -> int:
    return ne0 // 32 * 34 * rows


def f32(n: int) -> int:
    return 4 * n


Q, KV = N_HEAD * HEAD, N_HEAD_KV * HEAD
ATTENTION = (f32(N_EMBD) + q8(N_EMBD, Q) + 2 * q8(N_EMBD, KV) + f32(Q) + 2 * f32(KV) + q8(Q, N_EMBD)
             + f32(N_EMBD))                                        # attn_norm ... post_attention_norm
DENSE = 2 * q8(N_EMBD, N_FF) + q8(N_FF, N_EMBD)                    # ffn_gate, ffn_up, ffn_down
MOE = (f32(N_EMBD * N_EXPERT) + f32(N_EXPERT)                      # ffn_gate_inp, exp_probs_b
       + 2 * q8(N_EMBD, N_FF_EXP * N_EXPERT) + q8(N_FF_EXP, N_EMBD * N_EXPERT)    # the experts
       + 2 * q8(N_EMBD, N_FF_EXP) + q8(N_FF_EXP, N_EMBD))          # the shared expert
MTP_HEAD = q8(2 * N_EMBD, N_EMBD) + 3 * f32(N_EMBD)               # eh_proj, enorm, hnorm, shared_head_norm
BLOCK_DENSE, BLOCK_MOE, BLOCK_MTP = ATTENTION + DENSE, ATTENTION + MOE, ATTENTION + MOE + MTP_HEAD
EMBD, OUTPUT = q8(N_EMBD, N_VOCAB), f32(N_EMBD) + q8(N_EMBD, N_VOCAB)   # token_embd; output_norm + output
TRUNK = BLOCK_DENSE + (N_LAYER - 1) * BLOCK_MOE


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> ModelContext:
    path = Path(tmp_path_factory.mktemp("nextn")) / "glm4moe-mtp.gguf"
    glm4moe_spec(n_layer=N_LAYER, n_nextn=1, n_embd=N_EMBD, n_head=N_HEAD, n_head_kv=N_HEAD_KV, head_dim=HEAD,
                 n_ff=N_FF, n_expert=N_EXPERT, n_ff_exp=N_FF_EXP, n_vocab=N_VOCAB).write(path)
    return model_context(str(path))


def _model_bytes(ctx: ModelContext, argv: list[str]) -> dict[str, int]:
    return {d.name: d.model_bytes for d in estimate(ctx, argv).devices}


def test_the_mtp_block_is_not_loaded_by_default(ctx):
    assert ctx.facts.n_layer == N_LAYER and ctx.facts.n_layer_all == N_LAYER + 1
    rows = _model_bytes(ctx, ["-c", "512", "-ngl", "0", "-nr"])
    assert rows["Host"] == EMBD + TRUNK + OUTPUT


def test_draft_mtp_loads_the_mtp_block(ctx):
    rows = _model_bytes(ctx, ["-c", "512", "-ngl", "0", "-nr", "--spec-type", "draft-mtp"])
    assert rows["Host"] == EMBD + TRUNK + BLOCK_MTP + OUTPUT


def test_the_mtp_block_still_counts_as_a_layer_when_placing(ctx):
    """5 layers (blocks 0..3 and the output) split 1,1: upper_bound(il / 5) puts blocks 0-2 on RPC0 and
    block 3 (the MTP block) and the output on RPC1; RPC1 then holds the output's weights alone."""
    argv = [*RPC, "-c", "512", "-ts", "1,1"]
    est = estimate(ctx, argv)
    assert dict(est.layers)["RPC1"] == (3, 4)
    rows = _model_bytes(ctx, argv)
    assert (rows["RPC0"], rows["RPC1"], rows["Host"]) == (TRUNK, OUTPUT, EMBD)
    loaded = _model_bytes(ctx, [*argv, "--spec-type", "draft-mtp"])
    assert (loaded["RPC0"], loaded["RPC1"]) == (TRUNK, BLOCK_MTP + OUTPUT)


def test_the_planner_sizes_layers_as_loaded(ctx):
    default = layer_weights(ctx, parse_llama_flags(["-c", "512"])).weights
    mtp = layer_weights(ctx, parse_llama_flags(["-c", "512", "--spec-type", "draft-mtp"])).weights
    assert default[:N_LAYER + 1] == [BLOCK_DENSE, BLOCK_MOE, BLOCK_MOE, 0]
    assert mtp[N_LAYER] == BLOCK_MTP


def test_which_architectures_load_their_nextn_blocks():
    # src/models/glm4-moe.cpp, deepseek2.cpp, qwen3next.cpp: TENSOR_SKIP unless ml.load_mtp
    assert [nextn_loaded(a, False) for a in ("glm4moe", "deepseek2", "qwen3next")] == [False] * 3
    assert [nextn_loaded(a, True) for a in ("glm4moe", "deepseek2", "qwen3next")] == [True] * 3
    # src/models/glm4.cpp, exaone4.cpp: TENSOR_SKIP always
    assert [nextn_loaded(a, True) for a in ("glm4", "exaone4")] == [False, False]
