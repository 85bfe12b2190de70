"""What each layer costs: weight bytes by group, K/V bytes per cache cell, recurrent state per sequence.

All expected figures are worked out by hand below from the tensor shapes llama.cpp creates
(src/models/<arch>.cpp) and ggml's block sizes: Q4_K 256 values / 144 bytes, Q6_K 256 / 210,
Q8_0 32 / 34, Q4_0 32 / 18, F16 2 bytes, F32 4 bytes; a tensor is rows x (ne0 / block x bytes).
Groups follow planner.model.costs.WeightGroup's definitions: attention = attention or recurrent mixer
projections, ffn = dense FFN, experts = routed `*_exps`, shared_experts = `*_shexp`,
norms_other = norms, the router and anything else. Recurrent state is f32.
"""
from __future__ import annotations

import pytest

from planner.core.errors import BadInput
from planner.gguf.reader import read_model
from planner.model.arch import AttnKind, model_facts
from planner.model.costs import CostTable, WeightGroup, cost_table
from planner.registry.examples import resolve_model
from planner.synth.gguf_factory import (
    ModelSpec,
    deepseek2_spec,
    gemma3_spec,
    granitehybrid_spec,
    llama_spec,
    mamba2_spec,
    qwen3moe_spec,
)

A, F, E, S, OT = (WeightGroup.ATTENTION, WeightGroup.FFN, WeightGroup.EXPERTS, WeightGroup.SHARED_EXPERTS,
                 WeightGroup.OTHER)
Q8_ROW_32 = 34   # bytes per 32 values
Q4K_ROW_256 = 144
Q6K_ROW_256 = 210


def _costs(spec: ModelSpec, tmp_path, type_k: str = "f16", type_v: str = "f16") -> tuple[CostTable, int]:
    [path] = spec.write(tmp_path / f"{spec.arch}.gguf")
    model = read_model(path)
    return cost_table(model, model_facts(model), type_k, type_v), model.total_tensor_bytes


def _groups(layer) -> dict[WeightGroup, int]:
    return {g: b for g, b in layer.weights if b}


def test_gemma3_270m_real_file():
    model = read_model(resolve_model("example:gemma3-270m"))
    costs = cost_table(model, model_facts(model))
    # 236 tensors of 246,587,904 bytes: figures from gguf-py's independent GGUFReader on this file
    assert len(model.tensors) == 236
    assert model.total_tensor_bytes == 246_587_904
    assert costs.layer_weight_bytes + costs.non_repeating_bytes == 246_587_904
    assert len(costs.layers) == 18
    # token_embd: 262144 rows of 640 Q8_0 values
    embd = next(t for t in costs.non_repeating if t.name == "token_embd.weight")
    assert embd.n_bytes == 262144 * (640 // 32) * Q8_ROW_32
    assert costs.tied_embeddings
    # one KV head of 256: 256 x 2 bytes for K and for V in every layer, SWA or not
    assert {(lc.k_bytes_per_cell, lc.v_bytes_per_cell) for lc in costs.layers} == {(512, 512)}
    assert sum(lc.kind is AttnKind.SWA for lc in costs.layers) == 15
    assert sum(lc.kind is AttnKind.FULL for lc in costs.layers) == 3
    q8 = cost_table(model, model_facts(model), "q8_0", "q8_0")
    assert {(lc.k_bytes_per_cell, lc.v_bytes_per_cell) for lc in q8.layers} == {(272, 272)}  # 8 blocks x 34


def test_llama_gqa(tmp_path):
    costs, total = _costs(llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=1000), tmp_path)
    attn = (256 * Q4K_ROW_256            # attn_q   Q4_K {256, 256}
            + 64 * Q4K_ROW_256           # attn_k   Q4_K {256, 2 heads x 32}
            + 64 * 8 * Q8_ROW_32         # attn_v   Q8_0 {256, 64}
            + 256 * Q4K_ROW_256)         # attn_output Q4_K {256, 256}
    ffn = 2 * 512 * Q4K_ROW_256 + 256 * 2 * Q6K_ROW_256   # gate, up {256, 512}; down Q6_K {512, 256}
    other = 2 * 256 * 4                                    # attn_norm, ffn_norm f32
    for lc in costs.layers:
        assert _groups(lc) == {A: attn, F: ffn, OT: other}
        assert lc.weight_bytes == attn + ffn + other
        assert (lc.k_bytes_per_cell, lc.v_bytes_per_cell, lc.state_bytes_per_seq) == (64 * 2, 64 * 2, 0)
        assert dict(lc.elements)[A] == 2 * 256 * 256 + 2 * 256 * 64
    assert sorted(t.name for t in costs.non_repeating) == ["output.weight", "output_norm.weight", "token_embd.weight"]
    assert costs.non_repeating_bytes == 1000 * 8 * Q8_ROW_32 + 256 * 4 + 1000 * Q6K_ROW_256
    assert costs.layer_weight_bytes + costs.non_repeating_bytes == total
    assert not costs.tied_embeddings


@pytest.mark.parametrize("ctype, per_cell", [
    ("f16", 64 * 2), ("f32", 64 * 4), ("bf16", 64 * 2),
    ("q8_0", 64 // 32 * 34), ("q4_0", 64 // 32 * 18), ("Q8_0", 64 // 32 * 34),
])
def test_cache_types(tmp_path, ctype, per_cell):
    costs, _ = _costs(llama_spec(n_embd=256, n_head=8, n_head_kv=2), tmp_path, ctype, ctype)
    assert {(lc.k_bytes_per_cell, lc.v_bytes_per_cell) for lc in costs.layers} == {(per_cell, per_cell)}


def test_mixed_k_and_v_types(tmp_path):
    costs, _ = _costs(llama_spec(n_embd=256, n_head=8, n_head_kv=2), tmp_path, "q8_0", "f16")
    assert (costs.type_k, costs.type_v) == ("q8_0", "f16")
    assert {(lc.k_bytes_per_cell, lc.v_bytes_per_cell) for lc in costs.layers} == {(2 * 34, 64 * 2)}


def test_qwen3moe_experts(tmp_path):
    costs, total = _costs(qwen3moe_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_expert=8,
                                        n_ff_exp=128), tmp_path)
    attn = (512 * Q4K_ROW_256            # attn_q Q4_K {256, 8 x 64}
            + 128 * Q4K_ROW_256          # attn_k Q4_K {256, 2 x 64}
            + 128 * Q6K_ROW_256          # attn_v Q6_K {256, 128}
            + 256 * 2 * Q4K_ROW_256)     # attn_output Q4_K {512, 256}
    experts = (2 * (128 * 8) * Q4K_ROW_256        # gate_exps, up_exps Q4_K {256, 128, 8}
               + (256 * 8) * 4 * Q8_ROW_32)       # down_exps Q8_0 {128, 256, 8}
    other = 256 * 4 + 64 * 4 * 2 + 256 * 4 + 256 * 8 * 4   # attn_norm, k/q norms, ffn_norm, router f32
    for lc in costs.layers:
        assert _groups(lc) == {A: attn, E: experts, OT: other}
        assert (lc.k_bytes_per_cell, lc.v_bytes_per_cell) == (2 * 64 * 2, 2 * 64 * 2)
    q8, _ = _costs(qwen3moe_spec(n_layer=2, n_head_kv=2, head_dim=64), tmp_path, "q8_0", "q8_0")
    assert {lc.k_bytes_per_cell for lc in q8.layers} == {128 // 32 * 34}
    assert costs.layer_weight_bytes + costs.non_repeating_bytes == total


def test_gemma3_swa_and_tied_embeddings(tmp_path):
    costs, total = _costs(gemma3_spec(n_layer=7, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256,
                                      n_vocab=512, window=128), tmp_path)
    attn = (256 * 4 * Q8_ROW_32          # attn_q {128, 4 x 64}
            + 2 * 64 * 4 * Q8_ROW_32     # attn_k, attn_v {128, 64}
            + 128 * 8 * Q8_ROW_32)       # attn_output {256, 128}
    ffn = 2 * 256 * 4 * Q8_ROW_32 + 128 * 8 * Q8_ROW_32
    other = 4 * 128 * 4 + 2 * 64 * 4     # four n_embd norms, q/k norms
    assert [lc.kind for lc in costs.layers] == [AttnKind.SWA] * 5 + [AttnKind.FULL, AttnKind.SWA]
    assert [lc.window for lc in costs.layers] == [128] * 5 + [0, 128]
    for lc in costs.layers:
        assert _groups(lc) == {A: attn, F: ffn, OT: other}
        assert (lc.k_bytes_per_cell, lc.v_bytes_per_cell) == (64 * 2, 64 * 2)
    assert costs.tied_embeddings
    assert costs.non_repeating_bytes == 512 * 4 * Q8_ROW_32 + 128 * 4
    assert costs.layer_weight_bytes + costs.non_repeating_bytes == total


def test_deepseek2_mla(tmp_path):
    spec = deepseek2_spec(n_layer=3, n_dense_lead=1, n_embd=256, n_head=4, q_lora_rank=128, kv_lora_rank=128,
                          qk_nope=64, qk_rope=32, v_head_dim=64, n_ff=512, n_expert=4, n_expert_shared=1,
                          n_ff_exp=64)
    costs, total = _costs(spec, tmp_path)
    attn = (128 * 8 * Q8_ROW_32          # attn_q_a {256, 128}
            + 4 * 96 * 4 * Q8_ROW_32     # attn_q_b {128, 4 heads x (64 + 32)}
            + 160 * 8 * Q8_ROW_32        # attn_kv_a_mqa {256, 128 + 32}
            + 64 * 128 * 4 * 2           # attn_k_b f16 {64, 128, 4}
            + 128 * 64 * 4 * 2           # attn_v_b f16 {128, 64, 4}
            + 256 * 8 * Q8_ROW_32)       # attn_output {4 x 64, 256}
    norms = 256 * 4 + 128 * 4 + 128 * 4 + 256 * 4   # attn_norm, q_a_norm, kv_a_norm, ffn_norm
    dense_ffn = 2 * 512 * 8 * Q8_ROW_32 + 256 * 16 * Q8_ROW_32
    experts = 3 * (64 * 4 * 8 * Q8_ROW_32)          # down {64, 256, 4}: 1024 rows x 2 blocks; gate, up: 256 rows x 8
    assert experts == 1024 * 2 * Q8_ROW_32 + 2 * 256 * 8 * Q8_ROW_32
    shared = 2 * 64 * 8 * Q8_ROW_32 + 256 * 2 * Q8_ROW_32
    router = 256 * 4 * 4 + 4 * 4                    # ffn_gate_inp f32 {256, 4}, exp_probs_b f32 {4}
    assert _groups(costs.layers[0]) == {A: attn, F: dense_ffn, OT: norms}
    for lc in costs.layers[1:]:
        assert _groups(lc) == {A: attn, E: experts, S: shared, OT: norms + router}
    for lc in costs.layers:  # K-only cache: latent 128 + rope 32, one head
        assert (lc.k_bytes_per_cell, lc.v_bytes_per_cell) == (160 * 2, 0)
    q8, _ = _costs(spec, tmp_path, "q8_0", "q8_0")
    assert {(lc.k_bytes_per_cell, lc.v_bytes_per_cell) for lc in q8.layers} == {(160 // 32 * 34, 0)}
    assert costs.layer_weight_bytes + costs.non_repeating_bytes == total


def test_mamba2_state(tmp_path):
    costs, total = _costs(mamba2_spec(n_layer=2, n_embd=128, d_conv=4, d_inner=256, d_state=16, n_group=2,
                                      n_ssm_head=8), tmp_path)
    conv_dim = 256 + 2 * 2 * 16
    attn = ((256 + conv_dim + 8) * 4 * Q8_ROW_32   # ssm_in Q8_0 {128, d_inner + conv_dim + heads}
            + 4 * conv_dim * 4 + conv_dim * 4      # ssm_conv1d weight {4, conv_dim} and bias, f32
            + 3 * 8 * 4                            # ssm_dt bias, ssm_a, ssm_d: 8 heads f32
            + 128 * 8 * Q8_ROW_32)                 # ssm_out {256, 128}
    other = 128 * 4 + 256 * 4                      # attn_norm, ssm_norm {128, 2}
    state = ((4 - 1) * conv_dim + 16 * 256) * 4
    for lc in costs.layers:
        assert lc.kind is AttnKind.RECURRENT
        assert _groups(lc) == {A: attn, OT: other}
        assert (lc.k_bytes_per_cell, lc.v_bytes_per_cell, lc.state_bytes_per_seq) == (0, 0, state)
    assert costs.layer_weight_bytes + costs.non_repeating_bytes == total


def test_granitehybrid(tmp_path):
    costs, total = _costs(granitehybrid_spec(n_embd=128, n_head=4, head_count_kv=(0, 0, 2, 0), n_ff=256, d_conv=4,
                                             d_state=16, n_group=1, n_ssm_head=8), tmp_path)
    d_inner, conv_dim = 256, 256 + 2 * 1 * 16
    mixer = ((d_inner + conv_dim + 8) * 4 * Q8_ROW_32 + 4 * conv_dim * 4 + conv_dim * 4 + 3 * 8 * 4
             + 128 * 8 * Q8_ROW_32)
    attn = 128 * 4 * Q8_ROW_32 + 2 * 64 * 4 * Q8_ROW_32 + 128 * 4 * Q8_ROW_32   # q, k, v, output
    ffn = 2 * 256 * 4 * Q8_ROW_32 + 128 * 8 * Q8_ROW_32
    state = ((4 - 1) * conv_dim + 16 * d_inner) * 4
    rec = {A: mixer, F: ffn, OT: 128 * 4 + d_inner * 4 + 128 * 4}   # attn_norm, ssm_norm, ffn_norm
    att = {A: attn, F: ffn, OT: 2 * 128 * 4}
    assert [_groups(lc) for lc in costs.layers] == [rec, rec, att, rec]
    assert [(lc.k_bytes_per_cell, lc.v_bytes_per_cell, lc.state_bytes_per_seq) for lc in costs.layers] == \
        [(0, 0, state)] * 2 + [(2 * 32 * 2, 2 * 32 * 2, 0), (0, 0, state)]
    assert costs.layer_weight_bytes + costs.non_repeating_bytes == total


def test_unknown_architecture_weights_only(tmp_path):
    costs, total = _costs(llama_spec(arch="zyxformer", n_layer=2, n_embd=256, n_head=8, n_ff=512), tmp_path)
    assert [lc.kind for lc in costs.layers] == [AttnKind.UNKNOWN] * 2
    assert {(lc.k_bytes_per_cell, lc.v_bytes_per_cell, lc.state_bytes_per_seq) for lc in costs.layers} == {(0, 0, 0)}
    assert {lc.group_bytes(F) for lc in costs.layers} == {2 * 512 * Q4K_ROW_256 + 256 * 2 * Q6K_ROW_256}
    assert costs.layer_weight_bytes + costs.non_repeating_bytes == total


def test_quantized_cache_needs_whole_blocks(tmp_path):
    # head_dim 40 with one KV head: a 40-value row is not a whole number of 32-value q8_0 blocks
    spec = gemma3_spec(n_layer=2, n_embd=128, n_head=4, n_head_kv=1, head_dim=40)
    costs, _ = _costs(spec, tmp_path)
    assert {lc.k_bytes_per_cell for lc in costs.layers} == {40 * 2}
    with pytest.raises(BadInput, match="cache type q8_0 cannot hold layer 0's K"):
        _costs(spec, tmp_path, "q8_0", "f16")


def test_unknown_cache_type(tmp_path):
    with pytest.raises(BadInput, match="unsupported cache type 'q3_k'"):
        _costs(llama_spec(), tmp_path, "q3_k", "f16")
