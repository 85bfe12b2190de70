"""Shape-faithful files of the held-out models a consumer card is planned for (issue 42's 48-plan matrix),
beside the ones planner/synth/shapes_common.py has (Llama-3.1-8B, Qwen3-30B-A3B, gpt-oss-20b). Dimensions from
each model's published config.json, Q4_K_M-like types (Q4_K matrices, Q6_K attn_v / ffn_down / output);
the data is a sparse hole, so a file is a header of a real size and costs a few MiB on disk.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q, gemma3_spec, llama_spec, qwen_spec, write_once
from planner.synth.shapes_common import SHAPES, tokenized


def gemma3_27b() -> ModelSpec:
    """Gemma-3-27B (text): 62 layers, 5376 wide, 32 heads / 16 KV of 128, n_ff 21504, window 1024 (five
    local layers to one global), 262k vocab, 131072 positions."""
    spec = gemma3_spec(n_layer=62, n_embd=5376, n_head=32, n_head_kv=16, head_dim=128, n_ff=21504,
                       n_vocab=262144, window=1024)
    return tokenized(spec, 262144, 131072)


def mistral_nemo_12b() -> ModelSpec:
    """Mistral-Nemo-12B (a `llama` file): 40 layers, 5120 wide, 32 heads / 8 KV of 128 (head_dim is not
    n_embd / n_head: the file states key and value lengths), n_ff 14336, 131072 vocab, 1024000 positions."""
    spec = llama_spec(n_layer=40, n_embd=5120, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=131072,
                      attn_type=Q.Q4_K, v_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K,
                      out_type=Q.Q6_K)
    head_dim = 128
    spec.tensors = [(name, qtype, _nemo_shape(name, shape, head_dim)) for name, qtype, shape in spec.tensors]
    spec.metadata.update({Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
                          Keys.Rope.DIMENSION_COUNT: head_dim})
    spec = tokenized(spec, 131072, 1024000)
    spec.metadata[Keys.Rope.FREQ_BASE] = 1000000.0
    return spec


def _nemo_shape(name: str, shape: tuple[int, ...], head_dim: int) -> tuple[int, ...]:
    """Q is 32 x 128 = 4096 wide, not 5120: attn_q's rows and attn_output's columns follow head_dim."""
    if name.endswith("attn_q.weight"):
        return (shape[0], 32 * head_dim)
    if name.endswith(("attn_k.weight", "attn_v.weight")):
        return (shape[0], 8 * head_dim)
    if name.endswith("attn_output.weight"):
        return (32 * head_dim, shape[1])
    return shape


def qwen25_14b() -> ModelSpec:
    """Qwen2.5-14B-Instruct: 48 layers, 5120 wide, 40 heads / 8 KV of 128, n_ff 13824, Q/K/V biases,
    152k vocab, 32768 positions."""
    spec = qwen_spec("qwen2", n_layer=48, n_embd=5120, n_head=40, n_head_kv=8, n_ff=13824, n_vocab=152064,
                     qkv_bias=True)
    return tokenized(spec, 152064, 32768)


CONSUMER_SHAPES: dict[str, Callable[[], ModelSpec]] = {
    "llama-8b": SHAPES["llama-8b"],
    "qwen3moe-30b-a3b": SHAPES["qwen3moe-30b-a3b"],
    "gpt-oss-20b": SHAPES["gpt-oss-20b"],
    "gemma3-27b": gemma3_27b,
    "mistral-nemo-12b": mistral_nemo_12b,
    "qwen2.5-14b": qwen25_14b,
}


def write_consumer_shape(name: str, directory: Path) -> Path:
    """Write one of CONSUMER_SHAPES into `directory` (once) and return its path."""
    return write_once(directory, name, CONSUMER_SHAPES[name])
