"""GLM-4.5-Air's next-token-prediction block against the pinned llama-fit-params (`--fit-print on`).

A shape-faithful sparse glm4moe file (tests/support/glm4moe_factory.py: GLM-4.5-Air's widths, heads,
vocabulary and tensor types, fewer blocks and experts, one MTP block after the trunk as the real file
has). llama.cpp logs "model has unused tensor blk.N... -- ignoring" for the MTP block and allocates
nothing for it; the model and context rows must equal its figures to the MiB on the host and over two
loopback rpc-servers, with full and partial offload. glm4moe has no graph builder, so its compute
column is the formula's and is not compared here.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from planner.llama.context import ModelContext, model_context
from planner.llama.placement import CPU_REPACK
from planner.memory.estimate import estimate
from tests.support.glm4moe_factory import glm45_air_like
from tests.support.shapes import fit_print

pytestmark = pytest.mark.peer

MIB = 2**20
N_LAYER = 4   # trunk blocks; block 4 is the MTP block, block 5 the output layer
FLAGS = (
    "-c 4096",
    "-c 4096 -ngl 3",
    "{rpc} -c 4096 -ts 1,1",
    "{rpc} -c 4096 -ts 3,1",
    "{rpc} -c 4096 -ts 1,1 -ngl 3",
    "{rpc} -c 4096 -ts 1,1 -ctk q8_0 -ctv q8_0",
)


@pytest.fixture(scope="module")
def glm(shapes_dir: Path) -> tuple[Path, ModelContext]:
    path = shapes_dir / "glm45-air-like.gguf"
    glm45_air_like(n_layer=N_LAYER).write(path)
    return path, model_context(str(path))


def test_llama_cpp_ignores_the_mtp_block(llama_tools, glm):
    """Every tensor of block N_LAYER, and no other, is logged as unused (a debug line: -v)."""
    path, ctx = glm
    run = subprocess.run([str(llama_tools / "llama-fit-params"), "-m", str(path), "--fit-print", "on", "-c", "4096",
                          "-v"], capture_output=True, text=True, timeout=300, check=True)
    ignored = {m.group(1) for m in re.finditer(r"model has unused tensor (\S+) \(size", run.stdout + run.stderr)}
    assert ignored == {t.name for t in ctx.model.tensors if t.name.startswith(f"blk.{N_LAYER}.")}


@pytest.mark.parametrize("template", FLAGS)
def test_model_rows_equal_fit_print(llama_tools, rpc_endpoints, glm, template):
    path, ctx = glm
    argv = template.replace("{rpc}", "--rpc " + ",".join(rpc_endpoints)).split()
    theirs = fit_print(llama_tools, path, argv)
    ours = {d.name: d for d in estimate(ctx, argv).devices if d.name != CPU_REPACK}
    assert list(ours) == list(theirs)
    for device, (model_mib, context_mib, _compute) in theirs.items():
        mine = ours[device]
        assert (mine.model_bytes // MIB, mine.context_bytes // MIB) == (model_mib, context_mib), device
