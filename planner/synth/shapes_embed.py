"""The BERT family of encoders llama-server serves with --embedding / --rerank, as GGUF headers the pinned
llama.cpp loads: tiny files for the builder tests and shape-faithful files of published models for the peer
matrix.

`bert_spec` lays a file out as the architecture's `load_arch_tensors` creates it (src/models/bert.cpp,
nomic-bert.cpp, jina-bert-v2.cpp, jina-bert-v3.cpp at the pinned build; `modern_bert_spec` modern-bert.cpp's):
token embeddings, the token-type table, BERT's learned positions (bert only: the others rope, jina-bert-v2 uses
ALiBi), the embeddings' LayerNorm, then per block Q/K/V (fused or separate), the output projection, two
post-LayerNorms with biases and the FFN (GELU over ffn_up for bert and jina-bert-v3, SiLU-gated for nomic-bert, a
GeGLU over one ffn_up of 2 * n_ff for jina-bert-v2). Biases follow the published checkpoints: BERT and
XLM-RoBERTa have them on every linear layer, nomic-bert on none. `EmbedTypes` holds the tensor types of a
Q4_K_M-like file (rows that are not a multiple of 256 fall back as llama-quantize does). The data is a sparse hole
(gguf_factory.write_model).
"""
from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, MODEL_TENSOR, Keys

from planner.synth.gguf_factory import ModelSpec, Q, add_tokenizer

T = MODEL_TENSOR
# llama-quantize's fallback when a row is not a multiple of a k-quant's 256 elements
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}
# the encoders' pooling (llama.h llama_pooling_type) as their converters write it
POOLING_MEAN, POOLING_CLS = 1, 2

BERT, NOMIC_BERT, JINA_BERT_V3, MODERN_BERT = "bert", "nomic-bert", "jina-bert-v3", "modern-bert"
JINA_BERT_V2 = "jina-bert-v2"
FUSED_QKV = frozenset({NOMIC_BERT, JINA_BERT_V3})   # one attn_qkv (convert_hf_to_gguf's layout)
LINEAR_BIAS = frozenset({BERT, JINA_BERT_V3, JINA_BERT_V2})   # biases on the linear layers (jina-bert-v2: not ffn_up)
GATED_FFN = frozenset({NOMIC_BERT})                 # ffn_gate beside ffn_up (SwiGLU)
NO_POS_TABLE = frozenset({NOMIC_BERT, JINA_BERT_V3, JINA_BERT_V2})   # roped, or ALiBi (jina-bert-v2)
ROPED = frozenset({NOMIC_BERT, JINA_BERT_V3})
GLU_UP = frozenset({JINA_BERT_V2})                  # one ffn_up of 2 * n_ff, gate and up (GeGLU), without bias


@dataclass(frozen=True)
class EncoderDims:
    n_layer: int
    n_embd: int
    n_head: int
    n_ff: int
    n_vocab: int
    n_ctx: int
    n_token_types: int = 2
    pooling: int = POOLING_CLS
    rope_base: float = 10000.0


@dataclass(frozen=True)
class EmbedTypes:
    mat: Q = Q.Q4_K      # attn_q/k/qkv, attn_output, ffn_up, ffn_gate
    v: Q = Q.Q6_K        # attn_v (the separate layout)
    down: Q = Q.Q6_K     # ffn_down
    embd: Q = Q.Q4_K     # token_embd
    small: Q = Q.F32     # norms, biases, token types and positions


def _fit(qtype: Q, row: int) -> Q:
    block = GGML_QUANT_SIZES[qtype][0]
    return qtype if row % block == 0 else _FALLBACK.get(qtype, Q.Q8_0)


def bert_spec(arch: str, d: EncoderDims, ty: EmbedTypes = EmbedTypes()) -> ModelSpec:
    """A bert, nomic-bert or jina-bert-v3 file: the tensors its load_arch_tensors requires, and the optional
    ones (biases, token types) a converted checkpoint has."""
    if arch not in (BERT, NOMIC_BERT, JINA_BERT_V3, JINA_BERT_V2):
        raise ValueError(f"bert_spec lays out bert, nomic-bert, jina-bert-v2 and jina-bert-v3, not {arch}")
    e, ff = d.n_embd, d.n_ff
    spec = ModelSpec(arch)
    spec.metadata.update({
        Keys.LLM.BLOCK_COUNT: d.n_layer, Keys.LLM.EMBEDDING_LENGTH: e, Keys.LLM.CONTEXT_LENGTH: d.n_ctx,
        Keys.LLM.FEED_FORWARD_LENGTH: ff, Keys.Attention.HEAD_COUNT: d.n_head,
        Keys.Attention.LAYERNORM_EPS: 1e-12, Keys.Attention.CAUSAL: False, Keys.LLM.POOLING_TYPE: d.pooling,
        Keys.General.FILE_TYPE: 15, Keys.Tokenizer.TOKEN_TYPE_COUNT: d.n_token_types,
    })
    if arch in ROPED:
        spec.metadata[Keys.Rope.FREQ_BASE] = d.rope_base
    add_tokenizer(spec, d.n_vocab, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    spec.add(T.TOKEN_EMBD, _fit(ty.embd, e), (e, d.n_vocab))
    spec.add(T.TOKEN_TYPES, ty.small, (e, d.n_token_types))
    if arch not in NO_POS_TABLE:
        spec.add(T.POS_EMBD, ty.small, (e, d.n_ctx))
    spec.add(T.TOKEN_EMBD_NORM, ty.small, (e,))
    spec.add(T.TOKEN_EMBD_NORM, ty.small, (e,), suffix="bias")
    for i in range(d.n_layer):
        _block(spec, arch, i, d, ty)
    return spec


def _linear(spec: ModelSpec, arch: str, kind: MODEL_TENSOR, qtype: Q, shape: tuple[int, int], i: int,
            ty: EmbedTypes) -> None:
    spec.add(kind, _fit(qtype, shape[0]), shape, i)
    if arch in LINEAR_BIAS:
        spec.add(kind, ty.small, (shape[1],), i, "bias")


def _block(spec: ModelSpec, arch: str, i: int, d: EncoderDims, ty: EmbedTypes) -> None:
    """One block as load_arch_tensors creates it: Q/K/V, output, two LayerNorms and the FFN."""
    e, ff = d.n_embd, d.n_ff
    if arch in FUSED_QKV:
        _linear(spec, arch, T.ATTN_QKV, ty.mat, (e, 3 * e), i, ty)
    else:
        for kind, qtype in ((T.ATTN_Q, ty.mat), (T.ATTN_K, ty.mat), (T.ATTN_V, ty.v)):
            _linear(spec, arch, kind, qtype, (e, e), i, ty)
    _linear(spec, arch, T.ATTN_OUT, ty.mat, (e, e), i, ty)
    spec.add(T.ATTN_OUT_NORM, ty.small, (e,), i)
    spec.add(T.ATTN_OUT_NORM, ty.small, (e,), i, "bias")
    if arch in GLU_UP:
        spec.add(T.FFN_UP, _fit(ty.mat, e), (e, 2 * ff), i)
    else:
        _linear(spec, arch, T.FFN_UP, ty.mat, (e, ff), i, ty)
    if arch in GATED_FFN:
        spec.add(T.FFN_GATE, _fit(ty.mat, e), (e, ff), i)
    _linear(spec, arch, T.FFN_DOWN, ty.down, (ff, e), i, ty)
    spec.add(T.LAYER_OUT_NORM, ty.small, (e,), i)
    spec.add(T.LAYER_OUT_NORM, ty.small, (e,), i, "bias")


def modern_bert_spec(d: EncoderDims, window: int, pattern: int, ty: EmbedTypes = EmbedTypes()) -> ModelSpec:
    """A modern-bert file (src/models/modern-bert.cpp load_arch_tensors): LayerNorms without biases, no attn_norm in
    block 0, a fused attn_qkv, a GeGLU ffn_up of 2 * n_ff, an output norm and no biases anywhere; sliding-window
    attention in every block but each pattern-th (from block 0)."""
    e, ff = d.n_embd, d.n_ff
    spec = ModelSpec(MODERN_BERT)
    spec.metadata.update({
        Keys.LLM.BLOCK_COUNT: d.n_layer, Keys.LLM.EMBEDDING_LENGTH: e, Keys.LLM.CONTEXT_LENGTH: d.n_ctx,
        Keys.LLM.FEED_FORWARD_LENGTH: ff, Keys.Attention.HEAD_COUNT: d.n_head, Keys.LLM.VOCAB_SIZE: d.n_vocab,
        Keys.Attention.LAYERNORM_EPS: 1e-5, Keys.Attention.CAUSAL: False, Keys.LLM.POOLING_TYPE: d.pooling,
        Keys.General.FILE_TYPE: 15, Keys.Rope.FREQ_BASE: d.rope_base,
        Keys.Attention.SLIDING_WINDOW: window, Keys.Attention.SLIDING_WINDOW_PATTERN: pattern,
    })
    add_tokenizer(spec, d.n_vocab, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    spec.add(T.TOKEN_EMBD, _fit(ty.embd, e), (e, d.n_vocab))
    spec.add(T.TOKEN_EMBD_NORM, ty.small, (e,))
    spec.add(T.OUTPUT_NORM, ty.small, (e,))
    for i in range(d.n_layer):
        if i:
            spec.add(T.ATTN_NORM, ty.small, (e,), i)
        spec.add(T.ATTN_QKV, _fit(ty.mat, e), (e, 3 * e), i)
        spec.add(T.ATTN_OUT, _fit(ty.mat, e), (e, e), i)
        spec.add(T.FFN_UP, _fit(ty.mat, e), (e, 2 * ff), i)
        spec.add(T.FFN_DOWN, _fit(ty.down, ff), (ff, e), i)
        spec.add(T.FFN_NORM, ty.small, (e,), i)
    return spec


TINY_TYPES = EmbedTypes(mat=Q.Q8_0, v=Q.Q8_0, down=Q.Q8_0, embd=Q.Q8_0)


def tiny_bert(arch: str, n_layer: int = 2, n_ctx: int = 512) -> ModelSpec:
    """An encoder of n_layer blocks, 128 wide, 4 heads of 32, n_ff 256, 512 tokens (Q8_0 matrices)."""
    dims = EncoderDims(n_layer=n_layer, n_embd=128, n_head=4, n_ff=256, n_vocab=512, n_ctx=n_ctx)
    if arch == MODERN_BERT:   # sliding windows of 64 in blocks 1, 2, 4 (the pattern of 3 from block 0)
        return modern_bert_spec(dims, window=64, pattern=3, ty=TINY_TYPES)
    return bert_spec(arch, dims, TINY_TYPES)


# --- shape-faithful files of published encoders (their config.json) ------------------------------------------------
def bge_large_en_v15() -> ModelSpec:
    """BAAI/bge-large-en-v1.5 (bert): 24 layers, 1024 wide, 16 heads, n_ff 4096, 30522 tokens, 512 positions,
    2 token types, CLS pooling."""
    return bert_spec(BERT, EncoderDims(n_layer=24, n_embd=1024, n_head=16, n_ff=4096, n_vocab=30522, n_ctx=512))


def nomic_embed_text_v15() -> ModelSpec:
    """nomic-ai/nomic-embed-text-v1.5 (nomic-bert): 12 layers, 768 wide, 12 heads, SwiGLU n_inner 3072, 30528
    tokens, 2048 trained positions, rotary base 1000, 2 token types, mean pooling."""
    return bert_spec(NOMIC_BERT, EncoderDims(n_layer=12, n_embd=768, n_head=12, n_ff=3072, n_vocab=30528,
                                             n_ctx=2048, pooling=POOLING_MEAN, rope_base=1000.0))


def jina_embeddings_v3() -> ModelSpec:
    """jinaai/jina-embeddings-v3 (jina-bert-v3, an XLM-RoBERTa-large trunk): 24 layers, 1024 wide, 16 heads,
    n_ff 4096, 250002 tokens, 8194 positions, rotary base 20000, 1 token type, mean pooling."""
    return bert_spec(JINA_BERT_V3, EncoderDims(n_layer=24, n_embd=1024, n_head=16, n_ff=4096, n_vocab=250002,
                                               n_ctx=8194, n_token_types=1, pooling=POOLING_MEAN,
                                               rope_base=20000.0))


def modernbert_base() -> ModelSpec:
    """answerdotai/ModernBERT-base (gte-modernbert-base has its shape): 22 layers, 768 wide, 12 heads, GeGLU
    n_ff 1152, 50368 tokens, 8192 positions, local windows of 128 with every third layer global, global rope
    base 160000, CLS pooling."""
    return modern_bert_spec(EncoderDims(n_layer=22, n_embd=768, n_head=12, n_ff=1152, n_vocab=50368, n_ctx=8192,
                                        rope_base=160000.0), window=128, pattern=3)


def jina_embeddings_v2_base_en() -> ModelSpec:
    """jinaai/jina-embeddings-v2-base-en (jina-bert-v2): 12 layers, 768 wide, 12 heads, GeGLU n_ff 3072 (one
    up_gated_layer of 6144), 30528 tokens, 8192 positions with ALiBi, 2 token types, mean pooling."""
    return bert_spec(JINA_BERT_V2, EncoderDims(n_layer=12, n_embd=768, n_head=12, n_ff=3072, n_vocab=30528,
                                               n_ctx=8192, pooling=POOLING_MEAN))


# --- qwen3 as an embedder or reranker (src/models/qwen3.cpp) ---------------------------------------------------------
POOLING_LAST, POOLING_RANK = 3, 4


def qwen3_encoder_spec(*, rerank: bool) -> ModelSpec:
    """Qwen/Qwen3-Embedding-0.6B or Qwen/Qwen3-Reranker-0.6B: Qwen3-0.6B's trunk (28 layers, 1024 wide, 16 heads /
    8 KV of 128, n_ff 3072, Q/K norms, tied embeddings, 151669 tokens, 32768 positions, rope base 1000000). The
    embedder pools the last token; the reranker's converter (conversion/qwen.py) adds cls.output, the "yes" and
    "no" rows of the head ({n_embd, 2}, classifier.output_labels), and rank pooling. qwen3's load_arch_tensors
    creates cls.output when present (an output-layer tensor) and the tied output matrix either way."""
    e, hd, n_head, n_kv, ff, n_vocab, n_layer = 1024, 128, 16, 8, 3072, 151669, 28
    spec = ModelSpec("qwen3")
    spec.metadata.update({
        Keys.LLM.BLOCK_COUNT: n_layer, Keys.LLM.EMBEDDING_LENGTH: e, Keys.LLM.CONTEXT_LENGTH: 32768,
        Keys.LLM.FEED_FORWARD_LENGTH: ff, Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_kv,
        Keys.Attention.KEY_LENGTH: hd, Keys.Attention.VALUE_LENGTH: hd, Keys.Attention.LAYERNORM_RMS_EPS: 1e-6,
        Keys.Rope.FREQ_BASE: 1000000.0, Keys.General.FILE_TYPE: 15,
        Keys.LLM.POOLING_TYPE: POOLING_RANK if rerank else POOLING_LAST,
    })
    if rerank:
        spec.metadata[Keys.Classifier.OUTPUT_LABELS] = ["yes", "no"]
    add_tokenizer(spec, n_vocab, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "qwen2"
    spec.add(T.TOKEN_EMBD, Q.Q4_K, (e, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (e,))
    if rerank:
        spec.add(T.CLS_OUT, Q.F16, (e, 2))
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (e,), i)
        spec.add(T.ATTN_Q, Q.Q4_K, (e, hd * n_head), i)
        spec.add(T.ATTN_K, Q.Q4_K, (e, hd * n_kv), i)
        spec.add(T.ATTN_V, Q.Q6_K, (e, hd * n_kv), i)
        spec.add(T.ATTN_OUT, Q.Q4_K, (hd * n_head, e), i)
        spec.add(T.ATTN_K_NORM, Q.F32, (hd,), i)
        spec.add(T.ATTN_Q_NORM, Q.F32, (hd,), i)
        spec.add(T.FFN_NORM, Q.F32, (e,), i)
        spec.add(T.FFN_GATE, Q.Q4_K, (e, ff), i)
        spec.add(T.FFN_UP, Q.Q4_K, (e, ff), i)
        spec.add(T.FFN_DOWN, Q.Q6_K, (ff, e), i)
    return spec


def qwen3_embedding_0p6b() -> ModelSpec:
    return qwen3_encoder_spec(rerank=False)


def qwen3_reranker_0p6b() -> ModelSpec:
    return qwen3_encoder_spec(rerank=True)
