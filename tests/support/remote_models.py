"""Sparse shape-faithful models to serve over loopback HTTP (tests/support/http_server.py).

`llama_70b` is a Llama-3-70B-class file (80 layers, 8192 wide, GQA 64/8, n_ff 28672, a real-size
128k tokenizer with 280k merges): about 40 GiB of logical size, a few MiB on disk. The 256k-
vocabulary model is the peer matrix's gemma2-9b shape.
"""
from __future__ import annotations

from pathlib import Path

from planner.synth.gguf_factory import Q, add_tokenizer, llama_spec
from planner.synth.shapes import write_shape

BIG_VOCAB = "gemma2-9b"   # 256000 tokens


def llama_70b(directory: Path, shards: int = 1) -> list[Path]:
    name = "llama-70b.gguf" if shards == 1 else "llama-70b-split.gguf"
    spec = llama_spec(n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, n_ff=28672, n_vocab=128256,
                      attn_type=Q.Q4_K, v_type=Q.Q6_K, ffn_type=Q.Q4_K, down_type=Q.Q6_K, embd_type=Q.Q4_K,
                      out_type=Q.Q6_K)
    add_tokenizer(spec, 128256, n_merges=280147)
    return spec.write(directory / name, shards=shards)


def big_vocab(directory: Path) -> Path:
    return write_shape(BIG_VOCAB, directory)
