"""The hostile files fitplan refuses (issue 39), refused by the pinned llama.cpp too, for the same reason.

Each file is a small qwen3moe or llama model written by gguf-py (planner/synth/gguf_factory.py) with one lie
(planner/synth/gguf_fields.py). `llama-fit-params -m FILE --fit-print on` must fail to load it, and the same
file without the lie must load, so the lie is what llama.cpp refuses. llama-fit-params aborts before its log
says why, so the reason is read from llama-bench's (`-p 0 -n 1 -v`), which logs it as it refuses the file.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import GGUFValueType as VT

from planner.synth.gguf_factory import ModelSpec, add_tokenizer, llama_spec, qwen3moe_spec
from planner.synth.gguf_fields import Gguf, load

pytestmark = pytest.mark.peer

ROOT = Path(__file__).resolve().parents[2]
N_VOCAB = 1000   # the specs' vocabulary


def _moe() -> ModelSpec:
    spec = qwen3moe_spec()
    add_tokenizer(spec, N_VOCAB, n_merges=1)   # llama.cpp's BPE vocabulary needs merges
    return spec


def _llama_norm_last() -> ModelSpec:
    """A llama model whose last tensor is a norm, so a lie about its shape moves no later data offset."""
    spec = llama_spec(n_layer=2)
    add_tokenizer(spec, N_VOCAB, n_merges=1)
    last = "blk.1.ffn_norm.weight"
    spec.tensors = [t for t in spec.tensors if t[0] != last] + [t for t in spec.tensors if t[0] == last]
    return spec


def _ffn_exp(vtype: VT, value: object, sub: VT | None = None) -> Callable[[Gguf], None]:
    return lambda g: g.set("qwen3moe.expert_feed_forward_length", vtype, value, sub)


def _huge_norm(g: Gguf) -> None:
    g.tis[-1].dims = [1 << 40]


# (name, base model, the lie, why llama.cpp refuses it, what fitplan says)
CASES = [
    ("ffn_exp string", _moe, _ffn_exp(VT.STRING, "128"), "has wrong type str but expected type u32",
     "qwen3moe.expert_feed_forward_length"),
    ("ffn_exp bool", _moe, _ffn_exp(VT.BOOL, True), "has wrong type bool but expected type u32",
     "qwen3moe.expert_feed_forward_length"),
    ("ffn_exp nan", _moe, _ffn_exp(VT.FLOAT32, float("nan")), "has wrong type f32 but expected type u32",
     "qwen3moe.expert_feed_forward_length"),
    ("ffn_exp 3 of 2 layers", _moe, _ffn_exp(VT.ARRAY, [128, 128, 128], VT.UINT32),
     "has wrong array length; expected 2, got 3", "3 entries, expected 2"),
    ("ffn_exp f32 array", _moe, _ffn_exp(VT.ARRAY, [128.0, 128.0], VT.FLOAT32), "wrong array element type",
     "an array of FLOAT32"),
    ("2^40 wide norm", _llama_norm_last, _huge_norm, "'blk.1.ffn_norm.weight' data is not within the file bounds",
     "[1099511627776]"),
]


def _fit_params(tools: Path, model: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools / "llama-fit-params"), "-m", str(model), "--fit-print", "on", *argv],
                          capture_output=True, text=True, timeout=120)


def _load_error(tools: Path, model: Path) -> str:
    run = subprocess.run([str(tools / "llama-bench"), "-m", str(model), "-p", "0", "-n", "1", "-v"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    return run.stderr


def _fitplan(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("name, base, lie, theirs, ours", CASES, ids=[c[0] for c in CASES])
def test_llama_cpp_refuses_what_fitplan_refuses(llama_tools, tmp_path, name, base, lie, theirs, ours):
    [path] = base().write(tmp_path / "base.gguf")
    assert _fit_params(llama_tools, path).returncode == 0, "the model without the lie must load"
    g = load(path)
    lie(g)
    bad = g.write(tmp_path / "m.gguf")
    run = _fit_params(llama_tools, bad)
    assert run.returncode != 0 and "failed to load model" in run.stderr, run.stderr[-2000:]
    assert theirs in _load_error(llama_tools, bad)
    mine = _fitplan("inspect", str(bad))
    assert mine.returncode == 2 and ours in mine.stderr, mine.stderr


def test_llama_cpp_refuses_more_than_256_slots(llama_tools, tmp_path):
    """llama_context: "n_seq_max must be <= 256"; `fitplan plan -np 1048576` once crashed instead."""
    [path] = _moe().write(tmp_path / "m.gguf")
    # llama_init_from_model's reason ("n_seq_max must be <= 256") goes through llama.cpp's asynchronous log,
    # which the abort that follows often cuts off; the refusal itself is certain, and -np 256 loads
    assert _fit_params(llama_tools, path, "-np", "256").returncode == 0
    run = _fit_params(llama_tools, path, "-np", "1048576")
    assert run.returncode != 0 and "failed to create llama_context" in run.stderr, run.stderr[-2000:]
    mine = _fitplan("plan", str(path), "--device", "CUDA0=8GiB", "--ram", "16GiB", "-np", "1048576")
    assert mine.returncode == 2 and "n_seq_max must be <= 256" in mine.stderr, mine.stderr
