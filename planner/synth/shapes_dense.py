"""Llama-like dense architectures as GGUF headers the pinned llama.cpp loads: tiny files for the
builder tests and shape-faithful files of published models for the peer matrix.

`dense_spec` lays one architecture's tensors out as its `load_arch_tensors` creates them
(src/models/<arch>.cpp at the pinned build): `LAYER_TENSORS` lists a block's tensors per
architecture, the way gguf-py's `MODEL_TENSORS` does, `QKV_BIAS` the models whose attention has
Q/K/V biases, and `UNTIED` those whose loader requires an output matrix. The `*_shape` functions
hold the dimensions of the published config.json their docstring names, with Q4_K_M-like types
(Q4_K matrices, Q6_K attn_v / ffn_down / output; rows that are not a multiple of 256 fall back
to Q5_0 / Q8_0 as llama-quantize does). The data is a sparse hole (gguf_factory.write_model).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gguf import GGML_QUANT_SIZES, MODEL_TENSOR, Keys

from planner.synth.gguf_factory import ModelSpec, Q, add_tokenizer

T = MODEL_TENSOR

_ATTN = (T.ATTN_Q, T.ATTN_K, T.ATTN_V, T.ATTN_OUT)
_GLU = (T.FFN_GATE, T.FFN_DOWN, T.FFN_UP)
_LLAMA = (T.ATTN_NORM, *_ATTN, T.FFN_NORM, *_GLU)

LAYER_TENSORS: dict[str, tuple[MODEL_TENSOR, ...]] = {
    "mistral3": _LLAMA,
    "internlm2": _LLAMA,
    "ernie4_5": _LLAMA,
    "smollm3": _LLAMA,
    "granite": _LLAMA,
    "seed_oss": (*_ATTN, T.ATTN_NORM, T.ATTN_POST_NORM, T.FFN_GATE, T.FFN_UP, T.FFN_DOWN),
    "arcee": (T.ATTN_NORM, *_ATTN, T.FFN_NORM, T.FFN_DOWN, T.FFN_UP),
    "apertus": (T.ATTN_NORM, *_ATTN, T.FFN_NORM, T.FFN_DOWN, T.FFN_UP, T.ATTN_Q_NORM, T.ATTN_K_NORM),
    "olmo2": (*_ATTN, T.ATTN_Q_NORM, T.ATTN_K_NORM, T.ATTN_POST_NORM, T.FFN_GATE, T.FFN_UP, T.FFN_DOWN,
              T.FFN_POST_NORM),
    "exaone4": (*_ATTN, T.ATTN_POST_NORM, T.ATTN_Q_NORM, T.ATTN_K_NORM, *_GLU, T.FFN_POST_NORM),
    "hunyuan-dense": (T.ATTN_NORM, *_ATTN, T.ATTN_K_NORM, T.ATTN_Q_NORM, T.FFN_NORM, *_GLU),
    "glm4": (T.ATTN_NORM, *_ATTN, T.ATTN_POST_NORM, T.FFN_NORM, T.FFN_DOWN, T.FFN_UP, T.FFN_POST_NORM),
}
QKV_BIAS = frozenset({"seed_oss", "glm4"})             # the published models' attention_bias
UNTIED = frozenset({"internlm2", "olmo2", "apertus"})  # output.weight required (no token_embd fallback)
_NORMS = frozenset({T.ATTN_NORM, T.FFN_NORM, T.ATTN_POST_NORM, T.FFN_POST_NORM, T.ATTN_Q_NORM, T.ATTN_K_NORM})
# llama-quantize's fallback when a row is not a multiple of a k-quant's 256 elements
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


@dataclass(frozen=True)
class Dims:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx: int = 4096
    tied: bool = True
    n_rot: int = 0          # 0: head_dim


@dataclass(frozen=True)
class Types:
    """Quantization types by role (Q4_K_M-like by default; tiny files use Q8_0 throughout)."""

    mat: Q = Q.Q4_K
    v: Q = Q.Q6_K
    down: Q = Q.Q6_K
    embd: Q = Q.Q4_K
    out: Q = Q.Q6_K


TINY_TYPES = Types(Q.Q8_0, Q.Q8_0, Q.Q8_0, Q.Q8_0, Q.Q8_0)


def _fit(qtype: Q, row: int) -> Q:
    block = GGML_QUANT_SIZES[qtype][0]
    return qtype if row % block == 0 else _FALLBACK.get(qtype, Q.Q8_0)


def _shape(kind: MODEL_TENSOR, arch: str, d: Dims) -> tuple[int, ...]:
    q, kv = d.head_dim * d.n_head, d.head_dim * d.n_head_kv
    if kind in (T.ATTN_Q_NORM, T.ATTN_K_NORM):
        if arch == "olmo2":   # olmo2 norms the whole projection
            return (q,) if kind is T.ATTN_Q_NORM else (kv,)
        return (d.head_dim,)
    if kind in _NORMS:
        return (d.n_embd,)
    n_up = 2 * d.n_ff if arch == "glm4" else d.n_ff   # glm4: gate and up in one ffn_up
    return {T.ATTN_Q: (d.n_embd, q), T.ATTN_K: (d.n_embd, kv), T.ATTN_V: (d.n_embd, kv),
            T.ATTN_OUT: (q, d.n_embd), T.FFN_GATE: (d.n_embd, d.n_ff), T.FFN_UP: (d.n_embd, n_up),
            T.FFN_DOWN: (d.n_ff, d.n_embd)}[kind]


def _type(kind: MODEL_TENSOR, shape: tuple[int, ...], types: Types) -> Q:
    if kind in _NORMS:
        return Q.F32
    role = types.v if kind is T.ATTN_V else types.down if kind is T.FFN_DOWN else types.mat
    return _fit(role, shape[0])


def dense_spec(arch: str, d: Dims, types: Types = Types(), extra: dict[str, Any] | None = None) -> ModelSpec:
    """One architecture of LAYER_TENSORS with dimensions `d`, a stand-in BPE tokenizer of n_vocab
    tokens and the keys its load_arch_hparams requires (`extra`: more keys, e.g. a RoPE base)."""
    spec = ModelSpec(arch)
    spec.metadata.update({
        Keys.LLM.BLOCK_COUNT: d.n_layer, Keys.LLM.EMBEDDING_LENGTH: d.n_embd, Keys.LLM.CONTEXT_LENGTH: d.n_ctx,
        Keys.LLM.VOCAB_SIZE: d.n_vocab, Keys.LLM.FEED_FORWARD_LENGTH: d.n_ff, Keys.Attention.HEAD_COUNT: d.n_head,
        Keys.Attention.HEAD_COUNT_KV: d.n_head_kv, Keys.Attention.KEY_LENGTH: d.head_dim,
        Keys.Attention.VALUE_LENGTH: d.head_dim, Keys.Rope.DIMENSION_COUNT: d.n_rot or d.head_dim,
        Keys.Attention.LAYERNORM_RMS_EPS: 1e-5, Keys.General.FILE_TYPE: 15,
    })
    if arch == "granite":   # load_arch_hparams requires the logit scale
        spec.metadata[Keys.LLM.LOGIT_SCALE] = 1.0
    if arch == "apertus":   # xIELU's four constants, required (the published values)
        spec.metadata.update({Keys.xIELU.ALPHA_N: 0.8, Keys.xIELU.ALPHA_P: 0.8, Keys.xIELU.BETA: 0.5,
                              Keys.xIELU.EPS: -1e-6})
    spec.metadata.update(extra or {})
    add_tokenizer(spec, d.n_vocab, n_merges=1)
    spec.metadata[Keys.Tokenizer.PRE] = "default"
    spec.add(T.TOKEN_EMBD, _fit(types.embd, d.n_embd), (d.n_embd, d.n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (d.n_embd,))
    if not d.tied or arch in UNTIED:
        spec.add(T.OUTPUT, _fit(types.out, d.n_embd), (d.n_embd, d.n_vocab))
    for il in range(d.n_layer):
        for kind in LAYER_TENSORS[arch]:
            shape = _shape(kind, arch, d)
            spec.add(kind, _type(kind, shape, types), shape, il)
            if arch in QKV_BIAS and kind in (T.ATTN_Q, T.ATTN_K, T.ATTN_V):
                spec.add(kind, Q.F32, (shape[1],), il, "bias")
    return spec


def tiny_spec(arch: str, n_layer: int = 2, extra: dict[str, Any] | None = None) -> ModelSpec:
    """A tiny file of `arch` for the builder tests: 128 wide, 4 heads / 2 KV of 32, n_ff 256, 512 tokens."""
    return dense_spec(arch, Dims(n_layer, 128, 4, 2, 32, 256, 512), TINY_TYPES, extra)


# --- shape-faithful files of published models (their config.json) ----------------------------

def _base(theta: float) -> dict[str, Any]:
    return {Keys.Rope.FREQ_BASE: theta}


def mistral3_24b() -> ModelSpec:
    """Mistral-Small-3.1-24B (text): 40 layers, 5120 wide, 32 heads / 8 KV of 128, n_ff 32768, 131072 vocab,
    theta 1e9, untied."""
    return dense_spec("mistral3", Dims(40, 5120, 32, 8, 128, 32768, 131072, 131072, tied=False), extra=_base(1e9))


def seed_oss_36b() -> ModelSpec:
    """Seed-OSS-36B: 64 layers, 5120 wide, 80 heads / 8 KV of 128, n_ff 27648, Q/K/V biases, 155136 vocab,
    theta 1e7, 512k context, untied."""
    return dense_spec("seed_oss", Dims(64, 5120, 80, 8, 128, 27648, 155136, 524288, tied=False), extra=_base(1e7))


def ernie4_5_0p3b() -> ModelSpec:
    """ERNIE-4.5-0.3B: 18 layers, 1024 wide, 16 heads / 2 KV of 64, n_ff 3072, 103424 vocab, theta 5e5,
    131072 context, tied embeddings."""
    return dense_spec("ernie4_5", Dims(18, 1024, 16, 2, 64, 3072, 103424, 131072), extra=_base(5e5))


def internlm2_7b() -> ModelSpec:
    """InternLM2.5-7B: 32 layers, 4096 wide, 32 heads / 8 KV of 128, n_ff 14336, 92544 vocab, theta 1e6,
    32768 context, an output matrix."""
    return dense_spec("internlm2", Dims(32, 4096, 32, 8, 128, 14336, 92544, 32768, tied=False), extra=_base(1e6))


def smollm3_3b() -> ModelSpec:
    """SmolLM3-3B: 36 layers (every 4th without RoPE), 2048 wide, 16 heads / 4 KV of 128, n_ff 11008,
    128256 vocab, theta 5e6, 65536 context, tied embeddings."""
    return dense_spec("smollm3", Dims(36, 2048, 16, 4, 128, 11008, 128256, 65536), extra=_base(5e6))


def granite_8b() -> ModelSpec:
    """Granite-3.3-8B: 40 layers, 4096 wide, 32 heads / 8 KV of 128, n_ff 12800, 49159 vocab, theta 1e7,
    131072 context, tied embeddings; embedding 12, residual 0.22, attention 1/128 and logit 16 scales."""
    return dense_spec("granite", Dims(40, 4096, 32, 8, 128, 12800, 49159, 131072), extra={
        **_base(1e7), Keys.LLM.EMBEDDING_SCALE: 12.0, Keys.LLM.RESIDUAL_SCALE: 0.22,
        Keys.Attention.SCALE: 0.0078125, Keys.LLM.LOGIT_SCALE: 16.0})


def arcee_4p5b() -> ModelSpec:
    """Arcee AFM-4.5B: 36 layers, 2560 wide, 20 heads / 4 KV of 128, relu^2 FFN of 18432, 128004 vocab,
    theta 1e4 with YaRN x20 over 4096 positions, 65536 context, untied."""
    return dense_spec("arcee", Dims(36, 2560, 20, 4, 128, 18432, 128004, 65536, tied=False), extra={
        **_base(1e4), Keys.Rope.SCALING_TYPE: "yarn", Keys.Rope.SCALING_FACTOR: 20.0,
        Keys.Rope.SCALING_ORIG_CTX_LEN: 4096})


def apertus_8b() -> ModelSpec:
    """Apertus-8B: 32 layers, 4096 wide, 32 heads / 8 KV of 128, xIELU FFN of 21504, Q/K norms, 131072 vocab,
    theta 1.2e7, 65536 context, an output matrix."""
    return dense_spec("apertus", Dims(32, 4096, 32, 8, 128, 21504, 131072, 65536, tied=False), extra=_base(1.2e7))


def olmo2_7b() -> ModelSpec:
    """OLMo-2-1124-7B: 32 layers, 4096 wide, 32 heads / 32 KV of 128, n_ff 11008, post norms, whole-width
    Q/K norms, 100352 vocab, theta 5e5, 4096 context, an output matrix."""
    return dense_spec("olmo2", Dims(32, 4096, 32, 32, 128, 11008, 100352, 4096, tied=False), extra=_base(5e5))


def olmo3_7b() -> ModelSpec:
    """OLMo-3-7B (an olmo2 file with a window): olmo2's layers, three sliding (4096) in four, 100278 vocab,
    65536 context. Not in SHAPES: the olmo2 peer test adds a few rows of it."""
    return dense_spec("olmo2", Dims(32, 4096, 32, 32, 128, 11008, 100278, 65536, tied=False), extra={
        **_base(5e5), Keys.Attention.SLIDING_WINDOW: 4096})


def exaone4_32b() -> ModelSpec:
    """EXAONE-4.0-32B: 64 layers (three sliding of 4096 then one global without RoPE), 5120 wide, 40 heads /
    8 KV of 128, n_ff 27392, post norms, Q/K norms, 102400 vocab, theta 1e6, 131072 context, untied."""
    return dense_spec("exaone4", Dims(64, 5120, 40, 8, 128, 27392, 102400, 131072, tied=False), extra={
        **_base(1e6), Keys.Attention.SLIDING_WINDOW: 4096})


def hunyuan_7b() -> ModelSpec:
    """Hunyuan-7B-Instruct: 32 layers, 4096 wide, 32 heads / 8 KV of 128, n_ff 14336, Q/K norms after RoPE,
    128167 vocab, 32768 context, tied embeddings."""
    return dense_spec("hunyuan-dense", Dims(32, 4096, 32, 8, 128, 14336, 128167, 32768), extra=_base(1e4))


def glm4_9b() -> ModelSpec:
    """GLM-4-9B-0414: 40 layers, 4096 wide, 32 heads / 2 KV of 128 (half of each head roped), Q/K/V biases,
    one ffn_up of 2 x 13696, sandwich norms, 151552 vocab, 32768 context, untied."""
    return dense_spec("glm4", Dims(40, 4096, 32, 2, 128, 13696, 151552, 32768, tied=False, n_rot=64),
                      extra=_base(1e4))


SHAPES: dict[str, Callable[[], ModelSpec]] = {
    "mistral3-24b": mistral3_24b,
    "seed-oss-36b": seed_oss_36b,
    "ernie4_5-0.3b": ernie4_5_0p3b,
    "internlm2-7b": internlm2_7b,
    "smollm3-3b": smollm3_3b,
    "granite-8b": granite_8b,
    "arcee-4.5b": arcee_4p5b,
    "apertus-8b": apertus_8b,
    "olmo2-7b": olmo2_7b,
    "exaone4-32b": exaone4_32b,
    "hunyuan-dense-7b": hunyuan_7b,
    "glm4-9b": glm4_9b,
}
