"""ggml's facts per backend at the pinned build: what the scheduler and the allocator ask of a device.

One table keyed by backend; every figure names the ggml file it comes from (the llama.cpp in
llama-cpp-python 0.3.36, commit 0c1e570). The planner's llama.cpp rules (planner/llama) and the
throughput model import these; nothing else restates them.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Backend(str, Enum):
    """The ggml backends fitplan knows, by the names their registries use."""

    CUDA = "CUDA"
    ROCM = "ROCm"
    VULKAN = "Vulkan"
    METAL = "Metal"
    SYCL = "SYCL"
    CPU = "CPU"
    RPC = "RPC"


# ggml-impl.h TENSOR_ALIGNMENT: the CPU buffer type's alignment (host buffers, rpc-servers on a CPU).
TENSOR_ALIGNMENT = 32
# ggml-cuda.cu ggml_backend_cuda_buffer_type_get_alignment.
CUDA_ALIGNMENT = 128
# ggml-backend.cpp GGML_SCHED_MAX_COPIES: pipeline-parallel copies of every graph input and crossing tensor.
GGML_SCHED_MAX_COPIES = 4
# The default of GGML_OP_OFFLOAD_MIN_BATCH (ggml-cuda.cu, ggml-vulkan.cpp, ggml-sycl.cpp offload_op):
# an op of at least this batch whose weight sits in host memory runs on the device.
GGML_OP_OFFLOAD_MIN_BATCH = 32


@dataclass(frozen=True)
class BackendProfile:
    alignment: int                 # buffer alignment of the device's buffer type
    offload_min_batch: int | None  # offload_op threshold; None: the backend has no offload_op
    host_buffer: bool              # offers a pinned host buffer type (make_cpu_buft_list puts it first)


# Vulkan, SYCL and Metal alignments vary by device: the CPU's value is used, which moves a model
# buffer by less than 1 KiB per tensor. ggml-rpc implements no offload_op; Metal's is not modelled.
PROFILES: dict[Backend, BackendProfile] = {
    Backend.CPU: BackendProfile(TENSOR_ALIGNMENT, None, False),
    Backend.RPC: BackendProfile(TENSOR_ALIGNMENT, None, False),
    Backend.CUDA: BackendProfile(CUDA_ALIGNMENT, GGML_OP_OFFLOAD_MIN_BATCH, True),
    Backend.ROCM: BackendProfile(CUDA_ALIGNMENT, GGML_OP_OFFLOAD_MIN_BATCH, True),
    Backend.VULKAN: BackendProfile(TENSOR_ALIGNMENT, GGML_OP_OFFLOAD_MIN_BATCH, True),
    Backend.SYCL: BackendProfile(TENSOR_ALIGNMENT, GGML_OP_OFFLOAD_MIN_BATCH, True),
    Backend.METAL: BackendProfile(TENSOR_ALIGNMENT, None, False),
}
