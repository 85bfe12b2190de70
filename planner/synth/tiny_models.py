"""Tiny GGUF models with real random weights, laid out as llama.cpp creates them
(src/models/{llama,qwen3,qwen3moe,gemma2,gemma3,openai-moe}.cpp at the pinned build), for runtime tests.

Shapes are ggml order in the spec (ne0 first); gguf-py's writer takes numpy order. Weights are
F32 or Q8_0 (gguf.quants quantizes Q8_0; k-quants have no quantizer in gguf-py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from planner.synth.gguf_factory import ModelSpec, add_value, key

Q = GGMLQuantizationType


@dataclass(frozen=True)
class Dims:
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_ff: int = 128
    n_vocab: int = 256
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_exp: int = 64
    window: int = 8


def random_weight(rng: np.random.Generator, name: str, shape: tuple[int, ...], qtype: Q,
                  all_f32: bool = False) -> tuple[np.ndarray, Q]:
    """Random values for one tensor (ggml shape): normal x 0.5 / sqrt(fan-in), norms near 1; stored
    as `qtype` (F32 when all_f32)."""
    values = rng.standard_normal(tuple(reversed(shape))).astype(np.float32)
    values = (1.0 + 0.1 * values if "norm" in name else values * (0.5 / np.sqrt(shape[0]))).astype(np.float32)
    qtype = Q.F32 if all_f32 else qtype
    return (values if qtype == Q.F32 else quantize(values, qtype)), qtype

def _tensors(arch: str, d: Dims) -> list[tuple[str, tuple[int, ...], Q]]:
    """(name, ggml shape, type) in llama.cpp's order."""
    out = [("token_embd.weight", (d.n_embd, d.n_vocab), Q.Q8_0), ("output_norm.weight", (d.n_embd,), Q.F32)]
    if arch not in ("gemma2", "gemma3"):
        out.append(("output.weight", (d.n_embd, d.n_vocab), Q.Q8_0))
    q, kv = d.head_dim * d.n_head, d.head_dim * d.n_head_kv
    for i in range(d.n_layer):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (d.n_embd,), Q.F32), (p + "attn_q.weight", (d.n_embd, q), Q.Q8_0),
                (p + "attn_k.weight", (d.n_embd, kv), Q.Q8_0), (p + "attn_v.weight", (d.n_embd, kv), Q.F32),
                (p + "attn_output.weight", (q, d.n_embd), Q.Q8_0), (p + "ffn_norm.weight", (d.n_embd,), Q.F32)]
        if arch == "qwen2":   # Q/K/V biases (src/models/qwen2.cpp)
            out += [(p + f"attn_{x}.bias", (n,), Q.F32) for x, n in (("q", q), ("k", kv), ("v", kv))]
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            out += [(p + "attn_q_norm.weight", (d.head_dim,), Q.F32), (p + "attn_k_norm.weight", (d.head_dim,), Q.F32)]
        if arch in ("gemma2", "gemma3"):
            out += [(p + "post_attention_norm.weight", (d.n_embd,), Q.F32),
                    (p + "post_ffw_norm.weight", (d.n_embd,), Q.F32)]
        if arch == "gpt-oss":   # sinks, biases everywhere, the FFN input normed by post_attention_norm
            e, f = d.n_expert, d.n_ff_exp
            out += [(p + f"attn_{x}.bias", (n,), Q.F32) for x, n in (("q", q), ("k", kv), ("v", kv))]
            out += [(p + "attn_output.bias", (d.n_embd,), Q.F32), (p + "attn_sinks.weight", (d.n_head,), Q.F32),
                    (p + "post_attention_norm.weight", (d.n_embd,), Q.F32),
                    (p + "ffn_gate_inp.weight", (d.n_embd, e), Q.F32), (p + "ffn_gate_inp.bias", (e,), Q.F32),
                    (p + "ffn_gate_exps.weight", (d.n_embd, f, e), Q.Q8_0), (p + "ffn_gate_exps.bias", (f, e), Q.F32),
                    (p + "ffn_up_exps.weight", (d.n_embd, f, e), Q.Q8_0), (p + "ffn_up_exps.bias", (f, e), Q.F32),
                    (p + "ffn_down_exps.weight", (f, d.n_embd, e), Q.Q8_0),
                    (p + "ffn_down_exps.bias", (d.n_embd, e), Q.F32)]
            out = [t for t in out if not t[0].startswith(p + "ffn_norm")]
            continue
        if arch == "qwen3moe":
            out += [(p + "ffn_gate_inp.weight", (d.n_embd, d.n_expert), Q.F32),
                    (p + "ffn_gate_exps.weight", (d.n_embd, d.n_ff_exp, d.n_expert), Q.Q8_0),
                    (p + "ffn_up_exps.weight", (d.n_embd, d.n_ff_exp, d.n_expert), Q.Q8_0),
                    (p + "ffn_down_exps.weight", (d.n_ff_exp, d.n_embd, d.n_expert), Q.Q8_0)]
        else:
            out += [(p + "ffn_gate.weight", (d.n_embd, d.n_ff), Q.Q8_0),
                    (p + "ffn_up.weight", (d.n_embd, d.n_ff), Q.Q8_0),
                    (p + "ffn_down.weight", (d.n_ff, d.n_embd), Q.Q8_0)]
    return out


def tensor_layout(arch: str, d: Dims = Dims()) -> list[tuple[str, tuple[int, ...], Q]]:
    return _tensors(arch, d)


def write_tiny(path: Path, arch: str, d: Dims = Dims(), seed: int = 0, all_f32: bool = False) -> Path:
    """Write the model; all_f32 stores every weight as F32 (no activation rounding in matmuls)."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, arch)
    a = arch
    w.add_uint32(f"{a}.block_count", d.n_layer)
    w.add_uint32(f"{a}.embedding_length", d.n_embd)
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.vocab_size", d.n_vocab)
    w.add_uint32(f"{a}.attention.head_count", d.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", d.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", d.head_dim)
    w.add_uint32(f"{a}.attention.value_length", d.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(f"{a}.feed_forward_length", d.n_ff)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    if arch in ("qwen3moe", "gpt-oss"):
        w.add_uint32(f"{a}.expert_count", d.n_expert)
        w.add_uint32(f"{a}.expert_used_count", d.n_expert_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", d.n_ff_exp)
    if arch in ("gemma2", "gemma3", "gpt-oss"):
        w.add_uint32(f"{a}.attention.sliding_window", d.window)
    # llama.cpp refuses a model without a vocabulary: a plain BPE token list (as gguf_factory's)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i:04d}" for i in range(d.n_vocab)])
    w.add_token_types([1] * d.n_vocab)
    w.add_token_merges(["t o"])
    _write_random_tensors(w, rng, _tensors(arch, d), all_f32)
    return path


def _write_random_tensors(w: GGUFWriter, rng: np.random.Generator,
                          tensors: list[tuple[str, tuple[int, ...], Q]], all_f32: bool) -> None:
    """Random weights for (name, ggml shape, type) in order, then the file written and closed."""
    for name, shape, qtype in tensors:
        data, qtype = random_weight(rng, name, shape, qtype, all_f32)
        w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_random(path: Path, spec: ModelSpec, all_f32: bool = False, seed: int = 0) -> Path:
    """A gguf_factory layout (its metadata and tensors) with random weights in place of the
    sparse hole: normal x 0.5 / sqrt(fan-in), norms near 1."""
    w = GGUFWriter(path, spec.arch)
    for name, value in spec.metadata.items():
        add_value(w, key(name, spec.arch), value)
    _write_random_tensors(w, np.random.default_rng(seed), [(n, shape, q) for n, q, shape in spec.tensors], all_f32)
    return path
