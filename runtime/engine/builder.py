"""One graph builder for the llama-shaped decoders: llama (Llama 2/3, Mistral), qwen2, qwen3,
qwen3moe and gemma3, differing only by the facts in hparams.ARCHS.

The graph has llama.cpp's op kinds in llama.cpp's order (src/models/<arch>.cpp and
src/llama-graph.cpp at the pinned build): inputs as llm_graph_input_* create them, per layer
norm -> Q/K/V -> (QK norm) -> RoPE -> KV store (set_rows) -> attention (flash or soft_max) ->
output projection -> residual -> FFN, and `ggml_build_forward_expand` at the same points, so
the scheduler sees the node order llama.cpp's scheduler sees. Tensors llama.cpp names "norm"
for a layer are returned as pins: llama.cpp's graph callback pins them to the layer's device
when a batch has fewer than 32 tokens or every layer is offloaded (llama-context.cpp graph_get_cb).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gguf import MODEL_TENSOR as T

from planner.core.errors import BadInput, ModelShapeError
from planner.gguf.reader import row_size
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, rope_freqs_name, tensor_name
from runtime.engine.hparams import FfnKind, HParams
from runtime.engine.kvcache import CacheKind, KVCache
from runtime.engine.lora import Adapters
from runtime.engine.moe import build_moe_layer
from runtime.ggml import build as B
from runtime.ggml.graph import FLAG_OUTPUT, GGMLType, Graph, Op, Tensor

I32, I64, F16, F32 = GGMLType.I32, GGMLType.I64, GGMLType.F16, GGMLType.F32


@dataclass(frozen=True)
class Qkv:
    """A layer's roped (and, where the model has them, normed) Q and K, and its V."""

    q: Tensor
    k: Tensor
    v: Tensor


@dataclass(frozen=True)
class BatchShape:
    n_tokens: int
    n_outputs: int
    n_kv: tuple[tuple[CacheKind, int], ...]


@dataclass(frozen=True)
class AttnInputs:
    k_idxs: Tensor
    v_idxs: Tensor
    mask: Tensor
    k_rot: Tensor | None = None   # Hadamard matrices of a quantized cache (attn_inp_k_rot / _v_rot)
    v_rot: Tensor | None = None


@dataclass
class BuiltGraph:
    graph: Graph
    shape: BatchShape
    tokens: Tensor
    embd: Tensor
    pos: Tensor
    out_ids: Tensor
    attn: dict[CacheKind, AttnInputs]
    logits: Tensor
    norm_pins: list[tuple[Tensor, int]] = field(default_factory=list)   # (tensor, layer)
    cpu_pins: list[Tensor] = field(default_factory=list)


class DecoderBuilder:
    """Builds the forward graph of one ubatch from weights (name -> Tensor) and the KV cache."""

    def __init__(self, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache, *, flash_attn: bool,
                 offload_kqv: bool, lora: Adapters | None = None) -> None:
        self.hp, self.w, self.kv = hp, weights, kv
        self.flash_attn, self.offload_kqv = flash_attn, offload_kqv
        # applied LoRA adapters: build_lora_mm's extra matmuls on the weights they patch (runtime/engine/lora.py)
        self.lora = lora or Adapters()
        self.layer_input: Tensor | None = None   # the input of the layer being built (_layer sets it)

    def _w(self, name: str) -> Tensor | None:
        return self.w.get(name)

    def _need(self, name: str) -> Tensor:
        t = self.w.get(name)
        if t is None:   # llama.cpp's create_tensor refuses the file at load: "missing tensor"
            raise ModelShapeError(f"the model has no tensor {name}, which its architecture needs (llama.cpp "
                                  f"refuses it at load: missing tensor)")
        return t

    # --- pieces shared by every layer ---------------------------------------------------------
    def norm(self, x: Tensor, weight: str, il: int) -> Tensor:
        """build_norm(LLM_NORM_RMS): rms_norm named "norm" (pinned when il >= 0), times the weight."""
        n = B.rms_norm(x, self.hp.eps, name=f"norm-{il}" if il >= 0 else "norm")
        if il >= 0:
            self.out.norm_pins.append((n, il))
        return B.mul(n, self._need(weight), name=f"{weight}-mul")

    def ffn(self, x: Tensor, il: int) -> Tensor:
        if self.hp.spec.ffn is FfnKind.MOE:
            return build_moe_layer(self.hp, self._need, self.out.graph, x, il, self._w, self.lora, self.dense_ffn,
                                   self.layer_input, self.out.out_ids)
        return self.dense_ffn(x, il)

    def dense_ffn(self, x: Tensor, il: int, up_w: T = T.FFN_UP, gate_w: T = T.FFN_GATE, down_w: T = T.FFN_DOWN,
                  name: str = "ffn") -> Tensor:
        """build_ffn with a parallel gate: the model's FFN, or a MoE layer's dense FFN or shared expert (SwiGLU)."""
        up = self.lora.mm(self._need(tensor_name(up_w, il)), x, name=f"{name}_up-{il}")
        gate = self.lora.mm(self._need(tensor_name(gate_w, il)), x, name=f"{name}_gate-{il}")
        kind = "GEGLU" if self.hp.spec.ffn is FfnKind.GEGLU else "SWIGLU"
        act = Tensor(F32, gate.ne, name=f"{name}_{kind.lower()}-{il}", op=Op.GLU, src=[gate, up],
                     op_params={"glu": kind})
        return self.lora.mm(self._need(tensor_name(down_w, il)), act, name=f"{name}_out-{il}")

    def _rope(self, x: Tensor, il: int) -> Tensor:
        hp = self.hp
        base = hp.freq_base_swa if hp.swa[il] else hp.freq_base
        factors = self._w(rope_freqs_name(il))
        r = B.rope(x, self.out.pos, hp.n_rot, int(hp.spec.rope), base, factors, name=f"rope-{il}")
        r.op_params["freq_scale"] = hp.freq_scale_swa if hp.swa[il] else hp.freq_scale
        if hp.ext_factor:
            r.op_params.update(ext_factor=hp.ext_factor, n_ctx_orig=hp.n_ctx_orig)
        return r

    def _roped(self, il: int) -> bool:
        """Whether the layer ropes Q and K: afmoe leaves every n-th layer unroped, exaone-moe with
        sliding-window layers ropes only those, smallthinker with them leaves layers 0, n, 2n... unroped."""
        spec, swa = self.hp.spec, self.hp.swa
        if spec.nope_every and (il + 1) % spec.nope_every == 0:
            return False
        if not (spec.nope_full_attn or spec.nope_every_from_first) or not any(swa):
            return True
        if spec.nope_full_attn and not swa[il]:
            return False
        return not spec.nope_every_from_first or il % spec.nope_every_from_first != 0

    def _qkv(self, x: Tensor, il: int, n_tokens: int) -> Qkv:
        hp = self.hp
        out = []
        for part, tensor, heads in (("q", T.ATTN_Q, hp.n_head), ("k", T.ATTN_K, hp.n_head_kv[il]),
                                    ("v", T.ATTN_V, hp.n_head_kv[il])):
            t = self.lora.mm(self._need(tensor_name(tensor, il)), x, name=f"{part.upper()}cur-{il}")
            bias = self._w(tensor_name(tensor, il, "bias"))
            if bias is not None:
                t = B.add(t, bias, name=f"{part.upper()}cur_b-{il}")
            if hp.spec.qk_norm_full and part != "v":
                t = self.norm(t, tensor_name(T.ATTN_Q_NORM if part == "q" else T.ATTN_K_NORM, il), il)
            out.append(B.reshape(t, (hp.head_dim, heads, n_tokens)))
        q, k, v = out
        qk_norm = hp.spec.qk_norm or (hp.spec.qk_norm_optional and self._w(tensor_name(T.ATTN_Q_NORM, il)) is not None)
        late, roped = hp.spec.qk_norm_after_rope, self._roped(il)
        if qk_norm and not late:
            q = self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il)
        if roped:
            q = self._rope(q, il)
        if qk_norm and not late:
            k = self.norm(k, tensor_name(T.ATTN_K_NORM, il), il)
        if roped:
            k = self._rope(k, il)
        if qk_norm and late:   # hunyuan-moe.cpp norms the roped K, then the roped Q
            k = self.norm(k, tensor_name(T.ATTN_K_NORM, il), il)
            q = self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il)
        if hp.q_scale != 1.0:
            q = B.scale(q, hp.q_scale, name=f"Qscaled-{il}")
        return Qkv(q, k, v)

    # --- attention ------------------------------------------------------------------------------
    @staticmethod
    def _hadamard(x: Tensor, rot: Tensor | None, name: str) -> Tensor:
        """llama_mul_mat_hadamard (src/llama-impl.h): rows of rot's width times rot, x's shape kept."""
        if rot is None:
            return x
        n = rot.ne[0]
        rows = (n, x.n_elements // n)
        flat = B.reshape(x, rows) if x.is_contiguous() else B.cont(x, rows)
        return B.reshape(B.mul_mat(rot, flat, name=name), x.ne)

    def _store(self, il: int, k: Tensor, v: Tensor, inp: AttnInputs) -> tuple[Tensor, Tensor]:
        """cpy_k / cpy_v (llama-kv-cache.cpp): set_rows into the cache, V element-wise when transposed;
        with several streams the cache is addressed as one [width, kv_size * n_stream] matrix."""
        kc, vc = self.kv.k[il], self.kv.v[il]
        n_tokens, width = k.ne[2], k.ne[0] * k.ne[1]
        k2 = B.view(k, (width, n_tokens), (k.nb[0], k.nb[2]), 0)
        if kc.ne[2] > 1:
            kc = B.reshape(kc, (kc.ne[0], kc.ne[1] * kc.ne[2]))
        store_k = B.set_rows(kc, k2, inp.k_idxs, name=f"cache_k_l{il} (set_rows)")
        if not self.kv.v_trans:
            v2 = B.view(v, (width, n_tokens), (v.nb[0], v.nb[2]), 0)
            if vc.ne[2] > 1:
                vc = B.reshape(vc, (vc.ne[0], vc.ne[1] * vc.ne[2]))
            return store_k, B.set_rows(vc, v2, inp.v_idxs, name=f"cache_v_l{il} (set_rows)")
        if width != vc.ne[0]:
            raise BadInput("-fa off with layers of different V widths is not implemented in the runtime")
        v2 = B.reshape(B.reshape(v, (width, n_tokens)), (1, width * n_tokens))
        v_all = B.reshape(vc, (1, vc.n_elements))
        return store_k, B.set_rows(v_all, v2, inp.v_idxs, name=f"cache_v_l{il} (set_rows)")

    def _cache_views(self, il: int, n_kv: int) -> tuple[Tensor, Tensor]:
        """get_k / get_v over every stream (the reserve's slot info spans streams 0..n_stream-1)."""
        hp, kc, vc = self.hp, self.kv.k[il], self.kv.v[il]
        hd, hkv, size, ns = hp.head_dim, hp.n_head_kv[il], kc.ne[1], kc.ne[2]
        k = B.view(kc, (hd, hkv, n_kv, ns), (kc.nb[0], row_size(kc.type, hd), row_size(kc.type, kc.ne[0]),
                                              row_size(kc.type, kc.ne[0] * size)), 0, name=f"k-{il}")
        if not self.kv.v_trans:
            v = B.view(vc, (hd, hkv, n_kv, ns), (vc.nb[0], row_size(vc.type, hd), row_size(vc.type, vc.ne[0]),
                                                 row_size(vc.type, vc.ne[0] * size)), 0, name=f"v-{il}")
        else:
            v = B.view(vc, (n_kv, hkv, hd, ns), (vc.nb[0], row_size(vc.type, size * hd), row_size(vc.type, size),
                                                 row_size(vc.type, size * vc.ne[0])), 0, name=f"v-{il}")
        return k, v

    @staticmethod
    def _f16_for_fa(t: Tensor) -> Tensor:
        """build_attn_mha casts an f32 K or V to f16 before ggml_flash_attn_ext (ggml_cast: a CPY
        into a new tensor, not a view)."""
        if t.type != F32:
            return t
        return Tensor(F16, t.ne, name=f"{t.name} (copy)", op=Op.CPY, src=[t])

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """build_attn + build_attn_mha; the tokens split evenly over the cache's streams."""
        kind = self.kv.kinds[il]
        inp = self.out.attn[kind]
        q = self._hadamard(q, inp.k_rot, f"q_rot-{il}")
        k = self._hadamard(k, inp.k_rot, f"k_rot-{il}")
        v = self._hadamard(v, inp.v_rot, f"v_rot-{il}")
        # llm_graph_context::build_attn expands q, v, k (one cache) or q, k, v (iswa) first; llama.cpp
        # takes the iswa path whenever the model has sliding-window layers (llama_kv_cache_iswa exists for
        # swa_type != NONE), also when every layer is windowed and the model has one table
        order = (q, k, v) if CacheKind.SWA in self.kv.tables else (q, v, k)
        for t in order:
            self.out.graph.expand(t)
        for t in self._store(il, k, v, inp):
            self.out.graph.expand(t)
        n_kv = dict(self.out.shape.n_kv)[kind]
        kv_k, kv_v = self._cache_views(il, n_kv)
        ns = kv_k.ne[3]
        per_stream = q.ne[2] // ns
        q4 = B.view(q, (q.ne[0], q.ne[1], per_stream, ns), (q.nb[0], q.nb[1], q.nb[2], q.nb[2] * per_stream), 0,
                    name=f"q-{il}")
        qp = B.permute(q4, (0, 2, 1, 3))
        kp, vp = B.permute(kv_k, (0, 2, 1, 3)), B.permute(kv_v, (0, 2, 1, 3))
        sinks, cap = self._w(tensor_name(T.ATTN_SINKS, il)), self.hp.attn_softcap
        if self.flash_attn:
            kp, vp = self._f16_for_fa(kp), self._f16_for_fa(vp)
            fa = B.flash_attn_ext(qp, kp, vp, inp.mask, self.hp.kq_scale, sinks, name=f"__fattn__-{il}", softcap=cap)
            cur = B.reshape(fa, (fa.ne[0] * fa.ne[1], fa.ne[2] * fa.ne[3]))
        else:
            kq = B.mul_mat(kp, qp, name=f"kq-{il}")
            if cap:   # build_attn_mha's soft-capping: scale, tanh, scale back
                kq = B.scale(B.unary(B.scale(kq, 1.0 / cap, name=f"kq_scaled_1-{il}"), "TANH", name=f"kq_tanh-{il}"),
                             cap, name=f"kq_scaled_2-{il}")
            kq = B.soft_max_ext(kq, inp.mask, self.hp.kq_scale, name=f"kq_soft_max-{il}", sinks=sinks)
            if not self.kv.v_trans:   # a cache made for flash attention (-fa auto resolved off): V copied transposed
                vp = B.cont(B.transpose(vp), name=f"v_cont-{il}")
            kqv = B.mul_mat(vp, kq, name=f"kqv-{il}")
            cur = B.permute(kqv, (0, 2, 1, 3))
            cur = B.cont(cur, (cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3]), name=f"kqv_out-{il}")
            if not self.offload_kqv:
                self.out.cpu_pins.append(cur)
        self.out.graph.expand(cur)
        return self._hadamard(cur, inp.v_rot, f"kqv_rot-{il}")

    # --- the graph --------------------------------------------------------------------------------
    def _inputs(self, shape: BatchShape) -> None:
        hp, t = self.hp, shape.n_tokens
        # build_attn_inp_kq_mask: [n_kv, n_tokens / n_stream, 1, n_stream]; the reserve's ubatch holds
        # one run of tokens per sequence, so its streams are the cache's (1 when unified)
        ns = self.kv.n_stream
        if t % ns:
            raise BadInput(f"a batch of {t} tokens does not split over {ns} KV streams")
        tokens = B.new_input(I32, (t,), "inp_tokens")
        embd = B.new_input(F32, (hp.n_embd, t), "inp_embd")
        pos = B.new_input(I32, (t,), "inp_pos")
        attn = {}
        v_width = self.kv.v[0].ne[0]
        for kind, n_kv in shape.n_kv:
            attn[kind] = AttnInputs(
                B.new_input(I64, (t,), "attn_inp_k_idxs"),
                B.new_input(I64, (t * v_width if self.kv.v_trans else t,), "attn_inp_v_idxs"),
                B.new_input(F16 if self.flash_attn else F32, (n_kv, t // ns, 1, ns), "attn_inp_kq_mask"))
        for kind, inp in attn.items():   # build_input_k_rot / v_rot, after every cache's indices and masks
            k_rot = B.new_input(F32, (self.kv.rot_k,) * 2, "attn_inp_k_rot") if self.kv.rot_k else None
            v_rot = B.new_input(F32, (self.kv.rot_v,) * 2, "attn_inp_v_rot") if self.kv.rot_v else None
            attn[kind] = AttnInputs(inp.k_idxs, inp.v_idxs, inp.mask, k_rot, v_rot)
        out_ids = B.new_input(I32, (shape.n_outputs,), "out_ids")
        self.out = BuiltGraph(Graph(), shape, tokens, embd, pos, out_ids, attn, logits=tokens)

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        hp = self.hp
        self.layer_input = x   # smallthinker's router reads it (moe.build_moe_layer)
        cur = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
        qkv = self._qkv(cur, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
        bias = self._w(tensor_name(T.ATTN_OUT, il, "bias"))
        if bias is not None:
            cur = B.add(cur, bias)
        residual = x
        if il == hp.n_layer - 1 and not hp.spec.trunk_is_output:  # keep only the rows that produce outputs
            cur = B.get_rows(cur, self.out.out_ids)
            residual = B.get_rows(residual, self.out.out_ids)
        if hp.spec.post_norms:
            cur = self.norm(cur, tensor_name(T.ATTN_POST_NORM, il), il)
        ffn_inp = B.add(cur, residual, name=f"ffn_inp-{il}")
        cur = self.ffn(self.norm(ffn_inp, tensor_name(hp.spec.ffn_norm, il), il), il)
        if hp.spec.post_norms:
            cur = self.norm(cur, tensor_name(T.FFN_POST_NORM, il), -1)  # gemma3 passes il = -1 here
        return B.add(cur, ffn_inp, name=f"l_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        tok_embd = self._need(TOKEN_EMBD)
        x = self.lora.embd(tok_embd, self.out.tokens, B.get_rows(tok_embd, self.out.tokens, name="inp_embd_rows"))
        g.expand(x)            # ggml_build_forward_select: the token path, then the embeddings input
        g.expand(self.out.embd)
        if hp.spec.embd_scale:
            x = B.scale(x, math.sqrt(hp.n_embd), name="inp_scaled")
        for il in range(hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        if hp.spec.trunk_is_output:
            x.flags |= FLAG_OUTPUT
            x = B.get_rows(x, self.out.out_ids)
        cur = self.norm(x, OUTPUT_NORM, -1)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        if hp.softcap:
            cur = B.scale(cur, 1.0 / hp.softcap)
            cur = B.unary(cur, "TANH")
            cur = B.scale(cur, hp.softcap)
        g.expand(cur)
        self.out.logits = cur
        return self.out
