"""qwen3vlmoe, granitemoe, cohere2moe and bailingmoe2 against the pinned llama-fit-params (`--fit-print on`): one
shape-faithful sparse file per architecture (planner/synth/shapes_moe3.py, real models' published shapes),
every row of tests/support/arch_matrix.py (host only, two and three rpc-servers, partial offload, -fa off
at 32k, q8_0 caches, -np 4, -ncmoe 8): model and context to the MiB, compute within 3 % or 4 MiB and
never more than 1 MiB below, with the compute simulated.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.synth.shapes_moe3 import (
    granite31_3b_a800m_spec,
    ling_mini_2_spec,
    north_mini_code_spec,
    qwen3vl_30b_a3b_spec,
)
from tests.support.arch_matrix import ArchShape, arch_rows, check_row, shape_file

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {s.name: s for s in (
    ArchShape("qwen3vl-30b-a3b", qwen3vl_30b_a3b_spec, 48, moe=True),
    ArchShape("granite31-3b-a800m", granite31_3b_a800m_spec, 32, moe=True),
    ArchShape("north-mini-code", north_mini_code_spec, 49, moe=True),
    ArchShape("ling-mini-2", ling_mini_2_spec, 20, moe=True),
)}


@pytest.mark.parametrize(("name", "template"), arch_rows(SHAPES))
def test_row_equals_fit_print(llama_tools: Path, rpc_three: list[str], shapes_dir: Path, shape_files: dict,
                              name: str, template: str) -> None:
    path, ctx = shape_file(shape_files, shapes_dir, SHAPES[name])
    check_row(llama_tools, path, ctx, SHAPES[name], template, rpc_three)
