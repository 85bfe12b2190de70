"""DeepSeek-V4 and Hy4 against the pinned llama-fit-params over issue 40's peer matrix (tests/support/arch_matrix.py),
on shape-faithful DeepSeek-V4-Flash and Hy4-preview files (planner/synth/shapes_dsv4.py).

hy_v4 is simulated (runtime/engine/hy_v4.py): model and context equal to the MiB, compute within 3 % or 4 MiB and
never more than 1 MiB below, on every row. deepseek4 has no graph builder yet: its rows check model and context to
the MiB (llama_kv_cache_dsv4: planner/llama/kv_dsv4.py) and that its compute is the formula's
(planner/memory/analytic.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.checking.llama import fit_print
from planner.llama.context import model_context
from planner.llama.placement import CPU_REPACK
from planner.memory.estimate import estimate
from planner.synth.shapes_dsv4 import deepseek_v4_flash, hy4_preview
from tests.support.arch_matrix import ArchShape, arch_rows, check_row, expand

pytestmark = pytest.mark.peer

MiB = 2**20
SIMULATED: dict[str, ArchShape] = {
    "hy4-preview": ArchShape("hy4-preview", hy4_preview, n_layer=78, moe=True),
}
KV_ONLY: dict[str, ArchShape] = {
    "deepseek-v4-flash": ArchShape("deepseek-v4-flash", deepseek_v4_flash, n_layer=43, moe=True),
}
# the files with simulated compute, under the name every family matrix uses (bench_estimate_accuracy --families)
SHAPES = SIMULATED


@pytest.fixture(scope="module")
def written(shapes_dir: Path) -> dict[str, Path]:
    out = {}
    for name, shape in {**SIMULATED, **KV_ONLY}.items():
        [out[name]] = shape.spec().write(shapes_dir / f"{name}.gguf")
    return out


@pytest.mark.parametrize("name, template", arch_rows(SIMULATED))
def test_dsv4_family_arch_matches_llama_fit_params(name: str, template: str, written: dict[str, Path],
                                                   llama_tools: Path, rpc_three: list[str]) -> None:
    path = written[name]
    check_row(llama_tools, path, model_context(str(path)), SIMULATED[name], template, rpc_three)


@pytest.mark.parametrize("name, template", arch_rows(KV_ONLY))
def test_deepseek4_model_and_context_match_llama_fit_params(name: str, template: str, written: dict[str, Path],
                                                            llama_tools: Path, rpc_three: list[str]) -> None:
    path = written[name]
    argv = expand(template, KV_ONLY[name], rpc_three)
    theirs = fit_print(llama_tools, path, argv)
    est = estimate(model_context(str(path)), argv)
    assert est.compute_model == "formula"
    ours = {d.name: (d.model_bytes // MiB, d.context_bytes // MiB) for d in est.devices if d.name != CPU_REPACK}
    assert ours == {device: (model, context) for device, (model, context, _compute) in theirs.items()}
