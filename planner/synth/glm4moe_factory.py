"""glm4moe layouts for tests (src/models/glm4-moe.cpp load_arch_tensors, pinned build): GLM-4.5 and
GLM-4.5-Air. It uses planner/synth/gguf_factory.py's helpers and conventions (names from gguf-py, a
sparse hole for the data).

Every block: attn_norm, attn_q/k/v with biases, attn_output, post_attention_norm (the norm before the
FFN; glm4moe has no ffn_norm); the first `leading_dense_block_count` blocks a dense FFN, the rest
routed experts (ffn_gate_inp, exp_probs_b, gate/up/down _exps) and one shared expert of n_ff_exp.
The `nextn_predict_layers` blocks after the trunk are whole MoE blocks plus the MTP head's
nextn.eh_proj [2 n_embd, n_embd], nextn.enorm, nextn.hnorm and nextn.shared_head_norm.
"""
from __future__ import annotations

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q, T, _common, _embeddings, add_tokenizer


def glm4moe_spec(*, n_layer: int = 3, n_nextn: int = 1, n_dense_lead: int = 1, n_embd: int = 256,
                 n_head: int = 4, n_head_kv: int = 2, head_dim: int = 64, n_ff: int = 512, n_expert: int = 4,
                 n_expert_used: int = 2, n_ff_exp: int = 64, n_vocab: int = 1000, mat_type: Q = Q.Q8_0,
                 v_type: Q = Q.Q8_0, exp_type: Q = Q.Q8_0, down_type: Q = Q.Q8_0, embd_type: Q = Q.Q8_0,
                 out_type: Q | None = Q.Q8_0) -> ModelSpec:
    """`n_layer` trunk blocks and `n_nextn` MTP blocks after them (block_count = n_layer + n_nextn)."""
    n_all = n_layer + n_nextn
    spec = ModelSpec("glm4moe")
    _common(spec, n_all, n_embd, n_vocab)
    spec.metadata.update({
        Keys.LLM.NEXTN_PREDICT_LAYERS: n_nextn, Keys.LLM.LEADING_DENSE_BLOCK_COUNT: n_dense_lead,
        Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
        Keys.Rope.DIMENSION_COUNT: head_dim // 2,   # GLM-4.5 ropes half of each head
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        Keys.LLM.EXPERT_SHARED_COUNT: 1, Keys.LLM.EXPERT_WEIGHTS_SCALE: 1.0, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
        Keys.LLM.EXPERT_GATING_FUNC: 2,   # sigmoid
    })
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    q, kv = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_all):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_Q, mat_type, (n_embd, q), i)
        spec.add(T.ATTN_K, mat_type, (n_embd, kv), i)
        spec.add(T.ATTN_V, v_type, (n_embd, kv), i)
        spec.add(T.ATTN_Q, Q.F32, (q,), i, "bias")
        spec.add(T.ATTN_K, Q.F32, (kv,), i, "bias")
        spec.add(T.ATTN_V, Q.F32, (kv,), i, "bias")
        spec.add(T.ATTN_OUT, mat_type, (q, n_embd), i)
        spec.add(T.ATTN_POST_NORM, Q.F32, (n_embd,), i)
        if i < n_dense_lead:
            spec.add(T.FFN_GATE, mat_type, (n_embd, n_ff), i)
            spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
            spec.add(T.FFN_UP, mat_type, (n_embd, n_ff), i)
        else:
            spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
            spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n_expert,), i, "bias")
            spec.add(T.FFN_GATE_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
            spec.add(T.FFN_DOWN_EXP, down_type, (n_ff_exp, n_embd, n_expert), i)
            spec.add(T.FFN_UP_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
            spec.add(T.FFN_GATE_SHEXP, mat_type, (n_embd, n_ff_exp), i)
            spec.add(T.FFN_DOWN_SHEXP, down_type, (n_ff_exp, n_embd), i)
            spec.add(T.FFN_UP_SHEXP, mat_type, (n_embd, n_ff_exp), i)
        if i >= n_layer:
            spec.add(T.NEXTN_EH_PROJ, mat_type, (2 * n_embd, n_embd), i)
            spec.add(T.NEXTN_ENORM, Q.F32, (n_embd,), i)
            spec.add(T.NEXTN_HNORM, Q.F32, (n_embd,), i)
            spec.add(T.NEXTN_SHARED_HEAD_NORM, Q.F32, (n_embd,), i)
    return spec


def glm45_air_like(n_layer: int = 4, n_expert: int = 16) -> ModelSpec:
    """GLM-4.5-Air's shapes (Q4_K_M-like types) with fewer blocks and experts: 4096 wide, 96 query heads
    and 8 KV heads of 128, dense n_ff 10944 in block 0, experts of 1408 (8 used) plus one shared, a
    151552-token vocabulary, and one MTP block after the trunk as the real file has (block_count 47,
    nextn_predict_layers 1). Rows of 1408 and 10944 values are not whole Q4_K/Q6_K blocks, so those
    down projections are Q8_0."""
    spec = glm4moe_spec(n_layer=n_layer, n_nextn=1, n_dense_lead=1, n_embd=4096, n_head=96, n_head_kv=8,
                        head_dim=128, n_ff=10944, n_expert=n_expert, n_expert_used=8, n_ff_exp=1408,
                        n_vocab=151552, mat_type=Q.Q4_K, v_type=Q.Q6_K, exp_type=Q.Q4_K, down_type=Q.Q8_0,
                        embd_type=Q.Q4_K, out_type=Q.Q6_K)
    add_tokenizer(spec, 151552, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    spec.metadata[Keys.LLM.CONTEXT_LENGTH] = 131072
    spec.metadata[Keys.Rope.FREQ_BASE] = 1000000.0
    return spec
