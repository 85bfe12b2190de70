"""The mixture-of-experts architectures against the pinned llama-fit-params (`--fit-print on`): one
shape-faithful sparse file per architecture (planner/synth/shapes_moe.py, real models' published shapes),
every row of tests/support/arch_matrix.py (host only, two and three rpc-servers, partial offload, -fa off
at 32k, q8_0 caches, -np 4, -ncmoe 8): model and context to the MiB, compute within 3 % or 4 MiB and
never more than 1 MiB below, with the compute simulated.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.synth.shapes_moe import (
    deepseek_moe_16b_spec,
    dots1_spec,
    ernie45_21b_a3b_spec,
    glm45_air_spec,
    hunyuan_a13b_spec,
    k_exaone_236b_spec,
    minimax_m2_spec,
    olmoe_1b_7b_spec,
    phi35_moe_spec,
    qwen15_moe_a27b_spec,
    smallthinker_4b_spec,
    trinity_mini_spec,
)
from tests.support.arch_matrix import ArchShape, arch_rows, check_row, shape_file

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {s.name: s for s in (
    ArchShape("glm45-air", glm45_air_spec, 46, moe=True),
    ArchShape("ernie45-21b-a3b", ernie45_21b_a3b_spec, 28, moe=True),
    ArchShape("qwen15-moe-a27b", qwen15_moe_a27b_spec, 24, moe=True),
    ArchShape("olmoe-1b-7b", olmoe_1b_7b_spec, 16, moe=True),
    ArchShape("minimax-m2", minimax_m2_spec, 62, moe=True),
    ArchShape("deepseek-moe-16b", deepseek_moe_16b_spec, 28, moe=True),
    ArchShape("dots1", dots1_spec, 62, moe=True),
    ArchShape("hunyuan-a13b", hunyuan_a13b_spec, 32, moe=True),
    ArchShape("k-exaone-236b", k_exaone_236b_spec, 48, moe=True),
    ArchShape("smallthinker-4b", smallthinker_4b_spec, 32, moe=True),
    ArchShape("trinity-mini", trinity_mini_spec, 32, moe=True),
    ArchShape("phi35-moe", phi35_moe_spec, 32, moe=True),
)}


@pytest.mark.parametrize(("name", "template"), arch_rows(SHAPES))
def test_row_equals_fit_print(llama_tools: Path, rpc_three: list[str], shapes_dir: Path, shape_files: dict,
                              name: str, template: str) -> None:
    path, ctx = shape_file(shape_files, shapes_dir, SHAPES[name])
    check_row(llama_tools, path, ctx, SHAPES[name], template, rpc_three)
