"""deepseek4 (DeepSeek-V4): hyper-connected streams around compressed sparse attention and hash/bias-routed
MoE, op for op as the pinned llama.cpp builds it for its reserve (src/models/deepseek4.cpp; the inputs of
build_inp_dsv4 and the reserve plans of src/llama-kv-cache-dsv4.cpp). The hyper-connections are
runtime/engine/mhc.py's (the fused DSV4_HC ops but those llama-context.cpp resolve_fused_ops turned off:
runner._resolve_fused_ops, e.g. DSV4_HC_COMB on a device without its pipeline).

The residual is hc = 4 streams [n_embd, hc, T]. Around each sub-block: mixes = hc_fn . rms_norm(streams); the
read gate sigmoid(mixes[:hc] * s0 + b) + eps feeds DSV4_HC_PRE, the write gate 2 sigmoid(mixes[hc:2hc] * s1 + b)
and the Sinkhorn mixer DSV4_HC_COMB(mixes) feed DSV4_HC_POST, which writes the new streams.

Attention (one shared K/V head of head_dim, K only): q = rms_norm(q_b norm(q_a x)) and kv = norm(wkv x), both
roped on their last n_rot rows; the raw window cache (an iSWA cache whose every layer slides) always. A block
with a compress ratio r (4 = CSA, 128 = HCA) first compresses: its compressor's kv and score rows of this ubatch
(+ the APE rows) join the f32 state, the reserve plan's blocks are gathered (CSA: two overlapping windows,
with a zero/-inf row appended), soft-maxed over the window, summed, normed, roped and written to the
compressed cache; the ubatch's last rows persist into the state. CSA blocks do the same for the lightning
indexer (index_head wide, Hadamard-rotated), whose fused scores pick the top-k compressed cells. The
attention runs over [raw | compressed] keys with their masks concatenated (CSA: the compressed mask opened
at the top-k only), with sinks; the output is de-roped (ROPE_BACK) and projected by the grouped low-rank
wo_a (per group) and wo_b.

MoE: sqrt(softplus(logits)) probabilities; the first hash_layer_count blocks take their experts from
ffn_gate_tid2eid by token id, the others the top-k of probs + exp_probs_b; normalised, scaled weights;
clamped SwiGLU experts plus one shared expert.

The runner sizes these graphs and does not run them.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Set
from dataclasses import dataclass

from gguf import MODEL_TENSOR as T

from planner.gguf.reader import row_size
from planner.model.arch import DSV4_CSA_RATIO, DSV4_HCA_RATIO
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder, layer_rms_norm, mha
from runtime.engine.deepseek2 import concat, plain_lm_head
from runtime.engine.deepseek4_hparams import Dsv4Cache, Dsv4HParams
from runtime.engine.dsa import index_rotation
from runtime.engine.dsv4_compress import CompInputs, comp_inputs, pool_blocks, state_all, with_rot
from runtime.engine.hy_v4 import hc_head_gate, hc_output_rows, hc_streams
from runtime.engine.kvcache import CacheKind, KVCache, rotation_size
from runtime.engine.lora import Adapters
from runtime.engine.mhc import HyperConnections, weighted_streams
from runtime.engine.moe import expert_weights, top_k, weighted_sum
from runtime.engine.recurrent import token_embeddings
from runtime.ggml import attn_res
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor

I32, I64, F16, F32 = GGMLType.I32, GGMLType.I64, GGMLType.F16, GGMLType.F32
@dataclass(frozen=True)
class _Part:
    """One compressor of a block: its weights' prefix, state, cache, inputs, width and ratio."""

    prefix: str
    state: tuple[Tensor, Tensor]
    cache: Tensor
    inp: CompInputs
    width: int
    ratio: int


class Deepseek4Builder:
    """Builds one ubatch's deepseek4 graph from weights, the raw window cache (kv) and the DSV4 cache."""

    def __init__(self, hp: Dsv4HParams, weights: Mapping[str, Tensor], kv: KVCache, cache: Dsv4Cache,
                 unfused: Set[Op] = frozenset(), *, flash_attn: bool, offload_kqv: bool,
                 lora: Adapters | None = None) -> None:
        self.hp, self.w, self.kv, self.cache = hp, weights, kv, cache
        self.flash_attn, self.offload_kqv = flash_attn, offload_kqv
        self.unfused = unfused   # the HC_FUSED ops resolve_fused_ops turned off (the runner's, read at build)
        # applied LoRA adapters where deepseek4.cpp goes through build_lora_mm / _mm_id (projections, compressors,
        # the indexer, wo_b, the FFNs and experts); the mixers, wo_a and the output are plain ggml_mul_mat
        self.lora = lora or Adapters()

    def _need(self, name: str) -> Tensor:
        t = self.w.get(name)
        if t is None:
            raise KeyError(f"the model has no tensor {name}")
        return t

    def _wl(self, name: str, il: int) -> Tensor:
        return self._need(f"blk.{il}.{name}")

    def norm(self, x: Tensor, weight: Tensor, il: int, name: str) -> Tensor:
        """build_norm(LLM_NORM_RMS): rms_norm named "norm" (pinned when il >= 0), times the weight."""
        return B.mul(layer_rms_norm(self.out, x, self.hp.eps, il), weight, name=name)

    def _rope(self, x: Tensor, pos: Tensor, il: int, base: float, name: str) -> Tensor:
        return B.rope(x, pos, self.hp.n_rot, 2, base, name=f"{name}-{il}")

    def _base(self, il: int) -> float:
        return self.hp.compress_freq_base if self.hp.ratios[il] else self.hp.freq_base

    # --- inputs ----------------------------------------------------------------------------------
    def _inputs(self, shape: BatchShape) -> None:
        """build_inp_embd, build_inp_pos, build_inp_out_ids, then build_inp_dsv4: the raw cache's indices, mask
        and rotation, then the CSA, HCA and indexer plans' inputs (their rotations last)."""
        hp, t, ns = self.hp, shape.n_tokens, self.kv.n_stream
        if t % ns:
            raise ValueError(f"a batch of {t} tokens does not split over {ns} KV streams")
        tokens = B.new_input(I32, (t,), "inp_tokens")
        embd = B.new_input(F32, (hp.n_embd, t), "inp_embd")
        pos = B.new_input(I32, (t,), "inp_pos")
        out_ids = B.new_input(I32, (shape.n_outputs,), "out_ids")
        self.out = BuiltGraph(Graph(), shape, tokens, embd, pos, out_ids, {}, logits=tokens)
        self.hc = HyperConnections(hp.eps, hp.hc_eps, hp.hc_iters, self.unfused, self.out.fused)
        n_raw = dict(shape.n_kv)[CacheKind.SWA]
        self.raw_idxs = B.new_input(I64, (t,), "attn_inp_k_idxs")
        self.raw_mask = B.new_input(F16 if self.flash_attn else F32, (n_raw, t // ns, 1, ns), "attn_inp_kq_mask")
        rot = self.kv.rot_k
        self.raw_rot = B.new_input(F32, (rot, rot), "attn_inp_k_rot") if rot else None
        cells = self.cache.cells
        fa = self.flash_attn
        csa = comp_inputs("csa", DSV4_CSA_RATIO, t, ns, cells[DSV4_CSA_RATIO], fa)
        hca = comp_inputs("hca", DSV4_HCA_RATIO, t, ns, cells[DSV4_HCA_RATIO], fa)
        lid = comp_inputs("lid", DSV4_CSA_RATIO, t, ns, cells[DSV4_CSA_RATIO], True)   # fused_lid: F16
        # build_input_k_rot of each compressed cache: a quantized one rotates; the indexer's always does
        lid_rot = index_rotation(hp.index_head) if hp.index_head else 0
        comp_rot = rotation_size(self.kv.type_k, hp.head_dim, widest=True)
        self.csa = with_rot(csa, comp_rot)
        self.hca = with_rot(hca, comp_rot)
        self.lid = with_rot(lid, lid_rot)

    # --- hyper-connections ---------------------------------------------------------------------------
    def _hc_pre(self, x: Tensor, part: str, il: int) -> tuple[Tensor, Tensor, Tensor]:
        """build_hc_pre with the block's hc_{attn,ffn} weights: (the sub-block's input, the write gate post
        [hc, T], the mixer comb [hc, hc, T]); deepseek4.cpp's build_hc_pre/_sinkhorn/_post are glm5-next's."""
        fn, sc, base = (self._wl(f"hc_{part}_{w}.weight", il) for w in ("fn", "scale", "base"))
        return self.hc.pre(x, fn, sc, base, il, f"hc_{part}_pre-{il}")

    def _hc_head(self, x: Tensor) -> Tensor:
        """build_hc_head: the streams collapsed by sigmoid(hc_head_fn . rms_norm(x) * scale + base) + eps, with
        build_hc_pre's unfused sum (il = -1)."""
        hp = self.hp
        pre = hc_head_gate(x, self._need("output_hc_fn.weight"), self._need("output_hc_scale.weight"),
                           self._need("output_hc_base.weight"), hp.eps, hp.hc_eps)
        return weighted_streams(x, pre)

    # --- compressors ---------------------------------------------------------------------------------
    def _state_rows(self, cur: Tensor, p: _Part, il: int) -> tuple[Tensor, Tensor]:
        """The compressor's kv and score rows of this ubatch, the score plus the APE rows of each position."""
        kv = self.lora.mm(self._wl(f"{p.prefix}_kv.weight", il), cur, name=f"state_kv-{il}")
        score = self.lora.mm(self._wl(f"{p.prefix}_gate.weight", il), cur, name=f"state_score-{il}")
        ape = B.get_rows(self._wl(f"{p.prefix}_ape.weight", il), p.inp.state_pos)
        return kv, B.add(score, ape, name=f"state_score_ape-{il}")

    def _sources(self, p: _Part, kv: Tensor, score: Tensor) -> tuple[Tensor, Tensor]:
        """dsv4_build_state_restore (no rollback planes: views) and the state rows, then this ubatch's."""
        out = []
        for state, new in zip(p.state, (kv, score), strict=True):
            restored = state_all(state)
            base = B.view(restored, (restored.ne[0], restored.ne[1]), (restored.nb[0], restored.nb[1]), 0)
            out.append(concat(base, new, 1))
        return out[0], out[1]

    def _compress(self, p: _Part, src_kv: Tensor, src_score: Tensor, il: int) -> Tensor:
        """The blocks pooled (dsv4_compress.pool_blocks), normed, roped on their last n_rot rows and, for a
        quantized or indexer cache, rotated."""
        comp = pool_blocks(src_kv, src_score, p.inp, p.width, p.ratio)
        comp = self.norm(comp, self._wl(f"{p.prefix}_norm.weight", il), il, f"comp_norm-{il}")
        comp = self._rope(comp, p.inp.write_pos, il, self.hp.compress_freq_base, "comp")
        return DecoderBuilder._hadamard(comp, p.inp.k_rot, f"comp_rot-{il}")

    def _write_comp(self, p: _Part, comp: Tensor, il: int) -> None:
        """llama_kv_cache::cpy_k of the compressed rows at the plan's write indices."""
        cache = p.cache
        k2 = B.view(comp, (comp.ne[0] * comp.ne[1], comp.ne[2]), (comp.nb[0], comp.nb[2]), 0)
        if cache.ne[2] > 1:
            cache = B.reshape(cache, (cache.ne[0], cache.ne[1] * cache.ne[2]))
        self.out.graph.expand(B.set_rows(cache, k2, p.inp.write_idxs, name=f"comp_k_l{il} (set_rows)"))

    def _persist(self, p: _Part, kv: Tensor, score: Tensor) -> None:
        """The ubatch's last rows per state slot into the state (get_rows, then set_rows), kv then score."""
        rows = [B.get_rows(t, p.inp.persist_src) for t in (kv, score)]
        for state, new in zip(p.state, rows, strict=True):
            self.out.graph.expand(B.set_rows(state_all(state), new, p.inp.persist_dst))

    def _compressor(self, cur: Tensor, p: _Part, il: int) -> None:
        kv, score = self._state_rows(cur, p, il)
        src_kv, src_score = self._sources(p, kv, score)
        self._write_comp(p, self._compress(p, src_kv, src_score, il), il)
        self._persist(p, kv, score)

    def _parts(self, il: int) -> list[_Part]:
        r = self.hp.ratios[il]
        comp, state = self.cache.comp[il], self.cache.state[il]
        if not r or comp is None or state is None:
            return []
        main = _Part("attn_compressor", state, comp, self.csa if r == DSV4_CSA_RATIO else self.hca,
                     self.hp.head_dim, r)
        lid, lid_state = self.cache.lid[il], self.cache.lid_state[il]
        if r != DSV4_CSA_RATIO or lid is None or lid_state is None:
            return [main]
        return [main, _Part("indexer_compressor", lid_state, lid, self.lid, self.hp.index_head, r)]

    # --- attention -----------------------------------------------------------------------------------
    def _top_k(self, qr: Tensor, cur: Tensor, il: int) -> Tensor:
        """build_lid_top_k with the fused lightning indexer."""
        hp = self.hp
        hd, nh, nt = hp.index_head, hp.n_index_head, cur.ne[1]
        q = self.lora.mm(self._wl("indexer.attn_q_b.weight", il), qr, name=f"lid_q-{il}")
        q = self._rope(B.reshape(q, (hd, nh, nt)), self.out.pos, il, hp.compress_freq_base, "lid_q")
        q = DecoderBuilder._hadamard(q, self.lid.k_rot, f"lid_q_rot-{il}")
        w = self.lora.mm(self._wl("indexer.proj.weight", il), cur, name=f"lid_weights-{il}")
        w = B.scale(w, 1.0 / math.sqrt(hd * nh), name=f"lid_weights-{il}")
        cache = self.cache.lid[il]
        assert cache is not None
        n_kv, ns = self.lid.mask.ne[0], cache.ne[2]
        row = row_size(cache.type, hd)
        keys = B.view(cache, (hd, 1, cache.ne[1], ns), (cache.nb[0], row, row, row_size(cache.type, hd * cache.ne[1])),
                      0)
        keys = B.view(keys, (hd, 1, n_kv, ns), keys.nb, 0, name=f"lid_k-{il}")
        q = B.view(q, (hd, nh, nt // ns, ns), (q.nb[0], q.nb[1], q.nb[2], q.nb[3] // ns), 0)
        w = B.view(w, (nh, nt // ns, 1, ns), (w.nb[0], w.nb[1], w.nb[2] // ns, w.nb[3] // ns), 0)
        score = B._node(Op.LIGHTNING_INDEXER, (n_kv, q.ne[2], 1, q.ne[3]), [q, keys, w, self.lid.mask],
                        f"lid_score_masked-{il}")
        n_top = min(score.ne[0], hp.index_top_k)
        return B.cont(B._node(Op.TOP_K, (n_top, *score.ne[1:]), [score], f"lid_top_k-{il}", I32))

    def _top_k_mask(self, mask: Tensor, top: Tensor, il: int) -> Tensor:
        """build_top_k_mask: -inf everywhere but the top-k cells, plus the compressed cache's mask."""
        every = B._node(Op.FILL, mask.ne, [mask], f"kq_mask_fill-{il}", mask.type, c=-math.inf)
        every = B.view(every, (1, every.ne[0], every.ne[1], every.ne[3]),
                       (every.nb[0], every.nb[0], every.nb[1], every.nb[2]), 0)
        idx = B.view(top, (top.ne[0], top.ne[1], top.ne[3], 1),
                     (top.nb[0], top.nb[1], top.nb[2], top.ne[3] * top.nb[3]), 0)
        zeros = B.new_tensor(F16 if self.flash_attn else F32, (1, idx.ne[0], idx.ne[1], idx.ne[2]))
        zeros = B._node(Op.FILL, zeros.ne, [zeros], f"zeros-{il}", zeros.type, c=0.0)
        kept = B.set_rows(every, zeros, idx, name=f"csa_top_k_mask-{il}")
        kept = B.view(kept, (kept.ne[1], kept.ne[2], 1, kept.ne[3]), (kept.nb[0], kept.nb[2], kept.nb[3], kept.nb[3]),
                      0)
        return B.add(kept, mask, name=f"csa_top_k_mask-{il}")

    def _raw_k(self, il: int) -> Tensor:
        kc = self.kv.k[il]
        hd, size, ns = kc.ne[0], kc.ne[1], kc.ne[2]
        n_kv = dict(self.out.shape.n_kv)[CacheKind.SWA]
        row = row_size(kc.type, hd)
        return B.view(kc, (hd, 1, n_kv, ns), (kc.nb[0], row, row, row_size(kc.type, hd * size)), 0, name=f"raw_k-{il}")

    def _comp_k(self, il: int, n_kv: int) -> Tensor:
        cache = self.cache.comp[il]
        assert cache is not None
        hd, size, ns = cache.ne[0], cache.ne[1], cache.ne[2]
        row = row_size(cache.type, hd)
        k = B.view(cache, (hd, 1, size, ns), (cache.nb[0], row, row, row_size(cache.type, hd * size)), 0)
        return B.view(k, (hd, 1, n_kv, ns), k.nb, 0, name=f"comp_k-{il}")

    def _attend(self, il: int, q: Tensor, kv: Tensor, qr: Tensor, cur: Tensor) -> Tensor:
        """build_csa_lid_attention / build_hca_attention / build_raw_attention, then build_attn_mha."""
        hp, g = self.hp, self.out.graph
        r = hp.ratios[il]
        top = self._top_k(qr, cur, il) if r == DSV4_CSA_RATIO else None
        q = DecoderBuilder._hadamard(q, self.raw_rot, f"q_rot-{il}")
        kv = DecoderBuilder._hadamard(kv, self.raw_rot, f"kv_rot-{il}")
        g.expand(q)
        g.expand(kv)
        kc = self.kv.k[il]
        k2 = B.view(kv, (kv.ne[0] * kv.ne[1], kv.ne[2]), (kv.nb[0], kv.nb[2]), 0)
        if kc.ne[2] > 1:
            kc = B.reshape(kc, (kc.ne[0], kc.ne[1] * kc.ne[2]))
        g.expand(B.set_rows(kc, k2, self.raw_idxs, name=f"cache_k_l{il} (set_rows)"))
        k = self._raw_k(il)
        mask = self.raw_mask
        if r:
            inp = self.csa if r == DSV4_CSA_RATIO else self.hca
            k = concat(k, self._comp_k(il, inp.mask.ne[0]), 2)
            comp_mask = self._top_k_mask(inp.mask, top, il) if top is not None else inp.mask
            mask = concat(mask, comp_mask, 0)
        out = self._mha(il, q, k, mask)
        return DecoderBuilder._hadamard(out, self.raw_rot, f"attn_rot-{il}")

    def _mha(self, il: int, q: Tensor, k: Tensor, mask: Tensor) -> Tensor:
        """build_attn_mha with v = k (one shared head, not transposed) and the block's sinks."""
        return mha(self.out, il, q, k, k, mask, 1.0 / math.sqrt(self.hp.head_dim), flash_attn=self.flash_attn,
                   offload_kqv=self.offload_kqv, sinks=self._wl("attn_sinks.weight", il))

    def _attention(self, cur: Tensor, il: int) -> Tensor:
        """build_attention_impl: the projections, the block's compressors, the attention and its output."""
        hp = self.hp
        nt, hd = cur.ne[1], hp.head_dim
        base = self._base(il)
        qr = self.lora.mm(self._wl("attn_q_a.weight", il), cur, name=f"qr-{il}")
        qr = self.norm(qr, self._wl("attn_q_a_norm.weight", il), il, f"qr_norm-{il}")
        q = self.lora.mm(self._wl("attn_q_b.weight", il), qr, name=f"q-{il}")
        q = B.rms_norm(B.reshape(q, (hd, hp.n_head, nt)), hp.eps, name=f"q_norm-{il}")
        q = self._rope(q, self.out.pos, il, base, "q")
        kv = self.lora.mm(self._wl("attn_kv.weight", il), cur, name=f"kv-{il}")
        kv = self.norm(kv, self._wl("attn_kv_a_norm.weight", il), il, f"kv_norm-{il}")
        kv = self._rope(B.reshape(kv, (hd, 1, nt)), self.out.pos, il, base, "kv")
        for p in self._parts(il):
            self._compressor(cur, p, il)
        out = self._attend(il, q, kv, qr, cur)
        out = B.reshape(out, (hd, hp.n_head, nt))
        out = attn_res.rope_back(out, self.out.pos, hp.n_rot, 2, base, name=f"attn_derope-{il}")
        group = hp.n_head // hp.o_groups * hd
        out = B.permute(B.reshape(out, (group, hp.o_groups, nt)), (0, 2, 1, 3))
        oa = B.mul_mat(self._wl("attn_output_a.weight", il), out, name=f"attn_wo_a-{il}")
        oa = B.permute(oa, (0, 2, 1, 3))
        oa = B.cont(oa, (hp.o_lora * hp.o_groups, nt))
        return self.lora.mm(self._wl("attn_output_b.weight", il), oa, name=f"attn_out-{il}")

    # --- feed-forward --------------------------------------------------------------------------------
    def _moe(self, cur: Tensor, il: int) -> Tensor:
        """build_moe_ffn(SQRT_SOFTPLUS): hash-routed blocks take their experts from ffn_gate_tid2eid."""
        hp, g = self.hp, self.out.graph
        n_embd, nt = cur.ne[0], cur.ne[1]
        k = hp.n_expert_used
        hashed = il < hp.n_hash
        selected = B.get_rows(self._wl("ffn_gate_tid2eid.weight", il), self.out.tokens) if hashed else None
        logits = self.lora.mm(self._need(tensor_name(T.FFN_GATE_INP, il)), cur, name=f"ffn_moe_logits-{il}")
        probs = B.unary(logits, "SOFTPLUS")
        probs = Tensor(probs.type, probs.ne, name=f"ffn_moe_probs-{il}", op=Op.SQRT, src=[probs])
        if selected is None:
            bias = self._need(tensor_name(T.FFN_EXP_PROBS_B, il, "bias"))
            selection = B.add(probs, bias, name=f"ffn_moe_probs_biased-{il}")
            selected = top_k(selection, k, f"ffn_moe_argsort-{il}", f"ffn_moe_topk-{il}")
        weights = expert_weights(g, probs, selected, il, hp.weights_norm, hp.weights_scale)
        x = B.reshape(cur, (n_embd, 1, nt))
        up = self.lora.mm_id(self._need(tensor_name(T.FFN_UP_EXP, il)), x, selected, name=f"ffn_moe_up-{il}")
        gate = self.lora.mm_id(self._need(tensor_name(T.FFN_GATE_EXP, il)), x, selected, name=f"ffn_moe_gate-{il}")
        act = B.swiglu(gate, up, name=f"ffn_moe_swiglu_limited-{il}")   # ggml_swiglu_clamp: one GLU node
        experts = self.lora.mm_id(self._need(tensor_name(T.FFN_DOWN_EXP, il)), act, selected,
                                   name=f"ffn_moe_down-{il}")
        return weighted_sum(g, experts, weights, n_embd, nt, k, il)

    def _shared(self, cur: Tensor, il: int) -> Tensor:
        """build_ffn(LLM_FFN_SILU, LLM_FFN_PAR) of the shared expert, its SwiGLU clamped (one GLU node)."""
        u = self.lora.mm(self._need(tensor_name(T.FFN_UP_SHEXP, il)), cur, name=f"ffn_up-{il}")
        g = self.lora.mm(self._need(tensor_name(T.FFN_GATE_SHEXP, il)), cur, name=f"ffn_gate-{il}")
        act = B.swiglu(g, u, name=f"ffn_swiglu_limited-{il}")
        return self.lora.mm(self._need(tensor_name(T.FFN_DOWN_SHEXP, il)), act, name=f"ffn_shexp-{il}")

    # --- the graph -----------------------------------------------------------------------------------
    def _layer(self, il: int, x: Tensor) -> Tensor:
        g = self.out.graph
        cur, post, comb = self._hc_pre(x, "attn", il)
        cur = self.norm(cur, self._wl("attn_norm.weight", il), il, f"attn_norm-{il}")
        cur = self._attention(cur, il)
        x = self.hc.post(cur, x, post, comb, il, f"hc_attn_post-{il}")
        cur, post, comb = self._hc_pre(x, "ffn", il)
        for t in (x, post, comb):
            g.expand(t)
        cur = self.norm(cur, self._wl("ffn_norm.weight", il), il, f"ffn_norm-{il}")
        moe = self._moe(cur, il)
        shared = self._shared(cur, il)
        cur = B.add(moe, shared, name=f"ffn_out-{il}")
        out = self.hc.post(cur, x, post, comb, il, f"l_last-{il}")
        # graph_get_cb pins a tensor named "l_last" as it pins "norm" (a small ubatch or full offload): the layer's
        # last hyper-connection stays on the layer's device, so resolve_fused_ops finds its DSV4_HC_POST there
        self.out.norm_pins.append((out, il))
        return out

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        tok_embd = self._need(TOKEN_EMBD)
        x = token_embeddings(g, tok_embd, self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        g.expand(self.raw_mask)
        x = hc_streams(x, hp.hc_mult)
        for il in range(hp.n_layer):
            x = self._layer(il, x)
        cur = self._hc_head(hc_output_rows(x, self.out.out_ids))
        cur = self.norm(cur, self._need(OUTPUT_NORM), -1, "result_norm")
        return plain_lm_head(self.out, cur, self.w.get(OUTPUT) or tok_embd)
