"""Where llama.cpp puts each layer, weight and KV cache for a set of flags (pinned llama.cpp build).

Rules, all from the llama.cpp vendored in llama-cpp-python 0.3.36:
- device list (src/llama.cpp llama_prepare_model_devices): `-dev` as given, else RPC devices first,
  then GPUs, then iGPUs when there is no GPU; `-sm none` keeps only device `-mg`.
- layers (src/llama-model.cpp load_tensors): the output layer is layer n_layer_all and is counted
  first by -ngl: layers from i_gpu_start = max(n_layer_all + 1 - ngl, 0) are offloaded, each to the
  device whose cumulative -ts share (float32, normalised) is the first greater than
  (il - i_gpu_start) / act_gpu_layers; no -ts means shares proportional to free memory. The input
  layer (token_embd) always stays on the CPU.
- weights (src/llama-model-loader.cpp create_tensor): -ot rules are searched in order, the first
  match wins; `=CPU` picks from the CPU list so repacking still applies; otherwise the first buffer
  type of the layer's list that supports the weight's op. Tied embeddings: llama.cpp duplicates
  token_embd as the output matrix on the output device. A device with a tensor-size limit (Vulkan:
  planner/hardware/vulkan_devices.py) refuses a weight whose 512-token test op (weight_buft_supported)
  has a source or result over it; the weight then takes the CPU list, as does lavapipe's tied output.
- CPU buffer list (make_cpu_buft_list): the host buffer of the first device that has one (unless
  --no-host; an rpc-server has none, so with `--rpc` before a GPU the GPU's pinned buffer is it), the
  CPU's extra (repack) buffer, then plain CPU memory.
"""
from __future__ import annotations

import enum
import logging
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from planner.core.errors import FlagError
from planner.gguf.reader import ModelFile
from planner.hardware.inventory import (
    BACKEND_REG_ORDER,
    HOST,
    Backend,
    DeviceKind,
    DeviceSpec,
    Inventory,
    llama_devices,
)
from planner.hardware.vulkan_devices import vulkan_features
from planner.llama.flags import LlamaFlags
from planner.llama.tensor_parallel import META_NAME, NO_MEMBERS, check_row_split, meta_profile
from planner.model.tensors import (
    LAYER_COPIED,
    NO_OUTPUT_MATRIX,
    OUTPUT,
    TOKEN_EMBD,
    is_first_layer,
    is_input,
    is_routed_expert,
    layer_copy_name,
    layer_of,
)
from runtime.ggml.profiles import DEFAULT_CUDA_CC, PROFILES, BackendProfile, device_profile

log = logging.getLogger(__name__)

# The rows of llama.cpp's memory breakdown that are host memory (common_get_device_memory_data):
# `Host` for every CPU buffer (HOST, planner.hardware.inventory), and repacked CPU weights on a row of
# their own, as --fit-print lists them.
CPU_REPACK = "CPU_REPACK"
HOST_ROWS = (HOST, CPU_REPACK)
# The CPU's name where a layer's device is given (layer_device) and in the runtime's backends.
CPU = "CPU"
INPUT_LAYER = -1
# Host rows take the CPU buffer type's alignment.
HOST_ALIGNMENT = PROFILES[Backend.CPU].alignment


def row_of(device: str) -> str:
    """The breakdown row of a device name: the CPU's memory is reported as Host."""
    return HOST if device == CPU else device


def device_of(row: str) -> str:
    """The device name of a breakdown row (the inverse of row_of)."""
    return CPU if row == HOST else row


class WeightOp(enum.Enum):
    GET_ROWS = "get_rows"
    MUL_MAT = "mul_mat"
    MUL_MAT_ID = "mul_mat_id"
    OTHER = "other"


# ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type on x86: type -> rows must divide by this.
# Q2_K additionally needs AVX512.
REPACK_X86_AVX2: dict[Q, int] = {Q.Q4_0: 8, Q.Q4_K: 8, Q.IQ4_NL: 8, Q.MXFP4: 8}
REPACK_X86_AVX512_EXTRA: dict[Q, int] = {Q.Q2_K: 8}


@lru_cache(maxsize=1)
def host_repack_table() -> dict[Q, int]:
    """The repack table of this machine's CPU (the one llama.cpp's CPU backend would use here)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = set(re.findall(r"\b(avx2|avx512f)\b", f.read()))
    except OSError:
        return {}
    table = dict(REPACK_X86_AVX2) if "avx2" in flags else {}
    if "avx512f" in flags:
        table.update(REPACK_X86_AVX512_EXTRA)
    return table


@dataclass(frozen=True)
class Device:
    name: str
    backend: Backend
    alignment: int
    free_bytes: int
    has_host_buffer: bool
    endpoint: str | None = None
    compute_capability: int | None = None   # CUDA: major x 100 + minor x 10 (profiles.DEFAULT_CUDA_CC if unknown)
    max_tensor_bytes: int = 0   # supports_op refuses a larger source or result (0: no limit; Vulkan)
    remote_backend: Backend | None = None   # RPC: the rpc-server's backend (its alignment and alloc sizes)
    members: tuple[Device, ...] = ()        # -sm tensor: the real devices the meta device wraps
    vk_subgroup_size: int = 0               # glm5n: a measured Vulkan device's subgroup size (its supports_op reads it)

    @property
    def profile(self) -> BackendProfile:
        if self.members:
            return meta_profile([m.profile for m in self.members])
        return device_profile(self.backend, self.remote_backend)

    def buft_names(self) -> tuple[str, ...]:
        """Names an -ot rule may use for this device's buffer type. ggml-rpc names every server's
        buffer type `RPC0[host:port]` whatever the device's index, and llama.cpp refuses `RPC1`
        ("unknown buffer type": checked with llama-fit-params)."""
        return (f"RPC0[{self.endpoint}]",) if self.endpoint else (self.name,)


@dataclass(frozen=True)
class TensorSlot:
    """A weight as llama.cpp creates it: its layer (-1 input, n_layer_all output) and op."""

    name: str
    layer: int
    op: WeightOp
    ggml_type: Q
    rows: int          # ne[1]
    n_dims: int
    n_bytes: int
    duplicate_of: str = ""   # the tied output matrix: no second copy when it lands beside its original
    ne0: int = 0             # row length in values (get_alloc_size pads quantized rows on CUDA-class buffers)
    own_copy: bool = False   # gemma4: a duplicate created before its original, so never reused (TIED_OUTPUT_FIRST)


@dataclass(frozen=True)
class Placement:
    devices: tuple[Device, ...]
    layer_device: tuple[str, ...]     # per layer 0..n_layer_all (last entry: the output layer), "CPU" or a device
    tensor_buft: tuple[tuple[str, str], ...]   # (tensor name, buffer row: device name, Host or CPU_REPACK)
    moved: tuple[tuple[str, str], ...]         # (tensor name, -ot target) for tensors an override matched
    i_gpu_start: int
    pipeline_parallel: bool
    # (name, placed name): a layer's copy of rope_freqs.weight that shares another layer's buffer type
    aliases: tuple[tuple[str, str], ...] = ()


def _device_from_spec(spec: DeviceSpec) -> Device:
    profile = device_profile(spec.backend, spec.remote_backend)
    cc = (spec.compute_capability or DEFAULT_CUDA_CC) if profile.fa_f16_staging else None
    vk = vulkan_features(spec.description) if spec.backend is Backend.VULKAN else None
    if vk is not None:   # a measured Vulkan device: its own alignment and supports_op size limit
        return Device(spec.name, spec.backend, vk.alignment, spec.free_bytes, profile.host_buffer, spec.endpoint,
                      cc, vk.max_tensor_bytes, vk_subgroup_size=vk.subgroup_size)
    return Device(spec.name, spec.backend, profile.alignment, spec.free_bytes, profile.host_buffer, spec.endpoint, cc,
                  remote_backend=spec.remote_backend)


def resolve_devices(flags: LlamaFlags, inventory: Inventory | None) -> tuple[Device, ...]:
    """llama.cpp's device list for a model, from the inventory plus `--rpc`, `-dev`, `-sm none`."""
    specs = _registered_devices(flags, inventory)
    chosen = _dev_chosen(flags, specs)
    if flags.split_mode == "none" and chosen:
        chosen = _main_gpu_only(flags, chosen)
    return _split_devices(flags, specs, chosen)


def _registered_devices(flags: LlamaFlags, inventory: Inventory | None) -> list[DeviceSpec]:
    """The non-CPU devices llama.cpp registers: the inventory's, less the rpc-servers `--rpc` does not name,
    then one RPC<n> device for each `--rpc` endpoint the inventory does not list."""
    specs = list(inventory.devices) if inventory else []
    # llama.cpp registers an rpc-server only when --rpc names it
    dropped = [s.name for s in specs if s.kind is DeviceKind.RPC and s.endpoint and s.endpoint not in flags.rpc]
    if dropped:
        log.warning("inventory devices %s are not in --rpc: llama.cpp would not use them", ", ".join(dropped))
    specs = [s for s in specs if s.name not in dropped]
    known = {s.endpoint for s in specs if s.kind is DeviceKind.RPC}
    rpc_new = [e for e in flags.rpc if e not in known]
    n_rpc = sum(1 for s in specs if s.kind is DeviceKind.RPC)
    for i, endpoint in enumerate(rpc_new):
        specs.append(DeviceSpec(name=f"RPC{n_rpc + i}", kind=DeviceKind.RPC, backend=Backend.RPC, total_bytes=0,
                                free_bytes=0, bandwidth_bytes_s=0, fp16_flops=0, link_bytes_s=0, endpoint=endpoint))
    return [s for s in specs if s.kind is not DeviceKind.CPU]


def _dev_chosen(flags: LlamaFlags, specs: list[DeviceSpec]) -> list[DeviceSpec]:
    """The devices `-dev` names (case-insensitive; `none`: no device), or without it the ones llama.cpp uses
    by default (llama_devices)."""
    if flags.devices is None:
        return list(llama_devices(specs).devices)
    if flags.devices == ("none",):
        return []
    by_name = {s.name.lower(): s for s in specs}
    missing = [d for d in flags.devices if d.lower() not in by_name]
    if missing:
        raise FlagError(f"-dev: invalid device {missing[0]!r}; available: {', '.join(by_name) or 'none'}")
    return [by_name[d.lower()] for d in flags.devices]


def _main_gpu_only(flags: LlamaFlags, chosen: list[DeviceSpec]) -> list[DeviceSpec]:
    """-sm none: the `-mg` device alone (none where -mg is negative)."""
    if flags.main_gpu < 0:
        return []
    if flags.main_gpu >= len(chosen):
        raise FlagError(f"-mg {flags.main_gpu}: invalid main GPU (available devices: {len(chosen)})")
    return [chosen[flags.main_gpu]]


def _split_devices(flags: LlamaFlags, specs: list[DeviceSpec], chosen: list[DeviceSpec]) -> tuple[Device, ...]:
    """The model's devices under -sm: -sm row refused (tensor_parallel.check_row_split), -sm tensor one
    meta device of the -dev devices, or without -dev of every non-CPU device in registry order
    (llama_prepare_model_devices)."""
    if flags.split_mode == "row":
        check_row_split([s.name for s in chosen], [s.backend for s in chosen])
    if flags.split_mode == "tensor":
        if flags.devices is None:
            chosen = sorted(specs, key=lambda s: BACKEND_REG_ORDER[s.backend])
        if not chosen:
            raise FlagError(NO_MEMBERS)
        return (meta_device(tuple(_device_from_spec(s) for s in chosen)),)
    return tuple(_device_from_spec(s) for s in chosen)


def meta_device(members: tuple[Device, ...]) -> Device:
    """The one device llama.cpp makes of `members` under -sm tensor (ggml-backend-meta.cpp): memory
    summed, the largest alignment, a host buffer type only when all members share one (same backend),
    the smallest tensor-size limit (supports_op is every member's)."""
    backends = {m.backend for m in members}
    limits = [m.max_tensor_bytes for m in members if m.max_tensor_bytes]
    return Device(META_NAME, members[0].backend, max(m.alignment for m in members),
                  sum(m.free_bytes for m in members),
                  all(m.has_host_buffer for m in members) and len(backends) == 1,
                  compute_capability=next((m.compute_capability for m in members if m.compute_capability), None),
                  max_tensor_bytes=min(limits, default=0), members=members)


def layer_devices(n_layer_all: int, ngl_flag: int, devices: tuple[Device, ...],
                  tensor_split: tuple[float, ...]) -> tuple[tuple[str, ...], int]:
    """Device of every layer 0..n_layer_all (the last is the output layer), and i_gpu_start."""
    ngl = ngl_flag if ngl_flag >= 0 else n_layer_all + 1
    i_gpu_start = max(n_layer_all + 1 - ngl, 0)
    act = 0 if not devices else min(ngl, n_layer_all + 1)
    n = len(devices)
    ts = list(tensor_split[:n]) + [0.0] * max(0, n - len(tensor_split))
    raw = ts if any(x != 0.0 for x in ts) else [float(d.free_bytes) for d in devices]
    if n and not any(raw):  # devices that report no memory fall back to the host's: equal shares
        raw = [1.0] * n
    # float32 throughout, as llama.cpp's std::vector<float> splits
    cum = np.cumsum(np.array(raw, dtype=np.float32), dtype=np.float32)
    splits = (cum / cum[-1]).astype(np.float32) if n and cum[-1] != 0 else cum
    out = []
    for il in range(n_layer_all + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out.append("CPU")
            continue
        x = np.float32(il - i_gpu_start) / np.float32(act)
        k = int(np.searchsorted(splits, x, side="right"))
        out.append(devices[min(k, n - 1)].name)
    return tuple(out), i_gpu_start


# dsv4: per-layer weights llm_tensor_info_mapping tests with GGML_OP_GET_ROWS (src/llama-arch.cpp): deepseek4's
# hash routing table and its compressors' position embeddings
GET_ROWS_WEIGHTS = frozenset({"ffn_gate_tid2eid.weight", "attn_compressor_ape.weight",
                              "indexer_compressor_ape.weight"})


def weight_op(suffix: str, n_dims: int) -> WeightOp:
    """The op llama.cpp tests a weight with (llm_tensor_info_mapping), reduced to what repacking needs."""
    if suffix in GET_ROWS_WEIGHTS:
        return WeightOp.GET_ROWS
    # ssm_a and ssm_d are bare names (no .weight); ssm_alpha and ssm_dt.weight are matmul weights
    if suffix.endswith(".bias") or "norm" in suffix or suffix.startswith("ssm_conv") or suffix in ("ssm_a", "ssm_d"):
        return WeightOp.OTHER
    if is_routed_expert(suffix):
        return WeightOp.MUL_MAT_ID if n_dims == 3 else WeightOp.OTHER
    return WeightOp.MUL_MAT if suffix.endswith(".weight") else WeightOp.OTHER


# Architectures whose load_arch_tensors creates the tied output (TENSOR_DUPLICATED) before token_embd: the
# duplicate finds no copy to reuse, and token_embd's own create (no flag) never reuses one, so the matrix is
# held twice even within one buffer type (llama-model-loader.cpp create_tensor; src/models/gemma4.cpp, gemma3n.cpp).
TIED_OUTPUT_FIRST = frozenset({"gemma3n", "gemma4"})


# dsv4: weights load_arch_tensors creates with more dimensions than the file stores (TENSOR_ALLOW_RESHAPE):
# (architecture, name suffix) -> n_dims as created. deepseek4.cpp reshapes attn_output_a to {.., o_lora_rank,
# o_groups}, a 3-D matrix the CPU repack buffer does not take (it repacks 2-D weights only).
LOADED_DIMS: dict[tuple[str, str], int] = {("deepseek4", "attn_output_a.weight"): 3}


def tensor_slots(model: ModelFile, n_layer_all: int) -> tuple[TensorSlot, ...]:
    """Every weight llama.cpp creates, with its layer; a tied output matrix is appended as `output.weight`,
    and rope_freqs.weight once per layer (the duplicates that land beside a copy reuse it)."""
    slots: list[TensorSlot] = []
    for t in model.tensors:
        block, suffix = layer_of(t.name)
        if t.name in LAYER_COPIED:   # one copy per buffer type of the layers (planner.model.tensors.rope_freqs_name)
            slots.extend(TensorSlot(layer_copy_name(t.name, il), il, WeightOp.OTHER, t.ggml_type, 1, len(t.shape),
                                    t.n_bytes, duplicate_of=t.name if il else "", ne0=t.shape[0])
                         for il in range(max(n_layer_all, 1)))
            continue
        if block is not None:
            layer = block
        elif is_input(t.name):
            layer = INPUT_LAYER
        elif is_first_layer(t.name, model.architecture):
            layer = 0
        else:
            layer = n_layer_all
        op = WeightOp.GET_ROWS if layer == INPUT_LAYER else weight_op(suffix, len(t.shape))
        rows = t.shape[1] if len(t.shape) > 1 else 1
        n_dims = LOADED_DIMS.get((model.architecture, suffix), len(t.shape))
        slots.append(TensorSlot(t.name, layer, op, t.ggml_type, rows, n_dims, t.n_bytes, ne0=t.shape[0]))
    names = {t.name for t in model.tensors}
    embd = model.tensor(TOKEN_EMBD)
    if OUTPUT not in names and embd is not None and model.architecture not in NO_OUTPUT_MATRIX:
        # create_tensor(... TENSOR_DUPLICATED): the output matrix is a second copy on the output device
        slots.append(TensorSlot(OUTPUT, n_layer_all, WeightOp.MUL_MAT, embd.ggml_type,
                                embd.shape[1] if len(embd.shape) > 1 else 1, len(embd.shape), embd.n_bytes,
                                duplicate_of=embd.name, ne0=embd.shape[0],
                                own_copy=model.architecture in TIED_OUTPUT_FIRST))
    return tuple(slots)


def _cpu_buft(slot: TensorSlot, devices: tuple[Device, ...], flags: LlamaFlags, repack: dict[Q, int]) -> str:
    """First of make_cpu_buft_list's buffer types that takes this weight: host buffer, repack, CPU.
    The host buffer type is listed with its device, whose supports_op decides for it: a weight over a
    Vulkan device's tensor-size limit passes on to the repack or plain CPU buffer (gpt-oss-20b's
    MXFP4 experts on lavapipe land in CPU_REPACK)."""
    # the loop over the model's devices stops at the first with a host buffer type, not at the first device
    host_dev = next((d for d in devices if d.has_host_buffer), None) if not flags.no_host else None
    if host_dev is not None and _device_takes(slot, host_dev):
        return HOST
    repackable = flags.repack and slot.ggml_type in repack and slot.rows % repack[slot.ggml_type] == 0
    matmul = (slot.op is WeightOp.MUL_MAT and slot.n_dims == 2) or (slot.op is WeightOp.MUL_MAT_ID and slot.n_dims == 3)
    if repackable and matmul:
        return CPU_REPACK
    return HOST


def _override_target(target: str, devices: tuple[Device, ...]) -> str | None:
    """Device name of an -ot buffer type; None for CPU. Unknown names are refused as llama.cpp does."""
    if target == "CPU":
        return None
    for dev in devices:
        if target in dev.buft_names():
            return dev.name
    raise FlagError(f"-ot: unknown buffer type {target!r}; available: CPU"
                    + "".join(f", {n}" for d in devices for n in d.buft_names()[-1:]))


# llama-model-loader.cpp weight_buft_supported: the test op's batch, and F32/I32 element sizes
_TEST_TOKENS = 512
_F32 = 4


def test_op_bytes(slot: TensorSlot) -> int:
    """The largest of the weight, the other sources and the result of the op weight_buft_supported
    builds for it (GET_ROWS over 512 ids, MUL_MAT against F32 [ne0, 512, ne2, ne3], ADD/MUL against
    an F32 copy of the weight's shape). MUL_MAT_ID's activations depend on n_expert_used, which a
    slot does not carry: only the weight counts there."""
    block, type_size = GGML_QUANT_SIZES[slot.ggml_type]
    n_elements = slot.n_bytes // type_size * block
    ne0 = slot.ne0 or max(1, n_elements // max(1, slot.rows))
    if slot.op is WeightOp.GET_ROWS:
        return max(slot.n_bytes, _TEST_TOKENS * 4, ne0 * _TEST_TOKENS * _F32)
    if slot.op is WeightOp.MUL_MAT:
        outer = n_elements // (ne0 * slot.rows) if ne0 * slot.rows else 1
        return max(slot.n_bytes, ne0 * _TEST_TOKENS * outer * _F32, slot.rows * _TEST_TOKENS * outer * _F32)
    if slot.op is WeightOp.OTHER:
        return max(slot.n_bytes, n_elements * _F32)
    return slot.n_bytes


def _device_takes(slot: TensorSlot, device: Device | None) -> bool:
    """weight_buft_supported on a device's own buffer type, as far as tensor sizes decide it
    (ggml-vulkan.cpp ggml_backend_vk_device_supports_op, tensor_size_supported)."""
    return device is None or not device.max_tensor_bytes or test_op_bytes(slot) <= device.max_tensor_bytes


def _check_leaf(slot: TensorSlot, device: Device | None, override: str) -> None:
    """-ot puts a weight in a buffer type without asking supports_op. A weight larger than its
    device's tensor-size limit is then a graph leaf no backend can take, and llama.cpp aborts at its
    first reserve (ggml-backend.cpp ggml_backend_sched_backend_id_from_cur: "pre-allocated tensor
    (token_embd.weight) in a buffer (Vulkan0) that cannot run the operation (NONE)", measured on
    lavapipe with -ot token_embd.weight=Vulkan0)."""
    if device is not None and device.max_tensor_bytes and slot.n_bytes > device.max_tensor_bytes:
        raise FlagError(f"-ot {override}: {slot.duplicate_of or slot.name} ({slot.n_bytes} bytes) is larger than "
                        f"the largest tensor {device.name} runs ops on ({device.max_tensor_bytes} bytes); llama.cpp "
                        f"aborts ('pre-allocated tensor in a buffer that cannot run the operation')")


@dataclass(frozen=True)
class Assigned:
    placed: tuple[tuple[str, str], ...]    # (weight, buffer row)
    moved: tuple[tuple[str, str], ...]     # (weight, -ot target) for those an override matched
    aliases: tuple[tuple[str, str], ...]   # (duplicate, the placed copy in the same buffer row)


def assign_weights(slots: tuple[TensorSlot, ...], layer_device: tuple[str, ...], devices: tuple[Device, ...],
                   flags: LlamaFlags, repack: dict[Q, int]) -> Assigned:
    """Buffer row of every weight, which weights an override moved (to what), and the duplicates that
    reuse a copy already in their buffer row."""
    rules = [(re.compile(o.pattern), o.target, _override_target(o.target, devices)) for o in flags.overrides]
    placed, moved = [], []
    aliases: list[tuple[str, str]] = []
    copies: dict[tuple[str, str], str] = {}   # (source weight, row) -> the name placed there
    sources = {slot.duplicate_of for slot in slots if slot.duplicate_of}
    limited = {d.name: d for d in devices if d.max_tensor_bytes}   # devices whose supports_op caps tensor sizes
    for slot in slots:
        override = _override_row(slot, rules, devices, flags, repack) if rules else None
        if override is not None:
            row, target = override
            moved.append((slot.name, target))
        else:
            dev_name = "CPU" if slot.layer == INPUT_LAYER else layer_device[slot.layer]
            # select_weight_buft: a device that refuses the weight passes it on to the CPU list
            on_cpu = dev_name == "CPU" or (dev_name in limited and not _device_takes(slot, limited[dev_name]))
            row = _cpu_buft(slot, devices, flags, repack) if on_cpu else dev_name
        if (slot.duplicate_of or slot.name in sources) and _reuses_copy(slot, row, copies, aliases):
            continue
        placed.append((slot.name, row))
    return Assigned(tuple(placed), tuple(moved), tuple(aliases))


def _override_row(slot: TensorSlot, rules: list[tuple[re.Pattern[str], str, str | None]],
                  devices: tuple[Device, ...], flags: LlamaFlags, repack: dict[Q, int]) -> tuple[str, str] | None:
    """(buffer row, -ot target) from the first -ot rule that matches the weight; None where none does."""
    for regex, target, dev in rules:
        # llama.cpp creates a tied output matrix under token_embd's name (TENSOR_DUPLICATED),
        # so an -ot rule sees that name (checked against llama-fit-params)
        if regex.search(slot.duplicate_of or slot.name):
            row = dev if dev is not None else _cpu_buft(slot, devices, flags, repack)
            _check_leaf(slot, next((d for d in devices if d.name == dev), None), f"{regex.pattern}={target}")
            return row, target
    return None


def _reuses_copy(slot: TensorSlot, row: str, copies: dict[tuple[str, str], str],
                 aliases: list[tuple[str, str]]) -> bool:
    """For a duplicated weight or the source of one: True where create_tensor reuses the copy already in this
    buffer row (a per-layer copy is then recorded in `aliases`); otherwise the weight is recorded in `copies`
    as its source's copy in that row."""
    if slot.duplicate_of and not slot.own_copy and (slot.duplicate_of, row) in copies:
        if slot.duplicate_of in LAYER_COPIED:
            aliases.append((slot.name, copies[(slot.duplicate_of, row)]))
        return True
    copies.setdefault((slot.duplicate_of or slot.name, row), slot.name)
    return False


def place(slots: tuple[TensorSlot, ...], n_layer_all: int, flags: LlamaFlags, devices: tuple[Device, ...],
          repack: dict[Q, int] | None = None) -> Placement:
    """The whole placement for one set of flags; O(layers + tensors x rules)."""
    repack = host_repack_table() if repack is None else repack
    layer_dev, i_gpu_start = layer_devices(n_layer_all, flags.n_gpu_layers, devices, flags.tensor_split)
    assigned = assign_weights(slots, layer_dev, devices, flags, repack)
    ngl = flags.n_gpu_layers if flags.n_gpu_layers >= 0 else n_layer_all + 1
    # llama_context: pipeline parallelism only with several devices, every layer offloaded, layer
    # split, KV offloaded, no override, and every device reporting caps.async and caps.events
    # (profiles.async_events: RPC, CUDA, Vulkan, Metal, SYCL all do).
    pipeline = (len(devices) > 1 and ngl > n_layer_all and flags.split_mode == "layer"
                and flags.kv_offload and not flags.overrides and all(d.profile.async_events for d in devices))
    return Placement(devices, layer_dev, assigned.placed, assigned.moved, i_gpu_start, pipeline, assigned.aliases)
