"""gemma-embedding (runtime/engine/gemma_embedding.py) on a tiny file: no cache at all, and the graph against
the pinned llama.cpp's figures on the very same file (llama-fit-params -v: "graph: nodes = N", "CPU compute
buffer size = X MiB"; it prints no llama_kv_cache line: create_memory gives this architecture none)."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.llama.context import model_context
from planner.memory.estimate import estimate
from planner.synth.shapes_gemma4 import gemma_embedding_spec
from tests.support.reserve_checks import assert_reserve_equals


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """Seven blocks (sliding but the sixth), 4 heads / 1 KV of 64, window 64."""
    spec = gemma_embedding_spec(n_layer=7, n_embd=128, n_head=4, n_head_kv=1, head_dim=64, n_ff=256, n_vocab=512,
                                window=64, n_ctx=4096)
    [path] = spec.write(tmp_path_factory.mktemp("gemma-embedding") / "tiny.gguf")
    return path


def test_no_layer_owns_a_cache(model: Path) -> None:
    assert not any(lf.has_kv for lf in model_context(str(model)).facts.layers)
    est = estimate(str(model), ["-c", "4096"])
    assert [d.context_bytes for d in est.devices] == [0] * len(est.devices)
    assert est.compute_model == "simulated"


LLAMA_CPP_RESERVE = {
    "-c 4096": (258, 3.26),
    "-c 4096 -fa off": (279, 7.76),
    "-c 2048 -np 2": (258, 3.26),
    "-c 1024 -ub 128": (258, 0.63),
}


@pytest.mark.parametrize("flags", list(LLAMA_CPP_RESERVE))
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(model: Path, flags: str) -> None:
    assert_reserve_equals(model, flags, *LLAMA_CPP_RESERVE[flags])
