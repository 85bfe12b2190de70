"""Shape-faithful sparse models of the hybrid recurrent families (qwen35, qwen35moe, …): published
config.json dimensions laid out as the pinned llama.cpp's load_arch_tensors creates the tensors, with
a Q4_K / Q6_K mix like llama-quantize's Q4_K_M (Q6_K for the output and the down projections), and a
stand-in tokenizer of the real vocabulary's length (planner/synth/shapes.py `tokenized`). The tensor
data is a sparse hole: llama-fit-params loads the headers in a second. The peer matrix
(tests/peer/test_arch_hybrid_peer.py) lists them.
"""
from __future__ import annotations

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q
from planner.synth.qwen3next_factory import qwen35_spec
from planner.synth.shapes import tokenized

QWEN35_VOCAB = 248320
QWEN35_CTX = 262144
QWEN35_ROPE_BASE = 10000000.0
QWEN35_SECTIONS = (11, 11, 10, 0)   # rope_parameters.mrope_section, padded to ggml's four


def _qwen35_tail(spec: ModelSpec) -> ModelSpec:
    spec = tokenized(spec, QWEN35_VOCAB, QWEN35_CTX)
    spec.metadata[Keys.Rope.FREQ_BASE] = QWEN35_ROPE_BASE
    return spec


def qwen35_27b() -> ModelSpec:
    """Qwen3.5-27B (Qwen/Qwen3.5-27B config.json text_config): 64 layers, 5120 wide, Gated DeltaNet
    (16 key / 48 value heads of 128, conv 4) with gated attention (24 heads / 4 KV of 256, a quarter
    roped, interleaved M-RoPE sections 11/11/10) every 4th layer, SwiGLU FFN of 17408, 248320 vocab,
    untied output."""
    spec = qwen35_spec(moe=False, n_layer=64, n_embd=5120, n_head=24, n_head_kv=4, head_dim=256, n_rot=64,
                       sections=QWEN35_SECTIONS, n_ff=17408, d_conv=4, d_state=128, n_k_heads=16, n_v_heads=48,
                       n_vocab=QWEN35_VOCAB, n_ctx=QWEN35_CTX, mat_type=Q.Q4_K, qkv_type=Q.Q6_K,
                       ssm_out_type=Q.Q4_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)
    return _qwen35_tail(spec)


def qwen35moe_35b_a3b() -> ModelSpec:
    """Qwen3.5-35B-A3B (Qwen/Qwen3.5-35B-A3B config.json text_config): 40 layers, 2048 wide, Gated
    DeltaNet (16 key / 32 value heads of 128, conv 4) with gated attention (16 heads / 2 KV of 256, a
    quarter roped, M-RoPE sections 11/11/10) every 4th layer, 256 experts (8 used) of 512 plus a
    shared expert of 512, 248320 vocab, untied output."""
    spec = qwen35_spec(moe=True, n_layer=40, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_rot=64,
                       sections=QWEN35_SECTIONS, n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512,
                       n_ff=512, d_conv=4, d_state=128, n_k_heads=16, n_v_heads=32, n_vocab=QWEN35_VOCAB,
                       n_ctx=QWEN35_CTX, mat_type=Q.Q4_K, qkv_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K,
                       exp_type=Q.Q4_K, exp_down_type=Q.Q6_K, embd_type=Q.Q4_K, out_type=Q.Q6_K)
    return _qwen35_tail(spec)
