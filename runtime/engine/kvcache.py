"""KV caches per layer on the layer's device, and the cell bookkeeping that fills the graph inputs.

Facts (pinned llama.cpp, src/llama-kv-cache.cpp and llama-kv-cache-iswa.cpp):
- per layer a K tensor [n_embd_k_gqa, kv_size] and a V tensor [n_embd_v_gqa, kv_size], f16 by
  default; without flash attention V is read transposed and every layer's V row takes the
  widest layer's width; sliding-window layers have their own, smaller cache (planner.llama.kv sizes
  both, so estimate and runtime agree);
- a graph attends over n_kv = min(size, max(256, pad(used_max_p1, 256))) cells, and the
  worst-case reserve uses the whole cache;
- the mask hides empty cells, future positions, and (SWA_TYPE_STANDARD) cells with
  token_pos - cell_pos >= n_swa.
One sequence only: cells are a ring over positions, which gives every token the same set of
visible keys as llama.cpp's slot search (the order of the sum differs, not its terms).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from planner.core.units import pad
from runtime.ggml.graph import GGMLType, Tensor

N_KV_PAD = 256


class CacheKind(enum.Enum):
    BASE = "base"
    SWA = "swa"


@dataclass
class CellTable:
    """Which position each cell holds (-1: empty) in one cache kind."""

    size: int
    window: int           # 0: full attention
    pos: np.ndarray

    @classmethod
    def empty(cls, size: int, window: int) -> CellTable:
        return cls(size, window, np.full(size, -1, dtype=np.int64))

    def cells_for(self, positions: np.ndarray) -> np.ndarray:
        if self.window == 0 and positions.max(initial=0) >= self.size:
            raise ValueError(f"position {int(positions.max())} does not fit a {self.size}-cell cache")
        return positions % self.size

    def store(self, positions: np.ndarray) -> np.ndarray:
        cells = self.cells_for(positions)
        self.pos[cells] = positions
        return cells

    def n_kv(self) -> int:
        used = np.flatnonzero(self.pos >= 0)
        used_max_p1 = int(used[-1]) + 1 if used.size else 0
        return min(self.size, max(N_KV_PAD, pad(used_max_p1, N_KV_PAD)))

    def mask(self, positions: np.ndarray, n_kv: int) -> np.ndarray:
        """[n_tokens, n_kv] of 0 (visible) and -inf."""
        cell_pos = self.pos[:n_kv][None, :]
        tok = positions[:, None]
        visible = (cell_pos >= 0) & (cell_pos <= tok)
        if self.window:
            visible &= (tok - cell_pos) < self.window
        return np.where(visible, 0.0, -np.inf).astype(np.float32)

    def clear(self) -> None:
        self.pos[:] = -1


class KVCache:
    """K and V tensors per layer (storage is given by the caller) plus one cell table per kind."""

    def __init__(self, n_embd_gqa: list[int], swa: list[bool], sizes: dict[CacheKind, int], window: int,
                 v_trans: bool, cache_type: GGMLType = GGMLType.F16) -> None:
        self.v_trans = v_trans
        self.kinds = [CacheKind.SWA if s else CacheKind.BASE for s in swa]
        self.tables = {k: CellTable.empty(sizes[k], window if k is CacheKind.SWA else 0)
                       for k in set(self.kinds)}
        v_width = max(n_embd_gqa)
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        for il, width in enumerate(n_embd_gqa):
            size = sizes[self.kinds[il]]
            self.k.append(Tensor(cache_type, (width, size, 1), name=f"cache_k_l{il}"))
            self.v.append(Tensor(cache_type, (v_width if v_trans else width, size, 1), name=f"cache_v_l{il}"))

    def kind_order(self) -> list[CacheKind]:
        """Kinds in llama.cpp's input order: the base cache's inputs first, then the SWA cache's."""
        return [k for k in (CacheKind.BASE, CacheKind.SWA) if k in self.tables]

    def clear(self) -> None:
        for table in self.tables.values():
            table.clear()
