"""`fitplan estimate` against llama-fit-params on a real op-offloading device (the Vulkan build on Mesa's
lavapipe, GGML_VK_VISIBLE_DEVICES=0), for the most used architectures with graph builders: shape-faithful
files of planner/synth/shapes_common.py (Llama 3.1 8B, Mistral 7B, Qwen2.5 7B, Qwen3 8B, Gemma 2 9B, gpt-oss 20B,
Qwen3-30B-A3B, DeepSeek-V2-Lite-class MLA, Qwen3-Next 80B, Granite 4.0-H, LFM2), the real Gemma 3 270M, and
twelve of the 2026 families (Mistral Small 3, Phi-4-mini, Command R7B, Qwen3.5-35B-A3B, Nemotron 3 Nano,
GLM-4.5-Air, MiniMax-M2, DeepSeek-V3.2, Llama 4 Scout, Mistral Small 4: its F32-precision down experts
run on the CPU; DeepSeek-V4-Flash, GLM-5.3-Flash; Gemma 4 and 3n are in test_arch_gemma4_peer.py).

What lavapipe exercises beyond the rpc-server rows: ggml-vulkan's graph_optimize node order
(runtime/ggml/vulkan_reorder.py), its supports_op (runtime/ggml/vulkan_ops.py: the 128 MiB largest buffer
keeps big logits, scores, output matrices and MXFP4 experts on the CPU; the MLA value projection over
several KV streams runs there too), op offload of large batches, and the host buffer type's own device
check (planner/llama/placement.py _cpu_buft). Same tolerance as every peer row: model and context to the
MiB, compute within 3 % or 4 MiB and never below llama.cpp's by more than 1 MiB.
"""
from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from planner.hardware.inventory import HostSpec, Inventory
from planner.hardware.vulkan_devices import LAVAPIPE, vulkan_device_spec
from planner.llama.context import ModelContext, model_context
from planner.memory.estimate import estimate
from planner.running.tool_runs import fit_print
from planner.synth import shapes_dense, shapes_dsv4, shapes_fused, shapes_glm5, shapes_hybrid, shapes_mla, shapes_moe
from planner.synth.gguf_factory import ModelSpec
from planner.system.llama_tools import VULKAN_ENV
from tests.support.estimate_matrix import N_LAYER, assert_rows_match, model_path

pytestmark = pytest.mark.peer

MODELS = ("gemma3-270m", "llama-8b", "mistral-7b", "qwen2-7b", "qwen3-8b", "gemma2-9b", "gpt-oss-20b",
          "qwen3moe-30b-a3b", "deepseek2-mla", "qwen3next-80b-a3b", "granite-hybrid", "lfm2-1.2b")
FLAGS = ("-c 4096", "-c 4096 -ngl {half}", "-c 4096 -fa off", "-c 4096 -ctk q8_0 -ctv q8_0", "-c 4096 -np 4",
         "-c 8192 -ub 256")
# the 2026 families (their rpc-server matrices: tests/peer/test_arch_*_peer.py): name -> (file, trunk layers)
FAMILIES: dict[str, tuple[Callable[[], ModelSpec], int]] = {
    "mistral3-24b": (shapes_dense.mistral3_24b, 40),
    "phi4-mini": (shapes_fused.phi4_mini, 32),
    "command-r7b": (shapes_fused.command_r7b, 32),
    "qwen35moe-35b-a3b": (shapes_hybrid.qwen35moe_35b_a3b_spec, 40),
    "nemotron3-nano-30b-a3b": (shapes_hybrid.nemotron3_nano_30b_a3b_spec, 52),
    "glm45-air": (shapes_moe.glm45_air_spec, 46),
    "minimax-m2": (shapes_moe.minimax_m2_spec, 62),
    "deepseek-v3.2": (shapes_mla.deepseek_v32, 61),
    "llama-4-scout": (shapes_mla.llama4_scout, 48),
    "mistral-small-4": (shapes_mla.mistral_small_4, 36),
    # dsv4, glm5n: lavapipe has no DSV4_HC_COMB pipeline (subgroups under 16 lanes): resolve_fused_ops finds the
    # mixer on the CPU and turns it off, and llama.cpp and the runtime build the plain Sinkhorn ops (DeepSeek-V4-Flash
    # at -c 4096: 24259 nodes)
    "deepseek-v4-flash": (shapes_dsv4.deepseek_v4_flash, 43),
    "glm5-next": (shapes_glm5.glm5_next_spec, shapes_glm5.GLM53_FLASH_BLOCKS),
}
# the host's RAM does not enter the estimate; llama.cpp sizes the same buffers on any host
INVENTORY = Inventory((vulkan_device_spec(LAVAPIPE),), HostSpec(64 * 2**30, 64 * 2**30, 0, ""), source="lavapipe")


@pytest.fixture(scope="module")
def contexts(shapes_dir: Path) -> dict[str, tuple[Path, ModelContext]]:
    """Each file written and read once, on first use."""
    return {}


def _context(contexts: dict[str, tuple[Path, ModelContext]], shapes_dir: Path, name: str) -> tuple[Path, ModelContext]:
    if name not in contexts:
        if name in FAMILIES:
            [path] = FAMILIES[name][0]().write(shapes_dir / f"{name}.gguf")
        else:
            path = model_path(name, shapes_dir)
        contexts[name] = (path, model_context(str(path)))
    return contexts[name]


@pytest.mark.parametrize("name", MODELS + tuple(FAMILIES))
@pytest.mark.parametrize("template", FLAGS)
def test_estimate_matches_fit_print_on_lavapipe(lavapipe: Path, shapes_dir: Path, contexts, name: str,
                                                template: str) -> None:
    path, ctx = _context(contexts, shapes_dir, name)
    n_layer = FAMILIES[name][1] if name in FAMILIES else N_LAYER[name]
    argv = shlex.split(template.replace("{half}", str(n_layer // 2)))
    theirs = fit_print(lavapipe, path, argv, env=dict(os.environ, **VULKAN_ENV))
    est = estimate(ctx, argv, INVENTORY)
    assert est.compute_model == "simulated"
    assert_rows_match(est, theirs)
