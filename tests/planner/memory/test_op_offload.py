"""The estimate on offloading devices: llama.cpp's flags and environment, as llama.cpp reads them."""
from __future__ import annotations

import pytest

from planner.api import as_inventory
from planner.core.units import MiB
from planner.llama.flags import flags_to_argv, parse_llama_flags
from planner.memory.estimate import estimate
from runtime.ggml.profiles import PROFILES, Backend, atoi, op_offload_min_batch

# Gemma 3 270M: the tied output matrix (token_embd, 262144 x 640 Q8_0) kept on the host. On CUDA0,
# at -ub 512 the logits matmul (batch ne[1] = 512 outputs) is offloaded: the weight is staged
# (167772160 * 34/32 = 178257920 bytes, + row_size(q8_0, 512 - 640 % 512 = 384) = 408 of CUDA row
# padding) and the logits are f32 262144 x 512 = 536870912 bytes.
ARGV = ["-dev", "CUDA0", "-ngl", "99", "-c", "4096", "-ot", r"^token_embd\.weight=CPU"]
STAGED = 178257920 + 408
LOGITS = 262144 * 512 * 4


@pytest.fixture(scope="module")
def inventory():
    return as_inventory(["CUDA0=4GiB"])


def test_flag_spellings_round_trip():
    assert parse_llama_flags(["--no-op-offload"]).op_offload is False
    assert parse_llama_flags(["--no-op-offload", "--op-offload"]).op_offload is True
    assert flags_to_argv(parse_llama_flags(["--no-op-offload"])) == ["--no-op-offload"]


@pytest.mark.parametrize("text, value", [("64", 64), (" 16", 16), ("+8", 8), ("12abc", 12), ("abc", 0), ("", 0),
                                         ("-3", -3)])
def test_min_batch_env_is_read_with_atoi(text, value):
    assert atoi(text) == value
    assert op_offload_min_batch({"GGML_OP_OFFLOAD_MIN_BATCH": text}) == value
    assert op_offload_min_batch({}) == 32


def test_only_offloading_backends_offload():
    assert {b for b, p in PROFILES.items() if p.offload_op} == {Backend.CUDA, Backend.ROCM, Backend.VULKAN,
                                                                Backend.SYCL, Backend.METAL}
    metal = PROFILES[Backend.METAL]
    assert metal.wants_op("MUL_MAT", (640, 512, 1, 1), 512, 32)
    assert not metal.wants_op("ROPE", (64, 8, 512, 1), 4096, 32)


def test_output_on_host_stages_weight_and_logits_on_cuda0(inventory):
    on = estimate("example:gemma3-270m", ARGV, inventory).device("CUDA0")
    off = estimate("example:gemma3-270m", ARGV + ["--no-op-offload"], inventory).device("CUDA0")
    assert on is not None and off is not None
    # everything else on CUDA0 is the same graph: the difference is at least the staged weight and the
    # logits, and the layers' own peak (off) is far below them
    assert on.compute_bytes - off.compute_bytes >= STAGED + LOGITS - off.compute_bytes
    assert abs(on.compute_bytes - (STAGED + LOGITS)) <= off.compute_bytes + MiB


def test_below_the_min_batch_nothing_is_staged(inventory, monkeypatch):
    base = estimate("example:gemma3-270m", ARGV + ["--no-op-offload"], inventory).device("CUDA0")
    monkeypatch.setenv("GGML_OP_OFFLOAD_MIN_BATCH", "513")   # above the 512-token prompt ubatch
    high = estimate("example:gemma3-270m", ARGV, inventory).device("CUDA0")
    assert base is not None and high is not None
    assert high.compute_bytes == base.compute_bytes


def test_cuda_pads_quantized_rows_in_the_model_column(inventory):
    """get_alloc_size on CUDA: nbytes + row_size(type, 512 - ne0 % 512) for a quantized tensor whose
    rows are not a multiple of 512 values, then the 128-byte alignment. Every weight but token_embd
    (the input layer stays on the host) lands on CUDA0, plus the output copy of token_embd."""
    from gguf import GGML_QUANT_SIZES

    from planner.gguf.reader import read_model
    from planner.registry.examples import resolve_model

    def on_cuda(ggml_type, ne0, n_bytes):
        block, size = GGML_QUANT_SIZES[ggml_type]
        if block > 1 and ne0 % 512:
            n_bytes += (512 - ne0 % 512) // block * size
        return -(-n_bytes // 128) * 128

    mf = read_model(resolve_model("example:gemma3-270m"))
    embd = mf.tensor("token_embd.weight")
    want = sum(on_cuda(t.ggml_type, t.shape[0], t.n_bytes) for t in mf.tensors if t.name != "token_embd.weight")
    want += on_cuda(embd.ggml_type, embd.shape[0], embd.n_bytes)
    cuda = estimate("example:gemma3-270m", ["-dev", "CUDA0", "-ngl", "99", "-c", "4096"], inventory).device("CUDA0")
    assert cuda is not None and cuda.model_bytes == want


def test_compute_model_is_named(inventory):
    est = estimate("example:gemma3-270m", ARGV, inventory)
    assert est.compute_model == "simulated" and est.to_dict()["compute_model"] == "simulated"
    assert "compute: simulated" in est.to_table()


def test_an_rpc_server_running_cuda_pads_as_cuda_but_never_offloads(tmp_path):
    """ggml-rpc asks the server for alignment and alloc sizes (RPC_CMD_GET_ALIGNMENT / GET_ALLOC_SIZE):
    a CUDA rpc-server pads like CUDA0. The client's RPC device has no offload_op, so a host output
    matrix stays with its logits on the host whatever the batch."""
    from planner.hardware.inventory_yaml import load_inventory

    path = tmp_path / "inv.yaml"
    path.write_text("host: {ram: 32GiB}\n"
                    "devices:\n"
                    "  - {name: RPC0, endpoint: '127.0.0.1:50052', memory: 4GiB, remote_backend: CUDA}\n"
                    "  - {name: CUDA0, memory: 4GiB, compute_capability: 8.6}\n")
    inv = load_inventory(path)
    assert inv.devices[0].remote_backend is Backend.CUDA and inv.devices[1].compute_capability == 860
    rpc = estimate("example:gemma3-270m", ["--rpc", "127.0.0.1:50052", "-dev", "RPC0", "-ngl", "99", "-c", "4096"],
                   inv).device("RPC0")
    cuda = estimate("example:gemma3-270m", ["-dev", "CUDA0", "-ngl", "99", "-c", "4096"], inv).device("CUDA0")
    assert rpc is not None and cuda is not None
    assert rpc.model_bytes == cuda.model_bytes and rpc.context_bytes == cuda.context_bytes
    host_out = ["--rpc", "127.0.0.1:50052", "-dev", "RPC0", "-ngl", "99", "-c", "4096",
                "-ot", r"^token_embd\.weight=CPU"]
    on_rpc = estimate("example:gemma3-270m", host_out, inv)
    off = estimate("example:gemma3-270m", host_out + ["--no-op-offload"], inv)
    assert on_rpc.device("RPC0").compute_bytes == off.device("RPC0").compute_bytes < 64 * MiB
