"""gemma (Gemma 1) through the llama-shaped builder (hparams.ARCHS' row: scaled embeddings, Q pre-scaled, GELU FFN)
on a tiny file, against llama-fit-params -v on the very same file ("graph: nodes = N", "CPU compute buffer size")."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.memory.estimate import estimate
from planner.synth.gguf_factory import Q
from planner.synth.shapes_gemma4 import Gemma4Types, gemma_spec
from tests.support.reserve_checks import assert_reserve_equals


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """Three blocks, 128 wide, 4 heads / 2 KV of 64, n_ff 256, Q8_0."""
    ty = Gemma4Types(mat=Q.Q8_0, v=Q.Q8_0, down=Q.Q8_0, embd=Q.Q8_0)
    spec = gemma_spec(n_layer=3, n_embd=128, n_head=4, n_head_kv=2, head_dim=64, n_ff=256, n_vocab=512, n_ctx=4096,
                      ty=ty)
    [path] = spec.write(tmp_path_factory.mktemp("gemma") / "tiny.gguf")
    return path


LLAMA_CPP_RESERVE = {
    "-c 4096": (103, 6.26),
    "-c 4096 -fa off": (118, 42.26),
    "-c 4096 -np 2 -ctk q8_0 -ctv q8_0": (145, 4.29),
    "-c 1024 -ub 64": (103, 0.41),
}


@pytest.mark.parametrize("flags", list(LLAMA_CPP_RESERVE))
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(model: Path, flags: str) -> None:
    assert_reserve_equals(model, flags, *LLAMA_CPP_RESERVE[flags])


def test_estimate_simulates_gemma(model: Path) -> None:
    assert estimate(str(model), ["-c", "4096"]).compute_model == "simulated"
