"""A DFlash drafter without an output matrix against the pinned llama-server: fitplan refuses exactly the
placements where llama-server aborts creating the draft context (planner/memory/draft.py
check_borrowed_output), and estimates the others.

The target is a small llama-layout file with a BPE vocabulary; the drafters are one-layer DFlash files
sharing it (planner/synth/draft_models.dflash_spec), one without token_embd and output (it runs the
target's output matrix, as published DFlash files do) and one with its own output. llama-server runs with
two loopback rpc-servers; a run either answers /health or exits with ggml-backend.cpp:941's abort.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import Keys

from planner.core.errors import DrafterOutputUnreachable
from planner.gguf.reader import read_model
from planner.memory.estimate import estimate
from planner.running.tool_runs import start_server, wait_ready
from planner.synth.draft_models import dflash_spec, vocab_metadata
from planner.synth.gguf_factory import Q, add_tokenizer, llama_spec
from planner.system.llama_tools import LOOPBACK, free_port, stop_process

pytestmark = pytest.mark.peer

ABORT = "that cannot run the operation"
CASES = {   # name -> (flags, drafter)
    "layer, drafter away from the output": ("-ts 1,1 -devd RPC0", "borrows"),
    "layer, drafter on the output's device": ("-ts 1,1 -devd RPC1", "borrows"),
    "layer, drafter on every device": ("-ts 1,1", "borrows"),
    "layer, own output, away from the target's": ("-ts 1,1 -devd RPC0", "own"),
    "tensor, drafter pinned": ("-sm tensor -devd RPC1", "borrows"),
    "tensor, drafter on every device": ("-sm tensor", "borrows"),
}


@pytest.fixture(scope="module")
def files(shapes_dir: Path) -> dict[str, Path]:
    # Q8_0 throughout: -sm tensor cuts rows into halves of 128 values, whole Q8_0 blocks
    target = llama_spec(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=2048, attn_type=Q.Q8_0,
                        ffn_type=Q.Q8_0, down_type=Q.Q8_0, out_type=Q.Q8_0)
    add_tokenizer(target, 2048, n_merges=1)
    target.metadata[Keys.Tokenizer.PRE] = "default"
    out = {"target": shapes_dir / "draft-target.gguf", "borrows": shapes_dir / "dflash.gguf",
           "own": shapes_dir / "dflash-output.gguf"}
    target.write(out["target"])
    model = read_model(str(out["target"]))
    vocab = {**vocab_metadata(model), Keys.Tokenizer.MERGES: list(model.metadata[Keys.Tokenizer.MERGES])}
    dims = {"n_embd": 256, "n_head": 4, "n_head_kv": 2, "head_dim": 64, "n_ff": 512, "target_layers": (0, 1, 2)}
    dflash_spec(vocab, **dims).write(out["borrows"])
    dflash_spec(vocab, output=True, **dims).write(out["own"])
    return out


def _server_runs(bin_dir: Path, argv: list[str], log: Path) -> bool:
    port = free_port()
    proc = start_server([str(bin_dir / "llama-server"), "--host", LOOPBACK, "--port", str(port), "-fit", "off",
                         *argv], log)
    try:
        wait_ready(proc, port, log, timeout_s=240)
        return True
    except Exception:
        text = log.read_text(errors="replace")
        assert ABORT in text, text[-2000:]   # no other failure counts as the abort
        return False
    finally:
        stop_process(proc)


@pytest.mark.parametrize("name", list(CASES))
def test_refused_exactly_where_llama_server_aborts(llama_tools, rpc_endpoints, files, tmp_path, name):
    flags, drafter = CASES[name]
    argv = ["-m", str(files["target"]), "--rpc", ",".join(rpc_endpoints), "-c", "4096", *flags.split(),
            "-md", str(files[drafter]), "--spec-type", "draft-dflash"]
    runs = _server_runs(llama_tools, argv, tmp_path / "server.log")
    try:
        estimate(str(files["target"]), argv[2:])
        refused = False
    except DrafterOutputUnreachable:
        refused = True
    assert refused == (not runs), name
