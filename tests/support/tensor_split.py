"""The -sm tensor accuracy matrix (tests/peer/test_tensor_split_peer.py, bench/bench_tensor_split.py).

SPLIT_MODELS: the shapes of tests/support/shapes.py with a graph builder whose architecture the pinned
llama.cpp splits by tensors (not on llm_arch_supports_sm_tensor's deny-list, and not gemma3, whose
token generation aborts; planner/llama/tensor_parallel.py).
"""
from __future__ import annotations

SPLIT_MODELS: tuple[str, ...] = ("llama-8b", "mistral-7b", "qwen2-7b", "qwen3-8b", "gemma2-9b", "gpt-oss-20b",
                                 "qwen3moe-30b-a3b", "lfm2-1.2b", "qwen3next-80b-a3b")
REFUSED_MODELS: tuple[str, ...] = ("deepseek2-mla", "granite-hybrid", "gemma3-270m")
RPC_COUNTS: tuple[int, ...] = (2, 3)
CONTEXTS: tuple[int, ...] = (4096, 32768)
