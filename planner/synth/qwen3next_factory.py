"""qwen3next layouts for tests (src/models/qwen3next.cpp load_arch_tensors, pinned build): Gated
DeltaNet layers where (il + 1) % full_attention_interval != 0, gated full attention elsewhere, routed
experts plus a sigmoid-gated shared expert in every layer. It uses planner/synth/gguf_factory.py's
helpers and conventions (names from gguf-py, a sparse hole for the data).

A DeltaNet layer: attn_qkv [n_embd, 2 key_dim + value_dim] and attn_gate [n_embd, value_dim] (the
current converter's split of the legacy ssm_in), ssm_conv1d [d_conv, conv_dim], ssm_dt.bias and ssm_a
[n_v_heads], ssm_ba [n_embd, 2 n_v_heads], ssm_norm [head_v_dim], ssm_out [value_dim, n_embd], with
key_dim = d_state * n_k_heads (ssm.group_count) and value_dim = d_state * n_v_heads (ssm.time_step_rank).
An attention layer: attn_q [n_embd, 2 n_head head_dim] (query and gate), attn_k / attn_v, attn_output,
per-head Q/K norms.
"""
from __future__ import annotations

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q, T, _common, _embeddings


def qwen3next_spec(*, n_layer: int = 4, n_embd: int = 128, n_head: int = 4, n_head_kv: int = 2,
                   head_dim: int = 64, n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 64,
                   n_ff_shexp: int = 64, d_conv: int = 4, d_state: int = 32, n_k_heads: int = 2,
                   n_v_heads: int = 4, interval: int = 4, n_vocab: int = 512, mat_type: Q = Q.Q8_0,
                   exp_type: Q = Q.Q8_0, embd_type: Q = Q.Q8_0, out_type: Q | None = Q.Q8_0,
                   n_mtp: int = 0) -> ModelSpec:
    """`n_mtp` MTP blocks after the trunk (src/models/qwen3next.cpp load_block_mtp): a full-attention block
    with the experts and the shared expert, plus nextn.eh_proj, enorm, hnorm and shared_head_norm."""
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    spec = ModelSpec("qwen3next")
    _common(spec, n_layer + n_mtp, n_embd, n_vocab)
    if n_mtp:
        spec.metadata[Keys.LLM.NEXTN_PREDICT_LAYERS] = n_mtp
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
        Keys.Rope.DIMENSION_COUNT: head_dim // 4,   # Qwen3-Next ropes a quarter of each head
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff_exp * n_expert_used, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: n_ff_shexp,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        Keys.LLM.FULL_ATTENTION_INTERVAL: interval,
        Keys.SSM.CONV_KERNEL: d_conv, Keys.SSM.INNER_SIZE: value_dim, Keys.SSM.STATE_SIZE: d_state,
        Keys.SSM.TIME_STEP_RANK: n_v_heads, Keys.SSM.GROUP_COUNT: n_k_heads,
    })
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    for i in range(n_layer + n_mtp):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_POST_NORM, Q.F32, (n_embd,), i)
        if i >= n_layer:
            spec.add(T.NEXTN_EH_PROJ, mat_type, (2 * n_embd, n_embd), i)
            spec.add(T.NEXTN_ENORM, Q.F32, (n_embd,), i)
            spec.add(T.NEXTN_HNORM, Q.F32, (n_embd,), i)
            spec.add(T.NEXTN_SHARED_HEAD_NORM, Q.F32, (n_embd,), i)
        if (i + 1) % interval == 0 or i >= n_layer:
            spec.add(T.ATTN_Q, mat_type, (n_embd, 2 * n_head * head_dim), i)
            spec.add(T.ATTN_K, mat_type, (n_embd, n_head_kv * head_dim), i)
            spec.add(T.ATTN_V, mat_type, (n_embd, n_head_kv * head_dim), i)
            spec.add(T.ATTN_OUT, mat_type, (n_head * head_dim, n_embd), i)
            spec.add(T.ATTN_Q_NORM, Q.F32, (head_dim,), i)
            spec.add(T.ATTN_K_NORM, Q.F32, (head_dim,), i)
        else:
            spec.add(T.ATTN_QKV, mat_type, (n_embd, 2 * key_dim + value_dim), i)
            spec.add(T.ATTN_GATE, mat_type, (n_embd, value_dim), i)
            spec.add(T.SSM_CONV1D, Q.F32, (d_conv, 2 * key_dim + value_dim), i)
            spec.add(T.SSM_DT, Q.F32, (n_v_heads,), i, "bias")
            spec.add(T.SSM_A, Q.F32, (n_v_heads,), i, None)
            spec.add(T.SSM_BETA_ALPHA, mat_type, (n_embd, 2 * n_v_heads), i)
            spec.add(T.SSM_NORM, Q.F32, (d_state,), i)
            spec.add(T.SSM_OUT, mat_type, (value_dim, n_embd), i)
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_DOWN_EXP, exp_type, (n_ff_exp, n_embd, n_expert), i)
        spec.add(T.FFN_GATE_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_UP_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_GATE_INP_SHEXP, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE_SHEXP, mat_type, (n_embd, n_ff_shexp), i)
        spec.add(T.FFN_UP_SHEXP, mat_type, (n_embd, n_ff_shexp), i)
        spec.add(T.FFN_DOWN_SHEXP, mat_type, (n_ff_shexp, n_embd), i)
    return spec


def qwen35_spec(*, moe: bool, n_layer: int = 4, n_embd: int = 128, n_head: int = 4, n_head_kv: int = 2,
                head_dim: int = 64, n_rot: int = 16, sections: tuple[int, int, int, int] = (3, 3, 2, 0),
                n_ff: int = 256, n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 64,
                n_ff_shexp: int = 64, d_conv: int = 4, d_state: int = 32, n_k_heads: int = 2, n_v_heads: int = 4,
                interval: int = 4, n_vocab: int = 512, n_ctx: int = 4096, mat_type: Q = Q.Q8_0,
                qkv_type: Q | None = None, ssm_out_type: Q | None = None, ffn_type: Q | None = None,
                down_type: Q | None = None, exp_type: Q = Q.Q8_0, exp_down_type: Q | None = None,
                embd_type: Q = Q.Q8_0, out_type: Q | None = Q.Q8_0, n_mtp: int = 0) -> ModelSpec:
    """qwen35 / qwen35moe (src/models/qwen35.cpp, qwen35moe.cpp load_arch_tensors): qwen3next's layout
    with ssm_beta and ssm_alpha [n_embd, n_v_heads] in place of ssm_ba, interleaved M-RoPE sections,
    and (qwen35) a dense SwiGLU FFN of n_ff in every layer. Types default to `mat_type` where not given.
    `n_mtp` MTP blocks follow the trunk as the converter writes them (conversion/qwen.py: block_count
    extended, nextn_predict_layers): a full-attention block with the trunk's FFN kind plus nextn.eh_proj,
    enorm, hnorm and shared_head_norm (load_block_mtp; llama.cpp skips them unless MTP is loaded)."""
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    spec = ModelSpec("qwen35moe" if moe else "qwen35")
    _common(spec, n_layer + n_mtp, n_embd, n_vocab, n_ctx)
    if n_mtp:
        spec.metadata[Keys.LLM.NEXTN_PREDICT_LAYERS] = n_mtp
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
        Keys.Rope.DIMENSION_COUNT: n_rot, Keys.Rope.DIMENSION_SECTIONS: list(sections),
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.LLM.FULL_ATTENTION_INTERVAL: interval,
        Keys.SSM.CONV_KERNEL: d_conv, Keys.SSM.INNER_SIZE: value_dim, Keys.SSM.STATE_SIZE: d_state,
        Keys.SSM.TIME_STEP_RANK: n_v_heads, Keys.SSM.GROUP_COUNT: n_k_heads,
    })
    if moe:
        spec.metadata.update({
            Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp, Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: n_ff_shexp,
            Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        })
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    qkv_type, ssm_out_type = qkv_type or mat_type, ssm_out_type or mat_type
    ffn_type = ffn_type or mat_type
    down_type, exp_down_type = down_type or ffn_type, exp_down_type or exp_type
    for i in range(n_layer + n_mtp):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_POST_NORM, Q.F32, (n_embd,), i)
        if (i + 1) % interval == 0 or i >= n_layer:
            spec.add(T.ATTN_Q, mat_type, (n_embd, 2 * n_head * head_dim), i)
            spec.add(T.ATTN_K, mat_type, (n_embd, n_head_kv * head_dim), i)
            spec.add(T.ATTN_V, qkv_type, (n_embd, n_head_kv * head_dim), i)
            spec.add(T.ATTN_OUT, ssm_out_type, (n_head * head_dim, n_embd), i)
            spec.add(T.ATTN_Q_NORM, Q.F32, (head_dim,), i)
            spec.add(T.ATTN_K_NORM, Q.F32, (head_dim,), i)
        else:
            spec.add(T.ATTN_QKV, qkv_type, (n_embd, 2 * key_dim + value_dim), i)
            spec.add(T.ATTN_GATE, mat_type, (n_embd, value_dim), i)
            spec.add(T.SSM_CONV1D, Q.F32, (d_conv, 2 * key_dim + value_dim), i)
            spec.add(T.SSM_DT, Q.F32, (n_v_heads,), i, "bias")
            spec.add(T.SSM_A, Q.F32, (n_v_heads,), i, None)
            spec.add(T.SSM_BETA, mat_type, (n_embd, n_v_heads), i)
            spec.add(T.SSM_ALPHA, mat_type, (n_embd, n_v_heads), i)
            spec.add(T.SSM_NORM, Q.F32, (d_state,), i)
            spec.add(T.SSM_OUT, ssm_out_type, (value_dim, n_embd), i)
        if i >= n_layer:
            spec.add(T.NEXTN_EH_PROJ, mat_type, (2 * n_embd, n_embd), i)
            spec.add(T.NEXTN_ENORM, Q.F32, (n_embd,), i)
            spec.add(T.NEXTN_HNORM, Q.F32, (n_embd,), i)
            spec.add(T.NEXTN_SHARED_HEAD_NORM, Q.F32, (n_embd,), i)
        if not moe:
            spec.add(T.FFN_GATE, ffn_type, (n_embd, n_ff), i)
            spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
            spec.add(T.FFN_UP, ffn_type, (n_embd, n_ff), i)
            continue
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_DOWN_EXP, exp_down_type, (n_ff_exp, n_embd, n_expert), i)
        spec.add(T.FFN_GATE_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_UP_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_GATE_INP_SHEXP, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE_SHEXP, ffn_type, (n_embd, n_ff_shexp), i)
        spec.add(T.FFN_UP_SHEXP, ffn_type, (n_embd, n_ff_shexp), i)
        spec.add(T.FFN_DOWN_SHEXP, down_type, (n_ff_shexp, n_embd), i)
    return spec
