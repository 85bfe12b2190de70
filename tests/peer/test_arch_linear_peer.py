"""The linear-attention hybrids against the pinned llama-fit-params (issue 40's peer matrix,
tests/support/arch_matrix.py): each shape-faithful file of planner/synth/shapes_linear.py over host only,
two and three rpc-servers, partial offload, -fa off at 32k, q8_0 caches, -np 4 and -ncmoe 8: model and
context equal to the MiB, compute within 3 % or 4 MiB and never more than 1 MiB below.

Kimi-Linear's file keeps value_length at n_embd / n_head = 72 (its converter writes none), which q8_0's
32-value blocks do not divide: llama.cpp refuses the q8_0 cache row, and so must fitplan (one clear line,
exit 2); every other row is compared."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from planner.llama.context import ModelContext, model_context
from planner.running.tool_runs import fit_print
from planner.synth import shapes_linear as linear
from planner.system.llama_tools import ToolsError
from tests.support.arch_matrix import ArchShape, arch_rows, check_row, expand

pytestmark = pytest.mark.peer

SHAPES: dict[str, ArchShape] = {
    # the extra rows end the host's layers with an MLA layer before a KDA layer on RPC0: flash attention stays on
    "kimi-linear-48b-a3b": ArchShape("kimi-linear-48b-a3b", linear.kimi_linear_48b_a3b_spec, 27, moe=True,
                                     extra=("{rpc2} -c 4096 -ts 1,1 -ngl 24",)),
    "ling-3-tiny-class": ArchShape("ling-3-tiny-class", linear.ling_3_tiny_class_spec, 24, moe=True,
                                   extra=("{rpc2} -c 4096 -ts 1,1 -ngl 13 -nkvo",)),
    "kimi-k3": ArchShape("kimi-k3", linear.kimi_k3_spec, 93, moe=True),
}
# shapes whose value head size q8_0's blocks do not divide
Q8_REFUSED = frozenset({"kimi-linear-48b-a3b"})
Q8_ROW = "{rpc2} -c 4096 -ts 1,1 -ctk q8_0 -ctv q8_0"
ROWS = [(n, t) for n, t in arch_rows(SHAPES) if not (n in Q8_REFUSED and t == Q8_ROW)]


@pytest.fixture(scope="module")
def contexts(shapes_dir: Path) -> dict[str, tuple[Path, ModelContext]]:
    out = {}
    for name, shape in SHAPES.items():
        [path] = shape.spec().write(shapes_dir / f"{name}.gguf")
        out[name] = (path, model_context(str(path)))
    return out


@pytest.mark.parametrize(("name", "template"), ROWS)
def test_row_matches_llama_fit_params(name: str, template: str, llama_tools: Path, rpc_three: list[str],
                                      contexts: dict[str, tuple[Path, ModelContext]]) -> None:
    path, ctx = contexts[name]
    check_row(llama_tools, path, ctx, SHAPES[name], template, rpc_three)


@pytest.mark.parametrize("name", sorted(Q8_REFUSED))
def test_q8_0_caches_refused_as_llama_cpp_refuses(name: str, llama_tools: Path, rpc_three: list[str],
                                                  contexts: dict[str, tuple[Path, ModelContext]]) -> None:
    path, _ctx = contexts[name]
    argv = expand(Q8_ROW, SHAPES[name], rpc_three)
    with pytest.raises(ToolsError, match="does not divide n_embd_head_v=72"):
        fit_print(llama_tools, path, argv)
    done = subprocess.run([sys.executable, "-m", "planner.cli", "estimate", str(path), "--", *argv],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2
    assert "does not divide the model's V head size 72" in done.stderr
