"""-sm tensor and -sm row as the pinned llama.cpp takes them (planner/llama/tensor_parallel.py).

Expected figures are worked out by hand from llama.cpp's rules: the meta device's name, alignment,
caps and member order (ggml-backend-meta.cpp, src/llama.cpp llama_prepare_model_devices), the
refusals (src/llama-arch.cpp llm_arch_supports_sm_tensor, src/llama-context.cpp, make_gpu_buft_list)
and the recurrent-state cut of llama_meta_device_get_split_state.
"""
from __future__ import annotations

import pytest

from planner.core.errors import FlagError
from planner.gguf.reader import read_model
from planner.hardware.inventory import Backend, DeviceKind, DeviceSpec, HostSpec, Inventory
from planner.llama.context import model_context
from planner.llama.flags import parse_llama_flags
from planner.llama.placement import resolve_devices
from planner.llama.settings import resolve_settings
from planner.llama.tensor_parallel import META_NAME, SM_TENSOR_UNSUPPORTED
from planner.synth.gguf_factory import llama_spec

GiB = 2**30


def _spec(kind: DeviceKind, backend: Backend, name: str, endpoint: str | None = None) -> DeviceSpec:
    return DeviceSpec(name=name, kind=kind, backend=backend, total_bytes=8 * GiB, free_bytes=8 * GiB,
                      bandwidth_bytes_s=0, fp16_flops=0, link_bytes_s=0, endpoint=endpoint)


def _inventory(*specs: DeviceSpec) -> Inventory:
    return Inventory(tuple(specs), HostSpec(64 * GiB, 64 * GiB, 0, "test"))


CUDA2 = _inventory(_spec(DeviceKind.GPU, Backend.CUDA, "CUDA0"), _spec(DeviceKind.GPU, Backend.CUDA, "CUDA1"))


@pytest.mark.parametrize("backend, name", [(Backend.CUDA, "CUDA0"), (Backend.ROCM, "ROCm0"),
                                           (Backend.VULKAN, "Vulkan0"), (Backend.METAL, "Metal0")])
def test_row_split_is_refused_with_llama_cpps_reason(backend, name):
    inv = _inventory(_spec(DeviceKind.GPU, backend, name))
    with pytest.raises(FlagError, match=f"device {name} does not support split buffers"):
        resolve_devices(parse_llama_flags(["-sm", "row"]), inv)


def test_row_split_over_rpc_is_refused_and_sycl_is_not_modelled():
    with pytest.raises(FlagError, match="device RPC0 does not support split buffers"):
        resolve_devices(parse_llama_flags(["-sm", "row", "--rpc", "127.0.0.1:1"]), None)
    with pytest.raises(FlagError, match="SYCL's split buffer type is not modelled"):
        resolve_devices(parse_llama_flags(["-sm", "row"]), _inventory(_spec(DeviceKind.GPU, Backend.SYCL, "SYCL0")))
    assert resolve_devices(parse_llama_flags(["-sm", "row"]), None) == ()   # CPU only: no split buffer asked


def test_tensor_split_makes_one_meta_device_in_registry_order():
    # no -dev: every non-CPU device in registry order, so the rpc-server comes after the GPUs
    inv = _inventory(_spec(DeviceKind.GPU, Backend.CUDA, "CUDA0"), _spec(DeviceKind.GPU, Backend.CUDA, "CUDA1"))
    [meta] = resolve_devices(parse_llama_flags(["-sm", "tensor", "--rpc", "127.0.0.1:1"]), inv)
    assert meta.name == META_NAME == "Meta()"
    assert [m.name for m in meta.members] == ["CUDA0", "CUDA1", "RPC0"]
    assert meta.alignment == 128                # the largest member's (CUDA's)
    assert not meta.has_host_buffer             # the members share no host buffer type
    profile = meta.profile
    assert (profile.offload_op, profile.async_events, profile.row_padding) == (False, False, 512)
    [cuda_meta] = resolve_devices(parse_llama_flags(["-sm", "tensor"]), CUDA2)
    assert cuda_meta.has_host_buffer            # both CUDA devices: CUDA_Host
    [picked] = resolve_devices(parse_llama_flags(["-sm", "tensor", "-dev", "CUDA1,CUDA0"]), CUDA2)
    assert [m.name for m in picked.members] == ["CUDA1", "CUDA0"]
    with pytest.raises(FlagError, match="needs >= 1 devices"):
        resolve_devices(parse_llama_flags(["-sm", "tensor"]), None)


def _context(spec, tmp_path, name="m.gguf"):
    [path] = spec.write(tmp_path / name)
    return model_context(read_model(path))


RPC2 = ["--rpc", "127.0.0.1:1,127.0.0.1:2"]


def test_tensor_split_refusals(tmp_path):
    dense = _context(llama_spec(), tmp_path)
    with pytest.raises(FlagError, match="requires flash_attn"):
        resolve_settings(dense, parse_llama_flags(["-sm", "tensor", "-fa", "off", *RPC2]))
    assert resolve_settings(dense, parse_llama_flags(["-sm", "tensor", *RPC2])).cparams.flash_attn
    assert {"deepseek2", "granitehybrid", "mamba", "t5"} <= SM_TENSOR_UNSUPPORTED
    with pytest.raises(FlagError, match="not implemented for architecture 'granitehybrid'"):
        resolve_settings(_context(llama_spec(arch="granitehybrid"), tmp_path, "h.gguf"),
                         parse_llama_flags(["-sm", "tensor", *RPC2]))
