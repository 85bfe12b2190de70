"""Sparse shape-faithful models to serve over loopback HTTP (tests/support/http_server.py): the
Llama-3-70B-class file of planner/synth/shapes_common.py (whole, or in shards) and, for a 256k vocabulary,
the peer matrix's gemma2-9b shape.
"""
from __future__ import annotations

from pathlib import Path

from planner.synth import shapes_common as shapes

BIG_VOCAB = "gemma2-9b"   # 256000 tokens


def llama_70b(directory: Path, shards: int = 1) -> list[Path]:
    name = "llama-70b.gguf" if shards == 1 else "llama-70b-split.gguf"
    return shapes.llama_70b().write(directory / name, shards=shards)


def big_vocab(directory: Path) -> Path:
    return shapes.write_shape(BIG_VOCAB, directory)
