"""llama.cpp's tensor-parallel mode (`-sm tensor`) and row split (`-sm row`) at the pinned build:
which models and flags it accepts, and what the one meta device it builds looks like.

Sources (llama.cpp in llama-cpp-python 0.3.36):
- src/llama.cpp llama_prepare_model_devices: with LLAMA_SPLIT_MODE_TENSOR llama.cpp pushes exactly
  one device, `ggml_backend_meta_device(devs...)`, into model.devices; without -dev its members are
  every registered device whose buffer type is not the CPU's, in registry order (no RPC-first
  reordering, no same-card filter), and none at all is an error ("needs >= 1 devices").
- ggml/src/ggml-backend-meta.cpp: the meta device's name is built in its context's constructor
  from the moved-from member list, so it reads `Meta()` whatever the members (the name
  --fit-print prints on its row); get_alignment is the largest member's, get_alloc_size the
  largest member's for the FULL tensor, caps.host_buffer and caps.events are false (no pipeline
  parallelism), offload_op is NULL (no op offload), get_host_buffer_type is the members' common
  host buffer type or none.
- src/llama-model.cpp llama_model_create: "LLAMA_SPLIT_MODE_TENSOR not implemented for
  architecture" for llm_arch_supports_sm_tensor's deny-list (src/llama-arch.cpp).
- src/llama-context.cpp llama_init_from_model: -fa auto becomes on, -fa off fails the context
  ("SPLIT_MODE_TENSOR requires flash_attn to be enabled").
- what the dry run cannot see (a graph the meta backend cannot split aborts at its first token) is
  found by resolving the graphs: runtime/engine/meta_check.py, asked by planner/memory/estimate.py.
- -sm row: src/llama-model.cpp make_gpu_buft_list throws "device X does not support split
  buffers" unless the device's registry exports ggml_backend_split_buffer_type, which at this
  pin only ggml-sycl.cpp (and ggml-hexagon.cpp) do.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gguf import GGML_QUANT_SIZES

from planner.core.errors import FlagError
from planner.gguf.reader import ModelFile
from planner.model.arch import AttnKind, ModelFacts
from runtime.ggml.meta import slice_counts
from runtime.ggml.profiles import Backend, BackendProfile

# ggml-backend-meta.cpp ggml_backend_meta_device_context: the printed name (see the module docstring).
META_NAME = "Meta()"

# src/llama-arch.cpp llm_arch_supports_sm_tensor: architectures (GGUF names, LLM_ARCH_NAMES) llama.cpp
# refuses to split by tensors.
SM_TENSOR_UNSUPPORTED: frozenset[str] = frozenset({
    "grok", "mpt", "plamo2", "minicpm3", "gemma3n", "mamba", "mamba2", "jamba", "falcon-h1", "olmo2", "olmoe",
    "deepseek2", "deepseek32", "hy_v4", "dots3note", "glm-dsa", "bitnet", "t5", "nemotron_h", "nemotron_h_moe",
    "granitehybrid", "minimax-01", "minimax-m2", "minimax-m3", "mistral4", "kimi-linear", "bailingmoe3", "kimi-k3",
    "glm5-next", "qwen3tts", "qwen4exp",
})

# Registries that export ggml_backend_split_buffer_type at the pin (only these take -sm row).
ROW_SPLIT_BACKENDS = frozenset({Backend.SYCL})


def check_row_split(device_names: Sequence[str], backends: Sequence[Backend]) -> None:
    """-sm row over devices: llama.cpp refuses every backend but SYCL; fitplan does not model SYCL's
    split buffer type either, so both refuse, with llama.cpp's reason where it has one."""
    for name, backend in zip(device_names, backends, strict=True):
        if backend not in ROW_SPLIT_BACKENDS:
            raise FlagError(f"-sm row: llama.cpp refuses it: 'device {name} does not support split buffers' "
                            f"(src/llama-model.cpp make_gpu_buft_list; at this pin only SYCL exports "
                            f"ggml_backend_split_buffer_type)")
    if device_names:
        raise FlagError("-sm row: SYCL's split buffer type is not modelled by fitplan (use -sm layer or -sm tensor)")


def check_tensor_split(arch: str, flash_attn: str) -> None:
    """What llama.cpp refuses, or aborts on, under -sm tensor before any memory is sized."""
    if arch in SM_TENSOR_UNSUPPORTED:
        raise FlagError(f"-sm tensor: llama.cpp refuses it: 'LLAMA_SPLIT_MODE_TENSOR not implemented for "
                        f"architecture {arch!r}' (src/llama-arch.cpp llm_arch_supports_sm_tensor)")
    if flash_attn == "off":
        raise FlagError("-sm tensor: llama.cpp fails the context: 'SPLIT_MODE_TENSOR requires flash_attn to be "
                        "enabled' (src/llama-context.cpp; -fa auto turns it on)")


NO_MEMBERS = ("-sm tensor: llama.cpp needs at least one device besides the CPU "
              "('LLAMA_SPLIT_MODE_TENSOR needs >= 1 devices')")


def meta_profile(members: Sequence[BackendProfile]) -> BackendProfile:
    """The meta device's profile: the largest alignment and quantized-row padding (get_alloc_size is
    the largest member's), f16 staging if any member stages, no offload_op, no pipeline parallelism.
    `host_buffer` says whether make_cpu_buft_list finds a host buffer type; whether the members share
    one is the caller's (Device.has_host_buffer)."""
    first = members[0]
    return replace(first, alignment=max(p.alignment for p in members), offload_op=False, host_buffer=False,
                   async_events=False, offload_ops=None, row_padding=max(p.row_padding for p in members),
                   fa_f16_staging=any(p.fa_f16_staging for p in members),
                   sources=("ggml-backend-meta.cpp: get_alignment max, get_alloc_size max of the full tensor, "
                            "offload_op NULL, caps.host_buffer/events false",),
                   outside_breakdown=tuple(t for p in members for t in p.outside_breakdown))


# The kernels' preferred slice multiple in llama-model.cpp get_split_granularity: lcm(blck_size, 128)
# for FFN matrices and linear-attention tensors, the bound up to which attention grows its block
# (runtime/engine/tensor_split.py imports it).
PERF_BLOCK = 128
# Architectures whose recurrent states llama.cpp mirrors (llama_meta_device_get_split_state: "the LFM2
# shortconv block runs fully mirrored"), and those whose state layout it segments by key/value heads.
MIRRORED_STATES = frozenset({"lfm2", "lfm2moe"})
_QWEN3NEXT = "qwen3next"
SEGMENTED_STATES = frozenset({_QWEN3NEXT, "qwen35", "qwen35moe"})


@dataclass(frozen=True)
class StateSlices:
    """One recurrent layer's r and s states as the meta device's members hold them (f32 elements per
    sequence row, one entry per member)."""

    r: tuple[int, ...]
    s: tuple[int, ...]


def _cut(segments: Sequence[tuple[int, int]], granularity: int, n_devices: int, rotation: int,
         weights: Sequence[float] | None) -> tuple[int, ...]:
    """Elements per member of a segmented AXIS_0 split: every segment is cut on its own, a member
    holds nr copies of its cut of each (the PARTIAL/AXIS loop at the end of get_split_state)."""
    out = [0] * n_devices
    for ne, nr in segments:
        for j, n in enumerate(slice_counts(ne, n_devices, granularity, rotation, weights)):
            out[j] += n * nr
    return tuple(out)


def state_slices(model: ModelFile, facts: ModelFacts, layer: int, n_devices: int,
                 tensor_split: Sequence[float] = ()) -> StateSlices | None:
    """How llama_meta_device_get_split_state cuts a recurrent layer's `cache_r_l*` / `cache_s_l*`
    over `n_devices` (AXIS_0, the type of ssm_out.weight setting the block size, the layer's rotation
    counted over earlier recurrent layers). None: the states are mirrored (every member holds them
    whole) or the architecture's layout is not one fitplan knows, so the full size stands."""
    arch = model.architecture
    if arch not in SEGMENTED_STATES:
        return None
    meta = model.metadata
    d_state = int(meta[f"{arch}.ssm.state_size"])
    n_k_heads = int(meta[f"{arch}.ssm.group_count"])
    n_v_heads = int(meta[f"{arch}.ssm.time_step_rank"])
    d_conv = int(meta[f"{arch}.ssm.conv_kernel"])
    out = model.tensor(f"blk.{layer}.ssm_out.weight")
    blck = GGML_QUANT_SIZES[out.ggml_type][0] if out is not None else 1
    granularity = math.lcm(math.lcm(blck, PERF_BLOCK), d_state)
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    trunk = [lf for lf in facts.layers if not lf.nextn]
    rotation = sum(1 for lf in trunk[:layer] if lf.kind is AttnKind.RECURRENT) % n_devices
    weights = list(tensor_split[:n_devices]) + [0.0] * max(0, n_devices - len(tensor_split))
    w = weights if any(weights) else None
    if arch == _QWEN3NEXT:
        r_segments = [(key_dim * (d_conv - 1), 2), (value_dim * (d_conv - 1), 1)]
        s_segments = [(facts.layers[layer].state_s, 1)]
    else:   # Qwen 3.5: V heads interleaved on the scale of K
        ratio = n_v_heads // n_k_heads
        r_segments = [(key_dim * (d_conv - 1), 2 + ratio)]
        s_segments = [(n_k_heads * d_state * d_state, ratio)]
    return StateSlices(_cut(r_segments, granularity * (d_conv - 1), n_devices, rotation, w),
                       _cut(s_segments, granularity * d_state, n_devices, rotation, w))
