"""DeepSeek-V4 and Hy4 against the pinned llama-fit-params over issue 40's peer matrix (tests/support/arch_matrix.py),
on shape-faithful DeepSeek-V4-Flash and Hy4-preview files (planner/synth/shapes_dsv4.py).

Both are simulated (runtime/engine/deepseek4.py, runtime/engine/hy_v4.py): model and context equal to the MiB
(deepseek4's llama_kv_cache_dsv4: planner/llama/kv_dsv4.py), compute within 3 % or 4 MiB and never more than
1 MiB below, on every row.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.llama.context import model_context
from planner.synth.shapes_dsv4 import deepseek_v4_flash, hy4_preview
from tests.support.arch_matrix import ArchShape, arch_rows, check_row

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {
    "hy4-preview": ArchShape("hy4-preview", hy4_preview, n_layer=78, moe=True),
    "deepseek-v4-flash": ArchShape("deepseek-v4-flash", deepseek_v4_flash, n_layer=43, moe=True),
}


@pytest.fixture(scope="module")
def written(shapes_dir: Path) -> dict[str, Path]:
    out = {}
    for name, shape in SHAPES.items():
        [out[name]] = shape.spec().write(shapes_dir / f"{name}.gguf")
    return out


@pytest.mark.parametrize("name, template", arch_rows(SHAPES))
def test_dsv4_family_arch_matches_llama_fit_params(name: str, template: str, written: dict[str, Path],
                                                   llama_tools: Path, rpc_three: list[str]) -> None:
    path = written[name]
    check_row(llama_tools, path, model_context(str(path)), SHAPES[name], template, rpc_three)
