"""DeepSeek-V4's context memory per layer: llama_kv_cache_dsv4 (src/llama-kv-cache-dsv4.cpp at the pinned build).

Every part keeps one stream per sequence (its caches and states are built non-unified whatever -kvu says), each
stream n_ctx_seq cells long before compression (the kv_size create_memory passes), K only:
- raw: an iSWA cache whose every layer slides, so the SWA half alone holds layers: [K, swa cells, n_seq] of
  type_k, swa cells as a non-unified iSWA cache sizes them (settings.swa_cells);
- compressed (layers with a compress ratio r, 4 = CSA or 128 = HCA): [K, pad(ceil(n_ctx_seq / r), 256), n_seq]
  of type_k (dsv4_comp_size, GGML_PAD to 256);
- the lightning indexer (CSA layers): [index_k, the CSA cells, n_seq] of type_k;
- compressor states (llama_dsv4_comp_state), f32 kv and score tensors [width, rows, n_seq * (1 + n_rs_seq)]:
  CSA 2 x head_k by 2 x 4 rows, HCA head_k by 128 rows, indexer 2 x index_k by 2 x 4 rows. n_rs_seq is 0
  without speculative decoding (common_params' need_n_rs_seq), which fitplan does not size.
Each tensor is padded to its buffer's alignment, as for the other caches.
"""
from __future__ import annotations

from dataclasses import replace

from planner.core.units import pad
from planner.llama.settings import CTX_PAD, LlamaSettings, swa_cells
from planner.model.arch import DSV4_CSA_RATIO, DSV4_HCA_RATIO, LayerFacts
from planner.model.costs import STATE_BYTES_PER_ELEMENT, cache_row_bytes

# llama-kv-cache-dsv4.cpp: the compressor state rows per ratio (state_size: 2 x ratio for CSA, ratio for HCA)
# and the state width in head widths (2 x for CSA's overlapping windows)
_STATE = {DSV4_CSA_RATIO: (2 * DSV4_CSA_RATIO, 2), DSV4_HCA_RATIO: (DSV4_HCA_RATIO, 1)}


def dsv4_cells(settings: LlamaSettings, ratio: int) -> int:
    """Cells per stream of a compressed cache of this ratio, or of the raw cache for ratio 0."""
    cp = settings.cparams
    if ratio == 0:
        return swa_cells(settings.ctx.facts.layers[0].window, replace(cp, kv_unified=False), settings.flags.swa_full)
    return pad(max(1, -(-cp.n_ctx_seq // ratio)), CTX_PAD)


def dsv4_layer_bytes(settings: LlamaSettings, lf: LayerFacts, row: str) -> int:
    """Bytes of one DSV4 layer's caches and compressor states on its buffer row."""
    n_seq = settings.cparams.n_seq
    align = settings.alignment[row]

    def k_cache(width: int, cells: int, what: str) -> int:
        k = cache_row_bytes(settings.type_k, width, what) * cells * n_seq
        k = settings.alloc_size(row, settings.type_k, width, k) if row in settings.row_padding else k
        return pad(k, align)

    def state(width: int, rows: int) -> int:   # the kv and the score tensor
        return 2 * pad(width * rows * n_seq * STATE_BYTES_PER_ELEMENT, align)

    total = k_cache(lf.k_per_cell, dsv4_cells(settings, 0), f"layer {lf.index}'s K")
    ratio = lf.comp_ratio or 0
    if ratio:
        cells = dsv4_cells(settings, ratio)
        rows, mult = _STATE[ratio]
        total += k_cache(lf.k_per_cell, cells, f"layer {lf.index}'s compressed K")
        total += state(mult * lf.head_dim_k, rows)
        if ratio == DSV4_CSA_RATIO and lf.index_k:
            total += k_cache(lf.index_k, cells, f"layer {lf.index}'s indexer K")
            total += state(mult * lf.index_k, rows)
    return total
