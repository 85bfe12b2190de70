"""Layouts of the hybrid recurrent families for tests (names and shapes as the pinned llama.cpp's
load_arch_tensors creates them), on planner/synth/gguf_factory.py's helpers.

- nemotron_h / nemotron_h_moe (src/models/nemotron-h.cpp): a block per letter of NVIDIA's
  hybrid_override_pattern: "M" Mamba-2 (head_count_kv 0, feed_forward_length 0), "*" attention
  without RoPE (feed_forward_length 0), "-" a relu^2 MLP of up and down, "E" routed relu^2 experts of
  up and down with a sigmoid router, its exp_probs_b selection bias and a relu^2 shared expert.
"""
from __future__ import annotations

from gguf import GGUFValueType, Keys

from planner.synth.gguf_factory import ModelSpec, Q, T, Typed, _common, _embeddings, _mamba2_mixer, _ssm_keys


def _u32s(values: list[int]) -> Typed:
    return Typed(values, GGUFValueType.ARRAY, GGUFValueType.UINT32)


def nemotron_h_spec(*, pattern: str = "M*-M-", n_embd: int = 128, n_head: int = 4, n_head_kv: int = 2,
                    head_dim: int = 32, n_ff: int = 256, d_conv: int = 4, d_inner: int = 256, d_state: int = 16,
                    n_group: int = 2, n_ssm_head: int = 8, n_expert: int = 8, n_expert_used: int = 2,
                    n_ff_exp: int = 64, n_ff_shexp: int = 128, norm_w: bool = True, w_scale: float = 2.5,
                    n_vocab: int = 512, n_ctx: int = 4096, mat_type: Q = Q.Q8_0, v_type: Q | None = None,
                    down_type: Q | None = None, exp_type: Q = Q.Q8_0, exp_down_type: Q | None = None,
                    embd_type: Q = Q.Q8_0, out_type: Q | None = Q.Q8_0) -> ModelSpec:
    moe = "E" in pattern
    n_layer = len(pattern)
    spec = ModelSpec("nemotron_h_moe" if moe else "nemotron_h")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: _u32s([n_head_kv if c == "*" else 0 for c in pattern]),
        Keys.LLM.FEED_FORWARD_LENGTH: _u32s([n_ff if c == "-" else n_ff_exp * n_expert_used if c == "E" else 0
                                             for c in pattern]),
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
        Keys.Attention.LAYERNORM_EPS: 1e-5, Keys.Attention.LAYERNORM_RMS_EPS: 1e-5,
    })
    _ssm_keys(spec, d_conv, d_inner, d_state, n_group, n_ssm_head)
    if moe:
        spec.metadata.update({
            Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
            Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp, Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: n_ff_shexp,
            Keys.LLM.EXPERT_SHARED_COUNT: 1, Keys.LLM.EXPERT_WEIGHTS_NORM: norm_w,
            Keys.LLM.EXPERT_WEIGHTS_SCALE: w_scale,
        })
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    v_type, down_type = v_type or mat_type, down_type or mat_type
    exp_down_type = exp_down_type or exp_type
    for i, c in enumerate(pattern):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        if c == "M":
            _mamba2_mixer(spec, i, n_embd, d_conv, d_inner, d_state, n_group, n_ssm_head, mat_type)
        elif c == "*":
            spec.add(T.ATTN_Q, mat_type, (n_embd, head_dim * n_head), i)
            spec.add(T.ATTN_K, mat_type, (n_embd, head_dim * n_head_kv), i)
            spec.add(T.ATTN_V, v_type, (n_embd, head_dim * n_head_kv), i)
            spec.add(T.ATTN_OUT, mat_type, (head_dim * n_head, n_embd), i)
        elif c == "-":
            spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
            spec.add(T.FFN_UP, mat_type, (n_embd, n_ff), i)
        else:
            spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
            spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n_expert,), i, "bias")
            spec.add(T.FFN_DOWN_EXP, exp_down_type, (n_ff_exp, n_embd, n_expert), i)
            spec.add(T.FFN_UP_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
            spec.add(T.FFN_DOWN_SHEXP, down_type, (n_ff_shexp, n_embd), i)
            spec.add(T.FFN_UP_SHEXP, mat_type, (n_embd, n_ff_shexp), i)
    return spec


def lfm2moe_spec(*, n_embd: int = 128, n_head: int = 4, head_count_kv: tuple[int, ...] = (0, 0, 2, 0),
                 n_dense_lead: int = 1, n_ff: int = 256, n_expert: int = 8, n_expert_used: int = 2,
                 n_ff_exp: int = 64, w_scale: float = 1.0, l_cache: int = 3, n_vocab: int = 512,
                 n_ctx: int = 4096, mat_type: Q = Q.Q8_0, v_type: Q | None = None, down_type: Q | None = None,
                 exp_type: Q = Q.Q8_0, exp_down_type: Q | None = None, embd_type: Q = Q.Q8_0) -> ModelSpec:
    """lfm2moe (src/models/lfm2moe.cpp load_arch_tensors): lfm2's blocks (short convolution where
    head_count_kv is 0, attention with per-head Q/K norms elsewhere; token_embd_norm as the output norm,
    tied output), a dense SwiGLU FFN in the first n_dense_lead blocks and sigmoid-routed SwiGLU experts
    with an exp_probs_b selection bias in the others."""
    n_layer, hd = len(head_count_kv), n_embd // n_head
    spec = ModelSpec("lfm2moe")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: _u32s(list(head_count_kv)), Keys.ShortConv.L_CACHE: l_cache,
        Keys.Attention.LAYERNORM_RMS_EPS: 1e-5, Keys.LLM.LEADING_DENSE_BLOCK_COUNT: n_dense_lead,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp, Keys.LLM.EXPERT_GATING_FUNC: 2,
        Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_WEIGHTS_SCALE: w_scale,
    })
    v_type, down_type = v_type or mat_type, down_type or mat_type
    exp_down_type = exp_down_type or exp_type
    spec.add(T.TOKEN_EMBD, embd_type, (n_embd, n_vocab))
    spec.add(T.TOKEN_EMBD_NORM, Q.F32, (n_embd,))
    for i, kv in enumerate(head_count_kv):   # load_arch_tensors' order
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        if i >= n_dense_lead:
            spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
            spec.add(T.FFN_GATE_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
            spec.add(T.FFN_DOWN_EXP, exp_down_type, (n_ff_exp, n_embd, n_expert), i)
            spec.add(T.FFN_UP_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
            spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n_expert,), i, "bias")
        else:
            spec.add(T.FFN_GATE, mat_type, (n_embd, n_ff), i)
            spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
            spec.add(T.FFN_UP, mat_type, (n_embd, n_ff), i)
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        if kv == 0:
            spec.add(T.SHORTCONV_CONV, Q.F32, (l_cache, n_embd), i)
            spec.add(T.SHORTCONV_INPROJ, mat_type, (n_embd, 3 * n_embd), i)
            spec.add(T.SHORTCONV_OUTPROJ, mat_type, (n_embd, n_embd), i)
            continue
        spec.add(T.ATTN_Q_NORM, Q.F32, (hd,), i)
        spec.add(T.ATTN_K_NORM, Q.F32, (hd,), i)
        spec.add(T.ATTN_Q, mat_type, (n_embd, hd * n_head), i)
        spec.add(T.ATTN_K, mat_type, (n_embd, hd * kv), i)
        spec.add(T.ATTN_V, v_type, (n_embd, hd * kv), i)
        spec.add(T.ATTN_OUT, mat_type, (hd * n_head, n_embd), i)
    return spec


def mamba2_layout(*, n_layer: int, n_embd: int, d_conv: int, d_inner: int, d_state: int, n_group: int,
                  n_ssm_head: int, n_vocab: int, n_ctx: int, mat_type: Q, embd_type: Q,
                  out_type: Q | None) -> ModelSpec:
    """mamba2 (src/models/mamba2.cpp load_arch_tensors): a Mamba-2 mixer in every block and nothing else;
    the converter writes head_count 0 and feed_forward_length 0."""
    spec = ModelSpec("mamba2")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx)
    spec.metadata.update({Keys.LLM.FEED_FORWARD_LENGTH: 0, Keys.Attention.HEAD_COUNT: 0})
    _ssm_keys(spec, d_conv, d_inner, d_state, n_group, n_ssm_head)
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        _mamba2_mixer(spec, i, n_embd, d_conv, d_inner, d_state, n_group, n_ssm_head, mat_type)
    return spec


def falcon_h1_spec(*, n_layer: int = 3, n_embd: int = 128, n_head: int = 4, n_head_kv: int = 2, head_dim: int = 32,
                   n_ff: int = 256, d_conv: int = 4, d_inner: int = 256, d_state: int = 16, n_group: int = 1,
                   n_ssm_head: int = 8, n_vocab: int = 512, n_ctx: int = 4096, mat_type: Q = Q.Q8_0,
                   v_type: Q | None = None, down_type: Q | None = None, embd_type: Q = Q.Q8_0,
                   out_type: Q | None = Q.Q8_0) -> ModelSpec:
    """falcon-h1 (src/models/falcon-h1.cpp load_arch_tensors): every block has a Mamba-2 mixer (ssm_norm
    present), attention (Q/K/V, attn_output) and a SwiGLU FFN; its FFN norm is named without a suffix
    (tn(LLM_TENSOR_FFN_NORM, i): "blk.N.ffn_norm")."""
    spec = ModelSpec("falcon-h1")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
    })
    _ssm_keys(spec, d_conv, d_inner, d_state, n_group, n_ssm_head)
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    v_type, down_type = v_type or mat_type, down_type or mat_type
    for i in range(n_layer):
        _mamba2_mixer(spec, i, n_embd, d_conv, d_inner, d_state, n_group, n_ssm_head, mat_type)
        spec.add(T.ATTN_Q, mat_type, (n_embd, head_dim * n_head), i)
        spec.add(T.ATTN_K, mat_type, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_V, v_type, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_OUT, mat_type, (head_dim * n_head, n_embd), i)
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i, None)
        spec.add(T.FFN_GATE, mat_type, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
        spec.add(T.FFN_UP, mat_type, (n_embd, n_ff), i)
    return spec


def jamba_spec(*, head_count_kv: tuple[int, ...] = (0, 2, 0, 0), moe_layers: tuple[int, ...] = (1, 3),
               n_embd: int = 128, n_head: int = 4, n_ff: int = 256, d_conv: int = 4, d_state: int = 16,
               dt_rank: int = 8, n_expert: int = 4, n_expert_used: int = 2, n_vocab: int = 512, n_ctx: int = 4096,
               mat_type: Q = Q.Q8_0, v_type: Q | None = None, down_type: Q | None = None, exp_type: Q = Q.Q8_0,
               exp_down_type: Q | None = None, embd_type: Q = Q.Q8_0, out_type: Q | None = Q.Q8_0) -> ModelSpec:
    """jamba (src/models/jamba.cpp load_arch_tensors): a Mamba-1 mixer where head_count_kv is 0 (d_inner =
    2 n_embd, ssm_x, dt/B/C norms, A [d_state, d_inner]), attention elsewhere; in `moe_layers` softmax-routed
    SwiGLU experts of n_ff, a SwiGLU FFN of n_ff in the others."""
    n_layer, hd, d_inner = len(head_count_kv), n_embd // n_head, 2 * n_embd
    spec = ModelSpec("jamba")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: _u32s(list(head_count_kv)),
        Keys.SSM.CONV_KERNEL: d_conv, Keys.SSM.INNER_SIZE: d_inner, Keys.SSM.STATE_SIZE: d_state,
        Keys.SSM.TIME_STEP_RANK: dt_rank,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
    })
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    v_type, down_type = v_type or mat_type, down_type or mat_type
    exp_down_type = exp_down_type or exp_type
    for i, kv in enumerate(head_count_kv):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        if kv == 0:
            spec.add(T.SSM_IN, mat_type, (n_embd, 2 * d_inner), i)
            spec.add(T.SSM_CONV1D, Q.F32, (d_conv, d_inner), i)
            spec.add(T.SSM_CONV1D, Q.F32, (d_inner,), i, "bias")
            spec.add(T.SSM_X, mat_type, (d_inner, dt_rank + 2 * d_state), i)
            spec.add(T.SSM_DT_NORM, Q.F32, (dt_rank,), i)
            spec.add(T.SSM_DT, mat_type, (dt_rank, d_inner), i)
            spec.add(T.SSM_DT, Q.F32, (d_inner,), i, "bias")
            spec.add(T.SSM_B_NORM, Q.F32, (d_state,), i)
            spec.add(T.SSM_C_NORM, Q.F32, (d_state,), i)
            spec.add(T.SSM_A, Q.F32, (d_state, d_inner), i, None)
            spec.add(T.SSM_D, Q.F32, (d_inner,), i, None)
            spec.add(T.SSM_OUT, mat_type, (d_inner, n_embd), i)
        else:
            spec.add(T.ATTN_Q, mat_type, (n_embd, n_embd), i)
            spec.add(T.ATTN_K, mat_type, (n_embd, hd * kv), i)
            spec.add(T.ATTN_V, v_type, (n_embd, hd * kv), i)
            spec.add(T.ATTN_OUT, mat_type, (n_embd, n_embd), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        if i in moe_layers:
            spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
            spec.add(T.FFN_GATE_EXP, exp_type, (n_embd, n_ff, n_expert), i)
            spec.add(T.FFN_DOWN_EXP, exp_down_type, (n_ff, n_embd, n_expert), i)
            spec.add(T.FFN_UP_EXP, exp_type, (n_embd, n_ff, n_expert), i)
        else:
            spec.add(T.FFN_GATE, mat_type, (n_embd, n_ff), i)
            spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
            spec.add(T.FFN_UP, mat_type, (n_embd, n_ff), i)
    return spec


def mamba_layout(*, n_layer: int = 2, n_embd: int = 128, d_conv: int = 4, d_state: int = 16, dt_rank: int = 32,
                 dt_b_c_rms: bool = True, n_vocab: int = 512, n_ctx: int = 4096, mat_type: Q = Q.Q8_0,
                 embd_type: Q = Q.Q8_0, out_type: Q | None = Q.Q8_0) -> ModelSpec:
    """mamba (src/models/mamba.cpp load_arch_tensors): a Mamba-1 mixer in every block (d_inner = 2 n_embd,
    ssm_x, ssm_dt, A [d_state, d_inner]); Falcon-Mamba's converter sets ssm.dt_b_c_rms."""
    d_inner = 2 * n_embd
    spec = ModelSpec("mamba")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: 0, Keys.Attention.HEAD_COUNT: 0,
        Keys.SSM.CONV_KERNEL: d_conv, Keys.SSM.INNER_SIZE: d_inner, Keys.SSM.STATE_SIZE: d_state,
        Keys.SSM.TIME_STEP_RANK: dt_rank, Keys.SSM.DT_B_C_RMS: dt_b_c_rms,
    })
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.SSM_IN, mat_type, (n_embd, 2 * d_inner), i)
        spec.add(T.SSM_CONV1D, Q.F32, (d_conv, d_inner), i)
        spec.add(T.SSM_CONV1D, Q.F32, (d_inner,), i, "bias")
        spec.add(T.SSM_X, mat_type, (d_inner, dt_rank + 2 * d_state), i)
        spec.add(T.SSM_DT, mat_type, (dt_rank, d_inner), i)
        spec.add(T.SSM_DT, Q.F32, (d_inner,), i, "bias")
        spec.add(T.SSM_A, Q.F32, (d_state, d_inner), i, None)
        spec.add(T.SSM_D, Q.F32, (d_inner,), i, None)
        spec.add(T.SSM_OUT, mat_type, (d_inner, n_embd), i)
    return spec
