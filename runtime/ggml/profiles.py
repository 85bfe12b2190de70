"""ggml's facts per backend at the pinned build: what the scheduler and the allocator ask of a device.

One table keyed by backend; every entry names the ggml file and function it comes from (the
llama.cpp in llama-cpp-python 0.3.36, commit 0c1e570). The planner's llama.cpp rules
(planner/llama), the runtime's devices (runtime/engine/runner.py) and the throughput model import
these; nothing else restates them.

What a profile answers:
- `offload_op`: whether the device takes an op whose weight sits in a CPU host buffer (seed 000
  "1.off") and from which batch (`op_offload_min_batch`, the `GGML_OP_OFFLOAD_MIN_BATCH`
  environment variable read with `atoi`, default 32), and for which ops (Metal: matmuls only);
  the batch of an op is `op_batch_size` (GET_ROWS counts 0, so embedding lookups never move);
- `alloc_size`: the bytes a buffer of the device takes for a tensor (`get_alloc_size`): CUDA,
  ROCm and SYCL pad a quantized tensor whose rows are not a multiple of MATRIX_ROW_PADDING, and
  CUDA's flash-attention nodes reserve f16 copies of non-f16 K/V for the kernel chosen by the
  device's compute capability;
- buffer alignment, the pinned host buffer type (`caps.host_buffer`, first in llama.cpp's
  make_cpu_buft_list), `caps.async`/`caps.events` (pipeline parallelism needs both);
- `outside_breakdown`: memory the backend allocates that llama.cpp's breakdown does not list.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
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
# The default of GGML_OP_OFFLOAD_MIN_BATCH (ggml-cuda.cu ggml_backend_cuda_reg, ggml-vulkan.cpp
# ggml_backend_vk_reg_get_device, ggml-sycl.cpp, ggml-metal-device.m): an op of at least this batch
# whose weight sits in host memory runs on the device.
GGML_OP_OFFLOAD_MIN_BATCH = 32
OP_OFFLOAD_ENV = "GGML_OP_OFFLOAD_MIN_BATCH"
# ggml-cuda/common.cuh MATRIX_ROW_PADDING (ggml-sycl/common.hpp has the same value).
MATRIX_ROW_PADDING = 512
# ggml-cuda/common.cuh GGML_CUDA_CC_TURING / GGML_CUDA_CC_ADA_LOVELACE (compute capability x 100 + x 10).
CC_TURING = 750
CC_ADA_LOVELACE = 890
DEFAULT_CUDA_CC = 900   # the lent GPU's (H200, Hopper) when an inventory names none


def atoi(text: str) -> int:
    """C's atoi: leading blanks, an optional sign, then digits; anything else reads as 0."""
    m = re.match(r"\s*([+-]?\d+)", text)
    return int(m.group(1)) if m else 0


def op_offload_min_batch(env: Mapping[str, str] | None = None) -> int:
    """The batch from which offloading backends take host-weight ops, as their registries read it."""
    value = (os.environ if env is None else env).get(OP_OFFLOAD_ENV)
    return GGML_OP_OFFLOAD_MIN_BATCH if value is None else atoi(value)


# ops by the names runtime/ggml/graph.py Op values carry (ggml_op_name spellings)
GET_ROWS, MUL_MAT, MUL_MAT_ID, ROPE, ROPE_BACK = "GET_ROWS", "MUL_MAT", "MUL_MAT_ID", "ROPE", "ROPE_BACK"


def op_batch_size(op: str, ne: tuple[int, ...], n_rows: int, rule: str = "cuda") -> int:
    """get_op_batch_size: ggml-cuda.cu / ggml-vulkan-debug.cpp / ggml-sycl.cpp (rule "cuda"),
    ggml-metal.cpp (rule "metal": no GET_ROWS or ROPE case)."""
    if rule == "cuda":
        if op == GET_ROWS:
            return 0
        if op in (MUL_MAT_ID, ROPE, ROPE_BACK):
            return ne[2]
    elif op == MUL_MAT_ID:
        return ne[2]
    if op == MUL_MAT:
        return ne[1]
    return n_rows


@dataclass(frozen=True)
class OutsideTerm:
    """Memory a backend allocates outside llama.cpp's breakdown: what it is, where it comes from,
    and its size when the source fixes it (None: it depends on the driver and is left to the
    device margin of planner/hardware/budgets.py until a real device has measured it)."""

    name: str
    source: str
    bytes: int | None = None


@dataclass(frozen=True)
class BackendProfile:
    alignment: int                 # buffer alignment of the device's buffer type (get_alignment)
    offload_op: bool               # the device implements offload_op
    host_buffer: bool              # caps.host_buffer: a pinned host buffer type first in make_cpu_buft_list
    async_events: bool             # caps.async and caps.events: pipeline parallelism possible
    offload_ops: frozenset[str] | None = None   # ops offload_op may take (None: any)
    batch_rule: str = "cuda"       # which get_op_batch_size
    row_padding: int = 0           # get_alloc_size pads quantized rows to a multiple of this (0: none)
    fa_f16_staging: bool = False   # FLASH_ATTN_EXT reserves f16 copies of non-f16 K/V (CUDA, by kernel)
    fusion_alloc_deps: bool = False   # graph_optimize keeps fused groups' tensors alive (runtime/ggml/cuda_fusion.py)
    graph_reorder: bool = False       # graph_optimize reorders each split's nodes (runtime/ggml/vulkan_reorder.py)
    sources: tuple[str, ...] = ()
    outside_breakdown: tuple[OutsideTerm, ...] = field(default=())

    def offload_min_batch(self, env: Mapping[str, str] | None = None) -> int | None:
        """The offload threshold of this backend's devices now; None: the backend never offloads."""
        return op_offload_min_batch(env) if self.offload_op else None

    def wants_op(self, op: str, ne: tuple[int, ...], n_rows: int, min_batch: int) -> bool:
        """offload_op for one op."""
        if self.offload_ops is not None and op not in self.offload_ops:
            return False
        return op_batch_size(op, ne, n_rows, self.batch_rule) >= min_batch


_CUDA_OUTSIDE = (
    OutsideTerm("CUDA context", "created by the driver on first use of the device (cudaSetDevice)"),
    OutsideTerm("cuBLAS handle and workspace", "ggml-cuda/common.cuh ggml_backend_cuda_context::cublas_handle"),
    OutsideTerm("ggml_cuda_pool (VMM or legacy)", "ggml-cuda.cu ggml_cuda_pool_vmm / ggml_cuda_pool_leg: "
                "temporaries of matmuls, converted weights and FA partial results, grown on use"),
)

PROFILES: dict[Backend, BackendProfile] = {
    Backend.CPU: BackendProfile(
        TENSOR_ALIGNMENT, offload_op=False, host_buffer=False, async_events=False,
        sources=("ggml-cpu/ggml-cpu.cpp: no offload_op; ggml-backend.cpp ggml_backend_cpu_buffer_type "
                 "get_alignment TENSOR_ALIGNMENT",)),
    Backend.RPC: BackendProfile(
        TENSOR_ALIGNMENT, offload_op=False, host_buffer=False, async_events=True,
        sources=("ggml-rpc.cpp ggml_backend_rpc_device_i: offload_op NULL; caps async+events, no host buffer; "
                 "alignment and alloc size asked of the server (RPC_CMD_GET_ALIGNMENT / GET_ALLOC_SIZE)",)),
    Backend.CUDA: BackendProfile(
        CUDA_ALIGNMENT, offload_op=True, host_buffer=True, async_events=True,
        row_padding=MATRIX_ROW_PADDING, fa_f16_staging=True, fusion_alloc_deps=True,
        sources=("ggml-cuda.cu ggml_backend_cuda_device_offload_op / get_op_batch_size",
                 "ggml-cuda.cu ggml_backend_cuda_graph_optimize (add_alloc_dep for the MoE fusions)",
                 "ggml-cuda.cu ggml_backend_cuda_buffer_type_get_alloc_size [TAG_ALLOC_SIZE_EXPAND]",
                 "ggml-cuda/fattn.cu ggml_cuda_flash_attn_ext_get_alloc_size, ggml_cuda_get_best_fattn_kernel",
                 "ggml-cuda.cu ggml_backend_cuda_device_get_props caps (GGML_CUDA_NO_PINNED drops the host buffer)"),
        outside_breakdown=_CUDA_OUTSIDE),
    # ggml-hip builds the ggml-cuda sources: the same rules (HIP's FA kernels differ; no f16 staging modelled)
    Backend.ROCM: BackendProfile(
        CUDA_ALIGNMENT, offload_op=True, host_buffer=True, async_events=True,
        row_padding=MATRIX_ROW_PADDING, fusion_alloc_deps=True,
        sources=("ggml-hip/CMakeLists.txt compiles ../ggml-cuda/*.cu: ggml-cuda.cu rules",),
        outside_breakdown=_CUDA_OUTSIDE),
    # Vulkan's alignment is the device's minStorageBufferOffsetAlignment (lavapipe and most GPUs: <= 64);
    # get_alloc_size is ggml_nbytes; the largest allocation is the device's suballocation block.
    Backend.VULKAN: BackendProfile(
        TENSOR_ALIGNMENT, offload_op=True, host_buffer=True, async_events=True, graph_reorder=True,
        sources=("ggml-vulkan.cpp ggml_vk_graph_optimize (node order of each split, top-k MoE alloc deps)",
                 "ggml-vulkan.cpp ggml_backend_vk_device_offload_op, ggml-vulkan-debug.cpp ggml_vk_get_op_batch_size",
                 "ggml-vulkan.cpp ggml_backend_vk_buffer_type_get_alignment / get_alloc_size (= ggml_nbytes)",
                 "ggml-vulkan.cpp ggml_backend_vk_device_get_props caps"),
        outside_breakdown=(OutsideTerm(
            "Vulkan instance, pipelines and descriptor pools",
            "ggml-vulkan.cpp ggml_vk_load_shaders / ggml_pipeline_allocate_descriptor_sets"),)),
    Backend.SYCL: BackendProfile(
        TENSOR_ALIGNMENT, offload_op=True, host_buffer=True, async_events=True,
        row_padding=MATRIX_ROW_PADDING,
        sources=("ggml-sycl.cpp ggml_backend_sycl_device_offload_op, ggml_backend_sycl_buffer_type_get_alloc_size",)),
    Backend.METAL: BackendProfile(
        TENSOR_ALIGNMENT, offload_op=True, host_buffer=False, async_events=True,
        offload_ops=frozenset({MUL_MAT, MUL_MAT_ID}), batch_rule="metal",
        sources=("ggml-metal.cpp ggml_backend_metal_device_offload_op (MUL_MAT, MUL_MAT_ID only)",
                 "ggml-metal.cpp ggml_backend_metal_buffer_type_get_alloc_size: MUL_MAT_ID and FA extras "
                 "not modelled",)),
}


def row_padding_bytes(block: int, type_size: int, ne0: int, padding: int) -> int:
    """What get_alloc_size adds to a tensor of `ne0`-value rows on a buffer that pads quantized rows
    to a multiple of `padding` values (ggml-cuda.cu [TAG_ALLOC_SIZE_EXPAND], ggml-sycl.cpp): one
    ggml_row_size of the missing values; nothing for a type that is not block-quantized."""
    if not padding or block == 1 or ne0 % padding == 0:
        return 0
    return (padding - ne0 % padding) // block * type_size


def device_profile(backend: Backend, remote: Backend | None = None) -> BackendProfile:
    """The profile of one device. An rpc-server forwards allocation questions to its own backend
    (ggml-rpc.cpp RPC_CMD_GET_ALIGNMENT, RPC_CMD_GET_ALLOC_SIZE), so a remote CUDA device pads and
    aligns as CUDA does, while the client's scheduler sees no offload_op (the RPC device has none)."""
    profile = PROFILES[backend]
    if backend is not Backend.RPC or remote is None or remote is Backend.RPC:
        return profile
    far = PROFILES[remote]
    return replace(profile, alignment=far.alignment, row_padding=far.row_padding, fa_f16_staging=far.fa_f16_staging,
                   sources=profile.sources + far.sources)


def fa_kernel_needs_f16(cc: int, n_q: int, head_dim: int, quantized: bool) -> bool:
    """Whether CUDA's flash-attention kernel for this node converts non-f16 K/V to f16 in its
    buffer (ggml-cuda/fattn.cu): the tile and MMA kernels do; the vector kernel, chosen for one
    or two query rows on a head size it has, converts only f32 caches."""
    vector_capable = head_dim <= 256 and head_dim % 64 == 0
    if not (vector_capable and quantized):
        return True
    vector_rows = 2 if cc >= CC_ADA_LOVELACE else 1
    return n_q > vector_rows

