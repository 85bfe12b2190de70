"""`fitplan estimate` through the CLI: the JSON contract of DESIGN.md, the table, and exit-2 errors.

The model: llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=1000).
Its weights by hand (ggml blocks: Q4_K 256 values / 144 bytes, Q6_K 256 / 210, Q8_0 32 / 34; each
tensor padded to 32 bytes in its buffer):
  token_embd Q8_0 256x1000 = 272000; output_norm f32 = 1024; output Q6_K 256x1000 = 210000 -> 210016;
  per layer: 2 norms 2048, q 36864, k 9216, v (Q8_0) 17408, o 36864, gate 73728, up 73728,
  down (Q6_K) 107520 = 357376.
With -nr (no repacking) everything on the CPU is one Host buffer: 483040 + 2 x 357376 = 1197792.
KV with -c 1024: 2 layers x (K + V) x 64 values x 2 bytes x 1024 cells = 524288.
"""
from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.synth.gguf_factory import llama_spec

HOST_WEIGHTS = 1197792
KV = 524288
LAYER = 357376


@pytest.fixture
def model(tmp_path):
    [path] = llama_spec(n_layer=2, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, n_vocab=1000).write(tmp_path / "m.gguf")
    return str(path)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["estimate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_cpu_only(capsys, model):
    code, out, err = _run(capsys, model, "--format", "json", "--", "-c", "1024", "-nr")
    assert code == 0, err
    doc = json.loads(out)
    [host] = doc["devices"]
    assert host["name"] == "Host"
    assert (host["model_bytes"], host["context_bytes"]) == (HOST_WEIGHTS, KV)
    assert isinstance(host["compute_bytes"], int) and host["compute_bytes"] > 0
    assert doc["layers"] == {"CPU": [0, 1, 2]} and doc["output_device"] == "CPU"


def test_json_two_rpc_devices(capsys, model):
    code, out, err = _run(capsys, model, "--format", "json", "--",
                          "--rpc", "127.0.0.1:50001,127.0.0.1:50002", "-ts", "1,1", "-c", "1024", "-nr")
    assert code == 0, err
    doc = json.loads(out)
    assert [d["name"] for d in doc["devices"]] == ["RPC0", "RPC1", "Host"]
    # 3 placeable layers at 1:1 -> 0/3 and 1/3 on RPC0, the output layer (2/3) on RPC1
    assert doc["layers"] == {"RPC0": [0, 1], "RPC1": [2]}
    rpc0, rpc1, host = doc["devices"]
    assert rpc0["model_bytes"] == 2 * LAYER and rpc0["context_bytes"] == KV
    assert rpc1["model_bytes"] == 1024 + 210016 and rpc1["context_bytes"] == 0
    assert host["model_bytes"] == 272000 and host["context_bytes"] == 0
    assert doc["pipeline_parallel"] is True


def test_device_shorthand_names_a_device(capsys, model):
    code, out, err = _run(capsys, model, "--device", "CUDA0=8GiB", "--format", "json", "--", "-c", "1024")
    assert code == 0, err
    assert [d["name"] for d in json.loads(out)["devices"]][:2] == ["CUDA0", "Host"]


def test_table_lists_moved_tensors_and_ignored_flags(capsys, model):
    code, out, err = _run(capsys, model, "--", "-c", "1024", "-ot", r"blk\.1\.ffn_down=CPU", "-t", "4",
                          "--rpc", "127.0.0.1:50001")
    assert code == 0, err
    assert "model MiB" in out and "context MiB" in out and "compute MiB" in out
    assert "blk.1.ffn_down.weight -> CPU" in out
    assert "ignored (no effect on memory): -t 4" in out


@pytest.mark.parametrize("flags, words", [
    (["--frobnicate"], "unknown llama.cpp flag '--frobnicate'"),
    (["-fa", "off", "-ctv", "q8_0"], "requires Flash Attention"),
    (["-ot", "exps=CUDA3"], "unknown buffer type 'CUDA3'"),
    (["-ngl"], "-ngl: expected a value"),
])
def test_bad_flags_exit_2_with_one_line(capsys, model, flags, words):
    code, out, err = _run(capsys, model, "--", *flags)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


def test_missing_model_exits_2(capsys, tmp_path):
    code, _, err = _run(capsys, str(tmp_path / "nope.gguf"), "--", "-c", "512")
    assert code == 2 and "no such file" in err
