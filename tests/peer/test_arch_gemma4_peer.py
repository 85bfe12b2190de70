"""gemma4, gemma3n, gemma-embedding and gemma against the pinned llama-fit-params: the peer matrix
(tests/support/arch_matrix.py) on shape-faithful files written by planner/synth/shapes_gemma4.py: Gemma 4 E2B
(per-layer embeddings, shared KV, a double-wide MLP), Gemma 4 31B (dense, V taken from K on the full layers),
Gemma 4 26B-A4B (experts beside a dense FFN), Gemma 3n E2B (AltUp, LAuReL, shared KV), EmbeddingGemma 300M
(no cache at all) and Gemma 7B (Gemma 1); the same files on lavapipe Vulkan too."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from planner.hardware.inventory import HostSpec, Inventory
from planner.hardware.vulkan_devices import LAVAPIPE, vulkan_device_spec
from planner.llama.context import model_context
from planner.memory.estimate import estimate
from planner.running.tool_runs import fit_print
from planner.synth.shapes_gemma4 import (
    embeddinggemma_300m,
    gemma3n_e2b,
    gemma4_26b_a4b,
    gemma4_31b,
    gemma4_e2b,
    gemma_7b,
)
from planner.system.llama_tools import VULKAN_ENV
from tests.support.arch_matrix import ArchShape, arch_rows, check_row
from tests.support.estimate_matrix import assert_rows_match

pytestmark = pytest.mark.peer

SHAPES = {
    "gemma4-e2b": ArchShape("gemma4-e2b", gemma4_e2b, n_layer=35),
    "gemma4-31b": ArchShape("gemma4-31b", gemma4_31b, n_layer=60),
    "gemma4-26b-a4b": ArchShape("gemma4-26b-a4b", gemma4_26b_a4b, n_layer=30, moe=True),
    "gemma3n-e2b": ArchShape("gemma3n-e2b", gemma3n_e2b, n_layer=30),
    "embeddinggemma-300m": ArchShape("embeddinggemma-300m", embeddinggemma_300m, n_layer=24),
    "gemma-7b": ArchShape("gemma-7b", gemma_7b, n_layer=28),
}


@pytest.fixture(scope="module")
def files(shapes_dir: Path) -> dict[str, Path]:
    out = {}
    for name, shape in SHAPES.items():
        [path] = shape.spec().write(shapes_dir / f"{name}.gguf")
        out[name] = path
    return out


@pytest.mark.parametrize(("name", "template"), arch_rows(SHAPES))
def test_gemma_row_equals_llama_cpp(llama_tools: Path, rpc_three: list[str], files: dict[str, Path], name: str,
                                     template: str) -> None:
    path = files[name]
    check_row(llama_tools, path, model_context(str(path)), SHAPES[name], template, rpc_three)


# lavapipe (the Vulkan build, GGML_VK_VISIBLE_DEVICES=0): graph_optimize's node order, supports_op's size cap
# and op offload of large batches on the same files (tests/peer/test_vulkan_archs_peer.py does the same for
# planner/synth/shapes_common.py's files)
LAVAPIPE_FLAGS = ("-c 4096", "-c 4096 -ngl {half}", "-c 4096 -fa off")
LAVAPIPE_INVENTORY = Inventory((vulkan_device_spec(LAVAPIPE),), HostSpec(64 * 2**30, 64 * 2**30, 0, ""),
                               source="lavapipe")


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("template", LAVAPIPE_FLAGS)
def test_gemma_row_equals_llama_cpp_on_lavapipe(lavapipe: Path, files: dict[str, Path], name: str,
                                                template: str) -> None:
    argv = shlex.split(template.replace("{half}", str(SHAPES[name].n_layer // 2)))
    theirs = fit_print(lavapipe, files[name], argv, env=dict(os.environ, **VULKAN_ENV))
    est = estimate(model_context(str(files[name])), argv, LAVAPIPE_INVENTORY)
    assert est.compute_model == "simulated"
    assert_rows_match(est, theirs)
