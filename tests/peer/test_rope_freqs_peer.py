"""Llama 3.1's RoPE frequency factors against the pinned llama-fit-params (`--fit-print on`).

The Llama 3 8B shape of planner/synth/shapes_common.py with Llama 3.1's rope_freqs.weight (64 f32 factors).
llama.cpp gives every layer a copy in its own buffer type, so each layer's rope reads factors on its own
device (src/models/llama.cpp, TENSOR_DUPLICATED). With one shared copy the ropes of the devices without
it were scheduled onto the device that has it: +12 MiB of compute on RPC0 under -ngl 16 -ts 1,1 (116
against 104, issue 40's partial-offload excess); on lavapipe's Vulkan0 the estimate was 6.5 MiB below
llama.cpp's (124.5 against 131 at -ngl 8). Model, context and compute must equal llama.cpp's as in
tests/peer/test_estimate_peer.py, over two rpc-servers and on lavapipe.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from planner.hardware.inventory import HostSpec, Inventory
from planner.hardware.vulkan_devices import LAVAPIPE, vulkan_device_spec
from planner.llama.context import ModelContext, model_context
from planner.memory.estimate import estimate
from planner.running.tool_runs import fit_print
from planner.synth.gguf_factory import Q
from planner.synth.shapes_common import SHAPES
from planner.system.llama_tools import VULKAN_ENV
from tests.support.estimate_matrix import assert_rows_match

pytestmark = pytest.mark.peer

MIB = 2**20
FLAGS = (
    "-c 4096",
    "{rpc} -c 4096 -ts 1,1",
    "{rpc} -c 4096 -ngl 16 -ts 1,1",
    "{rpc} -c 4096 -ngl 8 -ts 3,1",
    "{rpc} -c 4096 -ngl 20 -ts 1,1 -fa off",
)


@pytest.fixture(scope="module")
def llama31(shapes_dir: Path) -> tuple[Path, ModelContext]:
    spec = SHAPES["llama-8b"]()
    spec.tensors.append(("rope_freqs.weight", Q.F32, (64,)))   # n_rot / 2
    path = shapes_dir / "llama31-8b.gguf"
    spec.write(path)
    return path, model_context(str(path))


@pytest.mark.parametrize("template", FLAGS)
def test_estimate_matches_fit_print(llama_tools, rpc_endpoints, llama31, template):
    path, ctx = llama31
    argv = template.replace("{rpc}", "--rpc " + ",".join(rpc_endpoints)).split()
    theirs = fit_print(llama_tools, path, argv)
    est = estimate(ctx, argv)
    assert_rows_match(est, theirs)


LAVAPIPE_INVENTORY = Inventory((vulkan_device_spec(LAVAPIPE),), HostSpec(64 * 2**30, 64 * 2**30, 0, ""),
                               source="lavapipe")


@pytest.mark.parametrize("flags", ["-c 4096 -ngl 8", "-c 4096 -ngl 4 -ub 128"])
def test_estimate_matches_fit_print_on_lavapipe(llama_vulkan_tools, llama31, flags):
    path, ctx = llama31
    theirs = fit_print(llama_vulkan_tools, path, shlex.split(flags), env=dict(os.environ, **VULKAN_ENV))
    assert "Vulkan0" in theirs, "no Vulkan0 here (scripts/test_deps.sh installs Mesa's lavapipe)"
    est = estimate(ctx, shlex.split(flags), LAVAPIPE_INVENTORY)
    assert_rows_match(est, theirs)
