"""The peer matrix (tests/support/arch_matrix.py) on shape-faithful files of the architectures
runtime/engine/fused.py builds (planner/synth/shapes_fused.py): each row's model, context and compute
against llama-fit-params --fit-print on the same file."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.llama.context import model_context
from planner.synth import shapes_fused
from tests.support.arch_matrix import ArchShape, arch_rows, check_row

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {
    "phi4-mini": ArchShape("phi4-mini", shapes_fused.phi4_mini, 32),
    "command-r-v01": ArchShape("command-r-v01", shapes_fused.command_r_v01, 40),
    "command-r7b": ArchShape("command-r7b", shapes_fused.command_r7b, 32),
    "stablelm-2-1.6b": ArchShape("stablelm-2-1.6b", shapes_fused.stablelm2_1p6b, 24),
    "stablelm-2-12b": ArchShape("stablelm-2-12b", shapes_fused.stablelm2_12b, 40),
    "starcoder2-7b": ArchShape("starcoder2-7b", shapes_fused.starcoder2_7b, 32),
    "olmo-7b-0724": ArchShape("olmo-7b-0724", shapes_fused.olmo_7b_0724, 32),
    "qwen3vl-8b": ArchShape("qwen3vl-8b", shapes_fused.qwen3vl_8b, 36),
}


@pytest.mark.parametrize(("name", "template"), arch_rows(SHAPES))
def test_arch_row(name: str, template: str, llama_tools: Path, rpc_three: list[str], shapes_dir: Path) -> None:
    shape = SHAPES[name]
    path = shapes_dir / f"{name}.gguf"
    if not path.exists():
        shape.spec().write(path)
    check_row(llama_tools, path, model_context(str(path)), shape, template, rpc_three)
