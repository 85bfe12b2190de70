"""What deepseek4's graph reads from its file, as llama_model_deepseek4::load_arch_hparams reads it, and the
tensors of llama_kv_cache_dsv4 beside the raw window cache (src/models/deepseek4.cpp,
src/llama-kv-cache-dsv4.cpp at the pinned build): per CSA (ratio 4) or HCA (ratio 128) block its compressed K
cache of type_k, [head_dim, cells, n_seq], and its compressor's f32 kv and score states, [w, rows, n_seq]
(CSA 2 x head_dim by 2 x 4 rows, HCA head_dim by 128); per CSA block also the lightning indexer's K cache and
states (index_head wide). planner/llama/kv_dsv4.py sizes the same tensors for the context rows.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from gguf import Keys

from planner.core.errors import GGUFError
from planner.gguf.keys import (
    LLM_KV_ATTENTION_COMPRESS_RATIOS,
    LLM_KV_ATTENTION_COMPRESS_ROPE_FREQ_BASE,
    LLM_KV_ATTENTION_OUTPUT_GROUP_COUNT,
    LLM_KV_ATTENTION_OUTPUT_LORA_RANK,
    LLM_KV_HASH_LAYER_COUNT,
    LLM_KV_HC_COUNT,
    LLM_KV_HC_EPSILON,
    LLM_KV_HC_SINKHORN_ITERATIONS,
)
from planner.gguf.reader import ModelFile
from planner.model.arch import DSV4_CSA_RATIO, DSV4_HCA_RATIO, ModelFacts
from runtime.ggml.attn_res import HC_COMB_STREAMS
from runtime.ggml.graph import GGMLType, Tensor, contiguous_strides

DEEPSEEK4 = "deepseek4"
F32 = GGMLType.F32
# llama-kv-cache-dsv4.cpp: compressor state rows per stream (CSA and the indexer 2 x 4, HCA 128)
STATE_ROWS = {DSV4_CSA_RATIO: 2 * DSV4_CSA_RATIO, DSV4_HCA_RATIO: DSV4_HCA_RATIO}


@dataclass(frozen=True)
class Dsv4HParams:
    """What deepseek4's graph needs, read as llama_model_deepseek4::load_arch_hparams reads it. The raw
    cache the runner allocates is K only, one head of head_dim per cell, every layer windowed."""

    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    head_dim: int
    n_rot: int
    q_lora: int
    o_groups: int
    o_lora: int
    eps: float
    freq_base: float
    compress_freq_base: float
    ratios: tuple[int, ...]
    n_expert: int
    n_expert_used: int
    weights_norm: bool
    weights_scale: float
    n_hash: int
    n_index_head: int
    index_head: int
    index_top_k: int
    n_swa: int
    hc_mult: int
    hc_eps: float
    hc_iters: int

    @property
    def swa(self) -> tuple[bool, ...]:
        return (True,) * self.n_layer

    def n_embd_gqa(self, il: int) -> int:
        return self.head_dim


def _get(model: ModelFile, template: str, default: float) -> float:
    return float(model.metadata.get(template.format(arch=model.architecture), default) or default)


def read_deepseek4_hparams(model: ModelFile, facts: ModelFacts) -> Dsv4HParams:
    trunk = [lf for lf in facts.layers if not lf.nextn]
    ratios = tuple(int(lf.comp_ratio or 0) for lf in trunk)
    hc = int(_get(model, LLM_KV_HC_COUNT, 0))
    if hc != HC_COMB_STREAMS:
        raise GGUFError(model.path, f"deepseek4: hyper_connection.count {hc}; llama.cpp builds 4 streams only")
    if not model.metadata.get(LLM_KV_ATTENTION_COMPRESS_RATIOS.format(arch=model.architecture)):
        raise GGUFError(model.path, "deepseek4: no attention.compress_ratios")
    return Dsv4HParams(
        arch=model.architecture, n_layer=facts.n_layer, n_embd=facts.n_embd, n_vocab=facts.n_vocab,
        n_head=trunk[0].n_head, head_dim=int(_get(model, Keys.Attention.KEY_LENGTH, 0)),
        n_rot=int(_get(model, Keys.Rope.DIMENSION_COUNT, 0)),
        q_lora=int(_get(model, Keys.Attention.Q_LORA_RANK, 0)),
        o_groups=int(_get(model, LLM_KV_ATTENTION_OUTPUT_GROUP_COUNT, 0)),
        o_lora=int(_get(model, LLM_KV_ATTENTION_OUTPUT_LORA_RANK, 0)),
        eps=_get(model, Keys.Attention.LAYERNORM_RMS_EPS, 1e-6), freq_base=_get(model, Keys.Rope.FREQ_BASE, 10000.0),
        compress_freq_base=_get(model, LLM_KV_ATTENTION_COMPRESS_ROPE_FREQ_BASE, 10000.0), ratios=ratios,
        n_expert=facts.n_expert, n_expert_used=facts.n_expert_used,
        weights_norm=bool(model.metadata.get(Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch=model.architecture), False)),
        weights_scale=_get(model, Keys.LLM.EXPERT_WEIGHTS_SCALE, 0.0),
        n_hash=int(_get(model, LLM_KV_HASH_LAYER_COUNT, 0)),
        n_index_head=int(_get(model, Keys.Attention.Indexer.HEAD_COUNT, 0)),
        index_head=int(_get(model, Keys.Attention.Indexer.KEY_LENGTH, 0)),
        index_top_k=int(_get(model, Keys.Attention.Indexer.TOP_K, 0)),
        n_swa=int(_get(model, Keys.Attention.SLIDING_WINDOW, 0)), hc_mult=hc,
        hc_eps=_get(model, LLM_KV_HC_EPSILON, 1e-6), hc_iters=int(_get(model, LLM_KV_HC_SINKHORN_ITERATIONS, 1)),
    )


def loader_shapes(weights: MutableMapping[str, Tensor], hp: Dsv4HParams) -> None:
    """load_arch_tensors creates attn_output_a 3-D, {n_head * head_dim / o_groups, o_lora, o_groups}, from the
    file's 2-D tensor (TENSOR_ALLOW_RESHAPE: the same bytes)."""
    for il in range(hp.n_layer):
        t = weights.get(f"blk.{il}.attn_output_a.weight")
        if t is None:
            continue
        ne = (hp.n_head * hp.head_dim // hp.o_groups, hp.o_lora, hp.o_groups, 1)
        if t.ne != ne:
            if t.n_elements != math.prod(ne):
                raise GGUFError("", f"blk.{il}.attn_output_a: shape {t.ne} does not hold {ne}")
            t.ne = ne
            t.nb = contiguous_strides(t.type, ne)


@dataclass(frozen=True)
class Dsv4Cache:
    """llama_kv_cache_dsv4's tensors besides the raw window cache: per layer its compressed K (CSA or HCA),
    the indexer's K (CSA), and the f32 compressor states (kv, score) of the compressor and the indexer;
    `cells`: the compressed caches' cells per stream, by ratio."""

    cells: Mapping[int, int]
    comp: Sequence[Tensor | None]
    lid: Sequence[Tensor | None]
    state: Sequence[tuple[Tensor, Tensor] | None]
    lid_state: Sequence[tuple[Tensor, Tensor] | None]

    def tensors(self, il: int) -> list[Tensor]:
        out = [t for t in (self.comp[il], self.lid[il]) if t is not None]
        for pair in (self.state[il], self.lid_state[il]):
            out += list(pair) if pair is not None else []
        return out


def _states(width: int, ratio: int, n_stream: int, name: str) -> tuple[Tensor, Tensor]:
    """llama_dsv4_comp_state's kv and score tensors of one layer (no rollback planes)."""
    kv, score = (Tensor(F32, (width, STATE_ROWS[ratio], n_stream, 1), name=f"dsv4_{name}_state_{p}")
                 for p in ("kv", "score"))
    return kv, score


def dsv4_cache(hp: Dsv4HParams, type_k: GGMLType, cells: Mapping[int, int], n_stream: int) -> Dsv4Cache:
    """The tensors of llama_kv_cache_dsv4's kv_csa, kv_hca, kv_lid and its three llama_dsv4_comp_state."""
    comp: list[Tensor | None] = []
    lid: list[Tensor | None] = []
    state: list[tuple[Tensor, Tensor] | None] = []
    lid_state: list[tuple[Tensor, Tensor] | None] = []
    for il, r in enumerate(hp.ratios):
        compressed = r in STATE_ROWS
        csa = r == DSV4_CSA_RATIO
        comp.append(Tensor(type_k, (hp.head_dim, cells[r], n_stream, 1), name=f"cache_k_l{il}") if compressed else None)
        state.append(_states((2 if csa else 1) * hp.head_dim, r, n_stream, f"comp_l{il}") if compressed else None)
        lid.append(Tensor(type_k, (hp.index_head, cells[r], n_stream, 1), name=f"cache_lid_k_l{il}") if csa else None)
        lid_state.append(_states(2 * hp.index_head, r, n_stream, f"lid_l{il}") if csa else None)
    return Dsv4Cache(cells, comp, lid, state, lid_state)
