"""step35, mimo2 and hy_v3 (helper moe26) on tiny files (planner/synth/shapes_moe26.py): their KV facts,
the MTP-block weights the pinned llama.cpp allocates without --spec-type draft-mtp, and the reserve's node
count and CPU compute buffer against llama.cpp's.

Expected figures come from the pinned llama-fit-params on these very files (`--fit-print on` context
column; -v "graph: nodes = N" and "CPU compute buffer size = X MiB") or are derived here by hand.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.core.units import MiB
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.memory.estimate import estimate
from planner.synth.shapes_moe26 import TINY_SPECS

# llama-fit-params --fit-print on -c 4096, context column (MiB) of each tiny file
LLAMA_CPP_CONTEXT_MIB = {
    "hy_v3": 6,   # 3 trunk blocks x 4096 cells x 2 KV heads x 64 x f16 x (K + V); the MTP block has no cache
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("moe26")
    paths = {}
    for arch, spec in TINY_SPECS.items():
        [paths[arch]] = spec().write(d / f"{arch}.gguf")
    return paths


@pytest.mark.parametrize("arch", list(LLAMA_CPP_CONTEXT_MIB))
def test_context_equals_llama_cpp(arch: str, tiny: dict[str, Path]) -> None:
    [host] = estimate(model_context(str(tiny[arch])), ["-c", "4096"]).devices
    assert host.context_bytes == LLAMA_CPP_CONTEXT_MIB[arch] * MiB


def test_hy_v3_mtp_ffn_is_loaded_without_draft_mtp(tiny: dict[str, Path]) -> None:
    """hy-v3.cpp's load_block creates the FFN, router, experts and shared expert with TENSOR_NOT_REQUIRED
    only: llama.cpp allocates the MTP block's (a dense FFN in this file) even when the block is skipped; its
    attention, norms and eh_proj carry the skip (llama.cpp logs them as unused)."""
    ctx = model_context(str(tiny["hy_v3"]))
    loaded = {s.name for s in ctx.loaded_slots(parse_llama_flags([]))}
    mtp = {s.name for s in ctx.slots if s.layer == 3}
    assert mtp & loaded == {"blk.3.ffn_gate.weight", "blk.3.ffn_down.weight", "blk.3.ffn_up.weight"}
    assert mtp <= {s.name for s in ctx.loaded_slots(parse_llama_flags(["--spec-type", "draft-mtp"]))}
