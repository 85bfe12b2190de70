"""llama.cpp's flags resolved once against a model and its devices: the value every later stage reads.

`resolve_settings` turns (model, flags, inventory) into one `LlamaSettings`: llama.cpp's device
list, the placement, the context params with `-fa auto` decided, the cache types, the KV cells of
each attention kind, the attention cores the scheduler pulls onto another device and each buffer
row's alignment. The KV caches (kv.py), the compute model (planner/memory/analytic.py) and the
runtime (runtime/engine) read these and derive none of them again.

Sources (llama.cpp in llama-cpp-python 0.3.36):
- src/llama-context.cpp: n_ctx = -c or the training context, padded to 256; without a unified
  cache each of the -np streams gets n_ctx_seq = pad(n_ctx / n_seq, 256) cells; n_batch =
  min(n_ctx, -b), n_ubatch = min(n_batch, -ub); -fa auto turns flash attention off when a
  layer's fused op runs on another device than the layer (resolve_fused_ops).
- src/llama-kv-cache-iswa.cpp: SWA layers get pad(min(kv_size, n_swa * (unified ? n_seq : 1) +
  n_ubatch), 256) cells, or kv_size with --swa-full.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from types import MappingProxyType

from gguf import GGML_QUANT_SIZES, Keys
from gguf import GGMLQuantizationType as Q

from planner.core.errors import FlagError
from planner.core.units import pad
from planner.hardware.inventory import Inventory
from planner.llama.context import ModelContext
from planner.llama.expressible import check_expressible
from planner.llama.flags import LLAMA_MAX_SEQ, LlamaFlags
from planner.llama.placement import CPU_REPACK, HOST, HOST_ALIGNMENT, Device, Placement, place, resolve_devices
from planner.llama.tensor_parallel import check_tensor_split
from planner.model.arch import DSV4_CACHE, RECURRENT_RULES, AttnKind, ModelFacts, RecurrentRule
from planner.model.costs import cache_type
from runtime.ggml.profiles import row_padding_bytes

CTX_PAD = 256
# V cache types llama.cpp stores without flash attention; a quantized V cache requires -fa on
# (llama-context.cpp: "quantized V cache was requested, but this requires Flash Attention").
V_TYPES_WITHOUT_FA = frozenset({Q.F16, Q.F32, Q.BF16})


@dataclass(frozen=True)
class ContextParams:
    """llama.cpp's cparams that size memory."""

    n_ctx: int
    n_ctx_seq: int
    n_seq: int
    n_stream: int
    n_batch: int
    n_ubatch: int
    flash_attn: bool
    kv_unified: bool


def context_params(flags: LlamaFlags, n_ctx_train: int) -> ContextParams:
    """The cparams before layers are placed: `-fa auto` still counts as on (resolve_auto_fa decides)."""
    n_ctx = flags.n_ctx or n_ctx_train
    if n_ctx <= 0:
        raise FlagError("-c 0 asks for the training context, but the model declares none")
    n_seq = max(1, flags.n_parallel)
    if n_seq > LLAMA_MAX_SEQ:   # llama_context: "n_seq_max must be <= LLAMA_MAX_SEQ", before any sizing
        raise FlagError(f"-np {n_seq}: llama.cpp refuses it (n_seq_max must be <= {LLAMA_MAX_SEQ})")
    n_batch = min(n_ctx, flags.n_batch)          # causal attention caps the batch at the context
    n_ubatch = min(n_batch, flags.n_ubatch)
    n_ctx = pad(n_ctx, CTX_PAD)
    if flags.kv_unified:
        n_ctx_seq = n_ctx
    else:
        n_ctx_seq = pad(n_ctx // n_seq, CTX_PAD)
        n_ctx = n_ctx_seq * n_seq
    # flash attention 'auto' resolves to on when every layer's device runs the fused op; the
    # CPU, rpc-servers and the GPU backends fitplan knows all do.
    fa = flags.flash_attn != "off"
    if not fa and cache_type(flags.cache_type_v) not in V_TYPES_WITHOUT_FA:
        raise FlagError("quantized V cache was requested, but this requires Flash Attention (-fa on)")
    return ContextParams(n_ctx, n_ctx_seq, n_seq, 1 if flags.kv_unified else n_seq, n_batch, n_ubatch, fa,
                         flags.kv_unified)


# Hybrids whose attention core stays on its layer's device when the next layer is recurrent and on
# another device: runtime/engine/probe.py's replay of llama.cpp's flash-attention probe and llama-fit-params
# agree on it (Qwen3-Next-80B-A3B, Qwen3.5-27B, Qwen3.5-35B-A3B and LFM2-8B-A1B shapes over two rpc-servers
# with the last host layer an attention layer: flash attention stays on). The rule below was measured on
# Granite-4.0-H; lfm2 and jamba follow it.
ATTENTION_STAYS = frozenset({"qwen3next", "qwen35", "qwen35moe", "lfm2moe"})
# nemotron_h: its FFN-only blocks (relu^2 MLPs) between an attention block and the next Mamba-2 block change
# nothing, the core is pulled as if they were absent (NVIDIA-Nemotron-Nano-9B-v2 shape: llama-fit-params and the
# probe replay, with the MLP block on the host or the device); nemotron_h_moe's expert blocks do not pass it on
FFN_BLOCKS_PASS_THROUGH = frozenset({"nemotron_h"})


def pulled_attention(facts: ModelFacts, flags: LlamaFlags, layer_device: tuple[str, ...]) -> dict[int, str]:
    """Attention layers whose attention core the scheduler runs on another device than the layer's.

    Measured on a Granite-4.0-H-class hybrid (GGML_SCHED_DEBUG, llama-fit-params -v): when a host
    attention layer is followed by a device's first layer and that layer is recurrent, the recurrent
    state gathers sit next to the attention in graph order and ggml's expand passes give the
    attention core (scores or the fused op) to that device; its K and V views and the mask are
    copied there. With -nkvo the states live on the CPU, so an offloaded attention layer followed by
    a recurrent layer has its fused op on the CPU (llama.cpp's resolve_fused_ops probe logs it;
    without flash attention llama.cpp pins the scores to the CPU anyway). The runtime's scheduler
    places them so too (tests/runtime/engine/test_granitehybrid.py).
    """
    if facts.arch in ATTENTION_STAYS or facts.mla:
        # linear: an MLA layer's core stays on its layer's device next to a KDA layer on another (measured,
        # llama-fit-params --fit-print: kimi-linear, bailingmoe3 and kimi-k3 keep flash attention on with an
        # MLA layer last on the host and a KDA layer first on an rpc-server, with and without -nkvo)
        return {}
    trunk = [lf for lf in facts.layers if not lf.nextn]
    if RECURRENT_RULES.get(facts.arch) is RecurrentRule.PARALLEL:
        # falcon-h1: a block attends and recurs; with -nkvo its states live on the CPU and its fused op follows
        # them there (llama-fit-params logs "layer 0 is assigned to device RPC0 but Flash Attention is
        # assigned to device CPU"); with the states on the layer's device nothing moves
        return {} if flags.kv_offload else _offloaded_to_cpu([lf.index for lf in trunk], layer_device)
    if facts.arch in FFN_BLOCKS_PASS_THROUGH:
        trunk = [lf for lf in trunk if lf.kind is not AttnKind.NONE]
    attends_then_recurs = [(lf.index, nxt.index) for lf, nxt in pairwise(trunk)
                           if lf.kind in (AttnKind.FULL, AttnKind.SWA) and nxt.kind is AttnKind.RECURRENT]
    return _pulled_by_next_recurrent(attends_then_recurs, flags.kv_offload, layer_device)


def _offloaded_to_cpu(layers: list[int], layer_device: tuple[str, ...]) -> dict[int, str]:
    """Each of `layers` not on the CPU, its attention pulled to the CPU."""
    return {il: "CPU" for il in layers if layer_device[il] != "CPU"}


def _pulled_by_next_recurrent(pairs: list[tuple[int, int]], kv_offload: bool,
                              layer_device: tuple[str, ...]) -> dict[int, str]:
    """`pairs`: (attention layer, the recurrent layer after it). With -nkvo the offloaded attention layers go
    to the CPU; with the states on the devices a host layer's attention goes to the next layer's device."""
    if not kv_offload:
        return _offloaded_to_cpu([il for il, _ in pairs], layer_device)
    return {il: layer_device[nxt] for il, nxt in pairs if layer_device[il] == "CPU" and layer_device[nxt] != "CPU"}


def resolve_auto_fa(flags: LlamaFlags, cp: ContextParams, type_v: Q, pulled: Mapping[int, str]) -> ContextParams:
    """-fa auto once layers are placed: llama.cpp turns flash attention off when a layer's fused op
    is scheduled on another device than the layer (src/llama-context.cpp resolve_fused_ops), which
    is what `pulled_attention` describes. A quantized V cache forces it on instead."""
    if flags.flash_attn != "auto" or not cp.flash_attn or type_v not in V_TYPES_WITHOUT_FA:
        return cp
    if flags.split_mode == "tensor":   # llama_init_from_model sets it on before resolve_fused_ops runs
        return cp
    return replace(cp, flash_attn=False) if pulled else cp


def swa_cells(window: int, cp: ContextParams, swa_full: bool) -> int:
    if swa_full:
        return cp.n_ctx_seq
    return pad(min(cp.n_ctx_seq, window * (cp.n_seq if cp.kv_unified else 1) + cp.n_ubatch), CTX_PAD)


def kv_cells(facts: ModelFacts, cp: ContextParams, swa_full: bool) -> dict[AttnKind, int]:
    """Cells per stream of each attention kind that holds a KV cache: n_ctx_seq for full attention,
    `swa_cells` for sliding-window layers (a model has one window, llama_hparams.n_swa)."""
    trunk = [lf for lf in facts.layers if not lf.nextn]
    cells = {AttnKind.FULL: cp.n_ctx_seq}
    swa = [lf for lf in trunk if lf.kind is AttnKind.SWA]
    if swa:
        cells[AttnKind.SWA] = swa_cells(swa[0].window, cp, swa_full)
    return {k: v for k, v in cells.items() if any(lf.kind is k and lf.has_kv for lf in trunk)}


@dataclass(frozen=True)
class LlamaSettings:
    """One set of llama.cpp flags resolved against a model and devices, once."""

    ctx: ModelContext
    flags: LlamaFlags
    devices: tuple[Device, ...]        # llama.cpp's device list, in its order
    placement: Placement
    cparams: ContextParams             # -fa auto already decided
    type_k: Q                          # K and V cache types
    type_v: Q
    kv_cells: Mapping[AttnKind, int]   # cells per stream of each attention kind that holds a KV cache
    pulled: Mapping[int, str]          # attention layer -> the other device that runs its core
    alignment: Mapping[str, int]       # buffer row (device names, Host, CPU_REPACK) -> alignment
    # buffer row -> get_alloc_size's quantized-row padding (CUDA-class devices only)
    row_padding: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def alloc_size(self, row: str, ggml_type: Q, ne0: int, n_bytes: int) -> int:
        """Bytes a tensor takes in this row's buffer type before alignment (get_alloc_size): CUDA,
        ROCm and SYCL pad a quantized tensor to a multiple of MATRIX_ROW_PADDING values."""
        return n_bytes + row_padding_bytes(*GGML_QUANT_SIZES[ggml_type], ne0, self.row_padding.get(row, 0))


def resolve_settings(ctx: ModelContext, flags: LlamaFlags, inventory: Inventory | None = None) -> LlamaSettings:
    """`flags` on this model and inventory, as llama.cpp would resolve them; FlagError when llama.cpp
    would abort on them (planner/llama/expressible.py)."""
    devices = resolve_devices(flags, inventory)
    check_expressible(flags, inventory, devices, ctx.loaded_slots(flags))
    return resolve_on(ctx, flags, devices)


# kimi-k3.cpp load_arch_hparams sets n_embd_head_v to kv_lora_rank whatever value_length says  # linear
MLA_V_HEAD_IS_KV_LORA = frozenset({"kimi-k3"})


def _check_mla_cache_blocks(ctx: ModelContext, type_k: Q, type_v: Q) -> None:
    """llama_init_from_model refuses a quantized cache type whose block does not divide the model's head
    sizes unless flash attention is off (llama-context.cpp). On an MLA file they are key_length and
    value_length, each n_embd / n_head(0) when absent (llama-model.cpp load_hparams): a kimi-linear file
    keeps the latter (72 for Kimi-Linear-48B-A3B), though its K-only cache never stores V.  # linear"""
    meta, arch = ctx.model.metadata, ctx.model.architecture
    n_head = ctx.facts.layers[0].n_head
    default = ctx.facts.n_embd // n_head if n_head else 0
    for part, qtype, key in (("K", type_k, Keys.Attention.KEY_LENGTH), ("V", type_v, Keys.Attention.VALUE_LENGTH)):
        head = int(meta.get(key.format(arch=arch), 0) or 0) or default
        if part == "V" and arch in MLA_V_HEAD_IS_KV_LORA:
            head = int(meta.get(Keys.Attention.KV_LORA_RANK.format(arch=arch), 0) or 0)
        block = GGML_QUANT_SIZES[qtype][0]
        if block > 1 and head % block:
            raise FlagError(f"{part} cache type {qtype.name.lower()} with block size {block} does not divide the "
                            f"model's {part} head size {head}; llama.cpp refuses the context (MLA: K and V share one "
                            f"type, so use unquantized caches such as f16)")


def resolve_on(ctx: ModelContext, flags: LlamaFlags, devices: tuple[Device, ...],
               repack: dict[Q, int] | None = None) -> LlamaSettings:
    """`flags` on this model and an already resolved device list; `repack`: the CPU's repack table
    (default: this machine's)."""
    facts = ctx.facts
    if flags.split_mode == "tensor":
        check_tensor_split(ctx.model.architecture, flags.flash_attn)
    placement = place(ctx.loaded_slots(flags), facts.n_layer_all, flags, devices, repack)
    cp = context_params(flags, facts.n_ctx_train)
    type_k, type_v = cache_type(flags.cache_type_k), cache_type(flags.cache_type_v)
    # llama_init_from_model refuses the context (llama-context.cpp): MLA models and DeepSeek-V4 by name
    if (facts.mla or facts.arch in DSV4_CACHE) and type_k != type_v:
        raise FlagError(f"the model does not support different K ({flags.cache_type_k}) and V "
                        f"({flags.cache_type_v}) cache types (its caches hold K only)")
    if facts.mla and flags.flash_attn != "off":
        _check_mla_cache_blocks(ctx, type_k, type_v)
    pulled = pulled_attention(facts, flags, placement.layer_device)
    cp = resolve_auto_fa(flags, cp, type_v, pulled)
    alignment = {HOST: HOST_ALIGNMENT, CPU_REPACK: HOST_ALIGNMENT, **{d.name: d.alignment for d in devices}}
    padding = {d.name: d.profile.row_padding for d in devices if d.profile.row_padding}
    return LlamaSettings(ctx, flags, devices, placement, cp, type_k, type_v,
                         MappingProxyType(kv_cells(facts, cp, flags.swa_full)), MappingProxyType(pulled),
                         MappingProxyType(alignment), MappingProxyType(padding))
