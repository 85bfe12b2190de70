"""The hybrid recurrent architectures against the pinned llama-fit-params (issue 40's peer matrix,
tests/support/arch_matrix.py): each shape-faithful file of planner/synth/shapes_hybrid.py over host
only, two and three rpc-servers, partial offload, -fa off at 32k, q8_0 caches, -np 4 and, for the
mixtures of experts, -ncmoe 8: model and context equal to the MiB, compute within 3 % or 4 MiB and
never more than 1 MiB below."""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.llama.context import ModelContext, model_context
from planner.synth import shapes_hybrid as hybrid
from tests.support.arch_matrix import ArchShape, arch_rows, check_row

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {
    # the extra rows end the host's layers with an attention layer before a device's recurrent one
    # (planner.llama.settings.pulled_attention, ATTENTION_STAYS: flash attention stays on there)
    "qwen35-27b": ArchShape("qwen35-27b", hybrid.qwen35_27b_spec, 64, extra=("{rpc2} -c 4096 -ts 3,1 -ngl 34",)),
    "qwen35moe-35b-a3b": ArchShape("qwen35moe-35b-a3b", hybrid.qwen35moe_35b_a3b_spec, 40, moe=True,
                                   extra=("{rpc2} -c 4096 -ts 3,1 -ngl 10",)),
    # -nkvo pulls the attention blocks to the host; -ngl 41 ends the host at "*-" before RPC0's first Mamba-2
    "nemotron-nano-9b-v2": ArchShape("nemotron-nano-9b-v2", hybrid.nemotron_nano_9b_v2_spec, 56,
                                     extra=("{rpc2} -c 4096 -ts 1,1 -nkvo", "{rpc2} -c 4096 -ts 3,1 -ngl 41")),
    "nemotron3-nano-30b-a3b": ArchShape("nemotron3-nano-30b-a3b", hybrid.nemotron3_nano_30b_a3b_spec, 52, moe=True),
    "lfm2moe-8b-a1b": ArchShape("lfm2moe-8b-a1b", hybrid.lfm2moe_8b_a1b_spec, 24, moe=True,
                                extra=("{rpc2} -c 4096 -ts 3,1 -ngl 22",)),
    # -nkvo: the states on the host, the blocks on the devices (a dry run sizes the first prompt reserve only)
    "mamba-codestral-7b": ArchShape("mamba-codestral-7b", hybrid.mamba_codestral_7b_spec, 64,
                                    extra=("{rpc2} -c 4096 -ts 1,1 -nkvo",)),
    "falcon-mamba-7b": ArchShape("falcon-mamba-7b", hybrid.falcon_mamba_7b_spec, 64,
                                 extra=("{rpc2} -c 4096 -ts 1,1 -nkvo",)),
    # -nkvo: every offloaded block's attention follows its states to the host (-fa auto off)
    "falcon-h1-1.5b": ArchShape("falcon-h1-1.5b", hybrid.falcon_h1_1p5b_spec, 24,
                                extra=("{rpc2} -c 4096 -ts 1,1 -nkvo",)),
    # the host's last layer attends and RPC0's first is Mamba-1: the attention core is pulled (-fa auto off)
    "jamba-1.5-mini": ArchShape("jamba-1.5-mini", hybrid.jamba_1p5_mini_spec, 32, moe=True,
                                extra=("{rpc2} -c 4096 -ts 3,1 -ngl 28", "{rpc2} -c 4096 -ts 1,1 -nkvo")),
}


@pytest.fixture(scope="module")
def contexts(shapes_dir: Path) -> dict[str, tuple[Path, ModelContext]]:
    out = {}
    for name, shape in SHAPES.items():
        [path] = shape.spec().write(shapes_dir / f"{name}.gguf")
        out[name] = (path, model_context(str(path)))
    return out


@pytest.mark.parametrize(("name", "template"), arch_rows(SHAPES))
def test_row_matches_llama_fit_params(name: str, template: str, llama_tools: Path, rpc_three: list[str],
                                      contexts: dict[str, tuple[Path, ModelContext]]) -> None:
    path, ctx = contexts[name]
    check_row(llama_tools, path, ctx, SHAPES[name], template, rpc_three)
