"""What every layer costs: weight bytes by group, KV bytes per cell, recurrent state per sequence.

Pure functions of a `ModelFile` and its `ModelFacts`; no placement decisions here.
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile, TensorInfo, row_size
from planner.model.arch import AttnKind, ModelFacts
from planner.model.tensors import (
    NO_OUTPUT_MATRIX,
    OUTPUT,
    TOKEN_EMBD,
    is_dense_ffn,
    is_mixer,
    is_norm,
    is_routed_expert,
    is_shared_expert,
    layer_of,
)

# llama.cpp's accepted -ctk/-ctv values (common/arg.cpp kv_cache_types at the pinned build).
CACHE_TYPES: dict[str, GGMLQuantizationType] = {
    "f32": GGMLQuantizationType.F32, "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16, "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0, "q4_1": GGMLQuantizationType.Q4_1,
    "iq4_nl": GGMLQuantizationType.IQ4_NL, "q5_0": GGMLQuantizationType.Q5_0,
    "q5_1": GGMLQuantizationType.Q5_1,
}
# Recurrent states are always f32 in llama.cpp (llama_memory_recurrent is created with F32 r/s).
STATE_BYTES_PER_ELEMENT = 4


class WeightGroup(enum.Enum):
    ATTENTION = "attention"          # attention or recurrent mixer projections
    FFN = "ffn"                      # dense feed-forward
    EXPERTS = "experts"              # routed experts: what `-ot exps=CPU` / `-cmoe` move
    SHARED_EXPERTS = "shared_experts"
    OTHER = "norms_other"            # norms, router, biases of other kinds, anything else


# First match wins: an expert's norm is an expert tensor, an attention norm is not attention.
_GROUP_RULES: tuple[tuple[Callable[[str], bool], WeightGroup], ...] = (
    (is_routed_expert, WeightGroup.EXPERTS),
    (is_shared_expert, WeightGroup.SHARED_EXPERTS),
    (is_norm, WeightGroup.OTHER),
    (is_mixer, WeightGroup.ATTENTION),
    (is_dense_ffn, WeightGroup.FFN),
)


def tensor_group(suffix: str) -> WeightGroup:
    """Group of a block tensor by its name after `blk.N.` (llama.cpp's tensor naming)."""
    return next((group for matches, group in _GROUP_RULES if matches(suffix)), WeightGroup.OTHER)


@dataclass(frozen=True)
class LayerCost:
    index: int
    kind: AttnKind
    weights: tuple[tuple[WeightGroup, int], ...]  # (group, bytes), every group present
    k_bytes_per_cell: int
    v_bytes_per_cell: int
    state_bytes_per_seq: int
    window: int
    nextn: bool = False
    elements: tuple[tuple[WeightGroup, int], ...] = ()  # parameter counts by group, for FLOPs

    @property
    def weight_bytes(self) -> int:
        return sum(b for _, b in self.weights)

    def group_bytes(self, group: WeightGroup) -> int:
        return dict(self.weights)[group]

    @property
    def kv_bytes_per_cell(self) -> int:
        return self.k_bytes_per_cell + self.v_bytes_per_cell


@dataclass(frozen=True)
class CostTable:
    arch: str
    type_k: str
    type_v: str
    layers: tuple[LayerCost, ...]
    non_repeating: tuple[TensorInfo, ...]
    tied_embeddings: bool  # no output.weight: llama.cpp reuses token_embd as the output matrix

    @property
    def layer_weight_bytes(self) -> int:
        return sum(layer.weight_bytes for layer in self.layers)

    @property
    def non_repeating_bytes(self) -> int:
        return sum(t.n_bytes for t in self.non_repeating)

    @property
    def total_weight_bytes(self) -> int:
        return self.layer_weight_bytes + self.non_repeating_bytes


def cache_type(name: str) -> GGMLQuantizationType:
    try:
        return CACHE_TYPES[name.lower()]
    except KeyError:
        raise BadInput(f"unsupported cache type {name!r}: expected one of {', '.join(CACHE_TYPES)}") from None


def cache_row_bytes(qtype: GGMLQuantizationType, n_elements: int, what: str) -> int:
    """Bytes of one cache row; a quantized cache needs whole blocks (llama.cpp refuses otherwise)."""
    block, _ = GGML_QUANT_SIZES[qtype]
    if n_elements % block:
        raise BadInput(f"cache type {qtype.name.lower()} cannot hold {what}: its row of {n_elements} values "
                       f"is not a multiple of the {block}-value block")
    return row_size(qtype, n_elements)


def cost_table(model: ModelFile, facts: ModelFacts, type_k: str = "f16", type_v: str = "f16") -> CostTable:
    qk, qv = cache_type(type_k), cache_type(type_v)
    sums: list[dict[WeightGroup, int]] = [{g: 0 for g in WeightGroup} for _ in facts.layers]
    counts: list[dict[WeightGroup, int]] = [{g: 0 for g in WeightGroup} for _ in facts.layers]
    non_repeating: list[TensorInfo] = []
    for t in model.tensors:
        il, suffix = layer_of(t.name)
        if il is not None and il < len(sums):
            group = tensor_group(suffix)
            sums[il][group] += t.n_bytes
            counts[il][group] += t.n_elements
        else:
            non_repeating.append(t)
    layers = []
    for lf, groups, n_params in zip(facts.layers, sums, counts, strict=True):
        k = cache_row_bytes(qk, lf.k_per_cell, f"layer {lf.index}'s K") if lf.k_per_cell else 0
        k += cache_row_bytes(qk, lf.index_k, f"layer {lf.index}'s indexer K") if lf.index_k else 0   # DSA
        v = cache_row_bytes(qv, lf.v_per_cell, f"layer {lf.index}'s V") if lf.v_per_cell else 0
        v += cache_row_bytes(qv, lf.index_v, f"layer {lf.index}'s indexer V") if lf.index_v else 0   # MSA
        layers.append(LayerCost(
            index=lf.index, kind=lf.kind, weights=tuple(groups.items()),
            k_bytes_per_cell=k, v_bytes_per_cell=v,
            state_bytes_per_seq=(lf.state_r + lf.state_s) * STATE_BYTES_PER_ELEMENT,
            window=lf.window, nextn=lf.nextn, elements=tuple(n_params.items()),
        ))
    tied = (model.tensor(OUTPUT) is None and model.tensor(TOKEN_EMBD) is not None
            and facts.arch not in NO_OUTPUT_MATRIX)
    return CostTable(arch=facts.arch, type_k=type_k.lower(), type_v=type_v.lower(), layers=tuple(layers),
                     non_repeating=tuple(non_repeating), tied_embeddings=tied)
