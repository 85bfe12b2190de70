"""DeepSeek-V4 and Hy4 against the pinned llama-fit-params over issue 40's peer matrix (tests/support/arch_matrix.py),
on shape-faithful DeepSeek-V4-Flash and Hy4-preview files (planner/synth/shapes_dsv4.py).

Both are simulated (runtime/engine/deepseek4.py, runtime/engine/hy_v4.py): model and context equal to the MiB
(deepseek4's llama_kv_cache_dsv4: planner/llama/kv_dsv4.py), compute within 3 % or 4 MiB and never more than
1 MiB below, on every row. deepseek4's tiny file also on lavapipe, where llama.cpp turns the fused Sinkhorn
mixer off and runs the indexer of 64-wide heads on the CPU.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.hardware.inventory import HostSpec, Inventory
from planner.hardware.vulkan_devices import LAVAPIPE, vulkan_device_spec
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.settings import resolve_settings
from planner.memory.estimate import estimate
from planner.running.tool_runs import fit_print
from planner.synth.shapes_dsv4 import deepseek4_tiny, deepseek_v4_flash, hy4_preview
from planner.system.llama_tools import VULKAN_ENV
from runtime.engine.runner import ModelRunner
from tests.support.arch_matrix import ArchShape, arch_rows, check_row
from tests.support.estimate_matrix import assert_rows_match

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


# --- lavapipe: no DSV4_HC_COMB pipeline (8-lane subgroups) and no lightning indexer for heads of 64 ------------
# llama-fit-params -v (Vulkan build, GGML_VK_VISIBLE_DEVICES=0) on deepseek4_tiny: "graph: nodes = N, splits = 6"
# (the unfused Sinkhorn mixer; the two CSA blocks' indexer scores on the CPU)
LAVAPIPE_NODES = {"-c 4096": 2225, "-c 4096 -fa off": 2245, "-c 4096 -np 4": 2234}
INVENTORY = Inventory((vulkan_device_spec(LAVAPIPE),), HostSpec(64 * 2**30, 64 * 2**30, 0, ""), source="lavapipe")


@pytest.mark.parametrize("flags", LAVAPIPE_NODES)
def test_deepseek4_tiny_on_lavapipe(lavapipe: Path, tmp_path: Path, flags: str) -> None:
    [path] = deepseek4_tiny().write(tmp_path / "deepseek4.gguf")
    argv = flags.split()
    theirs = fit_print(lavapipe, path, argv, env=dict(os.environ, **VULKAN_ENV))
    ctx = model_context(str(path))
    est = estimate(ctx, argv, INVENTORY)
    assert est.compute_model == "simulated"
    assert_rows_match(est, theirs)
    runner = ModelRunner.from_settings(resolve_settings(ctx, parse_llama_flags(argv), INVENTORY), weights=False)
    assert runner.reserve_report is not None
    assert (runner.reserve_report.n_nodes_pp, runner.reserve_report.n_splits_pp) == (LAVAPIPE_NODES[flags], 6)
