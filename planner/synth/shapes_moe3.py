"""Files for tests of qwen3vlmoe, granitemoe, cohere2moe and bailingmoe2: tiny layouts and shape-faithful ones
of real models (published config.json of each), each laid out as the pinned llama.cpp's load_arch_tensors
creates the architecture's tensors (src/models/<arch>.cpp), with Q4_K_M-like tensor types.

The decoders are planner/synth/shapes_moe.py's `moe_layout` with each architecture's keys added.
"""
from __future__ import annotations

from dataclasses import replace

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q, T
from planner.synth.shapes_moe import TINY, MoeLayout, moe_layout, with_tokenizer

Q4KM = MoeLayout(mat_type=Q.Q4_K, v_type=Q.Q6_K, exp_type=Q.Q4_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)


# --- qwen3vlmoe: qwen3moe's layer with qwen3vl's interleaved M-RoPE and deepstack inputs --------------------
def qwen3vlmoe_layout(lay: MoeLayout, sections: tuple[int, ...], n_deepstack: int, n_ctx: int,
                      freq_base: float) -> ModelSpec:
    """qwen3vlmoe.cpp's tensors (per-head Q/K norms, routed experts only) and the keys of its text model:
    rope.dimension_sections (four), n_deepstack_layers, RMS eps 1e-6."""
    keys = {Keys.Rope.DIMENSION_SECTIONS: list(sections), Keys.LLM.NUM_DEEPSTACK_LAYERS: n_deepstack,
            Keys.Attention.LAYERNORM_RMS_EPS: 1e-6}
    spec = moe_layout("qwen3vlmoe", replace(lay, qk_norm="head"), keys)
    return with_tokenizer(spec, lay.n_vocab, n_ctx, freq_base)


def tiny_qwen3vlmoe() -> ModelSpec:
    """Three blocks, M-RoPE sections 12/10/10 of 32 rotated pairs, blocks 0-1 add deepstack slices 1-2."""
    return qwen3vlmoe_layout(TINY, (12, 10, 10, 0), 2, 4096, 5000000.0)


def qwen3vl_30b_a3b_spec() -> ModelSpec:
    """Qwen3-VL-30B-A3B-Instruct's text model: 48 blocks 2048 wide, 32 heads (4 KV) of 128, 128 experts of
    768 (8 used), vocabulary 151936, 262144 positions, rope theta 5e6, M-RoPE sections 24/20/20, three
    deepstack layers (deepstack_visual_indexes 8, 16, 24), untied output."""
    lay = replace(Q4KM, n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_ff=6144, n_expert=128,
                  n_expert_used=8, n_ff_exp=768, n_vocab=151936, down_type=Q.Q6_K)
    return qwen3vlmoe_layout(lay, (24, 20, 20, 0), 3, 262144, 5000000.0)


# --- granitemoe: granite's layer and scales over softmax experts, optionally a shared expert --------------
def granitemoe_layout(lay: MoeLayout, *, embd: float, residual: float, attn: float, logit: float, n_ctx: int,
                      freq_base: float) -> ModelSpec:
    """granite-moe.cpp's tensors and the granite scales (logit_scale required, the others optional)."""
    keys = {Keys.LLM.EMBEDDING_SCALE: embd, Keys.LLM.RESIDUAL_SCALE: residual, Keys.Attention.SCALE: attn,
            Keys.LLM.LOGIT_SCALE: logit}
    return with_tokenizer(moe_layout("granitemoe", lay, keys), lay.n_vocab, n_ctx, freq_base)


def tiny_granitemoe() -> ModelSpec:
    """Three blocks of softmax experts, tied embeddings, granite-3's scales."""
    return granitemoe_layout(replace(TINY, out_type=None), embd=12.0, residual=0.22, attn=0.015625, logit=6.0,
                             n_ctx=4096, freq_base=10000.0)


def tiny_granitemoe_shared() -> ModelSpec:
    """GraniteMoeShared: every block with a shared expert of 128 beside the routed ones."""
    return granitemoe_layout(replace(TINY, n_ff_shexp=128), embd=12.0, residual=0.22, attn=0.015625, logit=6.0,
                             n_ctx=4096, freq_base=10000.0)


def granite31_3b_a800m_spec() -> ModelSpec:
    """granite-3.1-3b-a800m-instruct: 32 blocks 1536 wide, 24 heads (8 KV) of 64, 40 experts of 512 (8 used),
    tied embeddings, vocabulary 49155, context 131072, rope theta 1e7; multipliers embedding 12, residual
    0.22, attention 0.015625, logits 6."""
    lay = replace(Q4KM, n_layer=32, n_embd=1536, n_head=24, n_head_kv=8, head_dim=64, n_expert=40, n_expert_used=8,
                  n_ff_exp=512, n_vocab=49155, down_type=Q.Q6_K, out_type=None)
    return granitemoe_layout(lay, embd=12.0, residual=0.22, attn=0.015625, logit=6.0, n_ctx=131072,
                             freq_base=10000000.0)


# --- cohere2moe: cohere2's parallel layer over sigmoid-routed experts -------------------------------------
def cohere2moe_layout(lay: MoeLayout, *, window: int, logit_scale: float, n_ctx: int, freq_base: float,
                      rms: bool = True, n_shared: int = 0) -> ModelSpec:
    """cohere2moe.cpp's tensors and keys as conversion/command_r.py writes them: the window and its per-layer
    pattern (three sliding layers to one full, the first full), the logit scale, leading_dense_block_count
    and expert_feed_forward_length (both required), expert_weights_norm false, the RMS or LayerNorm epsilon."""
    keys: dict[str, object] = {
        Keys.Attention.SLIDING_WINDOW: window,
        Keys.Attention.SLIDING_WINDOW_PATTERN: [il % 4 != 0 for il in range(lay.n_layer)],
        Keys.LLM.LOGIT_SCALE: logit_scale, Keys.LLM.LEADING_DENSE_BLOCK_COUNT: lay.n_dense_lead,
        Keys.LLM.EXPERT_WEIGHTS_NORM: False,
        Keys.Attention.LAYERNORM_RMS_EPS if rms else Keys.Attention.LAYERNORM_EPS: 1e-5,
    }
    if n_shared:
        keys[Keys.LLM.EXPERT_SHARED_COUNT] = n_shared
    spec = moe_layout("cohere2moe", lay, keys)
    # the parallel layer has one norm: load_arch_tensors creates no ffn_norm
    spec.tensors = [t for t in spec.tensors if not t[0].endswith(".ffn_norm.weight")]
    return with_tokenizer(spec, lay.n_vocab, n_ctx, freq_base)


def tiny_cohere2moe() -> ModelSpec:
    """Five blocks: block 0 dense (full attention, roped), blocks 1-3 sliding over 128, block 4 full and
    unroped; RMS norms, tied embeddings."""
    return cohere2moe_layout(replace(TINY, n_layer=5, n_dense_lead=1, out_type=None), window=128, logit_scale=0.25,
                             n_ctx=4096, freq_base=50000.0)


def tiny_cohere2moe_shared_ln() -> ModelSpec:
    """The LayerNorm variant (no RMS epsilon in the file) with a shared expert in each expert block."""
    lay = replace(TINY, n_layer=5, n_dense_lead=1, n_ff_shexp=TINY.n_ff_exp, out_type=None)
    return cohere2moe_layout(lay, window=128, logit_scale=0.25, n_ctx=4096, freq_base=50000.0, rms=False,
                             n_shared=1)


def tiny_cohere2moe_nextn() -> ModelSpec:
    """tiny_cohere2moe with an MTP block after the trunk (nextn_predict_layers 1: a full-attention expert block
    with eh_proj and its norms), which the pinned loader skips unless asked to load MTP."""
    lay = replace(TINY, n_layer=6, n_dense_lead=1, out_type=None)
    spec = cohere2moe_layout(lay, window=128, logit_scale=0.25, n_ctx=4096, freq_base=50000.0)
    spec.metadata[Keys.LLM.NEXTN_PREDICT_LAYERS] = 1
    spec.add(T.NEXTN_EH_PROJ, lay.mat_type, (2 * lay.n_embd, lay.n_embd), 5)
    spec.add(T.NEXTN_ENORM, Q.F32, (lay.n_embd,), 5)
    spec.add(T.NEXTN_HNORM, Q.F32, (lay.n_embd,), 5)
    return spec


def north_mini_code_spec() -> ModelSpec:
    """North-Mini-Code-1.0: 49 blocks 2048 wide (13 full-attention, 36 sliding over 4096), 32 heads (4 KV) of
    128, block 0 dense (3072), then 128 experts of 768 (8 used, sigmoid), RMS norms, tied embeddings,
    vocabulary 262144, context 500000, rope theta 50000."""
    lay = replace(Q4KM, n_layer=49, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_ff=3072, n_expert=128,
                  n_expert_used=8, n_ff_exp=768, n_vocab=262144, n_dense_lead=1, down_type=Q.Q6_K, out_type=None)
    return cohere2moe_layout(lay, window=4096, logit_scale=1.0, n_ctx=500000, freq_base=50000.0)


# --- bailingmoe2: fused QKV, Q/K norms, partial RoPE, sigmoid experts chosen within the best groups --------
def bailingmoe2_layout(lay: MoeLayout, *, n_groups: int, n_group_used: int, scale: float, n_ctx: int,
                       freq_base: float, qkv_type: Q = Q.Q8_0) -> ModelSpec:
    """bailingmoe2.cpp's tensors (one attn_qkv, per-head Q/K norms, the selection bias, one shared expert) and
    the keys conversion/bailingmoe.py writes: half the head roped, sigmoid gating, normalised weights scaled
    by routed_scaling_factor, expert_group_count and expert_group_used_count."""
    keys: dict[str, object] = {
        Keys.LLM.EXPERT_GATING_FUNC: 2, Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_WEIGHTS_SCALE: scale,
        Keys.LLM.EXPERT_SHARED_COUNT: 1, Keys.LLM.LEADING_DENSE_BLOCK_COUNT: lay.n_dense_lead,
        Keys.LLM.EXPERT_GROUP_COUNT: n_groups, Keys.LLM.EXPERT_GROUP_USED_COUNT: n_group_used,
        Keys.Attention.LAYERNORM_RMS_EPS: 1e-6,
    }
    lay = replace(lay, n_rot=lay.head_dim // 2, qk_norm="head", probs_bias=True)
    spec = moe_layout("bailingmoe2", lay, keys)
    width = (lay.n_head + 2 * lay.n_head_kv) * lay.head_dim
    fused: list[tuple[str, Q, tuple[int, ...]]] = []
    for name, qtype, shape in spec.tensors:   # create_tensor_qkv: attn_qkv where Q, K and V were
        part = name.rsplit(".", 2)[-2]
        if part == "attn_q":
            fused.append((name.replace(".attn_q.", ".attn_qkv."), qkv_type, (lay.n_embd, width)))
        elif part not in ("attn_k", "attn_v"):
            fused.append((name, qtype, shape))
    spec.tensors = fused
    return with_tokenizer(spec, lay.n_vocab, n_ctx, freq_base)


def tiny_bailingmoe2() -> ModelSpec:
    """Three blocks, block 0 dense; 8 experts in 4 groups of 2, the best 2 groups kept, 2 experts used."""
    lay = replace(TINY, n_dense_lead=1, n_expert=8, n_ff_shexp=TINY.n_ff_exp)
    return bailingmoe2_layout(lay, n_groups=4, n_group_used=2, scale=2.5, n_ctx=4096, freq_base=600000.0)


def tiny_bailingmoe2_nextn() -> ModelSpec:
    """tiny_bailingmoe2 with an MTP block after the trunk (nextn_predict_layers 1: an expert block with eh_proj,
    its norms and layer_output_norm), which the pinned loader skips."""
    lay = replace(TINY, n_layer=4, n_dense_lead=1, n_expert=8, n_ff_shexp=TINY.n_ff_exp)
    spec = bailingmoe2_layout(lay, n_groups=4, n_group_used=2, scale=2.5, n_ctx=4096, freq_base=600000.0)
    spec.metadata[Keys.LLM.NEXTN_PREDICT_LAYERS] = 1
    spec.add(T.NEXTN_EH_PROJ, lay.mat_type, (2 * lay.n_embd, lay.n_embd), 3)
    spec.add(T.NEXTN_ENORM, Q.F32, (lay.n_embd,), 3)
    spec.add(T.NEXTN_HNORM, Q.F32, (lay.n_embd,), 3)
    spec.add(T.LAYER_OUT_NORM, Q.F32, (lay.n_embd,), 3)
    return spec


def ling_mini_2_spec() -> ModelSpec:
    """Ling-mini-2.0: 20 blocks 2048 wide, 16 heads (4 KV) of 128 with half of each head roped, block 0 dense
    (5120), then 256 experts of 512 (8 used, sigmoid with the selection bias, normalised, scaled 2.5) chosen
    within the best 4 of 8 groups, one shared expert of 512, vocabulary 157184, context 32768, rope theta 6e5."""
    lay = replace(Q4KM, n_layer=20, n_embd=2048, n_head=16, n_head_kv=4, head_dim=128, n_ff=5120, n_expert=256,
                  n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, n_vocab=157184, n_dense_lead=1,
                  down_type=Q.Q6_K)
    return bailingmoe2_layout(lay, n_groups=8, n_group_used=4, scale=2.5, n_ctx=32768, freq_base=600000.0,
                              qkv_type=Q.Q5_K)


TINY_SPECS = {
    "qwen3vlmoe": tiny_qwen3vlmoe,
    "granitemoe": tiny_granitemoe,
    "granitemoe-shared": tiny_granitemoe_shared,
    "cohere2moe": tiny_cohere2moe,
    "cohere2moe-shared-ln": tiny_cohere2moe_shared_ln,
    "cohere2moe-nextn": tiny_cohere2moe_nextn,
    "bailingmoe2": tiny_bailingmoe2,
    "bailingmoe2-nextn": tiny_bailingmoe2_nextn,
}
