"""Vulkan device limits (planner/hardware/vulkan_devices.py) and the placement rule they drive.

Expected figures are derived by hand from lavapipe's vulkaninfo (tests/data/vulkan_lavapipe.json)
and ggml-vulkan.cpp's formulas, not from the module.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from gguf import GGMLQuantizationType as Q

from planner.core.errors import FlagError
from planner.hardware.inventory import Backend, DeviceKind, HostSpec, Inventory
from planner.hardware.vulkan_devices import LAVAPIPE, vulkan_device_spec, vulkan_features
from planner.llama.flags import parse_llama_flags
from planner.llama.placement import CPU_REPACK, HOST, TensorSlot, WeightOp, assign_weights, resolve_devices

MIB, GIB = 2**20, 2**30


def test_lavapipe_limits_follow_ggml_vulkan():
    # maintenance4: max_memory_allocation_size = min(2 GiB, 4 GiB - 1); suballocation min(1 GiB, that)
    assert LAVAPIPE.alloc_limit == 2 * GIB
    assert LAVAPIPE.max_alloc == GIB
    # no 64-bit indexing: supports_op's limit is min(maxBufferSize, maxStorageBufferRange)
    assert LAVAPIPE.max_tensor_bytes == 128 * MIB
    assert replace(LAVAPIPE, shader_64bit_indexing=True).max_tensor_bytes == 0xFFFFFFFF
    assert (LAVAPIPE.alignment, LAVAPIPE.host_alignment) == (16, 64)


def test_features_are_found_by_llama_cpp_description():
    assert vulkan_features("llvmpipe (LLVM 15.0.6, 256 bits)") is LAVAPIPE
    assert vulkan_features("NVIDIA GeForce RTX 3090") is None
    spec = vulkan_device_spec(LAVAPIPE)
    # a CPU-type device is a GPU to llama.cpp (only INTEGRATED_GPU is an iGPU); heaps = free memory
    assert (spec.name, spec.kind, spec.backend, spec.total_bytes, spec.free_bytes) == (
        "Vulkan0", DeviceKind.GPU, Backend.VULKAN, 2 * GIB, 2 * GIB)


def _slots() -> tuple[TensorSlot, ...]:
    """Gemma 3 270M's tied embedding (Q8_0 [640, 262144]: 262144 x 640 / 32 x 34 bytes) and one
    small layer matrix."""
    embd = 262144 * 640 // 32 * 34
    return (TensorSlot("token_embd.weight", -1, WeightOp.GET_ROWS, Q.Q8_0, 262144, 2, embd, ne0=640),
            TensorSlot("blk.0.ffn_up.weight", 0, WeightOp.MUL_MAT, Q.Q8_0, 2048, 2, 2048 * 640 // 32 * 34, ne0=640),
            TensorSlot("output.weight", 1, WeightOp.MUL_MAT, Q.Q8_0, 262144, 2, embd,
                       duplicate_of="token_embd.weight", ne0=640))


def test_tied_output_stays_with_token_embd_on_lavapipe():
    # the output's test op: MUL_MAT against F32 [640, 512] gives F32 [262144, 512] = 512 MiB > 128 MiB
    flags = parse_llama_flags(["-ngl", "99"])
    host = HostSpec(64 * GIB, 64 * GIB, 0, "")
    lavapipe = resolve_devices(flags, Inventory((vulkan_device_spec(LAVAPIPE),), host))
    placed = assign_weights(_slots(), ("Vulkan0", "Vulkan0"), lavapipe, flags, {}).placed
    assert dict(placed) == {"token_embd.weight": HOST, "blk.0.ffn_up.weight": "Vulkan0"}   # no second copy
    # a Vulkan device of unknown limits takes it, as a GPU with a 4 GiB storage-buffer range would
    other = resolve_devices(flags, Inventory((replace(vulkan_device_spec(LAVAPIPE), description="AMD"),), host))
    placed = assign_weights(_slots(), ("Vulkan0", "Vulkan0"), other, flags, {}).placed
    assert dict(placed)["output.weight"] == "Vulkan0"
    assert CPU_REPACK not in dict(placed).values()


def test_an_override_of_a_weight_over_the_limit_is_refused_as_llama_cpp_aborts():
    # llama-fit-params -ot token_embd.weight=Vulkan0 on lavapipe: GGML_ABORT "pre-allocated tensor
    # (token_embd.weight) in a buffer (Vulkan0) that cannot run the operation (NONE)"
    flags = parse_llama_flags(["-ngl", "99", "-ot", "token_embd.weight=Vulkan0"])
    lavapipe = resolve_devices(flags, Inventory((vulkan_device_spec(LAVAPIPE),), HostSpec(64 * GIB, 64 * GIB, 0, "")))
    with pytest.raises(FlagError, match="token_embd.weight"):
        assign_weights(_slots(), ("Vulkan0", "Vulkan0"), lavapipe, flags, {})
    small = parse_llama_flags(["-ngl", "0", "-ot", r"blk\.0\.ffn_up=Vulkan0"])   # 0.7 MiB: llama.cpp runs it
    placed = assign_weights(_slots(), ("CPU", "CPU"), lavapipe, small, {}).placed
    assert dict(placed)["blk.0.ffn_up.weight"] == "Vulkan0"
