"""The -sm tensor accuracy matrix (tests/peer/test_tensor_split_peer.py, bench/bench_tensor_split.py).

SPLIT_MODELS: the shapes of planner/synth/shapes_common.py with a graph builder whose architecture the pinned
llama.cpp splits by tensors (not on llm_arch_supports_sm_tensor's deny-list, and not gemma3, whose
token generation aborts; planner/llama/tensor_parallel.py).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from planner.synth.gguf_factory import ModelSpec, Q, gemma2_spec, gptoss_spec, llama_spec, qwen3moe_spec, qwen_spec
from planner.synth.shapes_common import tokenized

SPLIT_MODELS: tuple[str, ...] = ("llama-8b", "mistral-7b", "qwen2-7b", "qwen3-8b", "gemma2-9b", "gpt-oss-20b",
                                 "qwen3moe-30b-a3b", "lfm2-1.2b", "qwen3next-80b-a3b")
REFUSED_MODELS: tuple[str, ...] = ("deepseek2-mla", "granite-hybrid", "gemma3-270m")
RPC_COUNTS: tuple[int, ...] = (2, 3)
CONTEXTS: tuple[int, ...] = (4096, 32768)


# --- real loads (llama-cli) over rpc-servers: each member's buffers against planner/memory/tensor_members.py ---
# The published widths of planner/synth/shapes_common.py with 2-4 layers and a 32k vocabulary, so a load moves a few
# hundred MiB over loopback. (name -> spec)
def _real_load_specs() -> dict[str, Callable[[], ModelSpec]]:
    v = 32768
    return {
        "llama-8b-4l": lambda: llama_spec(n_layer=4, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=v,
                                          attn_type=Q.Q4_K, v_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K,
                                          embd_type=Q.Q4_K, out_type=Q.Q6_K),
        "qwen2-7b-2l": lambda: qwen_spec("qwen2", n_layer=2, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944,
                                         n_vocab=v, qkv_bias=True),
        "qwen3-8b-2l": lambda: qwen_spec("qwen3", n_layer=2, n_embd=4096, n_head=32, n_head_kv=8, n_ff=12288,
                                         n_vocab=v, qk_norm=True),
        "gemma2-9b-2l": lambda: gemma2_spec(n_layer=2, n_embd=3584, n_head=16, n_head_kv=8, head_dim=256,
                                            n_ff=14336, n_vocab=v, window=4096),
        "gpt-oss-20b-2l": lambda: gptoss_spec(n_layer=2, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64,
                                              n_expert=32, n_expert_used=4, n_ff_exp=2880, n_vocab=v, window=128),
        "qwen3moe-30b-2l": lambda: qwen3moe_spec(n_layer=2, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128,
                                                 n_expert=128, n_expert_used=8, n_ff_exp=768, n_vocab=v),
    }


REAL_LOAD_MODELS: tuple[str, ...] = tuple(_real_load_specs())


def write_real_load_shape(name: str, directory: Path) -> Path:
    """One real-load shape's sparse GGUF in `directory` (written once)."""
    path = directory / f"{name}.gguf"
    if not path.exists():
        spec = tokenized(_real_load_specs()[name](), 32768, 8192)
        [written] = spec.write(directory / f"{name}.partial.gguf")
        written.rename(path)
    return path
