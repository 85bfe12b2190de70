"""Models of the linear-attention hybrids (kimi-linear: Kimi Delta Attention beside MLA layers, routed
and shared experts), laid out as the pinned llama.cpp's load_arch_tensors creates the tensors
(src/models/kimi-linear.cpp), metadata as its converter writes it (conversion/kimi_linear.py:
head_count_kv 1 on the MLA layers and 0 on the KDA layers, key_length kv_lora_rank + qk_rope_head_dim,
kda.head_dim, ssm.conv_kernel). `kimi_linear_layout` writes any size (the tiny test files); the
`_spec` functions the published config.json's, with a Q4_K / Q6_K mix like llama-quantize's Q4_K_M
(Q6_K for the output and the down projections, Q8_0 where a row is not a multiple of 256) and a
stand-in tokenizer of the real vocabulary's length. The tensor data is a sparse hole.
"""
from __future__ import annotations

from collections.abc import Sequence

from gguf import Keys

from planner.gguf.keys import (
    LLM_KV_ATTN_RES_BLOCK_SIZE,
    LLM_KV_EXPERT_LATENT_LENGTH,
    LLM_KV_KDA_GATE_LOWER_BOUND,
    LLM_KV_KDA_SAFE_GATE,
    LLM_KV_SITU_BETA,
    LLM_KV_SITU_LINEAR_BETA,
)
from planner.synth.gguf_factory import ModelSpec, Q, T, _common, _embeddings
from planner.synth.shapes_common import tokenized

# llama_expert_gating_func_type (src/llama-hparams.h): Kimi routes by sigmoid
GATING_SIGMOID = 2


def kimi_linear_layout(*, n_layer: int = 4, mla_layers: Sequence[int] = (3,), n_embd: int = 128, n_head: int = 4,
                       kda_head: int = 32, d_conv: int = 4, kv_lora: int = 64, n_rot: int = 32,
                       nope: int = 32, head_v: int = 32, n_ff: int = 256, n_dense_lead: int = 1,
                       n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 64, n_shared: int = 1,
                       weights_scale: float = 2.5, n_vocab: int = 512, n_ctx: int = 4096, mat_type: Q = Q.Q8_0,
                       small_type: Q = Q.Q8_0, down_type: Q | None = None, exp_type: Q = Q.Q8_0,
                       exp_down_type: Q | None = None, embd_type: Q = Q.Q8_0, out_type: Q = Q.Q8_0) -> ModelSpec:
    """kimi-linear: KDA layers (q/k/v projections of n_head x kda_head, their causal convolutions of
    d_conv, the gate's f_a/f_b and the output gate's g_a/g_b low-rank pairs through kda_head, beta, A,
    dt bias, the gated norm, wo) except the `mla_layers` (0-based), which are MLA without a query LoRA
    (wq, wkv_a_mqa, kv_a_norm, wk_b, wv_b, wo); a SwiGLU FFN of n_ff in the first n_dense_lead layers,
    sigmoid-routed experts with a selection bias and n_shared shared experts in the others.
    `small_type` types the tensors whose rows are kda_head or nope wide."""
    spec = ModelSpec("kimi-linear")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: [1 if il in mla_layers else 0 for il in range(n_layer)],
        Keys.Attention.KEY_LENGTH: kv_lora + n_rot, Keys.Attention.KEY_LENGTH_MLA: nope + n_rot,
        Keys.Attention.VALUE_LENGTH_MLA: head_v, Keys.Attention.KV_LORA_RANK: kv_lora,
        Keys.Rope.DIMENSION_COUNT: n_rot, Keys.SSM.CONV_KERNEL: d_conv, Keys.KDA.HEAD_DIM: kda_head,
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        Keys.LLM.EXPERT_SHARED_COUNT: n_shared, Keys.LLM.LEADING_DENSE_BLOCK_COUNT: n_dense_lead,
        Keys.LLM.EXPERT_WEIGHTS_SCALE: weights_scale, Keys.LLM.EXPERT_GATING_FUNC: GATING_SIGMOID,
    })
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    down_type, exp_down_type = down_type or mat_type, exp_down_type or exp_type
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        if i in mla_layers:
            spec.add(T.ATTN_Q, mat_type, (n_embd, n_head * (nope + n_rot)), i)
            spec.add(T.ATTN_KV_A_MQA, mat_type, (n_embd, kv_lora + n_rot), i)
            spec.add(T.ATTN_KV_A_NORM, Q.F32, (kv_lora,), i)
            spec.add(T.ATTN_K_B, small_type, (nope, kv_lora, n_head), i)
            spec.add(T.ATTN_V_B, mat_type, (kv_lora, head_v, n_head), i)
            spec.add(T.ATTN_OUT, mat_type, (n_head * head_v, n_embd), i)
        else:
            _kda_layer(spec, i, n_embd=n_embd, n_head=n_head, kda_head=kda_head, d_conv=d_conv, mat_type=mat_type,
                       small_type=small_type, low_rank=True)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        if i < n_dense_lead:
            spec.add(T.FFN_GATE, mat_type, (n_embd, n_ff), i)
            spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
            spec.add(T.FFN_UP, mat_type, (n_embd, n_ff), i)
            continue
        n_ff_shexp = n_ff_exp * max(n_shared, 1)
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_GATE_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_DOWN_EXP, exp_down_type, (n_ff_exp, n_embd, n_expert), i)
        spec.add(T.FFN_UP_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_GATE_SHEXP, mat_type, (n_embd, n_ff_shexp), i)
        spec.add(T.FFN_DOWN_SHEXP, down_type, (n_ff_shexp, n_embd), i)
        spec.add(T.FFN_UP_SHEXP, mat_type, (n_embd, n_ff_shexp), i)
        spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n_expert,), i, "bias")
    return spec


def _kda_layer(spec: ModelSpec, i: int, *, n_embd: int, n_head: int, kda_head: int, d_conv: int, mat_type: Q,
               small_type: Q, low_rank: bool) -> None:
    """One KDA layer's tensors: kimi-linear's low-rank gates (f_a/f_b, g_a/g_b through kda_head, A padded
    to [1, n_head, 1, 1]) or bailingmoe3's full-rank ones (f_a and g_a [n_embd, d_inner], A [1, n_head])."""
    d_inner = n_head * kda_head
    for conv in (T.SSM_CONV1D_Q, T.SSM_CONV1D_K, T.SSM_CONV1D_V):
        spec.add(conv, Q.F32, (d_conv, 1, d_inner, 1), i)
    for proj in (T.ATTN_Q, T.ATTN_K, T.ATTN_V):
        spec.add(proj, mat_type, (n_embd, d_inner), i)
    spec.add(T.SSM_F_A, mat_type, (n_embd, kda_head if low_rank else d_inner), i)
    if low_rank:
        spec.add(T.SSM_F_B, small_type, (kda_head, d_inner), i)
    spec.add(T.SSM_BETA, mat_type, (n_embd, n_head), i)
    spec.add(T.SSM_A, Q.F32, (1, n_head, 1, 1) if low_rank else (1, n_head), i, None)
    spec.add(T.SSM_DT, Q.F32, (d_inner,), i, "bias")
    spec.add(T.SSM_G_A, mat_type, (n_embd, kda_head if low_rank else d_inner), i)
    if low_rank:
        spec.add(T.SSM_G_B, small_type, (kda_head, d_inner), i)
    spec.add(T.SSM_NORM, Q.F32, (kda_head,), i)
    spec.add(T.ATTN_OUT, mat_type, (d_inner, n_embd), i)


def bailingmoe3_layout(*, n_layer: int = 4, group: int = 4, n_embd: int = 128, n_head: int = 4, kda_head: int = 32,
                       d_conv: int = 4, gate_lower_bound: float = -5.0, q_lora: int = 0, kv_lora: int = 64,
                       n_rot: int = 32, nope: int = 32, head_v: int = 32, n_ff: int = 256, n_dense_lead: int = 1,
                       n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 64, n_ff_shexp: int = 64,
                       weights_scale: float = 2.5, n_vocab: int = 512, n_ctx: int = 4096, mat_type: Q = Q.Q8_0,
                       small_type: Q = Q.Q8_0, down_type: Q | None = None, exp_type: Q = Q.Q8_0,
                       exp_down_type: Q | None = None, embd_type: Q = Q.Q8_0, out_type: Q = Q.Q8_0) -> ModelSpec:
    """bailingmoe3 (src/models/bailingmoe3.cpp load_arch_tensors; metadata as conversion/bailingmoe3.py
    writes it): KDA layers with full-rank gates except every `group`-th layer and the tail past the last
    whole group (is_full_attention), which are gated MLA (a query LoRA of q_lora when not 0, wk_b, wv_b,
    a per-head sigmoid gate attn_gate [n_embd, n_head], RoPE over n_rot); a SwiGLU FFN of n_ff in the first
    n_dense_lead layers, sigmoid-routed experts with a selection bias, normalised weights and a shared expert
    of n_ff_shexp in the others. value_length is the KDA head size (the converter's head_dim)."""
    spec = ModelSpec("bailingmoe3")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx)
    full = [(il + 1) % group == 0 or il >= n_layer // group * group for il in range(n_layer)]
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: [int(f) for f in full],
        Keys.Attention.KEY_LENGTH: kv_lora + n_rot, Keys.Attention.VALUE_LENGTH: kda_head,
        Keys.Attention.KEY_LENGTH_MLA: nope + n_rot, Keys.Attention.VALUE_LENGTH_MLA: head_v,
        Keys.Attention.KV_LORA_RANK: kv_lora, Keys.Rope.DIMENSION_COUNT: n_rot, Keys.SSM.CONV_KERNEL: d_conv,
        Keys.KDA.HEAD_DIM: kda_head, LLM_KV_KDA_SAFE_GATE: True, LLM_KV_KDA_GATE_LOWER_BOUND: gate_lower_bound,
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: n_ff_shexp, Keys.LLM.EXPERT_SHARED_COUNT: 1,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        Keys.LLM.LEADING_DENSE_BLOCK_COUNT: n_dense_lead, Keys.LLM.EXPERT_WEIGHTS_SCALE: weights_scale,
        Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_GATING_FUNC: GATING_SIGMOID,
    })
    if q_lora:
        spec.metadata[Keys.Attention.Q_LORA_RANK] = q_lora
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    down_type, exp_down_type = down_type or mat_type, exp_down_type or exp_type
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        if not full[i]:
            _kda_layer(spec, i, n_embd=n_embd, n_head=n_head, kda_head=kda_head, d_conv=d_conv, mat_type=mat_type,
                       small_type=small_type, low_rank=False)
        else:
            if q_lora:
                spec.add(T.ATTN_Q_A, mat_type, (n_embd, q_lora), i)
                spec.add(T.ATTN_Q_A_NORM, Q.F32, (q_lora,), i)
                spec.add(T.ATTN_Q_B, mat_type, (q_lora, n_head * (nope + n_rot)), i)
            else:
                spec.add(T.ATTN_Q, mat_type, (n_embd, n_head * (nope + n_rot)), i)
            spec.add(T.ATTN_KV_A_MQA, mat_type, (n_embd, kv_lora + n_rot), i)
            spec.add(T.ATTN_KV_A_NORM, Q.F32, (kv_lora,), i)
            spec.add(T.ATTN_K_B, small_type, (nope, kv_lora, n_head), i)
            spec.add(T.ATTN_V_B, mat_type, (kv_lora, head_v, n_head), i)
            spec.add(T.ATTN_GATE, mat_type, (n_embd, n_head), i)
            spec.add(T.ATTN_OUT, mat_type, (n_head * head_v, n_embd), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        if i < n_dense_lead:
            spec.add(T.FFN_GATE, mat_type, (n_embd, n_ff), i)
            spec.add(T.FFN_UP, mat_type, (n_embd, n_ff), i)
            spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
            continue
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n_expert,), i, "bias")
        spec.add(T.FFN_GATE_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_UP_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_DOWN_EXP, exp_down_type, (n_ff_exp, n_embd, n_expert), i)
        spec.add(T.FFN_GATE_SHEXP, mat_type, (n_embd, n_ff_shexp), i)
        spec.add(T.FFN_UP_SHEXP, mat_type, (n_embd, n_ff_shexp), i)
        spec.add(T.FFN_DOWN_SHEXP, down_type, (n_ff_shexp, n_embd), i)
    return spec


KIMI_LINEAR_VOCAB = 163840
KIMI_LINEAR_CTX = 1048576


def kimi_linear_48b_a3b_spec() -> ModelSpec:
    """Kimi-Linear-48B-A3B (moonshotai/Kimi-Linear-48B-A3B-Instruct config.json): 27 layers, 2304 wide,
    32 heads (head_dim 72); KDA (head_dim 128, short_conv_kernel_size 4) except full_attn_layers 4, 8, …, 24, 27
    (1-based), which are MLA (kv_lora_rank 512, qk_nope 128 + qk_rope 64, v_head_dim 128, no q_lora);
    first_k_dense_replace 1 (intermediate_size 9216), 256 experts (8 used) of moe_intermediate_size 1024
    with one shared expert, routed_scaling_factor 2.446, vocab 163840, untied output."""
    spec = kimi_linear_layout(n_layer=27, mla_layers=(3, 7, 11, 15, 19, 23, 26), n_embd=2304, n_head=32,
                              kda_head=128, d_conv=4, kv_lora=512, n_rot=64, nope=128, head_v=128, n_ff=9216,
                              n_dense_lead=1, n_expert=256, n_expert_used=8, n_ff_exp=1024, n_shared=1,
                              weights_scale=2.446, n_vocab=KIMI_LINEAR_VOCAB, n_ctx=KIMI_LINEAR_CTX,
                              mat_type=Q.Q4_K, small_type=Q.Q8_0, down_type=Q.Q6_K, exp_type=Q.Q4_K,
                              exp_down_type=Q.Q6_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)
    spec = tokenized(spec, KIMI_LINEAR_VOCAB, KIMI_LINEAR_CTX)
    # config.json's head_dim 72: the converter's base class writes it as value_length (key_length it
    # overwrites with kv_lora_rank + qk_rope_head_dim)
    spec.metadata[Keys.Attention.VALUE_LENGTH] = 72
    spec.metadata[Keys.Attention.LAYERNORM_RMS_EPS] = 1e-5
    return spec


LING3_VOCAB = 157184
LING3_CTX = 131072


def ling_3_tiny_class_spec() -> ModelSpec:
    """A Ling-3.0-tiny-class bailingmoe3 file. Fixed by the pin and the model card (inclusionAI/Ling-3.0-tiny):
    24 layers 1536 wide with 128 experts (bailingmoe3.cpp's 7.9B-A1.3B type), 8 routed and 1 shared expert
    per token, KDA and MLA stacked 3:1 in blocks of 4, a query LoRA (gguf-py's tensor map names its q_a_proj),
    a 131072-token context, no MTP block. Assumed where the published config.json was not at hand: 16 heads,
    KDA heads of 128 with conv 4, q_lora 768, kv_lora 512, qk_nope 128 + qk_rope 64, v 128, one dense layer
    of 4608, experts and shared expert of 512 (7.9B in all with these), the Ling 2.x vocabulary of 157184."""
    spec = bailingmoe3_layout(n_layer=24, group=4, n_embd=1536, n_head=16, kda_head=128, d_conv=4,
                              gate_lower_bound=-5.0, q_lora=768, kv_lora=512, n_rot=64, nope=128, head_v=128,
                              n_ff=4608, n_dense_lead=1, n_expert=128, n_expert_used=8, n_ff_exp=512,
                              n_ff_shexp=512, weights_scale=2.5, n_vocab=LING3_VOCAB, n_ctx=LING3_CTX,
                              mat_type=Q.Q4_K, small_type=Q.Q8_0, down_type=Q.Q6_K, exp_type=Q.Q4_K,
                              exp_down_type=Q.Q6_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)
    return tokenized(spec, LING3_VOCAB, LING3_CTX)


def _k3_kda(spec: ModelSpec, i: int, n_embd: int, n_head: int, kda_head: int, d_conv: int, mat_type: Q,
            small_type: Q) -> None:
    """kimi-k3's KDA layer: kimi-linear's with a 1-d A and one full-rank output gate ssm_g."""
    d_inner = n_head * kda_head
    for conv in (T.SSM_CONV1D_Q, T.SSM_CONV1D_K, T.SSM_CONV1D_V):
        spec.add(conv, Q.F32, (d_conv, 1, d_inner, 1), i)
    for proj in (T.ATTN_Q, T.ATTN_K, T.ATTN_V):
        spec.add(proj, mat_type, (n_embd, d_inner), i)
    spec.add(T.SSM_F_A, mat_type, (n_embd, kda_head), i)
    spec.add(T.SSM_F_B, small_type, (kda_head, d_inner), i)
    spec.add(T.SSM_BETA, mat_type, (n_embd, n_head), i)
    spec.add(T.SSM_A, Q.F32, (n_head,), i, None)
    spec.add(T.SSM_DT, Q.F32, (d_inner,), i, "bias")
    spec.tensors.append((f"blk.{i}.ssm_g.weight", mat_type, (n_embd, d_inner)))
    spec.add(T.SSM_NORM, Q.F32, (kda_head,), i)
    spec.add(T.ATTN_OUT, mat_type, (d_inner, n_embd), i)


def _k3_mla(spec: ModelSpec, i: int, n_embd: int, n_head: int, q_lora: int, kv_lora: int, n_rot: int, nope: int,
            head_v: int, mat_type: Q, small_type: Q) -> None:
    """kimi-k3's MLA layer: an optional query LoRA, split wk_b / wv_b, the full output gate attn_gate."""
    if q_lora:
        spec.add(T.ATTN_Q_A_NORM, Q.F32, (q_lora,), i)
    spec.add(T.ATTN_KV_A_NORM, Q.F32, (kv_lora,), i)
    if q_lora:
        spec.add(T.ATTN_Q_A, mat_type, (n_embd, q_lora), i)
        spec.add(T.ATTN_Q_B, mat_type, (q_lora, n_head * (nope + n_rot)), i)
    else:
        spec.add(T.ATTN_Q, mat_type, (n_embd, n_head * (nope + n_rot)), i)
    spec.add(T.ATTN_KV_A_MQA, mat_type, (n_embd, kv_lora + n_rot), i)
    spec.add(T.ATTN_K_B, small_type, (nope, kv_lora, n_head), i)
    spec.add(T.ATTN_V_B, mat_type, (kv_lora, head_v, n_head), i)
    spec.add(T.ATTN_GATE, mat_type, (n_embd, n_head * head_v), i)
    spec.add(T.ATTN_OUT, mat_type, (n_head * head_v, n_embd), i)


def kimi_k3_layout(*, n_layer: int = 4, mla_layers: Sequence[int] = (3,), n_embd: int = 128, n_head: int = 4,
                   kda_head: int = 32, d_conv: int = 4, gate_lower_bound: float | None = -5.0, q_lora: int = 0,
                   kv_lora: int = 64, n_rot: int = 32, nope: int = 32, head_v: int = 32, n_ff: int = 256,
                   n_dense_lead: int = 1, n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 64,
                   n_shared: int = 1, latent: int = 64, res_block: int = 2, situ_beta: float = 2.0,
                   situ_linear_beta: float = 3.0, weights_scale: float = 2.5, n_vocab: int = 512,
                   n_ctx: int = 4096, mat_type: Q = Q.Q8_0, small_type: Q = Q.Q8_0, down_type: Q | None = None,
                   exp_type: Q = Q.Q8_0, exp_down_type: Q | None = None, embd_type: Q = Q.Q8_0,
                   out_type: Q = Q.Q8_0) -> ModelSpec:
    """kimi-k3 (src/models/kimi-k3.cpp load_arch_tensors; metadata as conversion/kimi_k3.py writes it): KDA
    layers (kimi-linear's, with a 1-d A and one full-rank output gate ssm_g) except `mla_layers`, which are
    RoPE-less MLA with a full sigmoid gate attn_gate [n_embd, n_head head_v]; attention-residual scores per
    layer (attn_res_score, ffn_res_score) and before the output (output_res_score) when res_block > 0; a
    situ FFN of n_ff in the first n_dense_lead layers, elsewhere routed experts in a `latent`-wide space
    (ffn_routed_down/up/norm) with a selection bias and n_shared shared experts of n_ff_exp at n_embd."""
    arch = "kimi-k3"
    spec = ModelSpec(arch)
    _common(spec, n_layer, n_embd, n_vocab, n_ctx)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: [1 if il in mla_layers else 0 for il in range(n_layer)],
        Keys.Attention.KEY_LENGTH: kv_lora + n_rot, Keys.Attention.VALUE_LENGTH: kv_lora,
        Keys.Attention.KEY_LENGTH_MLA: nope + n_rot, Keys.Attention.VALUE_LENGTH_MLA: head_v,
        Keys.Attention.KV_LORA_RANK: kv_lora, Keys.Rope.DIMENSION_COUNT: n_rot, Keys.SSM.CONV_KERNEL: d_conv,
        Keys.KDA.HEAD_DIM: kda_head, Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        Keys.LLM.EXPERT_SHARED_COUNT: n_shared, Keys.LLM.LEADING_DENSE_BLOCK_COUNT: n_dense_lead,
        Keys.LLM.EXPERT_WEIGHTS_SCALE: weights_scale, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
        Keys.LLM.EXPERT_GATING_FUNC: GATING_SIGMOID, LLM_KV_ATTN_RES_BLOCK_SIZE: res_block,
        LLM_KV_SITU_BETA: situ_beta, LLM_KV_SITU_LINEAR_BETA: situ_linear_beta,
    })
    if latent:
        spec.metadata[LLM_KV_EXPERT_LATENT_LENGTH] = latent
    if gate_lower_bound is not None:
        spec.metadata[LLM_KV_KDA_GATE_LOWER_BOUND] = gate_lower_bound
    if q_lora:
        spec.metadata[Keys.Attention.Q_LORA_RANK] = q_lora
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    if res_block:
        spec.tensors.append(("output_res_score.weight", Q.F32, (n_embd,)))
    down_type, exp_down_type = down_type or mat_type, exp_down_type or exp_type
    width = latent or n_embd
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        if res_block:
            spec.tensors.append((f"blk.{i}.attn_res_score.weight", Q.F32, (n_embd,)))
            spec.tensors.append((f"blk.{i}.ffn_res_score.weight", Q.F32, (n_embd,)))
        if i not in mla_layers:
            _k3_kda(spec, i, n_embd, n_head, kda_head, d_conv, mat_type, small_type)
        else:
            _k3_mla(spec, i, n_embd, n_head, q_lora, kv_lora, n_rot, nope, head_v, mat_type, small_type)
        if i < n_dense_lead:
            spec.add(T.FFN_GATE, mat_type, (n_embd, n_ff), i)
            spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
            spec.add(T.FFN_UP, mat_type, (n_embd, n_ff), i)
            continue
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n_expert,), i, "bias")
        spec.add(T.FFN_GATE_EXP, exp_type, (width, n_ff_exp, n_expert), i)
        spec.add(T.FFN_DOWN_EXP, exp_down_type, (n_ff_exp, width, n_expert), i)
        spec.add(T.FFN_UP_EXP, exp_type, (width, n_ff_exp, n_expert), i)
        if latent:
            spec.tensors.append((f"blk.{i}.ffn_routed_down.weight", mat_type, (n_embd, latent)))
            spec.tensors.append((f"blk.{i}.ffn_routed_up.weight", mat_type, (latent, n_embd)))
            spec.tensors.append((f"blk.{i}.ffn_routed_norm.weight", Q.F32, (latent,)))
        n_ff_shexp = n_ff_exp * max(n_shared, 1)
        spec.add(T.FFN_GATE_SHEXP, mat_type, (n_embd, n_ff_shexp), i)
        spec.add(T.FFN_DOWN_SHEXP, down_type, (n_ff_shexp, n_embd), i)
        spec.add(T.FFN_UP_SHEXP, mat_type, (n_embd, n_ff_shexp), i)
    return spec


KIMI_K3_VOCAB = 163840
KIMI_K3_CTX = 1048576


def kimi_k3_spec() -> ModelSpec:
    """Kimi K3 (moonshotai/Kimi-K3, its text backbone; the pin's 2.8T-A50B type for 93 layers), dimensions as
    read off the released config.json by public notes on the release: 7168 wide, 96 heads; KDA heads of 128
    with conv 4 and the -5 gate lower bound; 24 gated MLA layers (every 4th and the last) with q_lora 1536,
    kv_lora 512, qk_nope 128 + qk_rope 64, v 128; one dense layer of 18432; 896 experts (16 used) of 3072 in
    a 3584-wide latent space plus one shared expert; attention residuals every 12 layers; vocabulary 163840;
    a 1M context. The routed experts are MXFP4 as conversion/kimi_k3.py writes them, the rest a Q4_K_M mix."""
    n_layer = 93
    mla = tuple(il for il in range(n_layer) if (il + 1) % 4 == 0 or il == n_layer - 1)
    spec = kimi_k3_layout(n_layer=n_layer, mla_layers=mla, n_embd=7168, n_head=96, kda_head=128, d_conv=4,
                          gate_lower_bound=-5.0, q_lora=1536, kv_lora=512, n_rot=64, nope=128, head_v=128,
                          n_ff=18432, n_dense_lead=1, n_expert=896, n_expert_used=16, n_ff_exp=3072, n_shared=1,
                          latent=3584, res_block=12, situ_beta=2.0, situ_linear_beta=2.0, weights_scale=2.5,
                          n_vocab=KIMI_K3_VOCAB, n_ctx=KIMI_K3_CTX, mat_type=Q.Q4_K, small_type=Q.Q8_0,
                          down_type=Q.Q6_K, exp_type=Q.MXFP4, exp_down_type=Q.MXFP4, embd_type=Q.Q4_K,
                          out_type=Q.Q6_K)
    spec = tokenized(spec, KIMI_K3_VOCAB, KIMI_K3_CTX)
    spec.metadata[Keys.Attention.LAYERNORM_RMS_EPS] = 1e-5
    return spec
