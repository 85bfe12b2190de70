"""Synthetic GGUF files: llama.cpp's real tensor names and metadata keys, no real data.

`write_model` writes the header with gguf-py's `GGUFWriter` and leaves the tensor data as a
sparse hole (`truncate`), so an 8B-class header costs a few MiB of disk, not 5 GiB. The
`*_spec` builders lay out one architecture's tensors the way the pinned llama.cpp creates them
(`src/models/<arch>.cpp`, `load_arch_tensors`); names come from gguf-py's `TENSOR_NAMES` and keys
from `gguf.Keys`, never typed by hand.

Shapes are in ggml order: `shape[0]` is ne0, the row length (llama.cpp's `{n_embd, n_ff}`).
Expected figures in tests must be worked out by hand from the same dimensions; nothing here
computes a figure a test asserts.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, MODEL_TENSOR, TENSOR_NAMES, GGMLQuantizationType, GGUFValueType, GGUFWriter, Keys

Q = GGMLQuantizationType
T = MODEL_TENSOR
Tensor = tuple[str, GGMLQuantizationType, tuple[int, ...]]


@dataclass(frozen=True)
class Typed:
    """A metadata value with an explicit GGUF type (e.g. a UINT64 or an INT32 array)."""

    value: Any
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclass
class ModelSpec:
    arch: str
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: list[Tensor] = field(default_factory=list)

    def add(self, kind: MODEL_TENSOR, qtype: GGMLQuantizationType, shape: Sequence[int],
            bid: int | None = None, suffix: str | None = "weight") -> None:
        self.tensors.append((tname(kind, bid, suffix), qtype, tuple(shape)))

    def write(self, path: str | Path, **kw: Any) -> list[Path]:
        return write_model(path, self.arch, self.metadata, self.tensors, **kw)


def write_once(directory: Path, name: str, make: Callable[[], ModelSpec]) -> Path:
    """`directory/NAME.gguf`, written from `make()` when it is not there yet: through a partial name
    renamed at the end, so an interrupted write never leaves a file under the final one."""
    path = directory / f"{name}.gguf"
    if not path.exists():
        [written] = make().write(directory / f"{name}.partial.gguf")
        written.rename(path)
    return path


def tname(kind: MODEL_TENSOR, bid: int | None = None, suffix: str | None = "weight") -> str:
    """llama.cpp's tensor name, e.g. tname(T.ATTN_Q, 3) == 'blk.3.attn_q.weight'."""
    base = TENSOR_NAMES[kind].format(bid=bid)
    return f"{base}.{suffix}" if suffix else base


def key(template: str, arch: str) -> str:
    """A gguf.Keys template such as '{arch}.block_count' for one architecture."""
    return template.format(arch=arch)


def _padded_nbytes(qtype: GGMLQuantizationType, shape: Sequence[int], alignment: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    n = shape[0] // block * size * math.prod(shape[1:])
    return -(-n // alignment) * alignment


def add_value(writer: GGUFWriter, name: str, value: Any) -> None:
    if isinstance(value, Typed):
        writer.add_key_value(name, value.value, value.vtype, value.sub_type)
    elif isinstance(value, bool):
        writer.add_bool(name, value)
    elif isinstance(value, int):
        if 0 <= value < 2**32:
            writer.add_uint32(name, value)
        else:
            writer.add_uint64(name, value) if value >= 0 else writer.add_int64(name, value)
    elif isinstance(value, float):
        writer.add_float32(name, value)
    elif isinstance(value, str):
        writer.add_string(name, value)
    elif isinstance(value, (list, tuple)):
        writer.add_array(name, list(value))
    else:
        raise TypeError(f"no GGUF type for {name}={value!r}")


def write_model(path: str | Path, arch: str, metadata: Mapping[str, Any], tensors: Sequence[Tensor],
                *, shards: int = 1, alignment: int | None = None) -> list[Path]:
    """Write a GGUF (or `shards` gguf-split files) whose tensor data is a sparse hole.

    Metadata keys may be gguf.Keys templates ('{arch}.block_count'). With `shards` > 1 the files
    are named NAME-0000i-of-0000N.gguf next to `path`; the first holds all metadata, every shard
    holds split.no / split.count / split.tensors.count, as gguf-split writes them.
    Returns the written paths, first shard first.
    """
    per_shard = -(-len(tensors) // shards) if shards > 1 else 0
    writer = GGUFWriter(Path(path), arch, split_max_tensors=per_shard)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for name, value in metadata.items():
        add_value(writer, key(name, arch), value)
    for name, qtype, shape in tensors:
        # numpy order for the writer (it reverses dims); a non-uint8 dtype keeps the shape as given
        writer.add_tensor_info(name, tuple(reversed(shape)), np.dtype(np.float32),
                               _padded_nbytes(qtype, shape, writer.data_alignment), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    assert writer.fout is not None and writer.path is not None
    paths = writer.format_shard_names(writer.path)
    for fout, shard_tensors in zip(writer.fout, writer.tensors, strict=True):
        fout.flush()
        data_start = -(-fout.tell() // writer.data_alignment) * writer.data_alignment
        fout.truncate(data_start + sum(ti.nbytes for ti in shard_tensors.values()))
    writer.close()
    return paths


# --- architecture layouts (llama.cpp load_arch_tensors at the pinned build) -------------------

def _common(spec: ModelSpec, n_layer: int, n_embd: int, n_vocab: int, n_ctx: int = 4096) -> None:
    spec.metadata.update({
        Keys.LLM.BLOCK_COUNT: n_layer, Keys.LLM.EMBEDDING_LENGTH: n_embd,
        Keys.LLM.CONTEXT_LENGTH: n_ctx, Keys.LLM.VOCAB_SIZE: n_vocab,
        Keys.Attention.LAYERNORM_RMS_EPS: 1e-6, Keys.General.FILE_TYPE: 15,
    })


def _embeddings(spec: ModelSpec, n_embd: int, n_vocab: int, embd_type: Q, out_type: Q | None) -> None:
    spec.add(T.TOKEN_EMBD, embd_type, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    if out_type is not None:  # None: tied embeddings, llama.cpp reuses token_embd
        spec.add(T.OUTPUT, out_type, (n_embd, n_vocab))


def llama_spec(*, n_layer: int = 2, n_embd: int = 256, n_head: int = 8, n_head_kv: int | Sequence[int] = 2,
               n_ff: int = 512, n_vocab: int = 1000, attn_type: Q = Q.Q4_K, v_type: Q = Q.Q8_0,
               ffn_type: Q = Q.Q4_K, down_type: Q = Q.Q6_K, embd_type: Q = Q.Q8_0, out_type: Q | None = Q.Q6_K,
               arch: str = "llama") -> ModelSpec:
    """llama (src/models/llama.cpp): GQA attention, SwiGLU FFN; head_dim = n_embd / n_head."""
    spec = ModelSpec(arch)
    _common(spec, n_layer, n_embd, n_vocab)
    kv = [n_head_kv] * n_layer if isinstance(n_head_kv, int) else list(n_head_kv)
    spec.metadata.update({Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
                          Keys.Attention.HEAD_COUNT_KV: n_head_kv if isinstance(n_head_kv, int) else kv})
    hd = n_embd // n_head
    _embeddings(spec, n_embd, n_vocab, embd_type, out_type)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_Q, attn_type, (n_embd, hd * n_head), i)
        spec.add(T.ATTN_K, attn_type, (n_embd, hd * kv[i]), i)
        spec.add(T.ATTN_V, v_type, (n_embd, hd * kv[i]), i)
        spec.add(T.ATTN_OUT, attn_type, (hd * n_head, n_embd), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE, ffn_type, (n_embd, n_ff), i)
        spec.add(T.FFN_UP, ffn_type, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
    return spec


def qwen3moe_spec(*, n_layer: int = 2, n_embd: int = 256, n_head: int = 8, n_head_kv: int = 2,
                  head_dim: int = 64, n_expert: int = 8, n_expert_used: int = 2, n_ff_exp: int = 128,
                  n_vocab: int = 1000) -> ModelSpec:
    """qwen3moe (src/models/qwen3moe.cpp): decoupled head_dim (key_length), routed experts only."""
    spec = ModelSpec("qwen3moe")
    _common(spec, n_layer, n_embd, n_vocab)
    spec.metadata.update({
        Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff_exp * n_expert_used, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
    })
    _embeddings(spec, n_embd, n_vocab, Q.Q8_0, Q.Q6_K)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_Q, Q.Q4_K, (n_embd, head_dim * n_head), i)
        spec.add(T.ATTN_K, Q.Q4_K, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_V, Q.Q6_K, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_OUT, Q.Q4_K, (head_dim * n_head, n_embd), i)
        spec.add(T.ATTN_K_NORM, Q.F32, (head_dim,), i)
        spec.add(T.ATTN_Q_NORM, Q.F32, (head_dim,), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_GATE_EXP, Q.Q4_K, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_DOWN_EXP, Q.Q8_0, (n_ff_exp, n_embd, n_expert), i)
        spec.add(T.FFN_UP_EXP, Q.Q4_K, (n_embd, n_ff_exp, n_expert), i)
    return spec


def gemma3_spec(*, n_layer: int = 7, n_embd: int = 128, n_head: int = 4, n_head_kv: int = 1,
                head_dim: int = 64, n_ff: int = 256, n_vocab: int = 512, window: int | None = 128,
                swa_pattern: int | Sequence[bool] | None = None) -> ModelSpec:
    """gemma3 (src/models/gemma3.cpp): pre/post norms, tied embeddings, SWA when a window is set."""
    spec = ModelSpec("gemma3")
    _common(spec, n_layer, n_embd, n_vocab)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: n_head_kv, Keys.Attention.KEY_LENGTH: head_dim,
        Keys.Attention.VALUE_LENGTH: head_dim,
    })
    if window is not None:
        spec.metadata[Keys.Attention.SLIDING_WINDOW] = window
    if swa_pattern is not None:
        spec.metadata[Keys.Attention.SLIDING_WINDOW_PATTERN] = (
            swa_pattern if isinstance(swa_pattern, int) else [bool(x) for x in swa_pattern])
    _embeddings(spec, n_embd, n_vocab, Q.Q8_0, None)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_Q, Q.Q8_0, (n_embd, head_dim * n_head), i)
        spec.add(T.ATTN_K, Q.Q8_0, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_V, Q.Q8_0, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_OUT, Q.Q8_0, (head_dim * n_head, n_embd), i)
        spec.add(T.ATTN_POST_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_K_NORM, Q.F32, (head_dim,), i)
        spec.add(T.ATTN_Q_NORM, Q.F32, (head_dim,), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE, Q.Q8_0, (n_embd, n_ff), i)
        spec.add(T.FFN_UP, Q.Q8_0, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, Q.Q8_0, (n_ff, n_embd), i)
        spec.add(T.FFN_POST_NORM, Q.F32, (n_embd,), i)
    return spec


def qwen_spec(arch: str, *, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_vocab: int,
              qkv_bias: bool = False, qk_norm: bool = False) -> ModelSpec:
    """qwen2 (Q/K/V biases, src/models/qwen2.cpp) or qwen3 (per-head Q/K norms, src/models/qwen3.cpp):
    llama's layout plus those tensors; head_dim = n_embd / n_head, Q4_K_M-like types."""
    spec = llama_spec(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                      n_vocab=n_vocab, v_type=Q.Q6_K, embd_type=Q.Q4_K, arch=arch)
    hd = n_embd // n_head
    spec.metadata.update({Keys.Attention.KEY_LENGTH: hd, Keys.Attention.VALUE_LENGTH: hd})
    for i in range(n_layer):
        if qkv_bias:
            spec.add(T.ATTN_Q, Q.F32, (hd * n_head,), i, "bias")
            spec.add(T.ATTN_K, Q.F32, (hd * n_head_kv,), i, "bias")
            spec.add(T.ATTN_V, Q.F32, (hd * n_head_kv,), i, "bias")
        if qk_norm:
            spec.add(T.ATTN_K_NORM, Q.F32, (hd,), i)
            spec.add(T.ATTN_Q_NORM, Q.F32, (hd,), i)
    return spec


def gemma2_spec(*, n_layer: int = 4, n_embd: int = 128, n_head: int = 4, n_head_kv: int = 2, head_dim: int = 64,
                n_ff: int = 256, n_vocab: int = 512, window: int = 4096, attn_softcap: float = 50.0,
                final_softcap: float = 30.0, wtype: Q = Q.Q8_0) -> ModelSpec:
    """gemma2 (src/models/gemma2.cpp): gemma3's layout without the Q/K norms, tied embeddings, SWA
    on every other layer (the pattern is the architecture's), attention and final logit soft-capping."""
    spec = ModelSpec("gemma2")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx=8192)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: n_head_kv, Keys.Attention.KEY_LENGTH: head_dim,
        Keys.Attention.VALUE_LENGTH: head_dim, Keys.Attention.SLIDING_WINDOW: window,
        Keys.LLM.ATTN_LOGIT_SOFTCAPPING: attn_softcap, Keys.LLM.FINAL_LOGIT_SOFTCAPPING: final_softcap,
    })
    _embeddings(spec, n_embd, n_vocab, wtype, None)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_Q, wtype, (n_embd, head_dim * n_head), i)
        spec.add(T.ATTN_K, wtype, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_V, wtype, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_OUT, wtype, (head_dim * n_head, n_embd), i)
        spec.add(T.ATTN_POST_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE, wtype, (n_embd, n_ff), i)
        spec.add(T.FFN_UP, wtype, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, wtype, (n_ff, n_embd), i)
        spec.add(T.FFN_POST_NORM, Q.F32, (n_embd,), i)
    return spec


def gptoss_spec(*, n_layer: int = 4, n_embd: int = 128, n_head: int = 8, n_head_kv: int = 2, head_dim: int = 32,
                n_expert: int = 4, n_expert_used: int = 2, n_ff_exp: int = 128, n_vocab: int = 512,
                window: int = 128, wtype: Q = Q.Q8_0, exp_type: Q = Q.MXFP4) -> ModelSpec:
    """gpt-oss (src/models/openai-moe.cpp): attention sinks and an output bias per layer, SWA on every
    other layer, routed experts with biases (and their router's), an untied output."""
    spec = ModelSpec("gpt-oss")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx=131072)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff_exp, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
        Keys.Attention.SLIDING_WINDOW: window, Keys.LLM.EXPERT_COUNT: n_expert,
        Keys.LLM.EXPERT_USED_COUNT: n_expert_used, Keys.Attention.LAYERNORM_RMS_EPS: 1e-5,
    })
    _embeddings(spec, n_embd, n_vocab, wtype, wtype)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_POST_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_Q, wtype, (n_embd, head_dim * n_head), i)
        spec.add(T.ATTN_Q, Q.F32, (head_dim * n_head,), i, "bias")
        spec.add(T.ATTN_K, wtype, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_K, Q.F32, (head_dim * n_head_kv,), i, "bias")
        spec.add(T.ATTN_V, wtype, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_V, Q.F32, (head_dim * n_head_kv,), i, "bias")
        spec.add(T.ATTN_OUT, wtype, (head_dim * n_head, n_embd), i)
        spec.add(T.ATTN_OUT, Q.F32, (n_embd,), i, "bias")
        spec.add(T.ATTN_SINKS, Q.F32, (n_head,), i)
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_GATE_INP, Q.F32, (n_expert,), i, "bias")
        spec.add(T.FFN_GATE_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_GATE_EXP, Q.F32, (n_ff_exp, n_expert), i, "bias")
        spec.add(T.FFN_DOWN_EXP, exp_type, (n_ff_exp, n_embd, n_expert), i)
        spec.add(T.FFN_DOWN_EXP, Q.F32, (n_embd, n_expert), i, "bias")
        spec.add(T.FFN_UP_EXP, exp_type, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_UP_EXP, Q.F32, (n_ff_exp, n_expert), i, "bias")
    return spec


def deepseek2_spec(*, n_layer: int = 3, n_dense_lead: int = 1, n_embd: int = 256, n_head: int = 4,
                   q_lora_rank: int = 128, kv_lora_rank: int = 128, qk_nope: int = 64, qk_rope: int = 32,
                   v_head_dim: int = 64, n_ff: int = 512, n_expert: int = 4, n_expert_used: int = 2,
                   n_expert_shared: int = 1, n_ff_exp: int = 64, n_vocab: int = 1000) -> ModelSpec:
    """deepseek2 with MLA (src/models/deepseek2.cpp; keys as conversion/deepseek.py writes them:
    one KV head whose K is the compressed latent plus the rope part, V the latent)."""
    spec = ModelSpec("deepseek2")
    _common(spec, n_layer, n_embd, n_vocab)
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: 1,
        Keys.LLM.LEADING_DENSE_BLOCK_COUNT: n_dense_lead, Keys.Attention.Q_LORA_RANK: q_lora_rank,
        Keys.Attention.KV_LORA_RANK: kv_lora_rank,
        Keys.Attention.KEY_LENGTH: kv_lora_rank + qk_rope, Keys.Attention.VALUE_LENGTH: kv_lora_rank,
        Keys.Attention.KEY_LENGTH_MLA: qk_nope + qk_rope, Keys.Attention.VALUE_LENGTH_MLA: v_head_dim,
        Keys.Rope.DIMENSION_COUNT: qk_rope, Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        Keys.LLM.EXPERT_SHARED_COUNT: n_expert_shared,
    })
    _embeddings(spec, n_embd, n_vocab, Q.Q8_0, Q.Q8_0)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_Q_A_NORM, Q.F32, (q_lora_rank,), i)
        spec.add(T.ATTN_KV_A_NORM, Q.F32, (kv_lora_rank,), i)
        spec.add(T.ATTN_Q_A, Q.Q8_0, (n_embd, q_lora_rank), i)
        spec.add(T.ATTN_Q_B, Q.Q8_0, (q_lora_rank, n_head * (qk_nope + qk_rope)), i)
        spec.add(T.ATTN_KV_A_MQA, Q.Q8_0, (n_embd, kv_lora_rank + qk_rope), i)
        spec.add(T.ATTN_K_B, Q.F16, (qk_nope, kv_lora_rank, n_head), i)
        spec.add(T.ATTN_V_B, Q.F16, (kv_lora_rank, v_head_dim, n_head), i)
        spec.add(T.ATTN_OUT, Q.Q8_0, (n_head * v_head_dim, n_embd), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        if i < n_dense_lead:
            spec.add(T.FFN_GATE, Q.Q8_0, (n_embd, n_ff), i)
            spec.add(T.FFN_DOWN, Q.Q8_0, (n_ff, n_embd), i)
            spec.add(T.FFN_UP, Q.Q8_0, (n_embd, n_ff), i)
            continue
        spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
        spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n_expert,), i, "bias")
        spec.add(T.FFN_DOWN_EXP, Q.Q8_0, (n_ff_exp, n_embd, n_expert), i)
        spec.add(T.FFN_GATE_EXP, Q.Q8_0, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_UP_EXP, Q.Q8_0, (n_embd, n_ff_exp, n_expert), i)
        spec.add(T.FFN_GATE_SHEXP, Q.Q8_0, (n_embd, n_ff_exp * n_expert_shared), i)
        spec.add(T.FFN_DOWN_SHEXP, Q.Q8_0, (n_ff_exp * n_expert_shared, n_embd), i)
        spec.add(T.FFN_UP_SHEXP, Q.Q8_0, (n_embd, n_ff_exp * n_expert_shared), i)
    return spec


def _mamba2_mixer(spec: ModelSpec, i: int, n_embd: int, d_conv: int, d_inner: int, d_state: int,
                  n_group: int, n_ssm_head: int, in_type: Q) -> None:
    """The Mamba-2 mixer of mamba2.cpp / granite-hybrid.cpp (conv over x, B and C)."""
    conv_dim = d_inner + 2 * n_group * d_state
    spec.add(T.SSM_IN, in_type, (n_embd, d_inner + conv_dim + n_ssm_head), i)
    spec.add(T.SSM_CONV1D, Q.F32, (d_conv, conv_dim), i)
    spec.add(T.SSM_CONV1D, Q.F32, (conv_dim,), i, "bias")
    spec.add(T.SSM_DT, Q.F32, (n_ssm_head,), i, "bias")
    spec.add(T.SSM_A, Q.F32, (1, n_ssm_head), i, None)
    spec.add(T.SSM_D, Q.F32, (1, n_ssm_head), i, None)
    spec.add(T.SSM_NORM, Q.F32, (d_inner // n_group, n_group), i)
    spec.add(T.SSM_OUT, in_type, (d_inner, n_embd), i)


def _ssm_keys(spec: ModelSpec, d_conv: int, d_inner: int, d_state: int, n_group: int, n_ssm_head: int) -> None:
    spec.metadata.update({
        Keys.SSM.CONV_KERNEL: d_conv, Keys.SSM.INNER_SIZE: d_inner, Keys.SSM.STATE_SIZE: d_state,
        Keys.SSM.TIME_STEP_RANK: n_ssm_head, Keys.SSM.GROUP_COUNT: n_group,
    })


def mamba2_spec(*, n_layer: int = 2, n_embd: int = 128, d_conv: int = 4, d_inner: int = 256,
                d_state: int = 16, n_group: int = 2, n_ssm_head: int = 8, n_vocab: int = 512) -> ModelSpec:
    """mamba2 (src/models/mamba2.cpp; conversion/mamba.py writes head_count 0 and n_ff 0)."""
    spec = ModelSpec("mamba2")
    _common(spec, n_layer, n_embd, n_vocab, n_ctx=2**20)
    spec.metadata.update({Keys.LLM.FEED_FORWARD_LENGTH: 0, Keys.Attention.HEAD_COUNT: 0})
    _ssm_keys(spec, d_conv, d_inner, d_state, n_group, n_ssm_head)
    _embeddings(spec, n_embd, n_vocab, Q.Q8_0, None)
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        _mamba2_mixer(spec, i, n_embd, d_conv, d_inner, d_state, n_group, n_ssm_head, Q.Q8_0)
    return spec


def granitehybrid_spec(*, n_embd: int = 128, n_head: int = 4, head_count_kv: Sequence[int] = (0, 0, 2, 0),
                       n_ff: int = 256, d_conv: int = 4, d_state: int = 16, n_group: int = 1,
                       n_ssm_head: int = 8, n_vocab: int = 512) -> ModelSpec:
    """granitehybrid (src/models/granite-hybrid.cpp): a layer is Mamba-2 where its head_count_kv is 0,
    attention otherwise; every layer has a dense SwiGLU FFN; d_inner = 2 * n_embd."""
    n_layer, d_inner = len(head_count_kv), 2 * n_embd
    spec = ModelSpec("granitehybrid")
    _common(spec, n_layer, n_embd, n_vocab)
    spec.metadata.update({Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
                          Keys.Attention.HEAD_COUNT_KV: Typed(list(head_count_kv), GGUFValueType.ARRAY,
                                                              GGUFValueType.UINT32)})
    _ssm_keys(spec, d_conv, d_inner, d_state, n_group, n_ssm_head)
    hd = n_embd // n_head
    _embeddings(spec, n_embd, n_vocab, Q.Q8_0, None)
    for i, kv in enumerate(head_count_kv):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        if kv == 0:
            _mamba2_mixer(spec, i, n_embd, d_conv, d_inner, d_state, n_group, n_ssm_head, Q.Q8_0)
        else:
            spec.add(T.ATTN_Q, Q.Q8_0, (n_embd, hd * n_head), i)
            spec.add(T.ATTN_K, Q.Q8_0, (n_embd, hd * kv), i)
            spec.add(T.ATTN_V, Q.Q8_0, (n_embd, hd * kv), i)
            spec.add(T.ATTN_OUT, Q.Q8_0, (hd * n_head, n_embd), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE, Q.Q8_0, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, Q.Q8_0, (n_ff, n_embd), i)
        spec.add(T.FFN_UP, Q.Q8_0, (n_embd, n_ff), i)
    return spec


def lfm2_spec(*, n_embd: int = 128, n_head: int = 4, head_count_kv: Sequence[int] = (0, 0, 2, 0),
              n_ff: int = 256, l_cache: int = 3, n_vocab: int = 512, attn_type: Q = Q.Q8_0, v_type: Q = Q.Q8_0,
              ffn_type: Q = Q.Q8_0, down_type: Q = Q.Q8_0, embd_type: Q = Q.Q8_0) -> ModelSpec:
    """lfm2 (src/models/lfm2.cpp): a layer is a short convolution where its head_count_kv is 0 (in_proj
    to B, C and x, a depthwise conv of l_cache taps, out_proj), attention with per-head Q/K norms
    otherwise; a dense SwiGLU FFN in every layer; the output norm is named token_embd_norm and the
    output matrix is token_embd's (tied)."""
    n_layer, hd = len(head_count_kv), n_embd // n_head
    spec = ModelSpec("lfm2")
    _common(spec, n_layer, n_embd, n_vocab)
    spec.metadata.update({Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
                          Keys.Attention.HEAD_COUNT_KV: Typed(list(head_count_kv), GGUFValueType.ARRAY,
                                                              GGUFValueType.UINT32),
                          Keys.ShortConv.L_CACHE: l_cache, Keys.Attention.LAYERNORM_RMS_EPS: 1e-5})
    spec.add(T.TOKEN_EMBD, embd_type, (n_embd, n_vocab))
    spec.add(T.TOKEN_EMBD_NORM, Q.F32, (n_embd,))
    for i, kv in enumerate(head_count_kv):   # load_arch_tensors' order
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.FFN_GATE, ffn_type, (n_embd, n_ff), i)
        spec.add(T.FFN_DOWN, down_type, (n_ff, n_embd), i)
        spec.add(T.FFN_UP, ffn_type, (n_embd, n_ff), i)
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        if kv == 0:
            spec.add(T.SHORTCONV_CONV, Q.F32, (l_cache, n_embd), i)
            spec.add(T.SHORTCONV_INPROJ, attn_type, (n_embd, 3 * n_embd), i)
            spec.add(T.SHORTCONV_OUTPROJ, attn_type, (n_embd, n_embd), i)
            continue
        spec.add(T.ATTN_Q_NORM, Q.F32, (hd,), i)
        spec.add(T.ATTN_K_NORM, Q.F32, (hd,), i)
        spec.add(T.ATTN_Q, attn_type, (n_embd, hd * n_head), i)
        spec.add(T.ATTN_K, attn_type, (n_embd, hd * kv), i)
        spec.add(T.ATTN_V, v_type, (n_embd, hd * kv), i)
        spec.add(T.ATTN_OUT, attn_type, (hd * n_head, n_embd), i)
    return spec


def add_tokenizer(spec: ModelSpec, n_vocab: int, n_merges: int = 0) -> None:
    """A real-size BPE tokenizer block: tokens, scores, token types and merges (as llama 3 ships)."""
    spec.metadata.update({
        Keys.Tokenizer.MODEL: "gpt2",
        Keys.Tokenizer.LIST: [f"tok{i:06d}" for i in range(n_vocab)],
        Keys.Tokenizer.TOKEN_TYPE: Typed([1] * n_vocab, GGUFValueType.ARRAY, GGUFValueType.INT32),
    })
    if n_merges:
        spec.metadata[Keys.Tokenizer.MERGES] = [f"m{i} x{i}" for i in range(n_merges)]


def deepseek2_lite_layout(spec: ModelSpec, n_embd: int, n_head: int, head_k: int) -> ModelSpec:
    """DeepSeek-V2-Lite's layout of a deepseek2_spec: a plain attn_q instead of q_a / q_b and no
    q_lora_rank key (llama.cpp reads a 26- or 27-layer deepseek2 without it as lite)."""
    spec.metadata.pop(Keys.Attention.Q_LORA_RANK)
    tensors = []
    for name, qtype, shape in spec.tensors:
        if ".attn_q_a" in name:
            continue
        if name.endswith(".attn_q_b.weight"):
            name, shape = name.replace("attn_q_b", "attn_q"), (n_embd, n_head * head_k)
        tensors.append((name, qtype, shape))
    spec.tensors = tensors
    return spec
