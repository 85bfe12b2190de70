"""step35, mimo2 and hy_v3 against the pinned llama-fit-params (`--fit-print on`): one shape-faithful sparse
file per architecture (planner/synth/shapes_moe26.py, the published config.json of each model), every row of
tests/support/arch_matrix.py (host only, two and three rpc-servers, partial offload, -fa off at 32k, q8_0
caches, -np 4, -ncmoe 8): model and context to the MiB, compute within 3 % or 4 MiB and never more than 1 MiB
below, with the compute simulated.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.synth.shapes_moe26 import hy3_preview_spec, mimo_v2_flash_spec, step35_flash_spec
from tests.support.arch_matrix import ArchShape, arch_rows, check_row, shape_file

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {s.name: s for s in (
    ArchShape("hy3-preview", hy3_preview_spec, 80, moe=True),
    ArchShape("mimo-v2-flash", mimo_v2_flash_spec, 48, moe=True),
    ArchShape("step35-flash", step35_flash_spec, 45, moe=True),
)}


@pytest.mark.parametrize(("name", "template"), arch_rows(SHAPES))
def test_row_equals_fit_print(llama_tools: Path, rpc_three: list[str], shapes_dir: Path, shape_files: dict,
                              name: str, template: str) -> None:
    path, ctx = shape_file(shape_files, shapes_dir, SHAPES[name])
    check_row(llama_tools, path, ctx, SHAPES[name], template, rpc_three)
