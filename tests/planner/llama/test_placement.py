"""Layer, weight and device placement as the pinned llama.cpp does it (src/llama-model.cpp load_tensors,
src/llama.cpp llama_prepare_model_devices, src/llama-model-loader.cpp create_tensor).

Expected placements are worked out by hand: with n_layer_all = 4 there are 5 placeable layers
(the output layer is index 4); layer il goes to the first device whose cumulative share exceeds
(il - i_gpu_start) / act_gpu_layers, i_gpu_start = 5 - ngl.
"""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q

from planner.core.errors import FlagError
from planner.gguf.reader import read_model
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.flags import parse_llama_flags
from planner.llama.placement import (
    CPU_REPACK,
    HOST,
    Device,
    TensorSlot,
    WeightOp,
    layer_devices,
    place,
    resolve_devices,
    tensor_slots,
)
from planner.synth.gguf_factory import llama_spec

GiB = 2**30
A = Device("A", Backend.RPC, 32, 1 * GiB, False, "127.0.0.1:1")
B = Device("B", Backend.RPC, 32, 3 * GiB, False, "127.0.0.1:2")
REPACK = {Q.Q4_K: 8}   # the x86 AVX2 rule for Q4_K: rows divisible by 8


def _spec(kind: DeviceKind, backend: Backend, name: str, endpoint: str | None = None) -> DeviceSpec:
    return DeviceSpec(name=name, kind=kind, backend=backend, total_bytes=8 * GiB, free_bytes=8 * GiB,
                      bandwidth_bytes_s=0, fp16_flops=0, link_bytes_s=0, endpoint=endpoint)


@pytest.mark.parametrize("ngl, ts, expected", [
    (-1, (1, 1), ("A", "A", "A", "B", "B")),          # 0, .2, .4 < .5; .6, .8 >= .5
    (-2, (3, 1), ("A", "A", "A", "A", "B")),          # only .8 reaches the last quarter
    (2, (1, 1), ("CPU", "CPU", "CPU", "A", "B")),     # i_gpu_start 3: layer 3 -> 0/2, output -> 1/2
    (1, (1, 1), ("CPU", "CPU", "CPU", "CPU", "A")),   # -ngl 1 offloads the output layer first
    (0, (1, 1), ("CPU",) * 5),
    (99, (0, 1), ("B",) * 5),                         # a zero share gets nothing
    (-1, (), ("A", "A", "B", "B", "B")),              # no -ts: free memory 1:3, so .4 passes .25
])
def test_layer_split(ngl, ts, expected):
    layers, _ = layer_devices(4, ngl, (A, B), tuple(float(x) for x in ts))
    assert layers == expected


def test_no_devices_keeps_every_layer_on_the_cpu():
    assert layer_devices(4, -1, (), ())[0] == ("CPU",) * 5


def test_rpc_devices_come_first_and_dev_reorders():
    inv = Inventory((_spec(DeviceKind.GPU, Backend.CUDA, "CUDA0"),), HostSpec(0, 0, 0, ""))
    flags = parse_llama_flags(["--rpc", "127.0.0.1:7000"])
    assert [d.name for d in resolve_devices(flags, inv)] == ["RPC0", "CUDA0"]
    flags = parse_llama_flags(["--rpc", "127.0.0.1:7000", "-dev", "CUDA0,RPC0"])
    assert [d.name for d in resolve_devices(flags, inv)] == ["CUDA0", "RPC0"]
    assert resolve_devices(parse_llama_flags(["-dev", "none"]), inv) == ()


def test_split_mode_none_keeps_the_main_gpu():
    inv = Inventory((_spec(DeviceKind.GPU, Backend.CUDA, "CUDA0"), _spec(DeviceKind.GPU, Backend.CUDA, "CUDA1")),
                    HostSpec(0, 0, 0, ""))
    assert [d.name for d in resolve_devices(parse_llama_flags(["-sm", "none", "-mg", "1"]), inv)] == ["CUDA1"]
    with pytest.raises(FlagError, match="invalid main GPU"):
        resolve_devices(parse_llama_flags(["-sm", "none", "-mg", "2"]), inv)


def test_igpu_dropped_when_a_gpu_exists():
    inv = Inventory((_spec(DeviceKind.IGPU, Backend.VULKAN, "Vulkan1"), _spec(DeviceKind.GPU, Backend.CUDA, "CUDA0")),
                    HostSpec(0, 0, 0, ""))
    assert [d.name for d in resolve_devices(parse_llama_flags([]), inv)] == ["CUDA0"]


def test_unknown_device_is_refused():
    with pytest.raises(FlagError, match="invalid device 'CUDA7'"):
        resolve_devices(parse_llama_flags(["-dev", "CUDA7"]), None)


@pytest.fixture
def tied_llama(tmp_path):
    # 4 layers, n_embd 256: Q4_K attention (rows 256 / 64, both divisible by 8), tied embeddings
    spec = llama_spec(n_layer=4, n_embd=256, n_head=8, n_head_kv=2, n_ff=512, out_type=None)
    [path] = spec.write(tmp_path / "m.gguf")
    model = read_model(path)
    return tensor_slots(model, 4)


def _rows(placement) -> dict[str, str]:
    return dict(placement.tensor_buft)


def test_tied_output_is_a_second_copy_only_on_another_device(tied_llama):
    slots = tied_llama
    out = [s for s in slots if s.name == "output.weight"]
    assert len(out) == 1 and out[0].duplicate_of == "token_embd.weight" and out[0].op is WeightOp.MUL_MAT
    on_a = place(slots, 4, parse_llama_flags(["-ts", "1,1"]), (A, B), REPACK)
    assert _rows(on_a)["output.weight"] == "B" and _rows(on_a)["token_embd.weight"] == HOST
    cpu_only = place(slots, 4, parse_llama_flags([]), (), REPACK)
    # token_embd is Q8_0 (no repack): the duplicate lands in the same CPU buffer, so it is not created
    assert "output.weight" not in _rows(cpu_only)


def test_cpu_weights_repack_by_type_and_op(tied_llama):
    rows = _rows(place(tied_llama, 4, parse_llama_flags(["-ngl", "0"]), (A, B), REPACK))
    assert rows["blk.0.attn_q.weight"] == CPU_REPACK      # Q4_K matmul, 256 rows
    assert rows["blk.0.ffn_down.weight"] == HOST          # Q6_K: no x86 repack
    assert rows["blk.0.attn_norm.weight"] == HOST         # F32 norm
    assert rows["token_embd.weight"] == HOST              # GET_ROWS never repacks
    rows = _rows(place(tied_llama, 4, parse_llama_flags(["-ngl", "0", "-nr"]), (A, B), REPACK))
    assert rows["blk.0.attn_q.weight"] == HOST


def test_overrides_first_match_wins_and_cpu_keeps_repack(tied_llama):
    b = "RPC0[127.0.0.1:2]"  # ggml-rpc's buffer type name for device B, the only one llama.cpp accepts
    flags = parse_llama_flags(["-ts", "1,1", "-ot", r"blk\.3\.ffn_up=CPU", "-ot", rf"ffn_up={b},blk\.0\.={b}"])
    p = place(tied_llama, 4, flags, (A, B), REPACK)
    rows = _rows(p)
    assert rows["blk.3.ffn_up.weight"] == CPU_REPACK      # first rule; Q4_K with 512 rows
    assert rows["blk.0.ffn_up.weight"] == "B"             # second rule before the third
    assert rows["blk.0.attn_q.weight"] == "B"             # third rule
    assert rows["blk.1.attn_q.weight"] == "A"             # no rule: its layer's device
    assert ("blk.3.ffn_up.weight", "CPU") in p.moved and ("blk.1.ffn_up.weight", b) in p.moved
    assert not p.pipeline_parallel                         # any override turns pipelining off


def test_unknown_override_target_is_refused(tied_llama):
    with pytest.raises(FlagError, match="unknown buffer type 'CUDA9'"):
        place(tied_llama, 4, parse_llama_flags(["-ot", "exps=CUDA9"]), (A, B), REPACK)


def test_rpc_device_name_is_not_a_buffer_type(tied_llama):
    # llama-fit-params with two rpc-servers: "-ot x=RPC1" -> 'unknown buffer type'; the buffer
    # types it lists are CPU and RPC0[host:port] for every server
    with pytest.raises(FlagError, match="unknown buffer type 'B'"):
        place(tied_llama, 4, parse_llama_flags(["-ot", "ffn_up=B"]), (A, B), REPACK)


def test_rpc_buffer_type_name_is_accepted(tied_llama):
    p = place(tied_llama, 4, parse_llama_flags(["-ot", "ffn_up=RPC0[127.0.0.1:2]"]), (A, B), REPACK)
    assert _rows(p)["blk.0.ffn_up.weight"] == "B"


@pytest.mark.parametrize("argv, expected", [
    (["-ts", "1,1"], True),                    # two devices, every layer, layer split, KV offloaded
    (["-ts", "1,1", "-ngl", "4"], False),      # the output layer stays on the CPU
    (["-ts", "1,1", "-nkvo"], False),
    (["-ts", "1,1", "-sm", "none"], False),
])
def test_pipeline_parallel_conditions(tied_llama, argv, expected):
    assert place(tied_llama, 4, parse_llama_flags(argv), (A, B), REPACK).pipeline_parallel is expected


def test_inventory_rpc_devices_need_their_endpoint_in_rpc():
    inv = Inventory((_spec(DeviceKind.RPC, Backend.RPC, "RPC0", "10.1.1.1:50052"),), HostSpec(0, 0, 0, ""))
    assert resolve_devices(parse_llama_flags([]), inv) == ()
    assert [d.name for d in resolve_devices(parse_llama_flags(["--rpc", "10.1.1.1:50052"]), inv)] == ["RPC0"]


def test_rope_freqs_has_one_copy_in_each_buffer_type_of_the_layers(tmp_path):
    """Llama 3.1's rope_freqs.weight: src/models/llama.cpp creates it for every layer in that layer's buffer
    type (TENSOR_DUPLICATED for i != 0), create_tensor reusing a copy already in the same one. -ngl 4 of 5
    placeable layers (i_gpu_start 1, 4 offloaded): block 0 on the CPU; blocks 1 and 2 on A ((il - 1) / 4 =
    0, 0.25 below the split point 0.5), block 3 and the output on B (0.5, 0.75); each device and the host
    hold one copy, read by the layers there."""
    spec = llama_spec(n_layer=4, n_embd=256, n_head=8, n_head_kv=2, n_ff=512)
    spec.tensors.append(("rope_freqs.weight", Q.F32, (16,)))
    [path] = spec.write(tmp_path / "m.gguf")
    p = place(tensor_slots(read_model(path), 4), 4, parse_llama_flags(["-ngl", "4", "-ts", "1,1"]), (A, B), REPACK)
    assert p.layer_device == ("CPU", "A", "A", "B", "B")
    rows = _rows(p)
    copies = {name: row for name, row in rows.items() if name.startswith("rope_freqs.weight")}
    assert copies == {"rope_freqs.weight": HOST, "rope_freqs.weight#1": "A", "rope_freqs.weight#3": "B"}
    assert dict(p.aliases) == {"rope_freqs.weight#2": "rope_freqs.weight#1"}


def test_a_weight_over_the_host_devices_tensor_limit_skips_the_host_buffer(tied_llama):
    # make_cpu_buft_list lists the host buffer type with its device (Vulkan0): weight_buft_supported asks
    # that device's supports_op, which refuses a tensor over its limit, so the weight passes on to the
    # repack buffer (Q4_K matmul rows divisible by 8) or, failing that, the plain CPU buffer. Layer 0's
    # ffn_up is [256, 512] Q4_K: 73,728 bytes; its test MUL_MAT's result [512, 512] f32 is 1 MiB.
    limit = 2**20 - 1
    vk = Device("Vulkan0", Backend.VULKAN, 16, 8 * GiB, True, max_tensor_bytes=limit)
    rows = _rows(place(tied_llama, 4, parse_llama_flags(["-ngl", "0"]), (vk,), REPACK))
    assert rows["blk.0.ffn_up.weight"] == CPU_REPACK      # the test op's result is over the limit
    assert rows["blk.0.attn_norm.weight"] == HOST         # small: the host buffer takes it
    roomy = Device("Vulkan0", Backend.VULKAN, 16, 8 * GiB, True, max_tensor_bytes=2**30)
    assert _rows(place(tied_llama, 4, parse_llama_flags(["-ngl", "0"]), (roomy,), REPACK))["blk.0.ffn_up.weight"] \
        == HOST


def test_host_buffer_passes_weights_over_its_devices_tensor_limit_to_repack_and_cpu():
    """make_cpu_buft_list tries the first device's host buffer before the repack buffer, and
    weight_buft_supported asks that device's supports_op: a Vulkan device refuses a weight larger than its
    maxStorageBufferRange, so the weight goes to the next type that takes it (a stacked Q4_K expert
    tensor of 8-divisible rows: CPU_REPACK; llama-fit-params on lavapipe keeps Qwen3.5-35B-A3B's 288 MiB
    expert tensors out of the Vulkan_Host row)."""
    vk = Device("Vulkan0", Backend.VULKAN, 64, 2 * GiB, True, max_tensor_bytes=128 * 2**20)
    big = TensorSlot("blk.0.ffn_up_exps.weight", 0, WeightOp.MUL_MAT_ID, Q.Q4_K, 512, 3, 288 * 2**20, ne0=2048)
    small = TensorSlot("blk.0.ffn_gate_inp.weight", 0, WeightOp.MUL_MAT, Q.Q4_K, 256, 2, 1 * 2**20, ne0=2048)
    flags = parse_llama_flags(["-ngl", "0"])
    rows = dict(place((big, small), 1, flags, (vk,), REPACK).tensor_buft)
    assert rows == {"blk.0.ffn_up_exps.weight": CPU_REPACK, "blk.0.ffn_gate_inp.weight": HOST}
