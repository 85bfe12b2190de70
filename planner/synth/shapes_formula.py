"""Shape-faithful files of architectures the estimate sizes with the formula (no graph builder):
the tensors each one's load_arch_tensors creates at the pinned build (src/models/<arch>.cpp), with
the published model's dimensions and Q4_K_M-like types. They check the formula's safety term
(planner/memory/analytic.py formula_safety) against llama-fit-params; the data is never read.
"""
from __future__ import annotations

from collections.abc import Callable

from gguf import MODEL_TENSOR as T
from gguf import GGMLQuantizationType as Q
from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, _common, _embeddings, llama_spec
from planner.synth.shapes_common import tokenized


def minicpm_2b() -> ModelSpec:
    """MiniCPM-2B (openbmb/MiniCPM-2B-sft-bf16 config.json): 40 layers, 2304 wide, 36 heads of 64 (no
    GQA), n_ff 5760, 122753 vocab, tied embeddings; llama's tensors (src/models/minicpm.cpp). Rows of
    5760 are not a multiple of 256: llama-quantize's Q4_K_M falls back to Q8_0 for ffn_down."""
    spec = llama_spec(n_layer=40, n_embd=2304, n_head=36, n_head_kv=36, n_ff=5760, n_vocab=122753,
                      attn_type=Q.Q4_K, v_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q8_0, embd_type=Q.Q6_K,
                      out_type=None, arch="minicpm")
    return tokenized(spec, 122753, 4096)


def dbrx_132b() -> ModelSpec:
    """DBRX (databricks/dbrx-instruct config.json): 40 layers, 6144 wide, 48 heads / 8 KV of 128, fused
    QKV, 16 experts of 10752 (4 used), 100352 vocab, clip_qkv 8; src/models/dbrx.cpp's tensors."""
    n_layer, n_embd, n_head, n_head_kv, n_ff, n_expert, n_vocab = 40, 6144, 48, 8, 10752, 16, 100352
    hd = n_embd // n_head
    spec = ModelSpec("dbrx")
    _common(spec, n_layer, n_embd, n_vocab)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: n_head_kv, Keys.Attention.LAYERNORM_EPS: 1e-5,
        Keys.Attention.CLAMP_KQV: 8.0, Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: 4,
    })
    _embeddings(spec, n_embd, n_vocab, Q.Q4_K, Q.Q6_K)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_QKV, Q.Q4_K, (n_embd, n_embd + 2 * hd * n_head_kv), i)
        spec.add(T.ATTN_OUT, Q.Q4_K, (n_embd, n_embd), i)
        spec.add(T.ATTN_OUT_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_GATE_EXP, Q.Q4_K, (n_embd, n_ff, n_expert), i)
        spec.add(T.FFN_DOWN_EXP, Q.Q6_K, (n_ff, n_embd, n_expert), i)
        spec.add(T.FFN_UP_EXP, Q.Q4_K, (n_embd, n_ff, n_expert), i)
    return tokenized(spec, n_vocab, 32768)


def bailingmoe_lite() -> ModelSpec:
    """Ling-lite (inclusionAI/Ling-lite config.json, bailingmoe): 28 layers, 2048 wide, 16 heads / 4 KV of
    128, 64 experts of 1408 (6 used) and 2 shared, 126464 vocab; src/models/bailingmoe.cpp's tensors."""
    n_layer, n_embd, n_head, n_head_kv, hd = 28, 2048, 16, 4, 128
    n_expert, n_ff_exp, n_shared, n_vocab = 64, 1408, 2, 126464
    spec = ModelSpec("bailingmoe")
    _common(spec, n_layer, n_embd, n_vocab)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: 5632, Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv,
        Keys.Rope.DIMENSION_COUNT: hd, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: 6, Keys.LLM.EXPERT_SHARED_COUNT: n_shared,
        Keys.LLM.EXPERT_WEIGHTS_NORM: True,
    })
    _embeddings(spec, n_embd, n_vocab, Q.Q4_K, Q.Q6_K)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_Q, Q.Q4_K, (n_embd, hd * n_head), i)
        spec.add(T.ATTN_K, Q.Q4_K, (n_embd, hd * n_head_kv), i)
        spec.add(T.ATTN_V, Q.Q6_K, (n_embd, hd * n_head_kv), i)
        spec.add(T.ATTN_OUT, Q.Q4_K, (hd * n_head, n_embd), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_GATE_EXP, Q.Q4_K, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_DOWN_EXP, Q.Q8_0, (n_ff_exp, n_embd, n_expert), i)   # rows of 1408: the Q8_0 fallback
        spec.add(T.FFN_UP_EXP, Q.Q4_K, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_GATE_SHEXP, Q.Q4_K, (n_embd, n_ff_exp * n_shared), i)
        spec.add(T.FFN_DOWN_SHEXP, Q.Q6_K, (n_ff_exp * n_shared, n_embd), i)
        spec.add(T.FFN_UP_SHEXP, Q.Q4_K, (n_embd, n_ff_exp * n_shared), i)
    return tokenized(spec, n_vocab, 16384)


FORMULA_SHAPES: dict[str, Callable[[], ModelSpec]] = {
    "minicpm-2b": minicpm_2b,
    "dbrx-132b": dbrx_132b,
    "bailingmoe-lite": bailingmoe_lite,
}
