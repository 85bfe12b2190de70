"""GLM-4.5-Air's next-token-prediction block against the pinned llama-fit-params (`--fit-print on`).

A shape-faithful sparse glm4moe file (tests/support/glm4moe_factory.py: GLM-4.5-Air's widths, heads,
vocabulary and tensor types, fewer blocks and experts, one MTP block after the trunk as the real file
has). llama.cpp logs "model has unused tensor blk.N... -- ignoring" for the MTP block and allocates
nothing for it; the model and context rows must equal its figures to the MiB on the host and over two
loopback rpc-servers, with full and partial offload. The compute column is compared in
tests/peer/test_arch_moe_peer.py. With --spec-type draft-mtp (llama-server only:
llama-fit-params does not take it) llama.cpp loads the MTP block with its layer: a small glm4moe file's
weight buffers in llama-server's log equal the model rows, with and without it.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from gguf import Keys

from planner.llama.context import ModelContext, model_context
from planner.llama.placement import CPU_REPACK
from planner.memory.estimate import estimate
from planner.running.tool_runs import (
    LOG_ROUNDING,
    fit_print,
    parse_model_loads,
    rows_by_device,
    start_server,
    wait_ready,
)
from planner.synth.gguf_factory import add_tokenizer
from planner.synth.glm4moe_factory import glm4moe_spec, glm45_air_like
from planner.system.llama_tools import LOOPBACK, free_port, rpc_servers, stop_process

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


@pytest.mark.parametrize("flags", ["-c 4096 -ts 1,1,1", "-c 4096 -ts 1,1,2 -ngl 4"])
def test_model_rows_equal_fit_print_over_three_rpc_servers(llama_tools, glm, flags):
    path, ctx = glm
    with rpc_servers(3, llama_tools) as endpoints:
        argv = ["--rpc", ",".join(endpoints), *flags.split()]
        theirs = fit_print(llama_tools, path, argv)
    ours = {d.name: d for d in estimate(ctx, argv).devices if d.name != CPU_REPACK}
    assert list(ours) == list(theirs)
    for device, (model_mib, context_mib, _compute) in theirs.items():
        assert (ours[device].model_bytes // MIB, ours[device].context_bytes // MIB) == (model_mib, context_mib)


@pytest.mark.parametrize("spec_type", [[], ["--spec-type", "draft-mtp"]], ids=["default", "draft-mtp"])
def test_model_rows_equal_llama_server_weights(llama_tools, rpc_endpoints, shapes_dir, tmp_path, spec_type):
    """llama-server -fit off -lm none (host weights in a plain CPU buffer), -ts 1,1 over the two rpc-servers:
    3 trunk blocks and the MTP block (block 3) and the output on RPC1; its model buffer lines (two decimals
    of a MiB) against the estimate's model rows."""
    path = shapes_dir / "glm4moe-small.gguf"
    if not path.exists():
        spec = glm4moe_spec(n_layer=3, n_nextn=1, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                            n_expert=8, n_ff_exp=64, n_vocab=2048)
        add_tokenizer(spec, 2048, n_merges=1)
        spec.metadata[Keys.Tokenizer.PRE] = "default"
        spec.write(path)
    argv = ["--rpc", ",".join(rpc_endpoints), "-c", "4096", "-ts", "1,1", "-lm", "none", *spec_type]
    log, port = tmp_path / "server.log", free_port()
    proc = start_server([str(llama_tools / "llama-server"), "-m", str(path), "--host", LOOPBACK, "--port", str(port),
                         "-fit", "off", "-v", *argv], log)
    try:
        wait_ready(proc, port, log, timeout_s=300)
    finally:
        stop_process(proc)
    theirs = rows_by_device(parse_model_loads(log.read_text(errors="replace"))[0],
                            {"RPC0": rpc_endpoints[0], "RPC1": rpc_endpoints[1]})
    ours = {d.name: d.model_bytes for d in estimate(str(path), argv).devices if d.model_bytes}
    assert set(ours) == {row for row, kinds in theirs.items() if kinds.get("model")}
    for row, model in ours.items():
        assert abs(model - theirs[row]["model"]) <= LOG_ROUNDING, (row, model, theirs[row])
