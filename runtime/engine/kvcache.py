"""KV caches per layer on the layer's device, and the cell bookkeeping that fills the graph inputs.

Facts (pinned llama.cpp, src/llama-kv-cache.cpp and llama-kv-cache-iswa.cpp):
- per layer a K tensor [n_embd_k_gqa, kv_size, n_stream] of -ctk's type and a V tensor
  [n_embd_v_gqa, kv_size, n_stream] of -ctv's type (n_stream: 1 with a unified cache, else -np);
  without flash attention V is read transposed and every layer's V row takes the widest layer's
  width; sliding-window layers have their own, smaller cache (planner.llama.kv sizes both, so
  estimate and runtime agree);
- a quantized K (V) cache whose head size is a multiple of 64 rotates Q and K (V and the
  attention output) by a Walsh-Hadamard matrix, a graph input (attn_rot_k / attn_rot_v;
  `rotation_size`);
- a graph attends over n_kv = min(size, max(256, pad(used_max_p1, 256))) cells, and the
  worst-case reserve uses the whole cache;
- the mask hides empty cells, future positions, and (SWA_TYPE_STANDARD) cells with
  token_pos - cell_pos >= n_swa.
Decode runs one sequence on f16/f32 caches: cells are a ring over positions, which gives every
token the same set of visible keys as llama.cpp's slot search (the order of the sum differs, not
its terms). Other caches are sized (the reserve) but not executed.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES

from planner.core.units import pad
from runtime.ggml.graph import GGMLType, Tensor

N_KV_PAD = 256
ROT_MIN = 64   # llama-kv-cache.cpp: the smallest Hadamard rotation, and the head-size multiple it needs


class CacheKind(enum.Enum):
    BASE = "base"
    SWA = "swa"


def is_quantized(cache_type: GGMLType) -> bool:
    """ggml_is_quantized: block types (f16, bf16 and f32 are not)."""
    return GGML_QUANT_SIZES[cache_type][0] > 1


def rotation_size(cache_type: GGMLType, head_dim: int, widest: bool) -> int:
    """Side of the Hadamard matrix llama.cpp rotates a quantized cache's heads by, 0 for none
    (llama_kv_cache: attn_rot_k/attn_rot_v, build_input_k_rot/v_rot). K takes the largest power of
    two from 64 up that divides the head size (`widest`); V always takes 64."""
    if not is_quantized(cache_type) or head_dim <= 0 or head_dim % ROT_MIN:
        return 0
    n = ROT_MIN
    while widest and head_dim % (2 * n) == 0:
        n *= 2
    return n


@dataclass
class CellTable:
    """Which position each cell holds (-1: empty) in one cache kind. The per-cell array exists once a
    token is stored: a reserve sizes a cache of any length (a header's 2^31-token training context
    included) without one array entry per cell."""

    size: int
    window: int           # 0: full attention
    _pos: np.ndarray | None = None

    @classmethod
    def empty(cls, size: int, window: int) -> CellTable:
        return cls(size, window)

    @property
    def pos(self) -> np.ndarray:
        if self._pos is None:
            self._pos = np.full(self.size, -1, dtype=np.int64)
        return self._pos

    def cells_for(self, positions: np.ndarray) -> np.ndarray:
        if self.window == 0 and positions.max(initial=0) >= self.size:
            raise ValueError(f"position {int(positions.max())} does not fit a {self.size}-cell cache")
        return positions % self.size

    def store(self, positions: np.ndarray) -> np.ndarray:
        cells = self.cells_for(positions)
        self.pos[cells] = positions
        return cells

    def n_kv(self) -> int:
        if self._pos is None:
            return min(self.size, N_KV_PAD)
        used = np.flatnonzero(self.pos >= 0)
        used_max_p1 = int(used[-1]) + 1 if used.size else 0
        return min(self.size, max(N_KV_PAD, pad(used_max_p1, N_KV_PAD)))

    def mask(self, positions: np.ndarray, n_kv: int) -> np.ndarray:
        """[n_tokens, n_kv] of 0 (visible) and -inf."""
        cell_pos = (self.pos[:n_kv] if self._pos is not None else np.full(n_kv, -1, dtype=np.int64))[None, :]
        tok = positions[:, None]
        visible = (cell_pos >= 0) & (cell_pos <= tok)
        if self.window:
            visible &= (tok - cell_pos) < self.window
        return np.where(visible, 0.0, -np.inf).astype(np.float32)

    def clear(self) -> None:
        if self._pos is not None:
            self._pos[:] = -1


class KVCache:
    """K and V tensors per layer (storage is given by the caller) plus one cell table per kind.
    `sizes` are cells per stream; `head_dim` is the one head size of K and V (0: no rotation)."""

    def __init__(self, n_embd_gqa: list[int], swa: list[bool], sizes: dict[CacheKind, int], window: int,
                 v_trans: bool, type_k: GGMLType = GGMLType.F16, type_v: GGMLType | None = None,
                 n_stream: int = 1, head_dim: int = 0, n_embd_v_gqa: list[int] | None = None,
                 head_dim_v: int = 0) -> None:
        """`n_embd_v_gqa` and `head_dim_v`: V's widths where they differ from K's (mimo2), else None and 0."""
        type_v = type_k if type_v is None else type_v
        self.v_trans = v_trans
        self.n_stream = n_stream
        self.type_k, self.type_v = type_k, type_v
        self.rot_k = rotation_size(type_k, head_dim, widest=True)
        self.rot_v = rotation_size(type_v, head_dim_v or head_dim, widest=False)
        self.kinds = [CacheKind.SWA if s else CacheKind.BASE for s in swa]
        self.tables = {k: CellTable.empty(sizes[k], window if k is CacheKind.SWA else 0)
                       for k in set(self.kinds)}
        v_widths = n_embd_gqa if n_embd_v_gqa is None else n_embd_v_gqa
        v_width = max(v_widths)
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        for il, (width, width_v) in enumerate(zip(n_embd_gqa, v_widths, strict=True)):
            size = sizes[self.kinds[il]]
            self.k.append(Tensor(type_k, (width, size, n_stream), name=f"cache_k_l{il}"))
            self.v.append(Tensor(type_v, (v_width if v_trans else width_v, size, n_stream), name=f"cache_v_l{il}"))

    def kind_order(self) -> list[CacheKind]:
        """Kinds in llama.cpp's input order: the base cache's inputs first, then the SWA cache's."""
        return [k for k in (CacheKind.BASE, CacheKind.SWA) if k in self.tables]

    def clear(self) -> None:
        for table in self.tables.values():
            table.clear()
