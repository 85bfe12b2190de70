"""Mixture-of-experts files for tests: tiny layouts and shape-faithful ones of real models, each laid out
as the pinned llama.cpp's load_arch_tensors creates the architecture's tensors (src/models/<arch>.cpp).

`moe_layout` writes one decoder of routed experts with the variations those loaders have: Q/K/V biases,
Q/K norms per head or over the whole projection, leading dense layers, the expert selection bias
(exp_probs_b), a shared expert (with qwen2moe's gate vector), and the norm before the FFN named
ffn_norm or post_attention_norm. The `*_like` functions give real models' widths, heads, vocabularies
and Q4_K_M-like tensor types with fewer blocks and experts (published config.json of each model).
Rows of a width that is not a whole Q4_K/Q6_K block (256 values) are Q8_0, as llama-quantize falls back.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q, T, _common, _embeddings, add_tokenizer
from planner.synth.glm4moe_factory import glm45_air_like


@dataclass(frozen=True)
class MoeLayout:
    """Which tensors each block has beyond attention norm, Q/K/V/O and the routed experts."""

    n_layer: int = 3
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_rot: int = 0                 # 0: the whole head
    n_ff: int = 512                # leading dense layers' FFN
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 64
    n_ff_shexp: int = 0            # 0: no shared expert
    n_vocab: int = 1000
    n_dense_lead: int = 0
    qkv_bias: bool = False
    qk_norm: str = ""              # "", "head" ({head_dim}) or "flat" ({n_head * head_dim}, {n_kv_heads * head_dim})
    shexp_gate: bool = False       # qwen2moe: ffn_gate_inp_shexp {n_embd}
    probs_bias: bool = False       # exp_probs_b {n_expert}
    ffn_norm: T = T.FFN_NORM       # glm4moe: ATTN_POST_NORM
    mat_type: Q = Q.Q8_0
    v_type: Q = Q.Q8_0
    exp_type: Q = Q.Q8_0
    down_type: Q = Q.Q8_0
    embd_type: Q = Q.Q8_0
    out_type: Q | None = Q.Q8_0    # None: tied to the token embeddings
    n_nextn: int = 0               # dense MTP blocks after the trunk (exaone-moe), with eh_proj and their norms
    gate_exps: bool = True         # ernie4_5-moe may have no ffn_gate_exps
    phi_biases: bool = False       # phimoe: biases on every norm, the attention output and the output
    rope_factors: bool = False     # phimoe (longrope): rope_factors_long / _short of head_dim / 2
    sandwich: bool = False         # afmoe: attn_gate, post_attention_norm and post_ffw_norm in every block


def _attention(spec: ModelSpec, lay: MoeLayout, i: int) -> None:
    q, kv = lay.n_head * lay.head_dim, lay.n_head_kv * lay.head_dim
    spec.add(T.ATTN_NORM, Q.F32, (lay.n_embd,), i)
    spec.add(T.ATTN_Q, lay.mat_type, (lay.n_embd, q), i)
    spec.add(T.ATTN_K, lay.mat_type, (lay.n_embd, kv), i)
    spec.add(T.ATTN_V, lay.v_type, (lay.n_embd, kv), i)
    if lay.phi_biases:
        spec.add(T.ATTN_NORM, Q.F32, (lay.n_embd,), i, "bias")
        spec.add(T.ATTN_OUT, Q.F32, (lay.n_embd,), i, "bias")
        spec.add(T.FFN_NORM, Q.F32, (lay.n_embd,), i, "bias")
    if lay.qkv_bias:
        spec.add(T.ATTN_Q, Q.F32, (q,), i, "bias")
        spec.add(T.ATTN_K, Q.F32, (kv,), i, "bias")
        spec.add(T.ATTN_V, Q.F32, (kv,), i, "bias")
    spec.add(T.ATTN_OUT, lay.mat_type, (q, lay.n_embd), i)
    if lay.sandwich:
        spec.add(T.ATTN_GATE, lay.mat_type, (lay.n_embd, q), i)
        spec.add(T.ATTN_POST_NORM, Q.F32, (lay.n_embd,), i)
        spec.add(T.FFN_POST_NORM, Q.F32, (lay.n_embd,), i)
    if lay.qk_norm:
        flat = lay.qk_norm == "flat"
        spec.add(T.ATTN_Q_NORM, Q.F32, (q if flat else lay.head_dim,), i)
        spec.add(T.ATTN_K_NORM, Q.F32, (kv if flat else lay.head_dim,), i)


def _ffn(spec: ModelSpec, lay: MoeLayout, i: int) -> None:
    e, n = lay.n_embd, lay.n_expert
    spec.add(lay.ffn_norm, Q.F32, (e,), i)
    if i < lay.n_dense_lead or i >= lay.n_layer:
        spec.add(T.FFN_GATE, lay.mat_type, (e, lay.n_ff), i)
        spec.add(T.FFN_DOWN, lay.down_type, (lay.n_ff, e), i)
        spec.add(T.FFN_UP, lay.mat_type, (e, lay.n_ff), i)
        return
    spec.add(T.FFN_GATE_INP, Q.F32, (e, n), i)
    if lay.probs_bias:
        spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n,), i, "bias")
    if lay.gate_exps:
        spec.add(T.FFN_GATE_EXP, lay.exp_type, (e, lay.n_ff_exp, n), i)
    spec.add(T.FFN_DOWN_EXP, lay.down_type, (lay.n_ff_exp, e, n), i)
    spec.add(T.FFN_UP_EXP, lay.exp_type, (e, lay.n_ff_exp, n), i)
    if lay.n_ff_shexp:
        if lay.shexp_gate:
            spec.add(T.FFN_GATE_INP_SHEXP, Q.F32, (e,), i)
        spec.add(T.FFN_GATE_SHEXP, lay.mat_type, (e, lay.n_ff_shexp), i)
        spec.add(T.FFN_DOWN_SHEXP, lay.down_type, (lay.n_ff_shexp, e), i)
        spec.add(T.FFN_UP_SHEXP, lay.mat_type, (e, lay.n_ff_shexp), i)


def moe_layout(arch: str, lay: MoeLayout, keys: Mapping[str, object] | None = None) -> ModelSpec:
    """One MoE decoder file; `keys` adds architecture keys (gating function, weights norm and scale...)."""
    spec = ModelSpec(arch)
    _common(spec, lay.n_layer + lay.n_nextn, lay.n_embd, lay.n_vocab)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: lay.n_head, Keys.Attention.HEAD_COUNT_KV: lay.n_head_kv,
        Keys.Attention.KEY_LENGTH: lay.head_dim, Keys.Attention.VALUE_LENGTH: lay.head_dim,
        Keys.Rope.DIMENSION_COUNT: lay.n_rot or lay.head_dim,
        Keys.LLM.FEED_FORWARD_LENGTH: lay.n_ff if lay.n_dense_lead else lay.n_ff_exp,
        Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: lay.n_ff_exp,
        Keys.LLM.EXPERT_COUNT: lay.n_expert, Keys.LLM.EXPERT_USED_COUNT: lay.n_expert_used,
    })
    if lay.n_dense_lead:
        spec.metadata[Keys.LLM.LEADING_DENSE_BLOCK_COUNT] = lay.n_dense_lead
    if lay.n_nextn:
        spec.metadata[Keys.LLM.NEXTN_PREDICT_LAYERS] = lay.n_nextn
    if lay.n_ff_shexp:
        spec.metadata[Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH] = lay.n_ff_shexp
    spec.metadata.update(keys or {})
    _embeddings(spec, lay.n_embd, lay.n_vocab, lay.embd_type, lay.out_type)
    if lay.phi_biases:
        spec.add(T.OUTPUT_NORM, Q.F32, (lay.n_embd,), None, "bias")
        spec.add(T.OUTPUT, Q.F32, (lay.n_vocab,), None, "bias")
    if lay.rope_factors:
        spec.add(T.ROPE_FACTORS_LONG, Q.F32, (lay.head_dim // 2,))
        spec.add(T.ROPE_FACTORS_SHORT, Q.F32, (lay.head_dim // 2,))
    for i in range(lay.n_layer + lay.n_nextn):
        _attention(spec, lay, i)
        _ffn(spec, lay, i)
        if i >= lay.n_layer:
            spec.add(T.NEXTN_EH_PROJ, lay.mat_type, (2 * lay.n_embd, lay.n_embd), i)
            spec.add(T.NEXTN_ENORM, Q.F32, (lay.n_embd,), i)
            spec.add(T.NEXTN_HNORM, Q.F32, (lay.n_embd,), i)
    return spec


def with_tokenizer(spec: ModelSpec, n_vocab: int, n_ctx: int, freq_base: float) -> ModelSpec:
    add_tokenizer(spec, n_vocab, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    spec.metadata[Keys.LLM.CONTEXT_LENGTH] = n_ctx
    spec.metadata[Keys.Rope.FREQ_BASE] = freq_base
    return spec


# --- tiny files (graph checks against llama-fit-params -v) ----------------------------------------
TINY = MoeLayout()
SIGMOID = 2   # expert_gating_func (llama-hparams.h LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID)


def tiny_qwen2moe() -> ModelSpec:
    lay = replace(TINY, qkv_bias=True, n_ff_shexp=128, shexp_gate=True)
    return with_tokenizer(moe_layout("qwen2moe", lay), 1000, 4096, 10000.0)


def tiny_olmoe() -> ModelSpec:
    lay = replace(TINY, n_head_kv=TINY.n_head, qk_norm="flat")
    return with_tokenizer(moe_layout("olmoe", lay), 1000, 4096, 10000.0)


def tiny_ernie45moe() -> ModelSpec:
    lay = replace(TINY, n_dense_lead=1, n_ff_shexp=128, probs_bias=True)
    keys = {Keys.LLM.INTERLEAVE_MOE_LAYER_STEP: 1}
    return with_tokenizer(moe_layout("ernie4_5-moe", lay, keys), 1000, 4096, 10000.0)


def tiny_glm4moe() -> ModelSpec:
    lay = replace(TINY, qkv_bias=True, n_rot=TINY.head_dim // 2, n_dense_lead=1, n_ff_shexp=TINY.n_ff_exp,
                  probs_bias=True, ffn_norm=T.ATTN_POST_NORM)
    keys = {Keys.LLM.EXPERT_SHARED_COUNT: 1, Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
            Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("glm4moe", lay, keys), 1000, 4096, 10000.0)


def tiny_minimax_m2() -> ModelSpec:
    lay = replace(TINY, n_rot=TINY.head_dim // 2, qk_norm="flat", probs_bias=True)
    return with_tokenizer(moe_layout("minimax-m2", lay, {Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}), 1000, 4096, 10000.0)


def tiny_deepseek() -> ModelSpec:
    lay = replace(TINY, n_head_kv=TINY.n_head, n_dense_lead=1, n_ff_shexp=2 * TINY.n_ff_exp)
    keys = {Keys.LLM.EXPERT_SHARED_COUNT: 2, Keys.LLM.EXPERT_WEIGHTS_SCALE: 1.5}
    return with_tokenizer(moe_layout("deepseek", lay, keys), 1000, 4096, 10000.0)


def tiny_dots1() -> ModelSpec:
    lay = replace(TINY, n_head_kv=TINY.n_head, qk_norm="head", n_dense_lead=1, n_ff_shexp=2 * TINY.n_ff_exp,
                  probs_bias=True)
    keys = {Keys.LLM.EXPERT_SHARED_COUNT: 2, Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
            Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("dots1", lay, keys), 1000, 4096, 10000.0)


def tiny_hunyuan_moe() -> ModelSpec:
    lay = replace(TINY, qk_norm="head", n_ff_shexp=128, out_type=None)
    return with_tokenizer(moe_layout("hunyuan-moe", lay), 1000, 4096, 10000.0)


def tiny_exaone_moe() -> ModelSpec:
    """Four blocks (three sliding-window, one full-attention and unroped), block 0 dense, one MTP block."""
    lay = replace(TINY, n_layer=4, qk_norm="head", n_dense_lead=1, n_ff_shexp=TINY.n_ff_exp, probs_bias=True,
                  n_nextn=1)
    keys = {Keys.Attention.SLIDING_WINDOW: 128, Keys.LLM.EXPERT_SHARED_COUNT: 1, Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5,
            Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("exaone-moe", lay, keys), 1000, 4096, 10000.0)


def tiny_smallthinker() -> ModelSpec:
    """Five blocks: sliding-window layers but every fourth from block 0 (full attention, unroped)."""
    lay = replace(TINY, n_layer=5, out_type=None)
    keys = {Keys.Attention.SLIDING_WINDOW: 4096, Keys.LLM.EXPERT_GATING_FUNC: 1}
    return with_tokenizer(moe_layout("smallthinker", lay, keys), 1000, 4096, 10000.0)


def tiny_afmoe() -> ModelSpec:
    """Five blocks: three sliding-window layers to one full (the fourth, unroped), block 0 dense."""
    lay = replace(TINY, n_layer=5, qk_norm="head", n_dense_lead=1, n_ff_shexp=TINY.n_ff_exp, probs_bias=True,
                  sandwich=True)
    keys = {Keys.Attention.SLIDING_WINDOW: 128, Keys.LLM.EXPERT_SHARED_COUNT: 1, Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5,
            Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("afmoe", lay, keys), 1000, 4096, 10000.0)


def tiny_ernie45moe_gateless() -> ModelSpec:
    """ernie4_5-moe without ffn_gate_exps: its experts are silu(up)."""
    lay = replace(TINY, n_dense_lead=1, n_ff_shexp=128, probs_bias=True, gate_exps=False)
    keys = {Keys.LLM.INTERLEAVE_MOE_LAYER_STEP: 1}
    return with_tokenizer(moe_layout("ernie4_5-moe", lay, keys), 1000, 4096, 10000.0)


def tiny_glm4moe_qk_norm() -> ModelSpec:
    """glm4moe with the Q/K norms GLM-4.5 (355B) has."""
    lay = replace(TINY, qkv_bias=True, n_rot=TINY.head_dim // 2, n_dense_lead=1, n_ff_shexp=TINY.n_ff_exp,
                  probs_bias=True, ffn_norm=T.ATTN_POST_NORM, qk_norm="head")
    keys = {Keys.LLM.EXPERT_SHARED_COUNT: 1, Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("glm4moe", lay, keys), 1000, 4096, 10000.0)


def tiny_phimoe() -> ModelSpec:
    lay = replace(TINY, qkv_bias=True, phi_biases=True)
    return with_tokenizer(moe_layout("phimoe", lay), 1000, 4096, 10000.0)


TINY_SPECS = {
    "glm4moe": tiny_glm4moe,
    "ernie4_5-moe": tiny_ernie45moe,
    "qwen2moe": tiny_qwen2moe,
    "olmoe": tiny_olmoe,
    "minimax-m2": tiny_minimax_m2,
    "deepseek": tiny_deepseek,
    "dots1": tiny_dots1,
    "hunyuan-moe": tiny_hunyuan_moe,
    "exaone-moe": tiny_exaone_moe,
    "smallthinker": tiny_smallthinker,
    "afmoe": tiny_afmoe,
    "phimoe": tiny_phimoe,
}


# --- shape-faithful files (published config.json; Q4_K_M-like types) ----------------------------
Q4KM = MoeLayout(mat_type=Q.Q4_K, v_type=Q.Q6_K, exp_type=Q.Q4_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)


def glm45_air_spec() -> ModelSpec:
    """GLM-4.5-Air whole: 46 trunk blocks and its MTP block (block_count 47), 128 experts
    (planner/synth/glm4moe_factory.py)."""
    return glm45_air_like(n_layer=46, n_expert=128)


def qwen15_moe_a27b_spec() -> ModelSpec:
    """Qwen1.5-MoE-A2.7B: 24 blocks 2048 wide, 16 heads (16 KV) of 128 with Q/K/V biases, 60 experts of 1408
    (4 used, softmax, unnormalised), a gated shared expert of 5632, vocabulary 151936, context 8192."""
    lay = replace(Q4KM, n_layer=24, n_embd=2048, n_head=16, n_head_kv=16, head_dim=128, n_expert=60, n_expert_used=4,
                    n_ff_exp=1408, n_ff_shexp=5632, n_vocab=151936, qkv_bias=True, shexp_gate=True,
                    down_type=Q.Q8_0)
    return with_tokenizer(moe_layout("qwen2moe", lay), 151936, 8192, 1000000.0)


def olmoe_1b_7b_spec() -> ModelSpec:
    """OLMoE-1B-7B-0924: 16 blocks 2048 wide, 16 heads (16 KV) of 128, Q/K norms over the whole projection,
    64 experts of 1024 (8 used), vocabulary 50304, context 4096."""
    lay = replace(Q4KM, n_layer=16, n_embd=2048, n_head=16, n_head_kv=16, head_dim=128, n_expert=64, n_expert_used=8,
                    n_ff_exp=1024, n_vocab=50304, qk_norm="flat", down_type=Q.Q6_K)
    return with_tokenizer(moe_layout("olmoe", lay), 50304, 4096, 10000.0)


def ernie45_21b_a3b_spec() -> ModelSpec:
    """ERNIE-4.5-21B-A3B: 28 blocks 2560 wide, 20 heads (4 KV) of 128, block 0 dense (12288), then 64 experts
    of 1536 (6 used) with the selection bias and two shared experts (3072), tied embeddings, vocabulary
    103424, context 131072."""
    lay = replace(Q4KM, n_layer=28, n_embd=2560, n_head=20, n_head_kv=4, head_dim=128, n_ff=12288, n_expert=64,
                    n_expert_used=6, n_ff_exp=1536, n_ff_shexp=3072, n_vocab=103424, n_dense_lead=1,
                    probs_bias=True, down_type=Q.Q6_K, out_type=None)
    keys = {Keys.LLM.INTERLEAVE_MOE_LAYER_STEP: 1}
    return with_tokenizer(moe_layout("ernie4_5-moe", lay, keys), 103424, 131072, 500000.0)


def minimax_m2_spec() -> ModelSpec:
    """MiniMax-M2: 62 blocks 3072 wide, 48 heads (8 KV) of 128 with 64 rotated, Q/K norms over the whole
    projection, 256 experts of 1536 (8 used, sigmoid with the selection bias), vocabulary 200064,
    context 196608."""
    lay = replace(Q4KM, n_layer=62, n_embd=3072, n_head=48, n_head_kv=8, head_dim=128, n_rot=64, n_expert=256,
                    n_expert_used=8, n_ff_exp=1536, n_vocab=200064, qk_norm="flat", probs_bias=True,
                    down_type=Q.Q6_K)
    keys = {Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("minimax-m2", lay, keys), 200064, 196608, 5000000.0)


def deepseek_moe_16b_spec() -> ModelSpec:
    """deepseek-moe-16b: 28 blocks 2048 wide, 16 heads (16 KV) of 128, block 0 dense (10944), then 64 experts
    of 1408 (6 used, softmax, unnormalised) and two shared experts (2816), vocabulary 102400, context 4096."""
    lay = replace(Q4KM, n_layer=28, n_embd=2048, n_head=16, n_head_kv=16, head_dim=128, n_ff=10944, n_expert=64,
                  n_expert_used=6, n_ff_exp=1408, n_ff_shexp=2816, n_vocab=102400, n_dense_lead=1,
                  down_type=Q.Q8_0)
    keys = {Keys.LLM.EXPERT_SHARED_COUNT: 2, Keys.LLM.EXPERT_WEIGHTS_SCALE: 1.0}
    return with_tokenizer(moe_layout("deepseek", lay, keys), 102400, 4096, 10000.0)


def dots1_spec() -> ModelSpec:
    """dots.llm1: 62 blocks 4096 wide, 32 heads (32 KV) of 128 with Q/K norms, block 0 dense (10944), then
    128 experts of 1408 (6 used, sigmoid with the selection bias, normalised, scaled 2.5) and two shared
    experts (2816), vocabulary 152064, context 32768."""
    lay = replace(Q4KM, n_layer=62, n_embd=4096, n_head=32, n_head_kv=32, head_dim=128, n_ff=10944, n_expert=128,
                  n_expert_used=6, n_ff_exp=1408, n_ff_shexp=2816, n_vocab=152064, n_dense_lead=1,
                  qk_norm="head", probs_bias=True, down_type=Q.Q8_0)
    keys = {Keys.LLM.EXPERT_SHARED_COUNT: 2, Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
            Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("dots1", lay, keys), 152064, 32768, 10000000.0)


def hunyuan_a13b_spec() -> ModelSpec:
    """Hunyuan-A13B: 32 blocks 4096 wide, 32 heads (8 KV) of 128 with Q/K norms after RoPE, 64 experts of
    3072 (8 used) and one shared expert of 3072, tied embeddings, vocabulary 128167, context 32768."""
    lay = replace(Q4KM, n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_expert=64,
                  n_expert_used=8, n_ff_exp=3072, n_ff_shexp=3072, n_vocab=128167, qk_norm="head",
                  down_type=Q.Q6_K, out_type=None)
    return with_tokenizer(moe_layout("hunyuan-moe", lay), 128167, 32768, 10000.0)


def k_exaone_236b_spec() -> ModelSpec:
    """K-EXAONE-236B-A23B: 48 blocks 6144 wide and one MTP block (block_count 49), 64 heads (8 KV) of 128 with
    Q/K norms, three sliding-window layers (window 128) to one full-attention layer, block 0 dense (18432),
    then 128 experts of 2048 (8 used, sigmoid with the selection bias, normalised, scaled 2.5) and one shared
    expert of 2048, vocabulary 153600, context 262144."""
    lay = replace(Q4KM, n_layer=48, n_embd=6144, n_head=64, n_head_kv=8, head_dim=128, n_ff=18432, n_expert=128,
                  n_expert_used=8, n_ff_exp=2048, n_ff_shexp=2048, n_vocab=153600, n_dense_lead=1,
                  qk_norm="head", probs_bias=True, down_type=Q.Q6_K, n_nextn=1)
    keys = {Keys.Attention.SLIDING_WINDOW: 128, Keys.LLM.EXPERT_SHARED_COUNT: 1, Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5,
            Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("exaone-moe", lay, keys), 153600, 262144, 1000000.0)


def smallthinker_4b_spec() -> ModelSpec:
    """SmallThinker-4BA0.6B: 32 blocks 1536 wide, 12 heads (2 KV) of 128, no sliding window (every layer
    roped), 32 ReLU-gated experts of 768 (4 used, sigmoid routing from the layer input), tied embeddings,
    vocabulary 151936, context 32768."""
    lay = replace(Q4KM, n_layer=32, n_embd=1536, n_head=12, n_head_kv=2, head_dim=128, n_expert=32,
                  n_expert_used=4, n_ff_exp=768, n_vocab=151936, down_type=Q.Q6_K, out_type=None)
    keys = {Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("smallthinker", lay, keys), 151936, 32768, 1500000.0)


def trinity_mini_spec() -> ModelSpec:
    """Trinity-Mini (afmoe): 32 blocks 2048 wide, 32 heads (4 KV) of 128 with Q/K norms and a gated output,
    three sliding-window layers (window 2048) to one full, blocks 0-1 dense (6144), then 128 experts of 1024
    (8 used, sigmoid with the selection bias, normalised, scaled 2.826) and one shared expert, vocabulary
    200192, context 131072."""
    lay = replace(Q4KM, n_layer=32, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_ff=6144, n_expert=128,
                  n_expert_used=8, n_ff_exp=1024, n_ff_shexp=1024, n_vocab=200192, n_dense_lead=2,
                  qk_norm="head", probs_bias=True, sandwich=True, down_type=Q.Q6_K)
    keys = {Keys.Attention.SLIDING_WINDOW: 2048, Keys.LLM.EXPERT_SHARED_COUNT: 1,
            Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.826, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
            Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    return with_tokenizer(moe_layout("afmoe", lay, keys), 200192, 131072, 10000.0)


def phi35_moe_spec() -> ModelSpec:
    """Phi-3.5-MoE-instruct: 32 blocks 4096 wide, 32 heads (8 KV) of 128 with biases, norms and output with
    biases, longrope factors, 16 experts of 6400 (2 used, softmax, normalised), vocabulary 32064, context
    131072."""
    lay = replace(Q4KM, n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_expert=16, n_expert_used=2,
                  n_ff_exp=6400, n_vocab=32064, qkv_bias=True, phi_biases=True, rope_factors=True, down_type=Q.Q6_K)
    return with_tokenizer(moe_layout("phimoe", lay), 32064, 131072, 10000.0)
