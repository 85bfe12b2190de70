"""The MLA / DSA family against the pinned llama-fit-params (issue 40's peer matrix, tests/support/arch_matrix.py):
one shape-faithful file per architecture (planner/synth/shapes_mla.py), every row with model and context equal
to the MiB and the simulated compute within 3 % or 4 MiB, never more than 1 MiB below.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.checking.llama import fit_print
from planner.core.units import MiB
from planner.llama.context import model_context
from planner.memory.estimate import CPU_REPACK, estimate
from planner.synth.shapes_mla import deepseek_v32, glm_5, mistral_small_4
from tests.support.arch_matrix import ArchShape, arch_rows, check_row, expand

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {
    "mistral-small-4": ArchShape("mistral-small-4", mistral_small_4, n_layer=36, moe=True),
}
# DSA models whose KV (the MLA cache and the indexer key cache) is exact while the compute stays on the
# formula (no graph builder yet): their rows check the model and context columns only.
DSA_KV_SHAPES: dict[str, ArchShape] = {
    "deepseek-v3.2": ArchShape("deepseek-v3.2", deepseek_v32, n_layer=61, moe=True),
    "glm-5": ArchShape("glm-5", glm_5, n_layer=78, moe=True),
}


@pytest.fixture(scope="module")
def written(shapes_dir: Path) -> dict[str, Path]:
    out = {}
    for name, shape in {**SHAPES, **DSA_KV_SHAPES}.items():
        [out[name]] = shape.spec().write(shapes_dir / f"{name}.gguf")
    return out


@pytest.mark.parametrize("name, template", arch_rows(SHAPES))
def test_mla_arch_matches_llama_fit_params(name: str, template: str, written: dict[str, Path], llama_tools: Path,
                                           rpc_three: list[str]) -> None:
    path = written[name]
    check_row(llama_tools, path, model_context(str(path)), SHAPES[name], template, rpc_three)


@pytest.mark.parametrize("name, template", arch_rows(DSA_KV_SHAPES))
def test_dsa_cache_matches_llama_fit_params(name: str, template: str, written: dict[str, Path], llama_tools: Path,
                                            rpc_three: list[str]) -> None:
    """Model and context equal to the MiB on every row (llama_kv_cache_dsa: the K-only MLA cache plus the
    indexer's key cache); the compute column is the formula's until a DSA graph builder exists."""
    path = written[name]
    argv = expand(template, DSA_KV_SHAPES[name], rpc_three)
    theirs = fit_print(llama_tools, path, argv)
    est = estimate(model_context(str(path)), argv)
    assert est.compute_model == "formula"
    ours = {d.name: (d.model_bytes // MiB, d.context_bytes // MiB) for d in est.devices if d.name != CPU_REPACK}
    assert ours == {device: (model, context) for device, (model, context, _) in theirs.items()}
