"""A drafter that runs the target's output matrix (planner/memory/draft.py check_borrowed_output).

DFlash files ship no token_embd and no output: src/models/dflash.cpp computes the draft's logits with the
target's output matrix (cparams.ctx_other). The drafter's scheduler has its own devices and the CPU; when
the matrix lies in a buffer none of them runs, the pinned llama-server aborts creating the draft context
(ggml-backend.cpp:941, "pre-allocated tensor (token_embd.weight) in a buffer (...) that cannot run the
operation (NONE)"). Measured on two loopback rpc-servers with a Gemma 3 270M target (its output is its
tied token_embd): -ts 1,1 -devd RPC0 aborts, -devd RPC1 (the output layer's device) and no -devd run;
under -sm tensor (the matrix in the target's Meta() buffer) -devd RPC1 aborts and no -devd runs; a
DFlash file with its own output.weight runs pinned anywhere (tests/peer/test_draft_output_peer.py).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gguf import Keys

from planner.core.errors import FlagError
from planner.llama.companions import borrows_target_output
from planner.memory.estimate import estimate
from planner.model.tensors import OUTPUT, TOKEN_EMBD
from planner.synth.draft_models import dflash_spec
from planner.synth.gguf_factory import llama_spec

RPC = ["--rpc", "127.0.0.1:50052,127.0.0.1:50053"]
N_VOCAB = 512


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = Path(tmp_path_factory.mktemp("draft-output"))
    vocab = {Keys.Tokenizer.MODEL: "llama", Keys.Tokenizer.LIST: [f"t{i}" for i in range(N_VOCAB)]}
    target = llama_spec(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=N_VOCAB)
    target.metadata.update(vocab)
    out = {"target": d / "target.gguf", "dflash": d / "dflash.gguf", "dflash-output": d / "dflash-output.gguf"}
    target.write(out["target"])
    dflash_spec(vocab, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512).write(out["dflash"])
    dflash_spec(vocab, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, output=True).write(
        out["dflash-output"])
    return {k: str(v) for k, v in out.items()}


def _estimate(files: dict[str, str], flags: str, drafter: str = "dflash"):
    argv = [*RPC, "-c", "4096", *flags.split(), "-md", files[drafter], "--spec-type", "draft-dflash"]
    return estimate(files["target"], argv)


def test_which_drafters_run_the_targets_output():
    assert borrows_target_output("dflash", set())
    assert not borrows_target_output("dflash", {OUTPUT}) and not borrows_target_output("dflash", {TOKEN_EMBD})
    assert borrows_target_output("eagle3", {TOKEN_EMBD}) and not borrows_target_output("eagle3", {OUTPUT})
    assert not borrows_target_output("llama", set())


def test_a_drafter_pinned_away_from_the_targets_output_is_refused(files):
    # 5 layers (4 blocks and the output) split 1,1: blocks 0-2 on RPC0, block 3 and the output on RPC1
    with pytest.raises(FlagError, match=r"lies in RPC1's buffer.*: use -devd RPC1, the device holding"):
        _estimate(files, "-ts 1,1 -devd RPC0")


@pytest.mark.parametrize("flags", ["-ts 1,1 -devd RPC1", "-ts 1,1", "-ts 1,1 -ngl 0 -devd RPC0"])
def test_a_drafter_that_reaches_the_output_is_estimated(files, flags):
    """On the output's device, on every device, or with the output in host memory (-ngl 0), which the
    drafter's CPU backend runs."""
    est = _estimate(files, flags)
    assert [c.kind for c in est.companions] == ["draft"]


def test_a_drafter_with_its_own_output_goes_anywhere(files):
    est = _estimate(files, "-ts 1,1 -devd RPC0", drafter="dflash-output")
    assert est.companions[0].device("RPC0") is not None


def test_under_tensor_split_a_pinned_drafter_is_refused(files):
    with pytest.raises(FlagError, match=r"target's Meta\(\) buffer.*leave out -devd"):
        _estimate(files, "-sm tensor -devd RPC1")
    assert _estimate(files, "-sm tensor").companions[0].kind == "draft"


def test_the_cli_refuses_with_one_line_and_exit_2(files):
    argv = [sys.executable, "-m", "planner.cli", "estimate", files["target"], "--", *RPC, "-c", "4096",
            "-ts", "1,1", "-devd", "RPC0", "-md", files["dflash"], "--spec-type", "draft-dflash"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "use -devd RPC1" in line and "Traceback" not in done.stderr
    ok = subprocess.run([*argv[:-6], "-devd", "RPC1", *argv[-4:]], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
