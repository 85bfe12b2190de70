"""`fitplan estimate` against llama.cpp's own dry run (`llama-fit-params --fit-print on`).

Every row of the matrix in tests/support/estimate_matrix.py: the Gemma 3 270M file and shape-faithful sparse
GGUFs (llama 8B, Mistral 7B, Qwen2.5 7B, Qwen3 8B, Gemma 2 9B, gpt-oss 20B, qwen3moe 30B-A3B, deepseek2
MLA, granite hybrid) under context sizes, partial and full offload over two loopback rpc-servers
(RPC0, RPC1), -ts 1,1 and 3,1, quantized caches, parallel sequences, flash attention off, small
ubatches, expert overrides and --swa-full.
Model and context must equal llama.cpp's figures to the MiB (it prints floor(bytes / MiB)). A
simulated compute figure (the runtime's scheduler reserve) must be within 3 % or 4 MiB and never
below llama.cpp's by more than 1 MiB; a formula figure (no graph builder) within 10 % or 16 MiB.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from planner.llama.context import ModelContext, model_context
from planner.memory.estimate import estimate
from planner.running.tool_runs import fit_print
from tests.support.estimate_matrix import MODELS, assert_rows_match, expand, matrix, model_path

pytestmark = pytest.mark.peer

MIB = 2**20


@pytest.fixture(scope="module")
def contexts(tmp_path_factory) -> dict[str, tuple[Path, ModelContext]]:
    directory = tmp_path_factory.mktemp("shapes")
    out = {}
    for name in MODELS:
        path = model_path(name, directory)
        out[name] = (path, model_context(str(path)))
    return out


@pytest.mark.parametrize("name, template", matrix(), ids=[f"{m}: {f}" for m, f in matrix()])
def test_estimate_matches_fit_print(llama_tools, rpc_endpoints, contexts, name, template):
    path, ctx = contexts[name]
    argv = expand(template, name, rpc_endpoints)
    theirs = fit_print(llama_tools, path, argv)
    est = estimate(ctx, argv)
    assert_rows_match(est, theirs)


@pytest.mark.parametrize("template", ["{rpc} -c 4096 -ts 3,1", "{rpc} -c 4096 -ts 1,1 -ngl 7",
                                      "{rpc} -c 4096 -ts 0.7/0.3", "{rpc} -c 4096 -sm none -mg 1",
                                      "{rpc} -c 4096 -dev RPC1,RPC0 -ts 1,2"])
def test_layer_devices_match_llama_cpp_log(llama_tools, rpc_endpoints, contexts, template):
    """llama.cpp logs 'load_tensors: layer N assigned to device X' for every layer and the output layer."""
    import re
    import subprocess

    path, ctx = contexts["gemma3-270m"]
    argv = expand(template, "gemma3-270m", rpc_endpoints)
    run = subprocess.run([str(llama_tools / "llama-fit-params"), "-m", str(path), "--fit-print", "on", "-v", *argv],
                         capture_output=True, text=True, timeout=300, check=True)
    theirs = re.findall(r"layer\s+(\d+) assigned to device (\w+)", run.stderr)
    assert len(theirs) == ctx.facts.n_layer_all + 1
    est = estimate(ctx, argv)
    ours = {il: dev for dev, layers in est.layers for il in layers}
    assert [(int(il), dev) for il, dev in theirs] == sorted(ours.items())
