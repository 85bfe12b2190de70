"""Context memory per device: KV caches, SWA caches and recurrent states, as the pinned llama.cpp sizes them.

Sizes read a `LlamaSettings` (settings.py): its cells per attention kind, cache types, placement
and row alignments were resolved once from the flags.

Sources (llama.cpp in llama-cpp-python 0.3.36):
- src/llama-kv-cache.cpp: per layer a K tensor [n_embd_k_gqa, kv_size, n_stream] and a V tensor
  [n_embd_v_gqa, kv_size, n_stream] on the layer's device (CPU with -nkvo); V rows take the
  largest layer's width when V is stored transposed (no flash attention); MLA caches hold K only.
- src/llama-kv-cache-dsa.cpp: DSA models keep the lightning indexer's keys in a second K-only cache of
  the same cells (LayerFacts.index_k wide, type_k) for the layers that own an indexer; glm5-next's
  src/llama-memory-hybrid-idx.cpp likewise (key, gate and pooled value: 3 x key_length wide).
- src/llama-kv-cache-msa.cpp: minimax-m3's indexer cache, same cells, K LayerFacts.index_k wide (type_k) and
  V LayerFacts.index_v wide (type_v) for the blocks past the leading dense ones.
- src/llama-kv-cache-iswa.cpp: SWA layers have their own cells (settings.swa_cells).
- src/llama-kv-cache-dsv4.cpp: DeepSeek-V4's raw, compressed and indexer caches and compressor states
  (kv_dsv4.py).
- src/llama-memory-recurrent.cpp: per recurrent layer f32 r and s rows x max(1, n_seq) x (1 + n_rs_seq), the
  rollback rows of draft-mtp / -eagle3 / -dflash / -dspark (--spec-draft-n-max each, 0 otherwise) on the
  architectures that keep them (planner.llama.companions.target_n_rs_seq).
Every tensor is padded to its buffer's alignment (ggml_backend_alloc_ctx_tensors_from_buft_size).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from planner.core.units import pad
from planner.llama.companions import target_n_rs_seq
from planner.llama.kv_dsv4 import dsv4_cells, dsv4_layer_bytes
from planner.llama.placement import row_of
from planner.llama.settings import LlamaSettings
from planner.llama.tensor_parallel import state_slices
from planner.model.arch import AttnKind
from planner.model.costs import STATE_BYTES_PER_ELEMENT, cache_row_bytes


@dataclass(frozen=True)
class LayerCache:
    layer: int
    row: str          # buffer row: device name or Host
    cells: int        # cells per stream (0 for a recurrent state)
    bytes: int
    # -sm tensor, a recurrent state on the meta device: its bytes on each member (the states are
    # really allocated even in a dry run, and a meta buffer is as large as its largest member's)
    member_bytes: tuple[int, ...] = ()


def layer_caches(settings: LlamaSettings, nextn: bool = False) -> list[LayerCache]:
    """Every layer's cache: its size in cells and bytes, and the buffer row it is counted on. `nextn`:
    the MTP draft context's cache instead, a plain KV cache of the nextn blocks alone (llama-model.cpp
    create_memory with LLAMA_CONTEXT_TYPE_MTP: the layer filter il >= n_layer)."""
    facts, flags, cp = settings.ctx.facts, settings.flags, settings.cparams
    trunk = [lf for lf in facts.layers if lf.nextn == nextn]
    # llama_memory_recurrent: mem_size x (1 + n_rs_seq) rows, n_rs_seq the rollback rows a drafter needs
    # (common_context_params_to_llama: need_n_rs_seq); the MTP context's is 0 and it has no states
    rs_rows = max(1, cp.n_seq) * (1 + target_n_rs_seq(facts.arch, flags))
    v_max = max((lf.v_per_cell for lf in trunk if lf.has_kv), default=0)
    out = []
    for lf in trunk:
        dev = settings.placement.layer_device[lf.index] if flags.kv_offload else "CPU"
        row = row_of(dev)
        align = settings.alignment[row]
        if not nextn and (lf.kind is AttnKind.RECURRENT or (lf.state_r or lf.state_s)):
            n_rows = rs_rows
            size = (pad(lf.state_r * STATE_BYTES_PER_ELEMENT * n_rows, align)
                    + pad(lf.state_s * STATE_BYTES_PER_ELEMENT * n_rows, align))
            out.append(LayerCache(lf.index, row, 0, size, _member_state_bytes(settings, dev, lf.index, n_rows)))
        if not lf.has_kv or lf.kind not in (AttnKind.FULL, AttnKind.SWA):
            continue
        if lf.comp_ratio is not None:   # dsv4: llama_kv_cache_dsv4 (kv_dsv4.py)
            out.append(LayerCache(lf.index, row, dsv4_cells(settings, 0), dsv4_layer_bytes(settings, lf, row)))
            continue
        cells = settings.kv_cells[lf.kind]
        k = cache_row_bytes(settings.type_k, lf.k_per_cell, f"layer {lf.index}'s K") * cells * cp.n_stream
        padded = row in settings.row_padding
        k = settings.alloc_size(row, settings.type_k, lf.k_per_cell, k) if padded else k
        v_width = lf.v_per_cell if cp.flash_attn else v_max
        v = (cache_row_bytes(settings.type_v, v_width, f"layer {lf.index}'s V") * cells * cp.n_stream
             if not facts.mla else 0)
        v = settings.alloc_size(row, settings.type_v, v_width, v) if v and padded else v
        out.append(LayerCache(lf.index, row, cells, pad(k, align) + (pad(v, align) if v else 0)
                              + _indexer_bytes(settings, lf.index_k, row, cells)
                              + _indexer_v_bytes(settings, lf.index_v, row, cells)))
    return out


def _indexer_bytes(settings: LlamaSettings, width: int, row: str, cells: int) -> int:
    """mla: a DSA layer's indexer key cache, a tensor [width, cells, n_stream] of type_k of its own
    (llama_kv_cache_dsa's second llama_kv_cache: same cells, K only)."""
    if not width:
        return 0
    k = cache_row_bytes(settings.type_k, width, "the indexer cache's K") * cells * settings.cparams.n_stream
    k = settings.alloc_size(row, settings.type_k, width, k) if row in settings.row_padding else k
    return pad(k, settings.alignment[row])


def _indexer_v_bytes(settings: LlamaSettings, width: int, row: str, cells: int) -> int:
    """glm5: an MSA layer's indexer V tensor [width, cells, n_stream] of type_v (llama_kv_cache_msa's
    second llama_kv_cache is not MLA, so it stores V; one head, the same width transposed or not)."""
    if not width:
        return 0
    v = cache_row_bytes(settings.type_v, width, "the indexer cache's V") * cells * settings.cparams.n_stream
    v = settings.alloc_size(row, settings.type_v, width, v) if row in settings.row_padding else v
    return pad(v, settings.alignment[row])


def _member_state_bytes(settings: LlamaSettings, dev: str, layer: int, n_rows: int) -> tuple[int, ...]:
    """A recurrent layer's r and s states on each member of the meta device `dev` (() elsewhere):
    ggml_backend_meta_alloc_ctx_tensors_from_buft allocates each member's slices in its own buffer
    (ggml-backend-meta.cpp), padded to that member's alignment."""
    device = next((d for d in settings.devices if d.name == dev and d.members), None)
    if device is None:
        return ()
    ss = state_slices(settings.ctx.model, settings.ctx.facts, layer, len(device.members), settings.flags.tensor_split)
    if ss is None:
        return ()
    return tuple(pad(r * STATE_BYTES_PER_ELEMENT * n_rows, m.alignment) + pad(s * STATE_BYTES_PER_ELEMENT * n_rows,
                                                                              m.alignment)
                 for m, r, s in zip(device.members, ss.r, ss.s, strict=True))


def context_bytes(caches: list[LayerCache]) -> dict[str, int]:
    """Context bytes per buffer row. The recurrent states of a meta device count as its largest
    member's share (a meta buffer's size is its largest member buffer's), its KV caches at full size
    (a dry run sizes them by the meta buffer type's alloc size, the largest member's of the full tensor)."""
    out: dict[str, int] = defaultdict(int)
    members: dict[str, list[int]] = {}
    for c in caches:
        if c.member_bytes:
            acc = members.setdefault(c.row, [0] * len(c.member_bytes))
            for j, b in enumerate(c.member_bytes):
                acc[j] += b
        else:
            out[c.row] += c.bytes
    for row, acc in members.items():
        out[row] += max(acc)
    return dict(out)
