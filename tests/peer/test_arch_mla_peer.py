"""The MLA / DSA family and llama4 against the pinned llama-fit-params (issue 40's peer matrix,
tests/support/arch_matrix.py): one shape-faithful file per architecture (planner/synth/shapes_mla.py), every row
with model and context equal to the MiB and the simulated compute within 3 % or 4 MiB, never more than 1 MiB
below.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.llama.context import model_context
from planner.synth.shapes_mla import deepseek_v32, glm_5, llama4_scout, mistral_small_4
from tests.support.arch_matrix import ArchShape, arch_rows, check_row

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {
    "mistral-small-4": ArchShape("mistral-small-4", mistral_small_4, n_layer=36, moe=True),
    "deepseek-v3.2": ArchShape("deepseek-v3.2", deepseek_v32, n_layer=61, moe=True),
    "glm-5": ArchShape("glm-5", glm_5, n_layer=78, moe=True),
    "llama-4-scout": ArchShape("llama-4-scout", llama4_scout, n_layer=48, moe=True),
}


@pytest.fixture(scope="module")
def written(shapes_dir: Path) -> dict[str, Path]:
    out = {}
    for name, shape in SHAPES.items():
        [out[name]] = shape.spec().write(shapes_dir / f"{name}.gguf")
    return out


@pytest.mark.parametrize("name, template", arch_rows(SHAPES))
def test_mla_arch_matches_llama_fit_params(name: str, template: str, written: dict[str, Path], llama_tools: Path,
                                           rpc_three: list[str]) -> None:
    path = written[name]
    check_row(llama_tools, path, model_context(str(path)), SHAPES[name], template, rpc_three)

