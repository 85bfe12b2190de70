"""MiniMax Sparse Attention (minimax-m3), op for op as the pinned llama.cpp builds it (src/models/minimax-m3.cpp,
build_attn_inp_kv_msa in src/llama-graph.cpp, the two caches of src/llama-kv-cache-msa.cpp).

The decoder is dots1's (per-head Q/K norms, partial NEOX RoPE, leading dense blocks, sigmoid experts with the
selection bias and a shared expert) with every FFN a clamped SwiGLU (LLM_FFN_SWIGLU_OAI_MOE). The leading dense
blocks, and every block when flash attention is off or a unified cache serves several sequences, attend through
build_attn. The other blocks run MSA over blocks of `blk` positions (the position axis n_ps = the cache's
positions padded to 256, then to whole blocks; an empty cache at reserve gives 256):
  indexer q = RoPE(norm(q_proj x)) [idx, Hd, T], k = RoPE(norm(k_proj x)) [idx, 1, T] stored in the indexer cache;
  scores of the cached keys gathered by position, plus the position mask; max-pooled per block; plus the
  local-block bias; top-k blocks (k = min(top_k, n_blocks)).
  prompt (per stream): the chosen blocks' mask (-1e30 rows, zeros set at the chosen ones), expanded from blocks to
  cells through cell_blk, plus the causal mask, one F16 mask per KV group; one flash attention with the groups
  on ne[3].
  one token per stream: the chosen positions' cells gathered (get_rows of K, V and the mask) and one flash
  attention over them, groups and streams on ne[3].
The runner sizes these graphs; decode refuses them (it fills no MSA inputs).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, Keys
from gguf import MODEL_TENSOR as T

from planner.core.errors import GGUFError, ModelShapeError
from planner.gguf.reader import ModelFile, row_size
from planner.model.tensors import tensor_name
from runtime.engine.builder import BatchShape, DecoderBuilder, Qkv
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.moe import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT
from runtime.ggml import build as B
from runtime.ggml.deltanet import repeat_4d
from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.kernels import KERNELS, read_f32
from runtime.ggml.ssm import concat

I32, I64, F16, F32 = GGMLType.I32, GGMLType.I64, GGMLType.F16, GGMLType.F32
FLOAT_TYPES = frozenset({F32, F16, GGMLType.BF16})
# llama_kv_cache_msa_context::get_n_pos pads the position axis to max(n_pad, 256) (n_pad is 1 here)
MSA_POS_PAD = 256
LOCAL_FORCE = 1e30          # the bias that ranks local blocks first, and the mask value of the others
POOL_MAX = 0                # ggml_op_pool GGML_OP_POOL_MAX
INDEXER_KEYS = ("head_count", "key_length", "top_k", "block_size", "local_blocks")


@dataclass(frozen=True)
class MsaParams:
    n_head: int         # indexer heads: one per KV group
    dim: int            # indexer key length
    top_k: int          # blocks kept
    block: int          # positions per block
    n_dense_lead: int   # blocks before this attend densely and have no indexer cache


def read_msa(model: ModelFile) -> MsaParams:
    """The indexer keys load_arch_hparams requires (get_key without a default)."""
    arch, md = model.architecture, model.metadata
    vals = {}
    for k in INDEXER_KEYS:
        name = f"{arch}.attention.indexer.{k}"
        if name not in md:
            raise GGUFError(model.path, f"missing required key {name}")
        vals[k] = int(md[name])
    if vals["block_size"] <= 0:
        raise GGUFError(model.path, f"{arch}.attention.indexer.block_size must be > 0 (llama.cpp asserts it)")
    lead = int(md.get(Keys.LLM.LEADING_DENSE_BLOCK_COUNT.format(arch=arch), 0) or 0)
    return MsaParams(vals["head_count"], vals["key_length"], vals["top_k"], vals["block_size"], lead)


def index_cache(msa: MsaParams, hp: HParams, type_k: GGMLType, type_v: GGMLType, cells: int,
                n_stream: int) -> list[tuple[Tensor, Tensor] | None]:
    """The indexer cache's K [dim, cells, ns] (type_k) and V [head_dim, cells, ns] (type_v) per sparse block."""
    return [(Tensor(type_k, (msa.dim, cells, n_stream), name=f"cache_k_l{il}"),
             Tensor(type_v, (hp.head_dim, cells, n_stream), name=f"cache_v_l{il}"))
            if il >= msa.n_dense_lead else None for il in range(hp.n_layer)]


def _pool_kernel(node: Tensor) -> None:
    """ggml_compute_forward_pool_2d (max, no padding, stride = kernel along ne0 and 1 along ne1)."""
    x = read_f32(node.source(0))
    k0 = node.op_params["k0"]
    n = node.ne[0]
    node.numpy()[...] = x[..., : n * k0].reshape(*x.shape[:-1], n, k0).max(axis=-1)


def _arange_kernel(node: Tensor) -> None:
    p = node.op_params
    node.numpy()[...] = (p["start"] + p["step"] * np.arange(node.ne[0])).astype(np.float32)


KERNELS.setdefault(Op.POOL_2D, _pool_kernel)
KERNELS.setdefault(Op.ARANGE, _arange_kernel)


def _cast(a: Tensor, t: GGMLType, name: str = "") -> Tensor:
    """ggml_cast: a CPY into a new tensor of type t."""
    return Tensor(t, a.ne, name=name or f"{a.name} (copy)", op=Op.CPY, src=[a])


def _add_inplace(a: Tensor, b: Tensor, name: str = "") -> Tensor:
    """ggml_add_inplace: the sum written over a (a view of a's storage)."""
    return Tensor(a.type, a.ne, name=name, op=Op.ADD, src=[a, b], view_src=a, nb=a.nb)


def _pool_blocks(x: Tensor, blk: int, name: str) -> Tensor:
    """ggml_pool_2d(x, MAX, blk, 1, blk, 1, 0, 0): one maximum per block of ne0."""
    return B._node(Op.POOL_2D, ((x.ne[0] - blk) // blk + 1, x.ne[1], x.ne[2], x.ne[3]), [x], name, F32,
                   k0=blk, k1=1, s0=blk, s1=1)


def _top_k(x: Tensor, k: int, name: str) -> Tensor:
    return B._node(Op.TOP_K, (k, *x.ne[1:]), [x], name, I32)


def _arange(stop: int, name: str) -> Tensor:
    return Tensor(F32, (stop,), name=name, op=Op.ARANGE, src=[], op_params={"start": 0.0, "stop": float(stop),
                                                                          "step": 1.0})


def _ggml_contiguous(t: Tensor) -> bool:
    """ggml_is_contiguous: rows packed, every stride past the first the product before it, a dimension of one
    element exempt (the runtime's Tensor.is_contiguous asks every stride)."""
    block, size = GGML_QUANT_SIZES[t.type]
    if t.ne[0] != block and t.nb[0] != size:
        return False
    nxt = size * t.ne[0] // block
    for i in range(1, 4):
        if t.ne[i] != 1 and t.nb[i] != nxt:
            return False
        nxt *= t.ne[i]
    return True


def _view(a: Tensor, ne: Sequence[int], nb: Sequence[int], offset: int) -> Tensor:
    return B.view(a, ne, (a.nb[0], *nb), offset)


class MsaBuilder(DecoderBuilder):
    """DecoderBuilder with clamped-SwiGLU FFNs and MiniMax Sparse Attention in the blocks past the dense lead.
    `cache[il]` is block il's indexer cache (K, V), None for the dense blocks."""

    def __init__(self, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache, msa: MsaParams,
                 cache: Sequence[tuple[Tensor, Tensor] | None], *, n_seq: int, flash_attn: bool,
                 offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.msa, self.cache = msa, cache
        # minimax-m3.cpp: MSA needs flash attention and one stream per sequence; else dense attention
        self.enabled = flash_attn and (n_seq == 1 or kv.n_stream > 1)
        self._attn_in: Tensor | None = None
        self._mask_f32: Tensor | None = None

    def dense_ffn(self, x: Tensor, il: int, up_w: T = T.FFN_UP, gate_w: T = T.FFN_GATE, down_w: T = T.FFN_DOWN,
                  name: str = "ffn") -> Tensor:
        """build_ffn(LLM_FFN_SWIGLU_OAI_MOE, LLM_FFN_PAR): the dense blocks' FFN and the shared expert."""
        up = self.lora.mm(self._need(tensor_name(up_w, il)), x, name=f"{name}_up-{il}")
        gate = self.lora.mm(self._need(tensor_name(gate_w, il)), x, name=f"{name}_gate-{il}")
        act = B.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, name=f"{name}_swiglu_oai-{il}")
        return self.lora.mm(self._need(tensor_name(down_w, il)), act, name=f"{name}_out-{il}")

    # --- inputs --------------------------------------------------------------------------------
    def _inputs(self, shape: BatchShape) -> None:
        """build_attn_inp_kv_msa (the base cache's indices, mask and rotations, then the indexer cache's K
        indices), then the graph's MSA inputs: the local-block bias, the position mask, pos -> cell maps and,
        for a prompt, the cell -> block map."""
        super()._inputs(shape)
        self._mask_f32 = None
        if not self.enabled:
            return
        t, ns = shape.n_tokens, self.kv.n_stream
        [(_, n_kv)] = shape.n_kv
        self.n_kv, self.n_tps = n_kv, t // ns
        self.n_ps = -(-MSA_POS_PAD // self.msa.block) * self.msa.block
        self.n_blk = self.n_ps // self.msa.block
        self.idx_k_idxs = B.new_input(I64, (t,), "attn_inp_k_idxs")
        self.bias = B.new_input(F32, (self.n_blk, t), "msa_bias")
        self.pos_mask = B.new_input(F32, (self.n_ps, t), "msa_pos_mask")
        self.pos_slot_i = B.new_input(I32, (self.n_ps, ns), "msa_pos_slot_i")
        self.decode = self.n_tps == 1
        if self.decode:
            self.pos_slot_f = B.new_input(F32, (self.n_ps, ns), "msa_pos_slot_f")
        else:
            self.cell_blk = B.new_input(I32, (n_kv, ns), "msa_cell_blk")

    # --- attention -------------------------------------------------------------------------------
    def _sparse(self, il: int) -> bool:
        return self.enabled and il >= self.msa.n_dense_lead

    def _qkv(self, x: Tensor, il: int, n_tokens: int) -> Qkv:
        self._attn_in = x   # the indexer projects the block's normed input
        return super()._qkv(x, il, n_tokens)

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if not self._sparse(il):
            return super().attention(il, q, k, v)
        g, msa = self.out.graph, self.msa
        x = self._attn_in
        assert x is not None
        t = x.ne[1]
        cache = self.cache[il]
        assert cache is not None, f"block {il} is sparse but has no indexer cache"
        ik_cache = cache[0]
        iq = self.lora.mm(self._need(f"blk.{il}.indexer.q_proj.weight"), x, name=f"msa_iq-{il}")
        ik = self.lora.mm(self._need(f"blk.{il}.indexer.k_proj.weight"), x, name=f"msa_ik-{il}")
        iq = B.reshape(iq, (msa.dim, msa.n_head, t))
        ik = B.reshape(ik, (msa.dim, 1, t))
        iq = self.norm(iq, f"blk.{il}.indexer.q_norm.weight", il)
        ik = self.norm(ik, f"blk.{il}.indexer.k_norm.weight", il)
        iq, ik = self._rope(iq, il), self._rope(ik, il)
        # the indexer cache's cpy_k
        ik2 = B.view(ik, (msa.dim, t), (ik.nb[0], ik.nb[2]), 0)
        kc = ik_cache if ik_cache.ne[2] == 1 else B.reshape(ik_cache, (ik_cache.ne[0], ik_cache.ne[1] * ik_cache.ne[2]))
        g.expand(B.set_rows(kc, ik2, self.idx_k_idxs, name=f"cache_k_l{il} (set_rows)"))
        ns, size = ik_cache.ne[2], ik_cache.ne[1]
        row = row_size(ik_cache.type, msa.dim)
        ik_kv = B.view(ik_cache, (msa.dim, 1, self.n_kv, ns), (ik_cache.nb[0], row, row, row * size), 0)
        inp = self.out.attn[self.kv.kinds[il]]
        q = self._hadamard(q, inp.k_rot, f"q_rot-{il}")
        k = self._hadamard(k, inp.k_rot, f"k_rot-{il}")
        v = self._hadamard(v, inp.v_rot, f"v_rot-{il}")
        for node in (q, k, v, *self._store(il, k, v, inp)):
            g.expand(node)
        kv_k, kv_v = self._cache_views(il, self.n_kv)
        if kv_k.ne[1] != msa.n_head:
            raise ModelShapeError(f"MSA: the indexer has {msa.n_head} heads for {kv_k.ne[1]} KV groups "
                                  f"(llama.cpp asserts one per group)")
        n_top = min(msa.top_k, self.n_blk)
        if self.decode:
            cur = self._decode(il, q, iq, ik_kv, kv_k, kv_v, n_top)
        else:
            cur = self._prompt(il, q, iq, ik_kv, kv_k, kv_v, n_top, inp.mask)
        return self._hadamard(cur, inp.v_rot, f"kqv_rot-{il}")

    def _fa(self, q_cur: Tensor, k: Tensor, v: Tensor, mask: Tensor, gp: int, il: int) -> Tensor:
        """build_attn_msa_fa: the GQA groups (and streams) on flash attention's ne[3]."""
        d, hq, t = q_cur.ne[0], q_cur.ne[1], q_cur.ne[2]
        c = k.ne[3]
        r = hq * t // (gp * c)
        q = B.permute(B.reshape(q_cur, (d, gp, c, r)), (0, 2, 3, 1))
        o = B.flash_attn_ext(q, k, v, mask, self.hp.kq_scale, name=f"msa_fattn-{il}")
        o = B.permute(o, (0, 1, 3, 2))
        if not _ggml_contiguous(o):
            return B.reshape(B.cont(o), (d * hq, t))
        # a permute that moved only a dimension of one element: ggml reshapes it as is
        return Tensor(o.type, (d * hq, t, 1, 1), name=f"{o.name} (reshaped)", op=Op.RESHAPE, src=[o], view_src=o)

    def _prompt(self, il: int, q: Tensor, iq: Tensor, ik_kv: Tensor, k: Tensor, v: Tensor, n_top: int,
                kq_mask: Tensor) -> Tensor:
        """The batch path of minimax-m3.cpp: one block mask and one flash attention per stream."""
        msa, n_kv, n_tps, n_ps, n_blk = self.msa, self.n_kv, self.n_tps, self.n_ps, self.n_blk
        hd, d, hkv, ns = msa.n_head, k.ne[0], k.ne[1], k.ne[3]
        if self._mask_f32 is None:
            self._mask_f32 = _cast(kq_mask, F32)
        mf = self._mask_f32
        outs = []
        for st in range(ns):
            iq_s = _view(iq, (msa.dim, hd, n_tps), (iq.nb[1], iq.nb[2]), st * n_tps * iq.nb[2])
            ik_s = _view(ik_kv, (msa.dim, n_kv), (ik_kv.nb[2],), st * ik_kv.nb[3])
            psl_s = _view(self.pos_slot_i, (n_ps,), (), st * self.pos_slot_i.nb[1])
            pm = self.pos_mask
            pm_s = _view(pm, (n_ps, 1, n_tps), (pm.nb[1], pm.nb[1]), st * n_tps * pm.nb[1])
            cb_s = _view(self.cell_blk, (n_kv,), (), st * self.cell_blk.nb[1])
            mf_s = _view(mf, (n_kv, n_tps, 1), (mf.nb[1], mf.nb[3]), st * mf.nb[3])
            bi = self.bias
            bias_s = _view(bi, (n_blk, 1, n_tps), (bi.nb[1], bi.nb[1]), st * n_tps * bi.nb[1])
            q_s = _view(q, (d, q.ne[1], n_tps), (q.nb[1], q.nb[2]), st * n_tps * q.nb[2])
            k_s = _view(k, (d, hkv, n_kv, 1), (k.nb[1], k.nb[2], k.nb[3]), st * k.nb[3])
            v_s = _view(v, (d, hkv, n_kv, 1), (v.nb[1], v.nb[2], v.nb[3]), st * v.nb[3])
            ikp = B.get_rows(ik_s, psl_s)
            sc = B.mul_mat(ikp, B.reshape(iq_s, (msa.dim, hd * n_tps)), name=f"msa_sc-{il}")
            sc = _add_inplace(B.reshape(sc, (n_ps, hd, n_tps)), pm_s)
            bs = _pool_blocks(sc, msa.block, f"msa_bs-{il}")
            bsf = B.add(bs, bias_s, name=f"msa_bsf-{il}")
            idx = _top_k(bsf, n_top, f"msa_top_k-{il}")
            ninf = _cast(B._node(Op.SCALE, bias_s.ne, [bias_s], "", F32, scale=0.0, bias=-LOCAL_FORCE), F16)
            ninf = repeat_4d(ninf, (n_blk, hd, n_tps, 1))
            zero = B.scale(_cast(idx, F32), 0.0)
            bm = B.set_rows(B.reshape(ninf, (1, n_blk, hd * n_tps)), B.reshape(zero, (1, n_top, hd * n_tps)),
                            B.reshape(idx, (n_top, hd * n_tps)))
            bm = B.cont(B.permute(B.reshape(bm, (n_blk, hd, n_tps)), (0, 2, 1, 3)), name=f"msa_block_mask-{il}")
            bm2 = B.cont(B.transpose(B.reshape(bm, (n_blk, n_tps * hd))))
            bmx = B.cont(B.transpose(B.get_rows(bm2, cb_s)))
            mask4 = _add_inplace(B.reshape(bmx, (n_kv, n_tps, hd)), mf_s)
            mask4 = _cast(B.reshape(mask4, (n_kv, n_tps, 1, hd)), F16, f"msa_mask4-{il}")
            kfa, vfa = B.permute(k_s, (0, 3, 1, 2)), B.permute(v_s, (0, 3, 1, 2))
            outs.append(self._fa(q_s, kfa, vfa, mask4, q.ne[1] // hkv, il))
        cur = outs[0]
        for o in outs[1:]:
            cur = concat(cur, o, 1)
        return cur

    def _decode(self, il: int, q: Tensor, iq: Tensor, ik_kv: Tensor, k: Tensor, v: Tensor, n_top: int) -> Tensor:
        """The one-token-per-stream path: the chosen positions' cells gathered, one flash attention."""
        msa, n_kv, n_ps, n_blk, blk = self.msa, self.n_kv, self.n_ps, self.n_blk, self.msa.block
        hd, d, hkv, ns = msa.n_head, k.ne[0], k.ne[1], k.ne[3]
        ik3 = _view(ik_kv, (msa.dim, n_kv, ns), (ik_kv.nb[2], ik_kv.nb[3]), 0)
        ikp = B.get_rows(ik3, self.pos_slot_i)
        iq4 = B.reshape(iq, (msa.dim, hd, 1, ns))
        sc = B.mul_mat(B.reshape(ikp, (msa.dim, n_ps, 1, ns)), iq4, name=f"msa_sc-{il}")
        sc = _add_inplace(sc, B.reshape(self.pos_mask, (n_ps, 1, 1, ns)))
        bs = _pool_blocks(sc, blk, f"msa_bs-{il}")
        bsf = B.add(bs, B.reshape(self.bias, (n_blk, 1, 1, ns)))
        idx = _top_k(bsf, n_top, f"msa_top_k-{il}")
        a = B.reshape(B.scale(_cast(idx, F32), float(blk)), (1, n_top, hd, ns))
        tj = B.add(repeat_4d(a, (blk, n_top, hd, ns)), B.reshape(_arange(blk, "msa_arange"), (blk, 1, 1)))
        tokj = _cast(B.reshape(tj, (blk * n_top * hd, ns)), I32)
        cs = B.get_rows(B.reshape(self.pos_slot_f, (1, n_ps, ns)), tokj)
        cs = B.reshape(cs, (blk, n_top, hd, ns))
        tr = B.add(B.scale(cs, float(hkv)), B.reshape(_arange(hkv, "msa_arange"), (1, 1, hd)))
        tokr = _cast(B.reshape(tr, (blk * n_top * hd, ns)), I32)
        k3 = _view(k, (d, hkv * n_kv, ns), (k.nb[1], k.nb[3]), 0)
        v3 = _view(v, (d, hkv * n_kv, ns), (v.nb[1], v.nb[3]), 0)
        mp = B.reshape(self.pos_mask, (1, n_ps, ns))
        kg, vg, mg = B.get_rows(k3, tokr), B.get_rows(v3, tokr), B.get_rows(mp, tokj)
        kt = k.type if k.type in FLOAT_TYPES else F16   # quantized rows are gathered as F32, cast to F16
        vt = v.type if v.type in FLOAT_TYPES else F16
        kfa = B.reshape(kg, (d, blk * n_top, 1, hd * ns))
        vfa = B.reshape(vg, (d, blk * n_top, 1, hd * ns))
        kfa = kfa if kfa.type == kt else _cast(kfa, kt)
        vfa = vfa if vfa.type == vt else _cast(vfa, vt)
        mfa = _cast(B.reshape(mg, (blk * n_top, 1, 1, hd * ns)), F16)
        return self._fa(q, kfa, vfa, mfa, q.ne[1] // hkv, il)


def msa_builder(model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache,
                cache: Sequence[tuple[Tensor, Tensor] | None], *, n_seq: int, flash_attn: bool,
                offload_kqv: bool) -> MsaBuilder:
    return MsaBuilder(hp, weights, kv, read_msa(model), cache, n_seq=n_seq, flash_attn=flash_attn,
                      offload_kqv=offload_kqv)

