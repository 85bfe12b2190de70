"""gemma4 (Gemma 4): node for node as src/models/gemma4.cpp builds it at the pinned build (DESIGN.md).

What differs from the llama-shaped builder, and why this is its own module:
- two attention geometries: sliding layers use key_length_swa heads and rope.dimension_count_swa
  rotated dims, full layers key_length heads, the shared `rope_freqs` factors (proportional RoPE) and
  their own KV head count; the iSWA cache keeps each kind's width (-fa off pads every V row to the
  widest layer's, with a PAD node before the store: llama-kv-cache.cpp cpy_v, [TAG_V_CACHE_VARIABLE],
  runtime/ggml/fused_ops.py's pad);
- shared KV: blocks from n_layer - shared_kv_layers on compute Q only and attend over an earlier
  layer's cache (the last sliding one before them for sliding blocks, the last full one for full
  blocks: create_memory's reuse callback);
- Q and K RMS-normed per head with weights, V RMS-normed without; attention scale 1;
- per-layer embeddings (PLE): a second token table looked up per ubatch, projected from the scaled
  embeddings, normed, added, scaled by 1/sqrt(2) and permuted to one slice per layer; each block ends
  with gate -> GELU -> times its slice -> projection -> norm -> residual, then the layer's output scale;
- the trunk runs every token: the output norm's result is a graph output (res->t_h_nextn) and the
  output rows are picked after it (cparams.embeddings_nextn_masked is false by default).
- the MoE block (26B-A4B): a dense GELU FFN beside the experts, each with its own post-norm, summed; the
  router reads an RMS-normed, 1/sqrt(n_embd)-scaled, per-channel-scaled copy of the block input; the experts
  (softmax gating, normalized weights, GEGLU over one fused gate_up matrix) scale their outputs by a
  per-expert factor (build_lora_mm_id's w_s: reshape, repeat, get_rows, mul).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import GGUFError
from planner.gguf.reader import ModelFile, row_size
from planner.model.arch import AttnKind, ModelFacts
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, rope_freqs_name, tensor_name
from runtime.engine.builder import AttnInputs, BatchShape, BuiltGraph, DecoderBuilder, Qkv, mha
from runtime.engine.hparams import ARCHS, HParams
from runtime.engine.kvcache import CacheKind, KVCache, is_quantized, rotation_size
from runtime.engine.moe import expert_weights, weighted_sum
from runtime.engine.recurrent import token_embeddings
from runtime.ggml import build as B
from runtime.ggml.deltanet import repeat_4d
from runtime.ggml.fused_ops import pad
from runtime.ggml.graph import FLAG_OUTPUT, GGMLType, Op, Tensor

GEMMA4 = "gemma4"
F32, I32 = GGMLType.F32, GGMLType.I32
PLE_INPUT_SCALE = 1.0 / math.sqrt(2.0)   # project_per_layer_inputs: per_layer_input_scale
DEFAULT_FINAL_SOFTCAP = 30.0   # llama-hparams.h: f_final_logit_softcapping's default


@dataclass(frozen=True)
class Gemma4HParams(HParams):
    """HParams plus gemma4's per-layer geometry. `head_dim`/`n_rot` are layer 0's (the cache's
    rotation test reads layer 0's head: llama_kv_cache, hparams.n_embd_head_k())."""

    head_dims: tuple[int, ...] = ()
    n_rots: tuple[int, ...] = ()
    has_kv: tuple[bool, ...] = ()
    reuse: tuple[int, ...] = ()          # the layer whose cache each layer reads (itself where it owns one)
    n_embd_per_layer: int = 0

    def n_embd_gqa(self, il: int) -> int:
        """The cache width a layer owns (0 for a block that reuses another's)."""
        return self.head_dims[il] * self.n_head_kv[il] if self.has_kv[il] else 0


def _reuse(swa: tuple[bool, ...], has_kv: tuple[bool, ...], path: str) -> tuple[int, ...]:
    """create_memory's reuse callback for gemma4: a block past n_layer_kv_from_start reads layer
    n_layer_kv_from_start - 2 when sliding, - 1 when full (and llama.cpp asserts that layer is of its kind)."""
    first = sum(has_kv)
    out = []
    for il in range(len(swa)):
        src = il if has_kv[il] else first - (2 if swa[il] else 1)
        if src < 0 or swa[src] != swa[il]:
            raise GGUFError(path, f"block {il} would reuse the cache of block {src}, which is not of its kind; "
                                  f"llama.cpp aborts on such a file")
        out.append(src)
    return tuple(out)


def read_gemma4_hparams(model: ModelFile, facts: ModelFacts) -> Gemma4HParams:
    """gemma4's hyper-parameters as load_hparams and llama_model_gemma4::load_arch_hparams read them (gemma3n's
    too, which runtime/engine/gemma3n.py then completes)."""
    meta, arch = model.metadata, model.architecture

    def get(template: str, default: float) -> float:
        return float(meta.get(template.format(arch=arch), default))

    trunk = [lf for lf in facts.layers if not lf.nextn]
    if any(lf.kind not in (AttnKind.FULL, AttnKind.SWA) for lf in trunk):
        raise GGUFError(model.path, "gemma4: every block attends (no head_count_kv of 0)")
    swa = tuple(lf.kind is AttnKind.SWA for lf in trunk)
    head_dims = tuple(lf.head_dim_k for lf in trunk)
    if any(lf.head_dim_k != lf.head_dim_v for lf in trunk):   # load_arch_tensors throws the same
        raise GGUFError(model.path, "Gemma 4 requires the same K and V head sizes")
    rot_full = int(get(Keys.Rope.DIMENSION_COUNT, head_dims[swa.index(False)] if False in swa else head_dims[0]))
    rot_swa = int(get(Keys.Rope.DIMENSION_COUNT_SWA, rot_full))
    has_kv = tuple(lf.has_kv for lf in trunk)
    freq_base = get(Keys.Rope.FREQ_BASE, 10000.0)
    window = max((lf.window for lf in trunk), default=0)
    return Gemma4HParams(
        arch=arch, spec=ARCHS[arch], n_layer=facts.n_layer, n_embd=facts.n_embd, n_vocab=facts.n_vocab,
        n_ctx_train=facts.n_ctx_train, n_head=trunk[0].n_head, n_head_kv=tuple(lf.n_head_kv for lf in trunk),
        head_dim=head_dims[0], n_rot=rot_swa if swa[0] else rot_full, eps=get(Keys.Attention.LAYERNORM_RMS_EPS, 1e-6),
        freq_base=freq_base, freq_base_swa=get(Keys.Rope.FREQ_BASE_SWA, 10000.0), freq_scale=1.0,
        freq_scale_swa=1.0, swa=swa, n_swa=window, kq_scale=1.0, q_scale=1.0,
        softcap=get(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, DEFAULT_FINAL_SOFTCAP), n_expert=facts.n_expert,
        n_expert_used=facts.n_expert_used, head_dims=head_dims,
        n_rots=tuple(rot_swa if s else rot_full for s in swa), has_kv=has_kv, reuse=_reuse(swa, has_kv, model.path),
        n_embd_per_layer=int(get(Keys.LLM.EMBD_LENGTH_PER_LAYER_INP, 0)),
    )


class Gemma4Builder(DecoderBuilder):
    hp: Gemma4HParams

    def __init__(self, hp: Gemma4HParams, weights: Mapping[str, Tensor], kv: KVCache, *, flash_attn: bool,
                 offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.hp = hp

    # --- inputs ---------------------------------------------------------------------------------
    def _rotations(self, kind: CacheKind) -> tuple[int, int]:
        """attn_rot_k / attn_rot_v of one cache: on for quantized types when layer 0's head is a multiple
        of 64 (llama_kv_cache's test), K's side from the heads of that cache's layers, V's 64."""
        hp, kv = self.hp, self.kv
        heads = [hp.head_dims[il] for il in range(hp.n_layer) if hp.has_kv[il] and kv.kinds[il] is kind]
        if not heads or hp.head_dims[0] % 64:
            return 0, 0
        k = rotation_size(kv.type_k, heads[0], widest=True) if is_quantized(kv.type_k) else 0
        v = rotation_size(kv.type_v, heads[0], widest=False) if is_quantized(kv.type_v) else 0
        return k, v

    def _inputs(self, shape: BatchShape) -> None:
        """The base inputs, with each cache's own rotation matrices (llama_kv_cache::build_input_k_rot)."""
        super()._inputs(shape)
        for kind, inp in self.out.attn.items():
            k, v = self._rotations(kind)
            self.out.attn[kind] = AttnInputs(inp.k_idxs, inp.v_idxs, inp.mask,
                                             B.new_input(F32, (k, k), "attn_inp_k_rot") if k else None,
                                             B.new_input(F32, (v, v), "attn_inp_v_rot") if v else None)

    def _per_layer_inputs(self, x: Tensor, n_tokens: int) -> Tensor:
        """build_inp_per_layer + project_per_layer_inputs: [n_embd_per_layer, n_tokens, n_layer]."""
        hp, g, npl = self.hp, self.out.graph, self.hp.n_embd_per_layer
        tokens = B.new_input(I32, (n_tokens,), "inp_tokens")
        rows = B.get_rows(self._need(tensor_name(T.PER_LAYER_TOKEN_EMBD)), tokens, name="inp_per_layer_rows")
        sel = B.scale(B.reshape(rows, (npl, hp.n_layer, n_tokens)), math.sqrt(npl), name="inp_per_layer_selected")
        g.expand(sel)
        proj = B.mul_mat(self._need(tensor_name(T.PER_LAYER_MODEL_PROJ)), x, name="per_layer_proj_mm")
        proj = B.reshape(B.scale(proj, 1.0 / math.sqrt(hp.n_embd)), (npl, hp.n_layer, n_tokens))
        proj = self.norm(proj, tensor_name(T.PER_LAYER_PROJ_NORM), -1)
        inp = B.scale(B.add(proj, sel), PLE_INPUT_SCALE, name="inp_per_layer")
        return B.cont(B.permute(inp, (0, 2, 1, 3)), name="inp_per_layer_cont")

    # --- attention ------------------------------------------------------------------------------
    def _rope(self, x: Tensor, il: int) -> Tensor:
        hp = self.hp
        factors = None if hp.swa[il] else self._w(rope_freqs_name(il))
        base = hp.freq_base_swa if hp.swa[il] else hp.freq_base
        return B.rope(x, self.out.pos, hp.n_rots[il], int(hp.spec.rope), base, factors, name=f"rope-{il}")

    def _qkv(self, x: Tensor, il: int, n_tokens: int) -> Qkv:
        """Q always; K and V (V is K's projection where the layer has no attn_v) for a layer that owns a
        cache. A block that reuses a cache returns its Q with K and V standing in as Q (not used)."""
        hp, hd = self.hp, self.hp.head_dims[il]
        q = self.lora.mm(self._need(tensor_name(T.ATTN_Q, il)), x, name=f"Qcur-{il}")
        q = B.reshape(q, (hd, hp.n_head, n_tokens))
        q = self._rope(self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il), il)
        if not hp.has_kv[il]:
            return Qkv(q, q, q)
        k = self.lora.mm(self._need(tensor_name(T.ATTN_K, il)), x, name=f"Kcur-{il}")
        wv = self._w(tensor_name(T.ATTN_V, il))
        v = self.lora.mm(wv, x, name=f"Vcur-{il}") if wv is not None else k
        k = B.reshape(k, (hd, hp.n_head_kv[il], n_tokens))
        v = B.reshape(v, (hd, hp.n_head_kv[il], n_tokens))
        k = self.norm(k, tensor_name(T.ATTN_K_NORM, il), il)
        v = B.rms_norm(v, hp.eps, name=f"Vcur_normed-{il}")
        return Qkv(q, self._rope(k, il), v)

    def _store_k(self, il: int, k: Tensor, inp: AttnInputs) -> Tensor:
        """cpy_k: K's rows into the cache (one [width, kv_size * n_stream] matrix over the streams)."""
        kc = self.kv.k[il]
        width, n_tokens = k.ne[0] * k.ne[1], k.ne[2]
        k2 = B.view(k, (width, n_tokens), (k.nb[0], k.nb[2]), 0)
        if kc.ne[2] > 1:
            kc = B.reshape(kc, (kc.ne[0], kc.ne[1] * kc.ne[2]))
        return B.set_rows(kc, k2, inp.k_idxs, name=f"cache_k_l{il} (set_rows)")

    def _store_v_padded(self, il: int, v: Tensor, inp: AttnInputs) -> Tensor:
        """cpy_v into a transposed cache whose rows are wider than this layer's V (ggml_pad first)."""
        vc = self.kv.v[il]
        width, n_tokens = v.ne[0] * v.ne[1], v.ne[2]
        v2 = B.reshape(v, (width, n_tokens))
        if width < vc.ne[0]:
            v2 = pad(v2, (vc.ne[0] - width,), name=f"Vcur_pad-{il}")
        v2 = B.reshape(v2, (1, v2.n_elements))
        return B.set_rows(B.reshape(vc, (1, vc.n_elements)), v2, inp.v_idxs, name=f"cache_v_l{il} (set_rows)")

    def _cache_views(self, il: int, n_kv: int) -> tuple[Tensor, Tensor]:
        """get_k / get_v of the cache layer `il` reads, with layer il's head geometry."""
        src = self.hp.reuse[il]
        kc, vc = self.kv.k[src], self.kv.v[src]
        hd, hkv, size, ns = self.hp.head_dims[il], self.hp.n_head_kv[il], kc.ne[1], kc.ne[2]
        k = B.view(kc, (hd, hkv, n_kv, ns), (kc.nb[0], row_size(kc.type, hd), row_size(kc.type, kc.ne[0]),
                                              row_size(kc.type, kc.ne[0] * size)), 0, name=f"k-{il}")
        if not self.kv.v_trans:
            v = B.view(vc, (hd, hkv, n_kv, ns), (vc.nb[0], row_size(vc.type, hd), row_size(vc.type, vc.ne[0]),
                                                 row_size(vc.type, vc.ne[0] * size)), 0, name=f"v-{il}")
        else:
            v = B.view(vc, (n_kv, hkv, hd, ns), (vc.nb[0], row_size(vc.type, size * hd), row_size(vc.type, size),
                                                 row_size(vc.type, size * vc.ne[0])), 0, name=f"v-{il}")
        return k, v

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """build_attn over the iSWA cache (llama-graph.cpp): K and V stored only by a layer that owns a
        cache; then build_attn_mha over the views of the cache the layer reads."""
        owns = self.hp.has_kv[il]
        inp = self.out.attn[self.kv.kinds[il]]
        q = self._hadamard(q, inp.k_rot, f"q_rot-{il}")
        g = self.out.graph
        g.expand(q)
        if owns:
            k = self._hadamard(k, inp.k_rot, f"k_rot-{il}")
            v = self._hadamard(v, inp.v_rot, f"v_rot-{il}")
            g.expand(k)
            g.expand(v)
            if self.kv.v_trans and v.ne[0] * v.ne[1] != self.kv.v[il].ne[0]:
                g.expand(self._store_k(il, k, inp))
                g.expand(self._store_v_padded(il, v, inp))
            else:
                for t in self._store(il, k, v, inp):
                    g.expand(t)
        n_kv = dict(self.out.shape.n_kv)[self.kv.kinds[il]]
        kv_k, kv_v = self._cache_views(il, n_kv)
        return self._hadamard(self._mha(il, q, kv_k, kv_v, inp), inp.v_rot, f"kqv_rot-{il}")

    def _mha(self, il: int, q: Tensor, kv_k: Tensor, kv_v: Tensor, inp: AttnInputs) -> Tensor:
        """build_attn_mha (no sinks, no soft-capping, scale 1)."""
        return mha(self.out, il, q, kv_k, kv_v, inp.mask, self.hp.kq_scale, flash_attn=self.flash_attn,
                   offload_kqv=self.offload_kqv, v_trans=self.kv.v_trans, q_name=f"q-{il}")

    # --- the MoE block ----------------------------------------------------------------------------
    def _moe_block(self, il: int, attn_out: Tensor) -> Tensor:
        """The dense MLP and the experts side by side (gemma4.cpp's is_moe_layer branch)."""
        hp = self.hp
        mlp = self.ffn(self.norm(attn_out, tensor_name(T.FFN_NORM, il), il), il)
        mlp = self.norm(mlp, tensor_name(T.FFN_POST_NORM_1, il), il)
        cur = self.norm(attn_out, tensor_name(T.FFN_PRE_NORM_2, il), il)
        tmp = B.scale(B.rms_norm(attn_out, hp.eps, name=f"router_norm-{il}"), 1.0 / math.sqrt(hp.n_embd))
        tmp = B.mul(tmp, self._need(tensor_name(T.FFN_GATE_INP, il, "scale")))
        logits = self.lora.mm(self._need(tensor_name(T.FFN_GATE_INP, il)), tmp, name=f"ffn_moe_logits-{il}")
        moe = self._experts(il, cur, logits)
        moe = self.norm(moe, tensor_name(T.FFN_POST_NORM_2, il), il)
        return B.add(mlp, moe, name=f"ffn_moe_combined-{il}")

    def _experts(self, il: int, cur: Tensor, logits: Tensor) -> Tensor:
        """build_moe_ffn with the router's logits given (probs_in), softmax gating, norm_w, GELU, the fused
        gate_up experts and the down experts' per-expert scale."""
        hp, g = self.hp, self.out.graph
        n_embd, n_tokens, k = cur.ne[0], cur.ne[1], hp.n_expert_used
        probs = B.soft_max_ext(logits, None, 1.0, name=f"ffn_moe_probs-{il}")
        order = B._node(Op.ARGSORT, probs.ne, [probs], f"ffn_moe_argsort-{il}", I32, order="DESC")
        selected = B.view(order, (k, n_tokens, 1, 1), (order.nb[0], order.nb[1], order.nb[2], order.nb[3]), 0,
                          name=f"ffn_moe_topk-{il}")
        weights = expert_weights(g, probs, selected, il, True, 0.0)
        x = B.reshape(cur, (n_embd, 1, n_tokens))
        gate_up = self.lora.mm_id(self._need(tensor_name(T.FFN_GATE_UP_EXP, il)), x, selected,
                                  name=f"ffn_moe_gate_up-{il}")
        n_ff = gate_up.ne[0] // 2
        gate = B.view(gate_up, (n_ff, gate_up.ne[1], gate_up.ne[2]), (gate_up.nb[0], gate_up.nb[1], gate_up.nb[2]), 0,
                      name=f"ffn_moe_gate-{il}")
        up = B.view(gate_up, (n_ff, gate_up.ne[1], gate_up.ne[2]), (gate_up.nb[0], gate_up.nb[1], gate_up.nb[2]),
                    n_ff * gate_up.nb[0], name=f"ffn_moe_up-{il}")
        act = Tensor(F32, gate.ne, name=f"ffn_moe_geglu-{il}", op=Op.GLU, src=[gate, up], op_params={"glu": "GEGLU"})
        experts = self.lora.mm_id(self._need(tensor_name(T.FFN_DOWN_EXP, il)), act, selected,
                                  name=f"ffn_moe_down-{il}")
        w_s = self._w(tensor_name(T.FFN_DOWN_EXP, il, "scale"))
        if w_s is not None:   # build_lora_mm_id's per-expert scale
            s = B.reshape(w_s, (1, w_s.ne[0], 1))
            s = repeat_4d(s, (1, w_s.ne[0], n_tokens, 1), name=f"ffn_moe_down_s-{il}")
            experts = B.mul(experts, B.get_rows(s, selected), name=f"ffn_moe_down_scaled-{il}")
        return weighted_sum(g, experts, weights, n_embd, n_tokens, k, il)

    # --- the graph --------------------------------------------------------------------------------
    def _per_layer_embd(self, il: int, cur: Tensor, ple: Tensor) -> Tensor:
        hp, n_tokens = self.hp, cur.ne[1]
        gate = self.lora.mm(self._need(tensor_name(T.PER_LAYER_INP_GATE, il)), cur, name=f"ple_gate-{il}")
        gate = B.unary(gate, "GELU", name=f"ple_gelu-{il}")
        npl = hp.n_embd_per_layer
        this = B.view(ple, (npl, n_tokens), (ple.nb[0], row_size(ple.type, npl)), il * npl * n_tokens * 4,
                      name=f"ple_slice-{il}")
        out = self.lora.mm(self._need(tensor_name(T.PER_LAYER_PROJ, il)), B.mul(gate, this), name=f"ple_proj-{il}")
        out = self.norm(out, tensor_name(T.PER_LAYER_POST_NORM, il), il)
        return B.add(cur, out, name=f"ple_out-{il}")

    def _gemma4_layer(self, il: int, x: Tensor, n_tokens: int, ple: Tensor | None) -> Tensor:
        cur = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
        qkv = self._qkv(cur, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
        cur = self.norm(cur, tensor_name(T.ATTN_POST_NORM, il), il)
        attn_out = B.add(cur, x, name=f"attn_res-{il}")
        if self._w(tensor_name(T.FFN_GATE_INP, il)) is not None:
            cur = self._moe_block(il, attn_out)
        else:
            cur = self.ffn(self.norm(attn_out, tensor_name(T.FFN_NORM, il), il), il)
        cur = self.norm(cur, tensor_name(T.FFN_POST_NORM, il), -1)   # gemma4.cpp passes il = -1 here
        cur = B.add(cur, attn_out, name=f"ffn_res-{il}")
        if ple is not None:
            cur = self._per_layer_embd(il, cur, ple)
        scale = self._w(tensor_name(T.LAYER_OUT_SCALE, il))
        if scale is not None:
            cur = B.mul(cur, scale, name=f"out_scaled-{il}")
        return cur

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        x = B.scale(x, math.sqrt(hp.n_embd), name="inp_scaled")
        ple = self._per_layer_inputs(x, shape.n_tokens) if hp.n_embd_per_layer else None
        for il in range(hp.n_layer):
            x = self._gemma4_layer(il, x, shape.n_tokens, ple)
        cur = self.norm(x, OUTPUT_NORM, -1)
        cur.flags |= FLAG_OUTPUT      # res->t_h_nextn: set_output in llm_graph_result::set_outputs
        cur = B.get_rows(cur, self.out.out_ids)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        if hp.softcap:
            cur = B.scale(B.unary(B.scale(cur, 1.0 / hp.softcap), "TANH"), hp.softcap)
        g.expand(cur)
        self.out.logits = cur
        return self.out
