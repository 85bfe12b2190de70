"""One figure per program (planner/llama/programs.py): llama-fit-params' dry run by default, llama-server's
load with --program server; and the files llama.cpp would not load as a model refused, as it refuses them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.core.errors import BadInput
from planner.llama.context import model_context
from planner.llama.programs import Program
from planner.memory.estimate import estimate
from planner.synth.gguf_factory import ModelSpec, add_tokenizer, llama_spec
from tests.support.overhead import cuda

N_VOCAB, N_EMBD, N_UBATCH = 32768, 256, 512


def _renamed(spec: ModelSpec, arch: str) -> ModelSpec:
    """The same tensors under another general.architecture, its keys renamed with it."""
    old = spec.arch + "."
    meta = {(arch + "." + k[len(old):] if k.startswith(old) else k): v for k, v in spec.metadata.items()}
    return ModelSpec(arch, meta, list(spec.tensors))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("programs")
    spec = llama_spec(n_layer=2, n_embd=N_EMBD, n_vocab=N_VOCAB)
    add_tokenizer(spec, N_VOCAB)
    paths = {"llama": out / "llama.gguf", "baichuan": out / "baichuan.gguf", "clip": out / "clip.gguf",
             "madeup": out / "madeup.gguf"}
    spec.write(paths["llama"])
    for arch in ("baichuan", "clip", "madeup"):
        _renamed(spec, arch).write(paths[arch])
    return paths


def _fitplan(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=True, text=True, timeout=120)


def test_server_reserves_one_output_row_per_slot_where_fit_params_reserves_the_ubatch(files):
    # the output device's logits: n_vocab x rows x 4 B; llama-fit-params reserves min(n_ubatch, n_batch)
    # rows (64 MiB here), llama-server -np 2 without a drafter two (server_output_limits), and its buffer
    # is then the layers' working set (a few MiB at this width)
    argv = ["-c", "1024", "-ngl", "0", "-np", "2"]
    dry = estimate(str(files["llama"]), argv).device("Host").compute_bytes
    served = estimate(str(files["llama"]), argv, program=Program.SERVER).device("Host").compute_bytes
    logits = N_VOCAB * N_UBATCH * 4
    assert dry >= logits and served < logits / 8


def test_server_without_np_takes_its_four_unified_slots(files):
    # tools/server/server.cpp: -np auto is 4 slots sharing one cache (llama-fit-params: 1)
    est = estimate(str(files["llama"]), ["-c", "1024"], program=Program.SERVER)
    assert (est.cparams.n_seq, est.cparams.n_stream) == (4, 1)
    assert estimate(str(files["llama"]), ["-c", "1024"]).cparams.n_seq == 1


def test_the_cli_says_which_program_it_sized(files):
    for program, name in (("fit-params", "llama-fit-params' dry run"), ("server", "llama-server's load")):
        done = _fitplan("estimate", str(files["llama"]), "--program", program, "--", "-c", "1024")
        assert done.returncode == 0, done.stderr
        assert f"sized as {name}" in done.stdout
        doc = json.loads(_fitplan("estimate", str(files["llama"]), "--program", program, "--format", "json",
                                  "--", "-c", "1024").stdout)
        assert doc["program"] == program
    bad = _fitplan("estimate", str(files["llama"]), "--program", "llama-bench", "--", "-c", "1024")
    assert bad.returncode == 2 and bad.stderr == ("fitplan: error: --program 'llama-bench': expected "
                                                  "fit-params | server\n")


@pytest.mark.parametrize("arch", ["clip", "madeup"])
def test_an_architecture_the_pin_does_not_know_is_refused(files, arch):
    with pytest.raises(BadInput, match=f"unknown model architecture: '{arch}'"):
        model_context(str(files[arch]))
    for command in (["estimate", str(files[arch]), "--", "-c", "512"], ["plan", str(files[arch])]):
        done = _fitplan(*command)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and f"general.architecture '{arch}'" in done.stderr
    if arch == "clip":
        assert "pass it with -mm beside the text model" in done.stderr


def test_a_weights_only_architecture_says_its_context_is_not_sized(files):
    # baichuan is an architecture of the pin that planner/model/arch.py has no KV facts for: both layers
    # are UNKNOWN, the context column is 0, and the estimate and the plan say so
    est = estimate(str(files["baichuan"]), ["-c", "1024"])
    assert all(d.context_bytes == 0 for d in est.devices)
    [note] = est.notes
    assert note.startswith("context not sized: fitplan has no KV facts for baichuan") and "2 of its 2 layers" in note
    done = _fitplan("estimate", str(files["baichuan"]), "--", "-c", "1024")
    assert note in done.stdout
    doc = json.loads(_fitplan("estimate", str(files["baichuan"]), "--format", "json", "--", "-c", "1024").stdout)
    assert doc["notes"] == [note]
    planned = _fitplan("plan", str(files["baichuan"]), "--device", f"CUDA0={cuda(1024)}", "--ram", "4GiB", "-c", "1024")
    assert planned.returncode == 0, planned.stderr
    assert note in planned.stdout
    assert estimate(str(files["llama"]), ["-c", "1024"]).notes == ()
