"""The formula's stated safety term (planner/memory/analytic.py formula_safety): carried by every row of an
architecture without a graph builder, included in its compute figure and printed; absent where the
compute is simulated. The figure is derived here by hand from the term's definition."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planner.core.units import fmt_mib
from planner.memory.analytic import FORMULA, SIMULATED
from planner.memory.estimate import estimate
from planner.synth.gguf_factory import add_tokenizer, llama_spec
from tests.support.overhead import cuda

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB, N_CTX, N_UBATCH = 256, 8, 2, 1024, 2048, 4096, 512
F32, F16, I32, I64 = 4, 2, 4, 8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("safety")
    paths = {}
    for arch in ("minicpm", "llama"):   # the same tensors: minicpm has no graph builder, llama has one
        spec = llama_spec(n_layer=2, n_embd=N_EMBD, n_head=N_HEAD, n_head_kv=N_HEAD_KV, n_ff=N_FF, n_vocab=N_VOCAB,
                          arch=arch)
        add_tokenizer(spec, N_VOCAB)
        [paths[arch]] = spec.write(out / f"{arch}.gguf")
    return paths


def _by_hand() -> int:
    """Host only, flash attention on, one sequence: the larger of the worst layer's working set and the
    graph's inputs."""
    t = N_UBATCH
    e = N_EMBD * t * F32
    hd = N_EMBD // N_HEAD
    ffn = e + 3 * N_FF * t * F32                                    # residual + up, gate, activation rows
    attn = 2 * e + (hd * N_HEAD + 2 * hd * N_HEAD_KV) * t * F32     # 2 residual rows + Q, K, V rows
    inputs = e + 2 * t * I32 + t * I32 + N_CTX * t * F16 + 2 * t * I64   # embd, ids, pos, out ids, mask, k/v idxs
    return max(ffn, attn, inputs)


def test_a_formula_architecture_carries_the_term_in_its_compute(files):
    argv = ["-c", str(N_CTX), "-ngl", "0"]
    est = estimate(str(files["minicpm"]), argv)
    assert est.compute_model == FORMULA
    assert dict(est.compute_safety) == {"Host": _by_hand()}
    bare = estimate(str(files["minicpm"]), argv, exact_compute=False)   # the same formula, same term
    assert est.device("Host").compute_bytes == bare.device("Host").compute_bytes
    simulated = estimate(str(files["llama"]), argv)
    assert simulated.compute_model == SIMULATED and simulated.compute_safety == ()


def test_the_term_is_printed_and_in_the_json(files):
    run = [sys.executable, "-m", "planner.cli", "estimate", str(files["minicpm"])]
    table = subprocess.run([*run, "--", "-c", str(N_CTX), "-ngl", "0"], capture_output=True, text=True, check=True)
    assert f"it includes a safety term, a layer's working set or the graph inputs once more: Host " \
           f"{fmt_mib(_by_hand())} MiB" in table.stdout
    doc = json.loads(subprocess.run([*run, "--format", "json", "--", "-c", str(N_CTX), "-ngl", "0"],
                                    capture_output=True, text=True, check=True).stdout)
    assert doc["compute_safety"] == {"Host": _by_hand()}
    planned = subprocess.run([sys.executable, "-m", "planner.cli", "plan", str(files["minicpm"]), "--device",
                              f"CUDA0={cuda(1024)}", "--ram", "4GiB", "-c", str(N_CTX)], capture_output=True, text=True)
    assert planned.returncode == 0, planned.stderr
    assert "compute: formula" in planned.stdout and "it includes a safety term" in planned.stdout
