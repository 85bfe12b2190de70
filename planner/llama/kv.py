"""Context memory per device: KV caches, SWA caches and recurrent states, as the pinned llama.cpp sizes them.

Sources (llama.cpp in llama-cpp-python 0.3.36):
- src/llama-context.cpp: n_ctx = -c or the training context, padded to 256; without a unified
  cache each of the -np streams gets n_ctx_seq = pad(n_ctx / n_seq, 256) cells; n_batch =
  min(n_ctx, -b), n_ubatch = min(n_batch, -ub).
- src/llama-kv-cache.cpp: per layer a K tensor [n_embd_k_gqa, kv_size, n_stream] and a V tensor
  [n_embd_v_gqa, kv_size, n_stream] on the layer's device (CPU with -nkvo); V rows take the
  largest layer's width when V is stored transposed (no flash attention); MLA caches hold K only.
- src/llama-kv-cache-iswa.cpp: SWA layers get pad(min(kv_size, n_swa * (unified ? n_seq : 1) +
  n_ubatch), 256) cells, or kv_size with --swa-full.
- src/llama-memory-recurrent.cpp: per recurrent layer f32 r and s rows x max(1, n_seq).
Every tensor is padded to its buffer's alignment (ggml_backend_alloc_ctx_tensors_from_buft_size).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from planner.model.arch import AttnKind, ModelFacts
from planner.model.costs import STATE_BYTES_PER_ELEMENT, cache_row_bytes, cache_type
from planner.core.errors import FlagError
from planner.core.units import pad
from planner.llama.flags import LlamaFlags
from planner.llama.placement import HOST, Placement

CTX_PAD = 256


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
    n_ctx = flags.n_ctx or n_ctx_train
    if n_ctx <= 0:
        raise FlagError("-c 0 asks for the training context, but the model declares none")
    n_seq = max(1, flags.n_parallel)
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
    if not fa and cache_type(flags.cache_type_v).name not in ("F16", "F32", "BF16"):
        raise FlagError("quantized V cache was requested, but this requires Flash Attention (-fa on)")
    return ContextParams(n_ctx, n_ctx_seq, n_seq, 1 if flags.kv_unified else n_seq, n_batch, n_ubatch, fa,
                         flags.kv_unified)


def pulled_attention(facts: ModelFacts, flags: LlamaFlags, layer_device: tuple[str, ...]) -> dict[int, str]:
    """Host attention layers whose attention core the scheduler runs on the next device.

    Measured on a Granite-4.0-H-class hybrid (GGML_SCHED_DEBUG, llama-fit-params -v): when a host
    attention layer is followed by a device's first layer and that layer is recurrent, the recurrent
    state gathers sit next to the attention in graph order and ggml's expand passes give the
    attention core (scores or the fused op) to that device; its K and V views and the mask are
    copied there. With -nkvo llama.cpp pins attention to the CPU, so nothing moves.
    """
    if not flags.kv_offload:
        return {}
    trunk = [lf for lf in facts.layers if not lf.nextn]
    return {lf.index: layer_device[nxt.index] for lf, nxt in zip(trunk, trunk[1:])
            if layer_device[lf.index] == "CPU" and layer_device[nxt.index] != "CPU"
            and lf.kind in (AttnKind.FULL, AttnKind.SWA) and nxt.kind is AttnKind.RECURRENT}


def resolve_auto_fa(facts: ModelFacts, flags: LlamaFlags, cp: ContextParams,
                    layer_device: tuple[str, ...]) -> ContextParams:
    """-fa auto once layers are placed: llama.cpp turns flash attention off when a layer's fused op
    is scheduled on another device than the layer (src/llama-context.cpp resolve_fused_ops), which
    is what `pulled_attention` describes. A quantized V cache forces it on instead."""
    if flags.flash_attn != "auto" or not cp.flash_attn:
        return cp
    if cache_type(flags.cache_type_v).name not in ("F16", "F32", "BF16"):
        return cp
    return replace(cp, flash_attn=False) if pulled_attention(facts, flags, layer_device) else cp


def swa_cells(window: int, cp: ContextParams, swa_full: bool) -> int:
    if swa_full:
        return cp.n_ctx_seq
    return pad(min(cp.n_ctx_seq, window * (cp.n_seq if cp.kv_unified else 1) + cp.n_ubatch), CTX_PAD)


@dataclass(frozen=True)
class LayerCache:
    layer: int
    row: str          # buffer row: device name or Host
    cells: int        # cells per stream (0 for a recurrent state)
    bytes: int


def layer_caches(facts: ModelFacts, flags: LlamaFlags, cp: ContextParams, placement: Placement,
                 alignment: dict[str, int]) -> list[LayerCache]:
    """Every layer's cache: its size in cells and bytes, and the buffer row it is counted on."""
    type_k, type_v = cache_type(flags.cache_type_k), cache_type(flags.cache_type_v)
    trunk = [lf for lf in facts.layers if not lf.nextn]
    v_max = max((lf.v_per_cell for lf in trunk if lf.has_kv), default=0)
    out = []
    for lf in trunk:
        dev = placement.layer_device[lf.index] if flags.kv_offload else "CPU"
        row = HOST if dev == "CPU" else dev
        align = alignment.get(row, 32)
        if lf.kind is AttnKind.RECURRENT or (lf.state_r or lf.state_s):
            n_rows = max(1, cp.n_seq)
            size = (pad(lf.state_r * STATE_BYTES_PER_ELEMENT * n_rows, align)
                    + pad(lf.state_s * STATE_BYTES_PER_ELEMENT * n_rows, align))
            out.append(LayerCache(lf.index, row, 0, size))
        if not lf.has_kv or lf.kind not in (AttnKind.FULL, AttnKind.SWA):
            continue
        cells = swa_cells(lf.window, cp, flags.swa_full) if lf.kind is AttnKind.SWA else cp.n_ctx_seq
        k = cache_row_bytes(type_k, lf.k_per_cell, f"layer {lf.index}'s K") * cells * cp.n_stream
        v_width = lf.v_per_cell if cp.flash_attn else v_max
        v = cache_row_bytes(type_v, v_width, f"layer {lf.index}'s V") * cells * cp.n_stream if not facts.mla else 0
        out.append(LayerCache(lf.index, row, cells, pad(k, align) + (pad(v, align) if v else 0)))
    return out


def context_bytes(caches: list[LayerCache]) -> dict[str, int]:
    """Context bytes per buffer row."""
    out: dict[str, int] = defaultdict(int)
    for c in caches:
        out[c.row] += c.bytes
    return dict(out)
