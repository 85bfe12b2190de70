"""minimax-m3 and glm5-next against the pinned llama-fit-params (`--fit-print on`): one shape-faithful file each
(planner/synth/shapes_glm5.py, the published config.json's shapes: MiniMax-M3, GLM-5.3-Flash), every row of
tests/support/arch_matrix.py (host only, two and three rpc-servers, partial offload, -fa off at 32k, q8_0 caches,
-np 4, -ncmoe 8): model and context to the MiB, compute within 3 % or 4 MiB and never more than 1 MiB below, with
the compute simulated (runtime/engine/msa.py, runtime/engine/glm5next.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.synth.shapes_glm5 import GLM53_FLASH_BLOCKS, glm5_next_spec, minimax_m3_spec
from tests.support.arch_matrix import ArchShape, arch_rows, check_row, shape_file

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {s.name: s for s in (
    ArchShape("minimax-m3", minimax_m3_spec, 60, moe=True),
    ArchShape("glm5-next", glm5_next_spec, GLM53_FLASH_BLOCKS, moe=True),
)}


@pytest.mark.parametrize(("name", "template"), arch_rows(SHAPES))
def test_row_equals_fit_print(llama_tools: Path, rpc_three: list[str], shapes_dir: Path, shape_files: dict,
                              name: str, template: str) -> None:
    path, ctx = shape_file(shape_files, shapes_dir, SHAPES[name])
    check_row(llama_tools, path, ctx, SHAPES[name], template, rpc_three)
