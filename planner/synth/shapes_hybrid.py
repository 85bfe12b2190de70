"""Shape-faithful sparse models of the hybrid recurrent families (qwen35, qwen35moe, …): published
config.json dimensions laid out as the pinned llama.cpp's load_arch_tensors creates the tensors, with
a Q4_K / Q6_K mix like llama-quantize's Q4_K_M (Q6_K for the output and the down projections), and a
stand-in tokenizer of the real vocabulary's length (planner/synth/shapes_common.py `tokenized`). The tensor
data is a sparse hole: llama-fit-params loads the headers in a second. The peer matrix
(tests/peer/test_arch_hybrid_peer.py) lists them; each builder ends in `_spec`, the name the coverage
page's hook (docs/hooks/coverage_reference.py) finds a peer test's architectures by.
"""
from __future__ import annotations

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q
from planner.synth.hybrid_factory import (
    falcon_h1_spec,
    jamba_spec,
    lfm2moe_spec,
    mamba2_layout,
    mamba_layout,
    nemotron_h_spec,
)
from planner.synth.qwen3next_factory import qwen35_spec
from planner.synth.shapes_common import tokenized

QWEN35_VOCAB = 248320
QWEN35_CTX = 262144
QWEN35_ROPE_BASE = 10000000.0
QWEN35_SECTIONS = (11, 11, 10, 0)   # rope_parameters.mrope_section, padded to ggml's four


def _qwen35_tail(spec: ModelSpec) -> ModelSpec:
    spec = tokenized(spec, QWEN35_VOCAB, QWEN35_CTX)
    spec.metadata[Keys.Rope.FREQ_BASE] = QWEN35_ROPE_BASE
    return spec


def qwen35_27b_spec() -> ModelSpec:
    """Qwen3.5-27B (Qwen/Qwen3.5-27B config.json text_config): 64 layers, 5120 wide, Gated DeltaNet
    (16 key / 48 value heads of 128, conv 4) with gated attention (24 heads / 4 KV of 256, a quarter
    roped, interleaved M-RoPE sections 11/11/10) every 4th layer, SwiGLU FFN of 17408, 248320 vocab,
    untied output; the MTP block the converter appends (mtp_num_hidden_layers 1)."""
    spec = qwen35_spec(moe=False, n_mtp=1, n_layer=64, n_embd=5120, n_head=24, n_head_kv=4, head_dim=256, n_rot=64,
                       sections=QWEN35_SECTIONS, n_ff=17408, d_conv=4, d_state=128, n_k_heads=16, n_v_heads=48,
                       n_vocab=QWEN35_VOCAB, n_ctx=QWEN35_CTX, mat_type=Q.Q4_K, qkv_type=Q.Q6_K,
                       ssm_out_type=Q.Q4_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)
    return _qwen35_tail(spec)


def qwen35moe_35b_a3b_spec() -> ModelSpec:
    """Qwen3.5-35B-A3B (Qwen/Qwen3.5-35B-A3B config.json text_config): 40 layers, 2048 wide, Gated
    DeltaNet (16 key / 32 value heads of 128, conv 4) with gated attention (16 heads / 2 KV of 256, a
    quarter roped, M-RoPE sections 11/11/10) every 4th layer, 256 experts (8 used) of 512 plus a
    shared expert of 512, 248320 vocab, untied output; the MTP block the converter appends
    (mtp_num_hidden_layers 1)."""
    spec = qwen35_spec(moe=True, n_mtp=1, n_layer=40, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_rot=64,
                       sections=QWEN35_SECTIONS, n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512,
                       n_ff=512, d_conv=4, d_state=128, n_k_heads=16, n_v_heads=32, n_vocab=QWEN35_VOCAB,
                       n_ctx=QWEN35_CTX, mat_type=Q.Q4_K, qkv_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K,
                       exp_type=Q.Q4_K, exp_down_type=Q.Q6_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)
    return _qwen35_tail(spec)


# Nemotron's widths (4480, 2688, and the FFNs' 15680 and 1856) are not multiples of 256, so llama-quantize's
# Q4_K_M falls back on those rows: Q4_K to Q5_0, Q6_K to Q8_0 (llama_tensor_get_type's fallback)
NEMOTRON_VOCAB = 131072


def nemotron_nano_9b_v2_spec() -> ModelSpec:
    """NVIDIA-Nemotron-Nano-9B-v2 (config.json): 56 blocks by hybrid_override_pattern, 4480 wide; Mamba-2
    of 128 heads of 80 (d_inner 10240), 8 groups, state 128, conv 4; attention 40 heads / 8 KV of 128;
    relu^2 MLP of 15680; 131072 vocab, untied output."""
    spec = nemotron_h_spec(pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", n_embd=4480,
                           n_head=40, n_head_kv=8, head_dim=128, n_ff=15680, d_conv=4, d_inner=10240, d_state=128,
                           n_group=8, n_ssm_head=128, n_vocab=NEMOTRON_VOCAB, n_ctx=131072, mat_type=Q.Q5_0,
                           v_type=Q.Q8_0, down_type=Q.Q8_0, embd_type=Q.Q5_0, out_type=Q.Q8_0)
    return tokenized(spec, NEMOTRON_VOCAB, 131072)


def nemotron3_nano_30b_a3b_spec() -> ModelSpec:
    """NVIDIA-Nemotron-3-Nano-30B-A3B (config.json): 52 blocks by hybrid_override_pattern, 2688 wide;
    Mamba-2 of 64 heads of 64 (d_inner 4096), 8 groups, state 128, conv 4; attention 32 heads / 2 KV of
    128; 128 relu^2 experts (6 used, weights normalised and scaled by 2.5) of 1856 and a shared expert
    of 3712; 131072 vocab, untied output."""
    spec = nemotron_h_spec(pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", n_embd=2688, n_head=32,
                           n_head_kv=2, head_dim=128, d_conv=4, d_inner=4096, d_state=128, n_group=8, n_ssm_head=64,
                           n_expert=128, n_expert_used=6, n_ff_exp=1856, n_ff_shexp=3712, norm_w=True, w_scale=2.5,
                           n_vocab=NEMOTRON_VOCAB, n_ctx=262144, mat_type=Q.Q5_0, v_type=Q.Q8_0,
                           down_type=Q.Q8_0, exp_type=Q.Q5_0, exp_down_type=Q.Q8_0, embd_type=Q.Q5_0,
                           out_type=Q.Q8_0)
    return tokenized(spec, NEMOTRON_VOCAB, 262144)


def lfm2moe_8b_a1b_spec() -> ModelSpec:
    """LFM2-8B-A1B (LiquidAI/LFM2-8B-A1B config.json): 24 blocks, 2048 wide, attention (32 heads / 8 KV of 64)
    at blocks 2, 6, 10, 14, 18 and 21, short convolutions (L_cache 3) elsewhere; a dense SwiGLU FFN of 7168 in
    the first 2 blocks, 32 sigmoid-routed experts (4 used, weights normalised) of 1792 in the others;
    65536 vocab, tied embeddings, RoPE base 1e6."""
    kv = tuple(8 if i in (2, 6, 10, 14, 18, 21) else 0 for i in range(24))
    spec = lfm2moe_spec(n_embd=2048, n_head=32, head_count_kv=kv, n_dense_lead=2, n_ff=7168, n_expert=32,
                        n_expert_used=4, n_ff_exp=1792, w_scale=1.0, l_cache=3, n_vocab=65536, n_ctx=128000,
                        mat_type=Q.Q4_K, v_type=Q.Q6_K, down_type=Q.Q6_K, exp_type=Q.Q4_K, exp_down_type=Q.Q6_K,
                        embd_type=Q.Q6_K)
    spec = tokenized(spec, 65536, 128000)
    spec.metadata[Keys.Rope.FREQ_BASE] = 1000000.0
    return spec


def mamba_codestral_7b_spec() -> ModelSpec:
    """Mamba-Codestral-7B-v0.1 (mistralai, config.json): 64 Mamba-2 blocks, 4096 wide, 128 heads of 64
    (d_inner 8192), 8 groups, state 128, conv 4; 32768 vocab, untied output."""
    spec = mamba2_layout(n_layer=64, n_embd=4096, d_conv=4, d_inner=8192, d_state=128, n_group=8, n_ssm_head=128,
                         n_vocab=32768, n_ctx=2**20, mat_type=Q.Q4_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)
    return tokenized(spec, 32768, 2**20)


def falcon_h1_1p5b_spec() -> ModelSpec:
    """Falcon-H1-1.5B (tiiuae, config.json): 24 blocks, 2048 wide, each with attention (8 heads / 2 KV of
    128) beside a Mamba-2 mixer (48 heads of 64, d_ssm 3072, 1 group, state 256, conv 4) and a SwiGLU FFN
    of 4608; 65537 vocab, untied output."""
    spec = falcon_h1_spec(n_layer=24, n_embd=2048, n_head=8, n_head_kv=2, head_dim=128, n_ff=4608, d_conv=4,
                          d_inner=3072, d_state=256, n_group=1, n_ssm_head=48, n_vocab=65537, n_ctx=131072,
                          mat_type=Q.Q4_K, v_type=Q.Q6_K, down_type=Q.Q6_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)
    return tokenized(spec, 65537, 131072)


def jamba_1p5_mini_spec() -> ModelSpec:
    """AI21-Jamba-1.5-Mini (ai21labs, config.json): 32 layers, 4096 wide; attention (32 heads / 8 KV of 128,
    no RoPE) at layers 4, 12, 20 and 28 (attn_layer_period 8, offset 4), Mamba-1 elsewhere (d_inner 8192,
    state 16, conv 4, dt_rank 256); 16 softmax-routed experts (2 used) of 14336 in the odd layers
    (expert_layer_period 2, offset 1), a SwiGLU FFN of 14336 in the even ones; 65536 vocab, untied."""
    kv = tuple(8 if i % 8 == 4 else 0 for i in range(32))
    spec = jamba_spec(head_count_kv=kv, moe_layers=tuple(range(1, 32, 2)), n_embd=4096, n_head=32, n_ff=14336,
                      d_conv=4, d_state=16, dt_rank=256, n_expert=16, n_expert_used=2, n_vocab=65536, n_ctx=262144,
                      mat_type=Q.Q4_K, v_type=Q.Q6_K, down_type=Q.Q6_K, exp_type=Q.Q4_K, exp_down_type=Q.Q6_K,
                      embd_type=Q.Q4_K, out_type=Q.Q6_K)
    return tokenized(spec, 65536, 262144)


def falcon_mamba_7b_spec() -> ModelSpec:
    """Falcon-Mamba-7B (tiiuae/falcon-mamba-7b, config.json): 64 Mamba-1 blocks, 4096 wide, d_inner 8192,
    state 16, conv 4, dt_rank 256, dt/B/C RMS-normed (ssm.dt_b_c_rms); 65024 vocab, untied output."""
    spec = mamba_layout(n_layer=64, n_embd=4096, d_conv=4, d_state=16, dt_rank=256, dt_b_c_rms=True, n_vocab=65024,
                        n_ctx=2**20, mat_type=Q.Q4_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)
    return tokenized(spec, 65024, 2**20)
