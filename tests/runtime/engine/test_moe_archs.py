"""The mixture-of-experts architectures built from facts (hparams.ARCHS rows, runtime/engine/moe.py) on
tiny files (planner/synth/shapes_moe.py): the reserve's node count and CPU compute buffer against
llama.cpp's, and the routing each file resolves to.

Expected figures come from the pinned llama-fit-params -v on these very files ("graph: nodes = N" and
"CPU compute buffer size = X MiB"); the routing facts are read off src/models/<arch>.cpp by hand.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import Keys

from planner.core.errors import GGUFError
from planner.gguf.reader import read_model
from planner.llama.context import model_context
from planner.memory.estimate import estimate
from planner.synth.shapes_moe import TINY_SPECS, tiny_ernie45moe_gateless, tiny_glm4moe_qk_norm
from runtime.engine.hparams import MoeGating, read_hparams
from tests.support.reserve_checks import assert_reserve_equals

# every architecture's tiny file, and variants: ernie4_5-moe without ffn_gate_exps (silu of up), glm4moe with
# the Q/K norms of GLM-4.5 (355B)
FILES = {**TINY_SPECS, "ernie4_5-moe-gateless": tiny_ernie45moe_gateless, "glm4moe-qk-norm": tiny_glm4moe_qk_norm}
FLAGS = ("-c 256", "-c 256 -fa off", "-c 512 -np 2 -ub 64", "-c 256 -ctk q8_0 -ctv q8_0")
# llama-fit-params -v on each file of FILES, per FLAGS: (nodes, CPU compute MiB)
LLAMA_CPP_RESERVE: dict[str, tuple[tuple[int, float], ...]] = {
    "qwen2moe": ((168, 2.11), (183, 2.75), (174, 0.53), (204, 2.14)),
    "olmoe": ((144, 1.63), (159, 3.00), (150, 0.41), (180, 1.66)),
    "ernie4_5-moe": ((143, 2.13), (158, 2.75), (149, 0.53), (179, 2.41)),
    "glm4moe": ((154, 2.13), (169, 2.75), (160, 0.53), (190, 2.41)),
    "minimax-m2": ((162, 1.63), (177, 2.75), (168, 0.41), (198, 1.66)),
    "deepseek": ((133, 2.13), (148, 3.00), (139, 0.53), (169, 2.41)),
    "dots1": ((157, 2.13), (172, 3.00), (163, 0.53), (193, 2.41)),
    "hunyuan-moe": ((174, 2.11), (189, 2.75), (180, 0.53), (210, 2.14)),
    "exaone-moe": ((213, 2.26), (233, 3.26), (221, 0.57), (261, 2.57)),
    "smallthinker": ((238, 1.77), (263, 3.26), (248, 0.44), (298, 2.36)),
    "afmoe": ((307, 2.51), (332, 3.26), (317, 0.63), (367, 2.57)),
    "phimoe": ((170, 2.11), (185, 2.75), (176, 0.53), (206, 2.14)),
    "ernie4_5-moe-gateless": ((141, 2.13), (156, 3.14), (147, 0.53), (177, 2.41)),
    "glm4moe-qk-norm": ((164, 2.13), (179, 2.75), (170, 0.53), (200, 2.41)),
}
ROWS = [(name, flags, *fig) for name, figs in LLAMA_CPP_RESERVE.items() for flags, fig in zip(FLAGS, figs, strict=True)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("moe")
    paths = {}
    for name, spec in FILES.items():
        [paths[name]] = spec().write(d / f"{name}.gguf")
    return paths


@pytest.mark.parametrize(("name", "flags", "n_nodes", "compute_mib"), ROWS)
def test_reserve_nodes_and_compute_buffer_equal_llama_cpp(name: str, flags: str, n_nodes: int, compute_mib: float,
                                                          tiny: dict[str, Path]) -> None:
    assert_reserve_equals(tiny[name], flags, n_nodes, compute_mib)


@pytest.mark.parametrize("arch", list(TINY_SPECS))
def test_compute_is_simulated(arch: str, tiny: dict[str, Path]) -> None:
    assert estimate(model_context(str(tiny[arch])), ["-c", "4096"]).compute_model == "simulated"


# (gating, norm_w, w_scale, moe layers) as each graph passes them to build_moe_ffn for its tiny file:
# qwen2moe and olmoe hard-code softmax without normalisation; ernie4_5-moe softmax with it, block 0 dense
# (leading_dense_block_count 1); glm4moe the file's sigmoid, expert_weights_norm and scale 2.5, block 0
# dense; minimax-m2 the file's sigmoid and a hard-coded normalisation; deepseek softmax unnormalised with the
# file's scale 1.5, block 0 dense; dots1 the file's sigmoid, norm and scale 2.5, block 0 dense; hunyuan-moe
# softmax, normalised; exaone-moe the file's sigmoid, norm and scale 2.5, block 0 dense (its MTP block is
# not part of the trunk); smallthinker the file's softmax (expert_gating_func 1), normalised; afmoe the file's
# sigmoid, norm and scale 2.5, block 0 dense; phimoe (phi3.cpp) softmax, normalised
ROUTING = {
    "qwen2moe": (MoeGating.SOFTMAX, False, 0.0, (True, True, True)),
    "olmoe": (MoeGating.SOFTMAX, False, 0.0, (True, True, True)),
    "ernie4_5-moe": (MoeGating.SOFTMAX, True, 0.0, (False, True, True)),
    "glm4moe": (MoeGating.SIGMOID, True, 2.5, (False, True, True)),
    "minimax-m2": (MoeGating.SIGMOID, True, 0.0, (True, True, True)),
    "deepseek": (MoeGating.SOFTMAX, False, 1.5, (False, True, True)),
    "dots1": (MoeGating.SIGMOID, True, 2.5, (False, True, True)),
    "hunyuan-moe": (MoeGating.SOFTMAX, True, 0.0, (True, True, True)),
    "exaone-moe": (MoeGating.SIGMOID, True, 2.5, (False, True, True, True)),
    "smallthinker": (MoeGating.SOFTMAX, True, 0.0, (True,) * 5),
    "afmoe": (MoeGating.SIGMOID, True, 2.5, (False, True, True, True, True)),
    "phimoe": (MoeGating.SOFTMAX, True, 0.0, (True, True, True)),
}


@pytest.mark.parametrize("arch", list(ROUTING))
def test_routing_as_the_loader_reads_it(arch: str, tiny: dict[str, Path]) -> None:
    r = read_hparams(read_model(str(tiny[arch]))).routing
    assert r is not None
    assert (r.gating, r.norm_w, r.w_scale, r.moe_layers) == ROUTING[arch]


def test_expert_groups_leave_the_estimate_on_the_formula(tmp_path: Path) -> None:
    """expert_group_count above 1 makes build_moe_ffn select groups first, which the runtime does not build:
    read_hparams refuses the file and the estimate keeps the formula rather than a wrong simulation."""
    spec = TINY_SPECS["glm4moe"]()
    spec.metadata[Keys.LLM.EXPERT_GROUP_COUNT] = 2
    spec.metadata[Keys.LLM.EXPERT_GROUP_USED_COUNT] = 1
    [path] = spec.write(tmp_path / "grouped.gguf")
    with pytest.raises(GGUFError, match="expert_group_count 2"):
        read_hparams(read_model(str(path)))
    assert estimate(model_context(str(path)), ["-c", "4096"]).compute_model == "formula"
