"""The peer matrix (tests/support/arch_matrix.py) on shape-faithful files of the BERT-family encoders
runtime/engine/bert.py builds and of qwen3 as an embedder and a reranker (planner/synth/shapes_embed.py): each
row's model, context (none for the encoders: these architectures have no memory) and compute against
llama-fit-params --fit-print on the same file.

The rows an encoder makes sense of: the matrix less its q8_0-cache row (there is no cache to type).
llama-fit-params accepts neither --embedding nor --pooling, so no row names them."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.llama.context import model_context
from planner.synth import shapes_embed
from tests.support.arch_matrix import ArchShape, arch_rows, check_row

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {
    "bge-large-en-v1.5": ArchShape("bge-large-en-v1.5", shapes_embed.bge_large_en_v15, 24),
    "nomic-embed-text-v1.5": ArchShape("nomic-embed-text-v1.5", shapes_embed.nomic_embed_text_v15, 12),
    "jina-embeddings-v2-base-en": ArchShape("jina-embeddings-v2-base-en", shapes_embed.jina_embeddings_v2_base_en, 12),
    "jina-embeddings-v3": ArchShape("jina-embeddings-v3", shapes_embed.jina_embeddings_v3, 24),
    "modernbert-base": ArchShape("modernbert-base", shapes_embed.modernbert_base, 22),
    # qwen3 as an embedder / reranker: qwen3's graph (no --embedding in llama-fit-params), the reranker's
    # cls.output on the output device
    "qwen3-embedding-0.6b": ArchShape("qwen3-embedding-0.6b", shapes_embed.qwen3_embedding_0p6b, 28),
    "qwen3-reranker-0.6b": ArchShape("qwen3-reranker-0.6b", shapes_embed.qwen3_reranker_0p6b, 28),
}
CACHED = frozenset({"qwen3-embedding-0.6b", "qwen3-reranker-0.6b"})   # the encoders have no cache to type
ROWS = [(name, t) for name, t in arch_rows(SHAPES) if name in CACHED or "-ctk" not in t]


@pytest.mark.parametrize(("name", "template"), ROWS)
def test_arch_row(name: str, template: str, llama_tools: Path, rpc_three: list[str], shapes_dir: Path) -> None:
    shape = SHAPES[name]
    path = shapes_dir / f"{name}.gguf"
    if not path.exists():
        shape.spec().write(path)
    check_row(llama_tools, path, model_context(str(path)), shape, template, rpc_three)
