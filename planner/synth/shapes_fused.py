"""Sparse GGUF layouts of the LayerNorm / fused-projection decoders (runtime/engine/fused.py): phi3,
command-r, cohere2, stablelm, starcoder2, olmo and qwen3vl, each tensor as the pinned llama.cpp's
load_arch_tensors creates it (src/models/<arch>.cpp), keys as the pin's converters write them.

`*_spec` lays out one architecture at any size (the builder tests use tiny ones); the functions after
them hold published models' dimensions (config.json on Hugging Face) with Q4_K_M-like types: Q4_K
matrices, Q6_K for V, ffn_down and the output, as llama-quantize's Q4_K_M mostly writes them.
"""
from __future__ import annotations

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q, T, add_tokenizer


def _base(arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int,
          n_vocab: int, n_ctx: int, rope_base: float) -> ModelSpec:
    spec = ModelSpec(arch)
    spec.metadata.update({
        Keys.LLM.BLOCK_COUNT: n_layer, Keys.LLM.EMBEDDING_LENGTH: n_embd, Keys.LLM.CONTEXT_LENGTH: n_ctx,
        Keys.LLM.VOCAB_SIZE: n_vocab, Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: n_head_kv, Keys.Attention.KEY_LENGTH: head_dim,
        Keys.Attention.VALUE_LENGTH: head_dim, Keys.Rope.FREQ_BASE: rope_base, Keys.General.FILE_TYPE: 15,
    })
    add_tokenizer(spec, n_vocab, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    return spec


def _qkv(spec: ModelSpec, i: int, n_embd: int, n_q: int, n_kv: int, fused: bool, bias: bool) -> None:
    """create_tensor_qkv: attn_qkv of n_q + 2 n_kv rows, or attn_q / attn_k / attn_v (with biases)."""
    if fused:
        spec.add(T.ATTN_QKV, Q.Q5_K, (n_embd, n_q + 2 * n_kv), i)
        if bias:
            spec.add(T.ATTN_QKV, Q.F32, (n_q + 2 * n_kv,), i, "bias")
        return
    spec.add(T.ATTN_Q, Q.Q4_K, (n_embd, n_q), i)
    spec.add(T.ATTN_K, Q.Q4_K, (n_embd, n_kv), i)
    spec.add(T.ATTN_V, Q.Q6_K, (n_embd, n_kv), i)
    if bias:
        spec.add(T.ATTN_Q, Q.F32, (n_q,), i, "bias")
        spec.add(T.ATTN_K, Q.F32, (n_kv,), i, "bias")
        spec.add(T.ATTN_V, Q.F32, (n_kv,), i, "bias")


def phi3_spec(*, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int,
              n_rot: int, n_ctx: int = 131072, n_ctx_orig: int = 4096, window: int = 262144) -> ModelSpec:
    """phi3 (src/models/phi3.cpp) as conversion/phi.py writes Phi-3.5/Phi-4-mini: fused attn_qkv, one ffn_up
    of 2 n_ff rows, tied embeddings, long/short RoPE factor tables of n_rot / 2, a sliding-window key the
    pin ignores (SWA disabled for phi3)."""
    hd = n_embd // n_head
    spec = _base("phi3", n_layer, n_embd, n_head, n_head_kv, hd, n_ff, n_vocab, n_ctx, 10000.0)
    spec.metadata.update({Keys.Attention.LAYERNORM_RMS_EPS: 1e-5, Keys.Rope.DIMENSION_COUNT: n_rot,
                          Keys.Rope.SCALING_ORIG_CTX_LEN: n_ctx_orig, Keys.Attention.SLIDING_WINDOW: window})
    spec.add(T.TOKEN_EMBD, Q.Q6_K, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    spec.add(T.ROPE_FACTORS_LONG, Q.F32, (n_rot // 2,))
    spec.add(T.ROPE_FACTORS_SHORT, Q.F32, (n_rot // 2,))
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        _qkv(spec, i, n_embd, n_embd, hd * n_head_kv, fused=True, bias=False)
        spec.add(T.ATTN_OUT, Q.Q4_K, (n_embd, n_embd), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_DOWN, Q.Q6_K, (n_ff, n_embd), i)
        spec.add(T.FFN_UP, Q.Q4_K, (n_embd, 2 * n_ff), i)
    return spec


def phi4_mini() -> ModelSpec:
    """Phi-4-mini-instruct: 32 layers, 3072 wide, 24 heads / 8 KV of 128, partial RoPE 0.75 (96 dims),
    n_ff 8192, 200064 vocab, 131072 positions over an original 4096 (longrope), tied embeddings."""
    return phi3_spec(n_layer=32, n_embd=3072, n_head=24, n_head_kv=8, n_ff=8192, n_vocab=200064, n_rot=96)


def cohere_spec(arch: str, *, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int,
                n_ctx: int, logit_scale: float, window: int = 0, rope_base: float = 10000.0) -> ModelSpec:
    """command-r (src/models/command-r.cpp) or cohere2 (src/models/cohere2.cpp, `window` > 0): LayerNorm
    weights without biases, separate Q/K/V, a SwiGLU FFN, tied embeddings, logit scale; cohere2 slides
    three layers in four (load_swa_pattern's default 4). Q/K norms exist from 64 layers on (command-r)."""
    hd = n_embd // n_head
    spec = _base(arch, n_layer, n_embd, n_head, n_head_kv, hd, n_ff, n_vocab, n_ctx, rope_base)
    spec.metadata.update({Keys.Attention.LAYERNORM_EPS: 1e-5, Keys.LLM.LOGIT_SCALE: logit_scale})
    if window:
        spec.metadata[Keys.Attention.SLIDING_WINDOW] = window
    spec.add(T.TOKEN_EMBD, Q.Q6_K, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        if arch == "command-r" and n_layer >= 64:
            spec.add(T.ATTN_Q_NORM, Q.F32, (hd, n_head), i)
            spec.add(T.ATTN_K_NORM, Q.F32, (hd, n_head_kv), i)
        _qkv(spec, i, n_embd, n_embd, hd * n_head_kv, fused=False, bias=False)
        spec.add(T.ATTN_OUT, Q.Q4_K, (n_embd, n_embd), i)
        spec.add(T.FFN_GATE, Q.Q4_K, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, Q.Q6_K, (n_ff, n_embd), i)
        spec.add(T.FFN_UP, Q.Q4_K, (n_embd, n_ff), i)
    return spec


def command_r_v01() -> ModelSpec:
    """c4ai-command-r-v01: 40 layers, 8192 wide, 64 heads / 64 KV of 128, n_ff 22528, 256000 vocab,
    131072 positions (the GGUF's context_length), rope theta 8e6, logit scale 0.0625."""
    return cohere_spec("command-r", n_layer=40, n_embd=8192, n_head=64, n_head_kv=64, n_ff=22528, n_vocab=256000,
                       n_ctx=131072, logit_scale=0.0625, rope_base=8000000.0)


def command_r7b() -> ModelSpec:
    """c4ai-command-r7b-12-2024 (cohere2): 32 layers, 4096 wide, 32 heads / 8 KV of 128, n_ff 14336,
    256000 vocab, 8192 positions, window 4096 on three layers in four, rope theta 50000, logit scale 0.25."""
    return cohere_spec("cohere2", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=256000,
                       n_ctx=8192, logit_scale=0.25, window=4096, rope_base=50000.0)


def stablelm_spec(*, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int, n_rot: int,
                  n_ctx: int = 4096, qkv_bias: bool = True, parallel: bool = False) -> ModelSpec:
    """stablelm (src/models/stablelm.cpp) as StableLM 2 1.6B: LayerNorms with biases (the output's too),
    Q/K/V biases, partial RoPE of n_rot dims, a SwiGLU FFN, an untied output. `parallel`: StableLM 2 12B's
    layer, per-head Q/K LayerNorm weights and no ffn_norm (the parallel residual)."""
    hd = n_embd // n_head
    spec = _base("stablelm", n_layer, n_embd, n_head, n_head_kv, hd, n_ff, n_vocab, n_ctx, 10000.0)
    spec.metadata.update({Keys.Attention.LAYERNORM_EPS: 1e-5, Keys.Rope.DIMENSION_COUNT: n_rot})
    spec.add(T.TOKEN_EMBD, Q.Q4_K, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,), None, "bias")
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    spec.add(T.OUTPUT, Q.Q6_K, (n_embd, n_vocab))
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i, "bias")
        _qkv(spec, i, n_embd, n_embd, hd * n_head_kv, fused=False, bias=qkv_bias)
        spec.add(T.ATTN_OUT, Q.Q4_K, (n_embd, n_embd), i)
        if parallel:
            spec.add(T.ATTN_Q_NORM, Q.F32, (hd, n_head), i)
            spec.add(T.ATTN_K_NORM, Q.F32, (hd, n_head_kv), i)
        else:
            spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
            spec.add(T.FFN_NORM, Q.F32, (n_embd,), i, "bias")
        spec.add(T.FFN_GATE, Q.Q4_K, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, Q.Q6_K, (n_ff, n_embd), i)
        spec.add(T.FFN_UP, Q.Q4_K, (n_embd, n_ff), i)
    return spec


def stablelm2_1p6b() -> ModelSpec:
    """stablelm-2-1_6b: 24 layers, 2048 wide, 32 heads / 32 KV of 64, a quarter roped (16 dims), n_ff 5632,
    100352 vocab, 4096 positions, Q/K/V biases."""
    return stablelm_spec(n_layer=24, n_embd=2048, n_head=32, n_head_kv=32, n_ff=5632, n_vocab=100352, n_rot=16)


def stablelm2_12b() -> ModelSpec:
    """stablelm-2-12b: 40 layers, 5120 wide, 32 heads / 8 KV of 160, a quarter roped (40 dims), n_ff 13824,
    100352 vocab, per-head Q/K LayerNorms, parallel residual, no Q/K/V biases."""
    return stablelm_spec(n_layer=40, n_embd=5120, n_head=32, n_head_kv=8, n_ff=13824, n_vocab=100352, n_rot=40,
                         qkv_bias=False, parallel=True)


def starcoder2_spec(*, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int,
                    n_ctx: int = 16384, rope_base: float = 1000000.0) -> ModelSpec:
    """starcoder2 (src/models/starcoder2.cpp): LayerNorms with biases, biases on Q/K/V, the output
    projection, up and down, a GELU FFN without gate, an untied output."""
    hd = n_embd // n_head
    spec = _base("starcoder2", n_layer, n_embd, n_head, n_head_kv, hd, n_ff, n_vocab, n_ctx, rope_base)
    spec.metadata[Keys.Attention.LAYERNORM_EPS] = 1e-5
    spec.add(T.TOKEN_EMBD, Q.Q4_K, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,), None, "bias")
    spec.add(T.OUTPUT, Q.Q6_K, (n_embd, n_vocab))
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i, "bias")
        _qkv(spec, i, n_embd, n_embd, hd * n_head_kv, fused=False, bias=True)
        spec.add(T.ATTN_OUT, Q.Q4_K, (n_embd, n_embd), i)
        spec.add(T.ATTN_OUT, Q.F32, (n_embd,), i, "bias")
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i, "bias")
        spec.add(T.FFN_DOWN, Q.Q6_K, (n_ff, n_embd), i)
        spec.add(T.FFN_UP, Q.Q4_K, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, Q.F32, (n_embd,), i, "bias")
        spec.add(T.FFN_UP, Q.F32, (n_ff,), i, "bias")
    return spec


def starcoder2_7b() -> ModelSpec:
    """starcoder2-7b: 32 layers, 4608 wide, 36 heads / 4 KV of 128, n_ff 18432, 49152 vocab, 16384
    positions, rope theta 1e6."""
    return starcoder2_spec(n_layer=32, n_embd=4608, n_head=36, n_head_kv=4, n_ff=18432, n_vocab=49152)


def olmo_spec(*, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int,
              n_ctx: int = 4096, clamp_kqv: float = 8.0) -> ModelSpec:
    """olmo (src/models/olmo.cpp): no norm weights at all (non-parametric LayerNorm), separate Q/K/V
    clamped to +-clamp_kqv, a SwiGLU FFN, an untied output."""
    hd = n_embd // n_head
    spec = _base("olmo", n_layer, n_embd, n_head, n_head_kv, hd, n_ff, n_vocab, n_ctx, 10000.0)
    spec.metadata[Keys.Attention.LAYERNORM_EPS] = 1e-5
    if clamp_kqv:
        spec.metadata[Keys.Attention.CLAMP_KQV] = clamp_kqv
    spec.add(T.TOKEN_EMBD, Q.Q4_K, (n_embd, n_vocab))
    spec.add(T.OUTPUT, Q.Q6_K, (n_embd, n_vocab))
    for i in range(n_layer):
        _qkv(spec, i, n_embd, n_embd, hd * n_head_kv, fused=False, bias=False)
        spec.add(T.ATTN_OUT, Q.Q4_K, (n_embd, n_embd), i)
        spec.add(T.FFN_GATE, Q.Q4_K, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, Q.Q6_K, (n_ff, n_embd), i)
        spec.add(T.FFN_UP, Q.Q4_K, (n_embd, n_ff), i)
    return spec


def olmo_7b_0724() -> ModelSpec:
    """OLMo-7B-0724-hf: 32 layers, 4096 wide, 32 heads / 32 KV of 128, n_ff 11008, 50304 vocab, 4096
    positions, Q/K/V clipped to 8."""
    return olmo_spec(n_layer=32, n_embd=4096, n_head=32, n_head_kv=32, n_ff=11008, n_vocab=50304)


def qwen3vl_spec(*, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int,
                 n_vocab: int, sections: tuple[int, ...], n_deepstack: int, n_ctx: int = 262144,
                 rope_base: float = 5000000.0) -> ModelSpec:
    """qwen3vl's text model (src/models/qwen3vl.cpp) as conversion/qwen3vl.py writes it: qwen3's layer
    (per-head Q/K RMS norms, separate Q/K/V, SwiGLU), rope.dimension_sections of four, the number of
    deepstack layers (the vision tower's deepstack_visual_indexes), an untied output."""
    spec = _base("qwen3vl", n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx, rope_base)
    spec.metadata.update({Keys.Attention.LAYERNORM_RMS_EPS: 1e-6, Keys.Rope.DIMENSION_SECTIONS: list(sections),
                          Keys.LLM.NUM_DEEPSTACK_LAYERS: n_deepstack})
    spec.add(T.TOKEN_EMBD, Q.Q4_K, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    spec.add(T.OUTPUT, Q.Q6_K, (n_embd, n_vocab))
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        _qkv(spec, i, n_embd, head_dim * n_head, head_dim * n_head_kv, fused=False, bias=False)
        spec.add(T.ATTN_OUT, Q.Q4_K, (head_dim * n_head, n_embd), i)
        spec.add(T.ATTN_K_NORM, Q.F32, (head_dim,), i)
        spec.add(T.ATTN_Q_NORM, Q.F32, (head_dim,), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE, Q.Q4_K, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, Q.Q6_K, (n_ff, n_embd), i)
        spec.add(T.FFN_UP, Q.Q4_K, (n_embd, n_ff), i)
    return spec


def qwen3vl_8b() -> ModelSpec:
    """Qwen3-VL-8B-Instruct's text model: 36 layers, 4096 wide, 32 heads / 8 KV of 128, n_ff 12288, 151936
    vocab, 262144 positions, rope theta 5e6, M-RoPE sections 24/20/20, three deepstack layers."""
    return qwen3vl_spec(n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=12288, n_vocab=151936,
                        sections=(24, 20, 20, 0), n_deepstack=3)
