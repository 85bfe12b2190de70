"""glm5-next (GLM-5.3-Flash): KDA layers where head_count_kv is 0 and nope MLA layers with the k-pool indexer
elsewhere, inside four hyper-connection streams, node for node as the pinned llama.cpp builds it
(src/models/glm5-next.cpp over llama_memory_hybrid_idx, src/llama-memory-hybrid-idx.cpp).

- Four hyper-connection streams [n_embd, 4, T] (the embedding repeated) around each sub-block
  (runtime/engine/mhc.py); after the trunk the output rows are gathered from the flattened streams, averaged
  over the streams, normed and projected.
- KDA: kimi-k3's layer (runtime/engine/kimi_k3.py: conv, safe-gate or softplus decay, fused GATED_DELTA_NET) with
  the L2 norm's epsilon fixed at 1e-6 and the output gate g_b(g_a x).
- MLA: no RoPE; q = q_b(norm(q_a x)) absorbed by wk_b, the latent norm(kv_a x) stored in the K-only cache.
- The k-pool indexer (layers of indexer.types, the others reuse the last selection): each token's key
  LayerNorm(attn_k x) and gate kpool_gate x are stored with a zero pooled slot (3 x key_length per cell); the
  pools the ubatch completes (n_new) are gathered, soft-maxed over their kpool members with the gate plus ape,
  summed and written to the pooled slot; every pool (n_pool = kpool_pad(pools)) is gathered and scored by the
  fused LIGHTNING_INDEXER; the top min(n_pool, top_k / kpool) pools are ordered by score and expanded to their
  cells, plus the incomplete tail (kpool - 1 cells). A ubatch of at most 16 tokens over more cells than it
  selects attends over the gathered latents; otherwise the selection is scattered into a -inf mask (dead slots
  written to dump rows past n_kv) that joins the causal mask, and the attention is build_attn_mha's.
- At reserve the memory is full: n_kv is the cache size, pools = (cells / kpool) x n_seq_max, all of them new.
The SwiGLU clamps (swiglu_clamp_exp / _shexp) select ggml_swiglu_clamp, a GLU node of the same shape and sources
as the plain SwiGLU built here: the runtime sizes these graphs and does not run them (decode is refused).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import GGUFError
from planner.gguf.keys import (
    LLM_KV_ATTENTION_INDEXER_KPOOL,
    LLM_KV_ATTENTION_INDEXER_KPOOL_SELECT_TAIL,
    LLM_KV_HC_COUNT,
    LLM_KV_HC_EPSILON,
    LLM_KV_HC_SINKHORN_ITERATIONS,
    LLM_KV_KDA_GATE_LOWER_BOUND,
)
from planner.gguf.reader import ModelFile, row_size
from planner.model.arch import ModelFacts, model_facts
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import AttnInputs, BatchShape, BuiltGraph
from runtime.engine.clip import cast
from runtime.engine.deepseek2 import Gating, plain_lm_head
from runtime.engine.hy_v4 import hc_output_rows, hc_streams
from runtime.engine.kimi import KimiHParams
from runtime.engine.kimi_k3 import KimiK3Builder
from runtime.engine.kvcache import CacheKind, KVCache
from runtime.engine.mhc import HyperConnections, fill, hc_mean, sum_rows
from runtime.engine.recurrent import RecurrentStates, RsInputs, token_embeddings, ubatch_sequences
from runtime.ggml import build as B
from runtime.ggml import fused_ops as F
from runtime.ggml import ssm
from runtime.ggml.deltanet import repeat_4d
from runtime.ggml.graph import FLAG_OUTPUT, GGMLType, Op, Tensor

GLM5_NEXT = "glm5-next"
I32, I64, F16, F32 = GGMLType.I32, GGMLType.I64, GGMLType.F16, GGMLType.F32
HC_STREAMS = 4             # glm5-next.cpp asserts hyper_connection.count == 4
L2_NORM_EPS = 1e-6         # build_kda_layer: FLA's L2 norm epsilon, not the RMS one
GATHER_MAX_TOKENS = 16     # build_inp_kpool: ubatches of at most this many tokens gather the selected latents
KPOOL_PAD = 64             # kpool_pad (llama-memory-hybrid-idx.cpp): pools padded to 64, one always unused


def kpool_pad(n_pool: int) -> int:
    return max(KPOOL_PAD, -(-(n_pool + 1) // KPOOL_PAD) * KPOOL_PAD)


@dataclass(frozen=True)
class Glm5NextHParams(KimiHParams):
    """KimiHParams (KDA layers, the MLA cache, the MoE) with the k-pool indexer (MlaHParams' n_index_head,
    index_head, index_top_k, index_full) and the hyper-connections (hc_mult, hc_eps)."""

    kpool: int = 0
    select_tail: bool = True
    hc_iters: int = 0
    norm_eps: float = 0.0      # attention.layernorm_epsilon: the indexer key's LayerNorm


@dataclass(frozen=True)
class KpoolShape:
    """build_inp_kpool's sizes for one ubatch."""

    n_pool: int    # pools gathered and scored (padded)
    n_new: int     # pools this ubatch completes (at least one)
    n_top: int     # pools selected per token
    n_sel: int     # cells selected per token (the pools' and the tail's)
    gather: bool   # attend over the gathered latents instead of a scattered mask

    @classmethod
    def reserve(cls, hp: Glm5NextHParams, cells: int, n_seq: int, n_kv: int, n_tokens: int) -> KpoolShape:
        """The reserve's: a full cache (llama_memory_hybrid_idx_context(mem): every pool of every sequence new)."""
        pools = (cells // hp.kpool) * n_seq
        n_pool = kpool_pad(pools)
        n_top = min(n_pool, hp.index_top_k // hp.kpool)
        n_sel = hp.kpool * n_top + (hp.kpool - 1 if hp.select_tail else 0)
        return cls(n_pool, max(pools, 1), n_top, n_sel, n_tokens <= GATHER_MAX_TOKENS and n_kv > n_sel)


def _get(model: ModelFile, template: str, default: float = 0.0) -> float:
    value = model.metadata.get(template.format(arch=model.architecture), default)
    return float(default if value is None else value)


def unsupported_reason(model: ModelFile, facts: ModelFacts) -> str | None:
    """Why this builder cannot build the file's graph as llama.cpp does, or None when it can."""
    if model.architecture != GLM5_NEXT:
        return f"architecture {model.architecture!r} is not built by the glm5-next builder"
    if not facts.mla:
        return "no MLA head sizes (key_length_mla / value_length_mla)"
    if int(_get(model, Keys.Rope.DIMENSION_COUNT)):
        return "a roped MLA (glm5-next.cpp asserts rope.dimension_count 0)"
    if int(_get(model, LLM_KV_HC_COUNT)) != HC_STREAMS:
        return f"hyper_connection.count other than {HC_STREAMS} (glm5-next.cpp asserts it)"
    kpool, top_k = int(_get(model, LLM_KV_ATTENTION_INDEXER_KPOOL)), int(_get(model, Keys.Attention.Indexer.TOP_K))
    if kpool <= 1 or top_k % kpool:
        return "an indexer kpool of at most 1 or a top_k it does not divide (glm5-next.cpp asserts both)"
    names = {t.name for t in model.tensors}
    for lf in facts.layers:
        if lf.nextn:
            continue
        if lf.state_s and tensor_name(T.ATTN_QKV, lf.index) in names:
            return "KDA layers with a fused attn_qkv projection are not built"
    return None


def read_glm5next_hparams(model: ModelFile, facts: ModelFacts | None = None) -> Glm5NextHParams:
    """Glm5NextHParams as llama_model_glm5_next::load_arch_hparams reads them; GGUFError for what the builder
    does not build."""
    facts = facts or model_facts(model)
    reason = unsupported_reason(model, facts)
    if reason is not None:
        raise GGUFError(model.path, f"the runtime's glm5-next builder: {reason}")
    trunk = [lf for lf in facts.layers if not lf.nextn]
    head_k = int(_get(model, Keys.Attention.KEY_LENGTH_MLA))
    # glm5-next.cpp: a file without expert_gating_func gates by sigmoid
    gating = int(_get(model, Keys.LLM.EXPERT_GATING_FUNC)) or Gating.SIGMOID.value
    if gating not in tuple(g.value for g in Gating):
        raise GGUFError(model.path, f"the runtime's glm5-next builder: expert gating function {gating} is not built")
    lower = LLM_KV_KDA_GATE_LOWER_BOUND.format(arch=GLM5_NEXT)
    return Glm5NextHParams(
        arch=GLM5_NEXT, n_layer=facts.n_layer, n_embd=facts.n_embd, n_vocab=facts.n_vocab, n_head=trunk[0].n_head,
        n_rot=0, kv_lora_rank=int(_get(model, Keys.Attention.KV_LORA_RANK)), head_k_mla=head_k,
        head_v_mla=int(_get(model, Keys.Attention.VALUE_LENGTH_MLA)),
        eps=_get(model, Keys.Attention.LAYERNORM_RMS_EPS, 1e-6), freq_base=10000.0, freq_scale=1.0,
        kq_scale=1.0 / math.sqrt(head_k), yarn=False,
        n_dense_lead=int(_get(model, Keys.LLM.LEADING_DENSE_BLOCK_COUNT)), n_expert=facts.n_expert,
        n_expert_used=facts.n_expert_used, gating=Gating(gating),
        weights_norm=bool(model.metadata.get(Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch=GLM5_NEXT), False)),
        weights_scale=_get(model, Keys.LLM.EXPERT_WEIGHTS_SCALE),
        n_index_head=int(_get(model, Keys.Attention.Indexer.HEAD_COUNT)),
        index_head=int(_get(model, Keys.Attention.Indexer.KEY_LENGTH)),
        index_top_k=int(_get(model, Keys.Attention.Indexer.TOP_K)),
        index_full=tuple(lf.index_k > 0 for lf in trunk),
        hc_mult=HC_STREAMS, hc_eps=_get(model, LLM_KV_HC_EPSILON),
        recurrent=tuple(bool(lf.state_s) for lf in trunk), kda_head=int(_get(model, Keys.KDA.HEAD_DIM)),
        d_conv=int(_get(model, Keys.SSM.CONV_KERNEL)),
        gate_lower_bound=_get(model, LLM_KV_KDA_GATE_LOWER_BOUND) if lower in model.metadata else -math.inf,
        kpool=int(_get(model, LLM_KV_ATTENTION_INDEXER_KPOOL)),
        select_tail=bool(model.metadata.get(LLM_KV_ATTENTION_INDEXER_KPOOL_SELECT_TAIL.format(arch=GLM5_NEXT),
                                            True)),
        hc_iters=int(_get(model, LLM_KV_HC_SINKHORN_ITERATIONS)), norm_eps=_get(model, Keys.Attention.LAYERNORM_EPS),
    )


class Glm5NextBuilder(KimiK3Builder):
    """kimi-k3's KDA and kimi-linear's MLA trunk, with glm5-next's hyper-connections and k-pool indexer;
    `index_cache[il]` is layer il's indexer cache [3 key_length, cells, streams] (None where it owns none)."""

    def __init__(self, model: ModelFile, hp: Glm5NextHParams, weights: Mapping[str, Tensor], kv: KVCache,
                 states: RecurrentStates, index_cache: Sequence[Tensor | None], unfused: Set[Op] = frozenset(), *,
                 flash_attn: bool, offload_kqv: bool) -> None:
        super().__init__(model, hp, weights, kv, states, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.ghp = hp
        self.index_cache = index_cache
        self.unfused = unfused   # the HC_FUSED ops resolve_fused_ops turned off (the runner's, read at build)
        self.sel: Tensor | None = None   # the last full indexer's selection (shared by the layers after it)

    # --- inputs ---------------------------------------------------------------------------------
    def _inputs(self, shape: BatchShape) -> None:
        """build_inp_mem_hybrid_k's K indices and mask (MlaBuilder's), then build_inp_kpool's."""
        super()._inputs(shape)
        hp, t = self.ghp, shape.n_tokens
        n_kv = dict(shape.n_kv)[CacheKind.BASE]
        ks = self.ks = KpoolShape.reserve(hp, self.kv.tables[CacheKind.BASE].size, self.states.size, n_kv, t)
        self.index_idxs = B.new_input(I64, (t,), "attn_inp_k_idxs")
        self.pool_cells = B.new_input(I32, (ks.n_pool,), "pool_cells")
        self.pool_idxs = B.new_input(I32, (hp.kpool, ks.n_pool), "pool_idxs")
        # the fused lightning indexer (cparams.fused_lid) reads an f16 mask
        self.pool_mask = B.new_input(F16, (ks.n_pool, t), "pool_mask")
        self.tail_idxs = B.new_input(I32, (hp.kpool - 1, t), "tail_idxs")
        self.gather_mask = B.new_input(F32, (ks.n_sel, 1, 1, t), "gather_mask")
        self.new_pool_idxs = B.new_input(I32, (hp.kpool, ks.n_new), "new_pool_idxs")
        self.new_pool_rep = B.new_input(I64, (ks.n_new,), "new_pool_rep")

    # --- KDA ------------------------------------------------------------------------------------
    def _l2_norm(self, x: Tensor) -> Tensor:
        n = x.ne[0]
        return B.scale(B.rms_norm(x, L2_NORM_EPS / n), 1.0 / math.sqrt(n))

    def _output_gate(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        hp = self.khp
        g2 = B.mul_mat(self._wl(T.SSM_G_B, il), B.mul_mat(self._wl(T.SSM_G_A, il), cur))
        return B.reshape(g2, (hp.kda_head, hp.n_head, n_tokens), name=f"kda_g2-{il}")

    # --- the k-pool indexer ---------------------------------------------------------------------
    def _index_k_norm(self, x: Tensor, il: int) -> Tensor:
        """build_norm(LLM_NORM) with weight and bias (the norm pinned to the layer's device)."""
        n = F.norm(x, self.ghp.norm_eps, name=f"norm-{il}")
        self.out.norm_pins.append((n, il))
        n = B.mul(n, self._wl(T.INDEXER_K_NORM, il), name=f"norm_w-{il}")
        return B.add(n, self._need(tensor_name(T.INDEXER_K_NORM, il, "bias")), name=f"indexer_k-{il}")

    def _pool_new(self, cache: Tensor, il: int) -> Tensor:
        """The pools this ubatch completes: their members' keys soft-maxed by gate + ape and summed [dim, n_new]."""
        hp, ks = self.ghp, self.ks
        dim, kp = hp.index_head, hp.kpool
        key_gate = B.view(cache, (2 * dim, cache.ne[1] * cache.ne[2]), (cache.nb[0], cache.nb[1]), 0)
        rows = B.get_rows(key_gate, B.reshape(self.new_pool_idxs, (kp * ks.n_new,)))
        rows = B.reshape(rows, (2 * dim, kp, ks.n_new))
        pk = B.view(rows, (dim, kp, ks.n_new), (rows.nb[0], rows.nb[1], rows.nb[2]), 0)
        pg = B.view(rows, (dim, kp, ks.n_new), (rows.nb[0], rows.nb[1], rows.nb[2]), row_size(rows.type, dim))
        logits = B.add(pg, self._need(f"blk.{il}.indexer_compressor_ape.weight"))
        logits = B.cont(B.permute(logits, (1, 0, 2, 3)))
        probs = B.soft_max_ext(B.reshape(logits, (kp, dim * ks.n_new)), None, 1.0)
        probs = B.reshape(probs, (kp, dim, ks.n_new))
        pk = B.cont(B.permute(pk, (1, 0, 2, 3)))
        return B.reshape(sum_rows(B.mul(probs, pk)), (dim, ks.n_new), name=f"indexer_pool_k_new-{il}")

    def _top_pools(self, score: Tensor, il: int, n_tokens: int) -> Tensor:
        """The top pools of each token ordered by descending score, I32 [n_top, T]."""
        ks = self.ks
        top = B._node(Op.TOP_K, (ks.n_top, *score.ne[1:]), [score], "", I32)
        sel_score = B.get_rows(B.reshape(score, (1, ks.n_pool, n_tokens)), top)
        order = B._node(Op.ARGSORT, (ks.n_top, n_tokens, 1, 1), [B.reshape(sel_score, (ks.n_top, n_tokens))], "",
                        I32, order="DESC")
        top = B.get_rows(B.reshape(cast(top, F32), (1, ks.n_top, n_tokens)), order)
        return cast(B.cont(B.reshape(top, (ks.n_top, n_tokens))), I32)

    def _kpool_select(self, cur: Tensor, qr: Tensor, mask: Tensor, il: int, n_tokens: int) -> Tensor:
        """build_kpool_select: the selected cells I32 [n_sel, T] (gather), or the additive mask [n_kv, T]."""
        hp, ks, g = self.ghp, self.ks, self.out.graph
        dim, nh, kp = hp.index_head, hp.n_index_head, hp.kpool
        iq = B.reshape(B.mul_mat(self._wl(T.INDEXER_ATTN_Q_B, il), qr), (dim, nh, n_tokens), name=f"indexer_q-{il}")
        ik = self._index_k_norm(B.mul_mat(self._wl(T.INDEXER_ATTN_K, il), cur), il)
        ig = B.mul_mat(self._need(f"blk.{il}.indexer_compressor_gate.weight"), cur, name=f"indexer_gate-{il}")
        zero = fill(B.new_tensor(F32, (dim, n_tokens)), 0.0)
        packed = B.reshape(ssm.concat(ssm.concat(ik, ig, 0), zero, 0), (3 * dim, 1, n_tokens))
        cache = self.index_cache[il]
        assert cache is not None, f"layer {il} owns an indexer but has no indexer cache"
        rows = B.view(packed, (3 * dim, n_tokens), (packed.nb[0], packed.nb[2]), 0)
        kc = cache if cache.ne[2] == 1 else B.reshape(cache, (cache.ne[0], cache.ne[1] * cache.ne[2]))
        g.expand(B.set_rows(kc, rows, self.index_idxs, name=f"cache_idx_k_l{il} (view)"))
        pooled_new = self._pool_new(cache, il)
        pooled_all = B.view(cache, (dim, cache.ne[1] * cache.ne[2]), (cache.nb[0], cache.nb[1]),
                            row_size(cache.type, 2 * dim))
        g.expand(B.set_rows(pooled_all, pooled_new, self.new_pool_rep))   # cache_safe at reserve
        pooled = B.reshape(B.get_rows(pooled_all, self.pool_cells), (dim, 1, ks.n_pool), name=f"indexer_pool_k-{il}")
        w = B.mul_mat(self._wl(T.INDEXER_PROJ, il), cur)
        w = B.scale(w, 1.0 / math.sqrt(dim * nh), name=f"indexer_weights-{il}")
        score = B._node(Op.LIGHTNING_INDEXER, (ks.n_pool, n_tokens, 1, 1), [iq, pooled, w, self.pool_mask],
                        f"indexer_score-{il}")
        top = self._top_pools(score, il, n_tokens)
        sel = B.get_rows(self.pool_idxs, B.reshape(top, (ks.n_top * n_tokens,)))
        sel = B.reshape(sel, (kp * ks.n_top, n_tokens))
        if hp.select_tail:
            sel = ssm.concat(sel, self.tail_idxs, 0, name=f"indexer_sel_idx-{il}")
        return sel if ks.gather else self._scatter(sel, mask, il, n_tokens)

    def _scatter(self, sel: Tensor, mask: Tensor, il: int, n_tokens: int) -> Tensor:
        """The selection as an additive mask: -inf but at the selected cells (each dead slot to its own dump row
        n_kv + slot), plus the causal mask, [n_kv, T]."""
        n_sel, n_kv = self.ks.n_sel, mask.ne[0]
        seed = cast(B.view(sel, (1,), None, 0), F32)
        mask_seed = fill(seed if mask.type == F32 else cast(seed, mask.type), -math.inf)
        every = B.reshape(repeat_4d(mask_seed, (1, n_kv + n_sel, n_tokens, 1)), (1, n_kv + n_sel, n_tokens))
        zeros = B.reshape(repeat_4d(fill(seed, 0.0), (1, n_sel, n_tokens, 1)), (1, n_sel, n_tokens))
        live = B.unary(B.reshape(self.gather_mask, (n_sel, n_tokens)), "EXP")
        dump = Tensor(F32, (n_sel,), op=Op.ARANGE, src=[],
                      op_params={"start": float(n_kv), "stop": float(n_kv + n_sel), "step": 1.0})
        idx = B._node(Op.SUB, (n_sel, n_tokens, 1, 1), [cast(sel, F32), dump], "")
        idx = cast(B.add(B.mul(idx, live), dump), I32)
        kept = B.set_rows(every, zeros, B.reshape(idx, (n_sel, n_tokens, 1)))
        kept = B.view(kept, (n_kv, n_tokens), (kept.nb[0], kept.nb[2]), 0)
        return B.add(kept, B.reshape(mask, (n_kv, n_tokens)), name=f"indexer_sel-{il}")

    # --- MLA --------------------------------------------------------------------------------------
    def _mask(self, il: int, inp: AttnInputs) -> Tensor:
        assert self.sel is not None
        return B.reshape(self.sel, inp.mask.ne, name=f"kq_mask_dsa-{il}")

    def _gathered(self, il: int, q: Tensor, sel: Tensor, n_tokens: int) -> Tensor:
        """The attention over the gathered latents: [n_head * head_v, T] before wo."""
        hp = self.ghp
        kc = self.kv.k[il]
        n_sel = sel.ne[0]
        rows = B.view(kc, (kc.ne[0], kc.ne[1] * kc.ne[2]), (kc.nb[0], kc.nb[1]), 0)
        k = B.get_rows(rows, B.reshape(sel, (n_sel * n_tokens,)))
        k = B.reshape(k, (hp.kv_lora_rank, n_sel, 1, n_tokens), name=f"kv_gathered-{il}")
        qg = B.permute(q, (0, 2, 3, 1))
        vt = B.cont(B.transpose(k))
        kq = B.soft_max_ext(B.mul_mat(k, qg), self.gather_mask, hp.kq_scale, name=f"kq_soft_max_gathered-{il}")
        kqv = B.mul_mat(self._wl(T.ATTN_V_B, il), B.mul_mat(vt, kq), name=f"kqv_gathered-{il}")
        out = B.cont(B.permute(kqv, (0, 2, 1, 3)))
        return B.reshape(out, (kqv.ne[0] * hp.n_head, n_tokens), name=f"kqv_out-{il}")

    def _dsa_layer(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        """build_dsa_layer: the nope MLA over the indexer's selection, through wo."""
        hp, g = self.ghp, self.out.graph
        qr = B.mul_mat(self._wl(T.ATTN_Q_A, il), cur)
        qr = self.norm(qr, self._wl(T.ATTN_Q_A_NORM, il), il, f"q_resid-{il}")
        q = B.reshape(B.mul_mat(self._wl(T.ATTN_Q_B, il), qr), (hp.head_k_mla, hp.n_head, n_tokens))
        kv = B.mul_mat(self._wl(T.ATTN_KV_A_MQA, il), cur)
        kv = self.norm(kv, self._wl(T.ATTN_KV_A_NORM, il), il, f"kv_cmpr-{il}")
        kv = B.reshape(kv, (hp.kv_lora_rank, 1, n_tokens), name=f"kv_cmpr-{il}")
        q = B.mul_mat(self._wl(T.ATTN_K_B, il), B.permute(q, (0, 2, 1, 3)))
        q = B.permute(q, (0, 2, 1, 3), name=f"q_absorbed-{il}")
        inp = self.out.attn[CacheKind.BASE]
        if hp.index_full[il]:
            self.sel = self._kpool_select(cur, qr, inp.mask, il, n_tokens)
        if self.sel is None:
            raise ValueError(f"layer {il} shares an indexer but no earlier layer owns one")
        if not self.ks.gather:   # build_attn_mha over the scattered mask (MlaBuilder.attention, _mask above)
            return self.attention(il, q, kv, kv)
        g.expand(q)
        g.expand(kv)
        g.expand(self._store(il, kv, inp))
        g.expand(inp.mask)
        out = self._gathered(il, q, self.sel, n_tokens)
        return B.mul_mat(self._wl(T.ATTN_OUT, il), out, name=f"attn_out-{il}")

    # --- the graph --------------------------------------------------------------------------------
    def _hc_weights(self, part: str, il: int) -> tuple[Tensor, Tensor, Tensor]:
        fn, scale, base = (self._need(f"blk.{il}.hc_{part}_{w}.weight") for w in ("fn", "scale", "base"))
        return fn, scale, base

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        hp = self.ghp
        hc = self.hc
        cur, post, comb = hc.pre(x, *self._hc_weights("attn", il), il, f"hc_attn_pre-{il}")
        cur = self.norm(cur, self._wl(T.ATTN_NORM, il), il, f"attn_norm-{il}")
        self.out.graph.expand(cur)
        cur = self._kda(cur, il, n_tokens) if hp.recurrent[il] else self._dsa_layer(cur, il, n_tokens)
        x = hc.post(cur, x, post, comb, il, f"hc_attn_post-{il}")
        cur, post, comb = hc.pre(x, *self._hc_weights("ffn", il), il, f"hc_ffn_pre-{il}")
        cur = self.norm(cur, self._wl(T.FFN_NORM, il), il, f"ffn_norm-{il}")
        cur = self._ffn_block(cur, il)
        return hc.post(cur, x, post, comb, il, f"l_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        self.n_seqs = ubatch_sequences(self.states, shape.n_tokens)
        self.rs = RsInputs.reserve(self.states, self.n_seqs)
        self.sel = None
        self._inputs(shape)
        self.hc = HyperConnections(self.ghp.eps, self.ghp.hc_eps, self.ghp.hc_iters, self.unfused, self.out.fused)
        hp, g, t = self.ghp, self.out.graph, shape.n_tokens
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd", self.lora)
        for inp in (self.pool_cells, self.pool_idxs, self.pool_mask, self.tail_idxs, self.gather_mask):
            g.expand(inp)   # build_inp_kpool expands them (set_input_kpool fills them whether read or not)
        x = hc_streams(x, hp.hc_mult)
        for il in range(hp.n_layer):
            x = self._layer(il, x, t)
        cur = hc_mean(hc_output_rows(x, self.out.out_ids))
        cur = self.norm(cur, self._need(OUTPUT_NORM), -1, "result_norm")
        cur.flags |= FLAG_OUTPUT   # res->t_embd and t_h_nextn
        return plain_lm_head(self.out, cur, self._need(OUTPUT))
