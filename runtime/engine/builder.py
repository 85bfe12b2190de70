"""One graph builder for the llama-shaped decoders: llama (Llama 2/3, Mistral), qwen2, qwen3,
qwen3moe, gemma2/3, gpt-oss and the llama-like dense architectures (mistral3, glm4, olmo2, ...),
differing only by the facts in hparams.ARCHS.

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
from runtime.engine.recurrent import token_embeddings
from runtime.ggml import build as B
from runtime.ggml.fused_ops import pad
from runtime.ggml.graph import FLAG_OUTPUT, GGMLType, Graph, Op, Tensor

I32, I64, F16, F32 = GGMLType.I32, GGMLType.I64, GGMLType.F16, GGMLType.F32
# build_ffn with no gate tensor (the dense architectures' FFNs of one up projection)
UNGATED_FFN = frozenset({FfnKind.RELU_SQR, FfnKind.XIELU, FfnKind.SWIGLU_FUSED})


def _softplus(x: float) -> float:
    """ggml_compute_softplus_f32 (ggml-impl.h): x itself above 20."""
    return x if x > 20.0 else math.log(1.0 + math.exp(x))


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
    # glm5n: the fused nodes llama.cpp's resolve_fused_ops checks (op, tensor, layer): res->add_fused_node
    fused: list[tuple[Op, Tensor, int]] = field(default_factory=list)


class DecoderBuilder:
    """Builds the forward graph of one ubatch from weights (name -> Tensor) and the KV cache."""

    def __init__(self, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache, *, flash_attn: bool,
                 offload_kqv: bool, lora: Adapters | None = None) -> None:
        self.hp, self.w, self.kv = hp, weights, kv
        self.flash_attn, self.offload_kqv = flash_attn, offload_kqv
        # applied LoRA adapters: build_lora_mm's extra matmuls on the weights they patch (runtime/engine/lora.py)
        self.lora = lora or Adapters()
        self._attn_scale: Tensor | None = None   # mistral3's temperature input (set by _inputs)
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
        return B.mul(layer_rms_norm(self.out, x, self.hp.eps, il), self._need(weight), name=f"{weight}-mul")

    def ffn(self, x: Tensor, il: int) -> Tensor:
        if self.hp.spec.ffn is FfnKind.MOE:
            return build_moe_layer(self.hp, self._need, self.out.graph, x, il, self._w, self.lora, self.dense_ffn,
                                   self.layer_input, self.out.out_ids)
        if self.hp.spec.ffn in UNGATED_FFN:
            return self._ffn_ungated(x, il)
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

    def _ffn_ungated(self, x: Tensor, il: int) -> Tensor:
        """build_ffn without a gate tensor: arcee's relu(up)^2, apertus' xielu(up) and glm4's ggml_swiglu
        over one ffn_up of twice n_ff (its first half the gate), then ffn_down."""
        kind = self.hp.spec.ffn
        up = self.lora.mm(self._need(tensor_name(T.FFN_UP, il)), x, name=f"ffn_up-{il}")
        if kind is FfnKind.RELU_SQR:
            act = B.sqr(B.unary(up, "RELU", name=f"ffn_relu-{il}"), name=f"ffn_sqr(relu)-{il}")
        elif kind is FfnKind.XIELU:
            act = B.unary(up, "XIELU", name=f"ffn_xielu-{il}")
            a_n, a_p, beta, eps = self.hp.xielu[il]   # ggml_xielu stores the softplus'd alphas
            act.op_params.update(alpha_n=beta + _softplus(a_n), alpha_p=_softplus(a_p), beta=beta, eps=eps)
        else:
            act = B.swiglu_halves(up, name=f"ffn_swiglu-{il}")
        return self.lora.mm(self._need(tensor_name(T.FFN_DOWN, il)), act, name=f"ffn_out-{il}")

    def _has_rope(self, il: int) -> bool:
        """smollm3 leaves every nope_every-th layer unroped; with sliding-window layers, exaone4 and
        exaone-moe their full-attention layers, smallthinker layers 0, n, 2n..."""
        spec, swa = self.hp.spec, self.hp.swa
        if spec.nope_every and (il + 1) % spec.nope_every == 0:
            return False
        if not any(swa):
            return True
        if spec.nope_full_attn and not swa[il]:
            return False
        return not spec.nope_every_from_first or il % spec.nope_every_from_first != 0

    def _rope(self, x: Tensor, il: int) -> Tensor:
        hp = self.hp
        base = hp.freq_base_swa if hp.swa[il] else hp.freq_base
        factors = self._w(rope_freqs_name(il))
        r = B.rope(x, self.out.pos, hp.n_rot, int(hp.spec.rope), base, factors, name=f"rope-{il}")
        r.op_params["freq_scale"] = hp.freq_scale_swa if hp.swa[il] else hp.freq_scale
        if hp.ext_factor:
            r.op_params.update(ext_factor=hp.ext_factor, n_ctx_orig=hp.n_ctx_orig)
        return r

    def _qkv(self, x: Tensor, il: int, n_tokens: int) -> Qkv:
        hp = self.hp
        spec = hp.spec
        if spec.qk_norm_full or spec.qk_norm_after_rope or spec.qk_norm_optional or not self._has_rope(il) \
                or self._attn_scale is not None:
            return self._qkv_dense(x, il, n_tokens)
        out = []
        for part, tensor, heads in (("q", T.ATTN_Q, hp.n_head), ("k", T.ATTN_K, hp.n_head_kv[il]),
                                    ("v", T.ATTN_V, hp.n_head_kv[il])):
            t = self.lora.mm(self._need(tensor_name(tensor, il)), x, name=f"{part.upper()}cur-{il}")
            bias = self._w(tensor_name(tensor, il, "bias"))
            if bias is not None:
                t = B.add(t, bias, name=f"{part.upper()}cur_b-{il}")
            out.append(B.reshape(t, (hp.hd_v if part == "v" else hp.head_dim, heads, n_tokens)))
        q, k, v = out
        if spec.qk_norm:
            q = self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il)
        q = self._rope(q, il)
        if spec.qk_norm:
            k = self.norm(k, tensor_name(T.ATTN_K_NORM, il), il)
        k = self._rope(k, il)
        if hp.q_scale != 1.0:
            q = B.scale(q, hp.q_scale, name=f"Qscaled-{il}")
        return Qkv(q, k, v)

    def _qkv_dense(self, x: Tensor, il: int, n_tokens: int) -> Qkv:
        """build_qkv and what the dense architectures do between it and build_attn: olmo2 norms Q and K
        over the whole projection before the heads split (build_qkv with reshape = false); the per-head
        norms come before RoPE (apertus, exaone4) or after it, K first (hunyuan-dense); layers without
        RoPE skip it (smollm3, exaone4); mistral3 multiplies Q by the temperature input."""
        hp, spec = self.hp, self.hp.spec
        flat = []
        for part, tensor in (("q", T.ATTN_Q), ("k", T.ATTN_K), ("v", T.ATTN_V)):
            t = self.lora.mm(self._need(tensor_name(tensor, il)), x, name=f"{part.upper()}cur-{il}")
            bias = self._w(tensor_name(tensor, il, "bias"))
            flat.append(B.add(t, bias, name=f"{part.upper()}cur_b-{il}") if bias is not None else t)
        q, k, v = flat
        if spec.qk_norm_full:
            q = self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il)
            k = self.norm(k, tensor_name(T.ATTN_K_NORM, il), il)
        q = B.reshape(q, (hp.head_dim, hp.n_head, n_tokens))
        k = B.reshape(k, (hp.head_dim, hp.n_head_kv[il], n_tokens))
        v = B.reshape(v, (hp.hd_v, hp.n_head_kv[il], n_tokens))
        # glm4moe: per-head norms where the file has them (GLM-4.5 355B), none in Air
        per_head = (spec.qk_norm or (spec.qk_norm_optional and self._w(tensor_name(T.ATTN_Q_NORM, il)) is not None)) \
            and not spec.qk_norm_full
        if per_head and not spec.qk_norm_after_rope:
            q = self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il)
            k = self.norm(k, tensor_name(T.ATTN_K_NORM, il), il)
        if self._has_rope(il):
            q, k = self._rope(q, il), self._rope(k, il)
        if per_head and spec.qk_norm_after_rope:
            k = self.norm(k, tensor_name(T.ATTN_K_NORM, il), il)
            q = self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il)
        if self._attn_scale is not None:
            q = B.mul(q, self._attn_scale, name=f"Qcur_attn_temp_scaled-{il}")
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
        width = v.ne[0] * v.ne[1]   # mimo2: V heads narrower than K's
        if not self.kv.v_trans:
            v2 = B.view(v, (width, n_tokens), (v.nb[0], v.nb[2]), 0)
            if vc.ne[2] > 1:
                vc = B.reshape(vc, (vc.ne[0], vc.ne[1] * vc.ne[2]))
            return store_k, B.set_rows(vc, v2, inp.v_idxs, name=f"cache_v_l{il} (set_rows)")
        v2 = B.reshape(v, (width, n_tokens))
        if width < vc.ne[0] and self.hp.head_dim_v:   # moe26: [TAG_V_CACHE_VARIABLE] pads to the widest V
            v2 = pad(v2, (vc.ne[0] - width,))
        elif width != vc.ne[0]:
            raise BadInput("-fa off with layers of different V widths is not implemented in the runtime")
        v2 = B.reshape(v2, (1, v2.ne[0] * n_tokens))
        v_all = B.reshape(vc, (1, vc.n_elements))
        return store_k, B.set_rows(v_all, v2, inp.v_idxs, name=f"cache_v_l{il} (set_rows)")

    def _cache_views(self, il: int, n_kv: int) -> tuple[Tensor, Tensor]:
        """get_k / get_v over every stream (the reserve's slot info spans streams 0..n_stream-1)."""
        hp, kc, vc = self.hp, self.kv.k[il], self.kv.v[il]
        hd, hkv, size, ns = hp.head_dim, hp.n_head_kv[il], kc.ne[1], kc.ne[2]
        hd_v = hp.hd_v
        k = B.view(kc, (hd, hkv, n_kv, ns), (kc.nb[0], row_size(kc.type, hd), row_size(kc.type, kc.ne[0]),
                                              row_size(kc.type, kc.ne[0] * size)), 0, name=f"k-{il}")
        if not self.kv.v_trans:
            v = B.view(vc, (hd_v, hkv, n_kv, ns), (vc.nb[0], row_size(vc.type, hd_v), row_size(vc.type, vc.ne[0]),
                                                   row_size(vc.type, vc.ne[0] * size)), 0, name=f"v-{il}")
        else:
            v = B.view(vc, (n_kv, hkv, hd_v, ns), (vc.nb[0], row_size(vc.type, size * hd_v), row_size(vc.type, size),
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
        cur = mha(self.out, il, q, kv_k, kv_v, inp.mask, self.hp.kq_scale, flash_attn=self.flash_attn,
                  offload_kqv=self.offload_kqv, sinks=self._w(tensor_name(T.ATTN_SINKS, il)),
                  softcap=self.hp.attn_softcap, v_trans=self.kv.v_trans, q_name=f"q-{il}")
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
        # build_inp_attn_scale (mistral3 with a temperature scale): one factor per token, [1, 1, n_tokens]
        self._attn_scale = B.new_input(F32, (1, 1, t), "inp_attn_scale") if hp.attn_temp_scale else None
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
        cur = self.norm(x, tensor_name(T.ATTN_NORM, il), il) if hp.spec.pre_norms else x
        qkv = self._qkv(cur, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
        bias = self._w(tensor_name(T.ATTN_OUT, il, "bias")) if hp.spec.attn_out_bias else None
        if bias is not None:
            cur = B.add(cur, bias)
        if hp.attn_value_scale:   # mimo2: the attention output scaled by the file's value scale
            cur = B.scale(cur, hp.attn_value_scale, name=f"attn_out_scaled-{il}")
        residual = x
        last = il == hp.n_layer - 1 and not (hp.spec.trunk_is_output or hp.spec.norm_is_output)
        if last:  # keep only the rows that produce outputs
            cur = B.get_rows(cur, self.out.out_ids)
            residual = B.get_rows(residual, self.out.out_ids)
        if hp.spec.post_norms:
            cur = self.norm(cur, tensor_name(T.ATTN_POST_NORM, il), il)
        if hp.residual_scale:   # granite: the attention and FFN outputs scaled before each residual add
            cur = B.scale(cur, hp.residual_scale)
        ffn_inp = B.add(cur, residual, name=f"ffn_inp-{il}")
        ffn_in = self.norm(ffn_inp, tensor_name(hp.spec.ffn_norm, il), il) if hp.spec.pre_norms else ffn_inp
        cur = self.ffn(ffn_in, il)
        if hp.spec.post_norms:   # gemma3 passes il = -1 here, glm4 il
            cur = self.norm(cur, tensor_name(T.FFN_POST_NORM, il), il if hp.spec.ffn_post_norm_layer else -1)
        if hp.residual_scale:
            cur = B.scale(cur, hp.residual_scale)
        return B.add(cur, ffn_inp, name=f"l_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        if hp.embd_scale_f:   # build_inp_embd scales granite's token embeddings and expands them
            x = B.scale(x, hp.embd_scale_f, name="embd")
            g.expand(x)
        if hp.spec.embd_scale:
            x = B.scale(x, math.sqrt(hp.n_embd), name="inp_scaled")
        for il in range(hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        if hp.spec.trunk_is_output:
            x.flags |= FLAG_OUTPUT
            x = B.get_rows(x, self.out.out_ids)
        cur = self.norm(x, OUTPUT_NORM, -1)
        if hp.spec.norm_is_output:   # moe26: hy_v3's res->t_h_nextn, then the output rows
            cur.flags |= FLAG_OUTPUT
            cur = B.get_rows(cur, self.out.out_ids)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        if hp.logit_scale:   # granite: logits divided by f_logit_scale
            cur = B.scale(cur, 1.0 / hp.logit_scale)
        if hp.softcap:
            cur = B.scale(cur, 1.0 / hp.softcap)
            cur = B.unary(cur, "TANH")
            cur = B.scale(cur, hp.softcap)
        g.expand(cur)
        self.out.logits = cur
        return self.out


def mha(out: BuiltGraph, il: int, q: Tensor, kv_k: Tensor, kv_v: Tensor, mask: Tensor | None, scale: float, *,
        flash_attn: bool, offload_kqv: bool, sinks: Tensor | None = None, softcap: float = 0.0,
        v_trans: bool = False, q_name: str = "") -> Tensor:
    """build_attn_mha over K and V [D, n_kv, n_head_kv, n_stream]: q split evenly over the streams, flash
    attention or kq -> (soft-capping) -> soft_max (with the sinks) -> kqv; V not stored transposed is copied
    transposed first. The result [n_embd_head * n_head, n_tokens] is expanded into out's graph (and pinned to
    the host when the KQV ops are not offloaded)."""
    ns = kv_k.ne[3]
    per_stream = q.ne[2] // ns
    q4 = B.view(q, (q.ne[0], q.ne[1], per_stream, ns), (q.nb[0], q.nb[1], q.nb[2], q.nb[2] * per_stream), 0,
                name=q_name)
    qp = B.permute(q4, (0, 2, 1, 3))
    kp, vp = B.permute(kv_k, (0, 2, 1, 3)), B.permute(kv_v, (0, 2, 1, 3))
    if flash_attn:
        kp, vp = DecoderBuilder._f16_for_fa(kp), DecoderBuilder._f16_for_fa(vp)
        fa = B.flash_attn_ext(qp, kp, vp, mask, scale, sinks, name=f"__fattn__-{il}", softcap=softcap)
        cur = B.reshape(fa, (fa.ne[0] * fa.ne[1], fa.ne[2] * fa.ne[3]))
    else:
        kq = B.mul_mat(kp, qp, name=f"kq-{il}")
        if softcap:   # build_attn_mha's soft-capping: scale, tanh, scale back
            kq = B.scale(B.unary(B.scale(kq, 1.0 / softcap, name=f"kq_scaled_1-{il}"), "TANH", name=f"kq_tanh-{il}"),
                         softcap, name=f"kq_scaled_2-{il}")
        kq = B.soft_max_ext(kq, mask, scale, name=f"kq_soft_max-{il}", sinks=sinks)
        if not v_trans:   # a cache made for flash attention (-fa auto resolved off): V copied transposed
            vp = B.cont(B.transpose(vp), name=f"v_cont-{il}")
        kqv = B.mul_mat(vp, kq, name=f"kqv-{il}")
        cur = B.permute(kqv, (0, 2, 1, 3))
        cur = B.cont(cur, (cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3]), name=f"kqv_out-{il}")
        if not offload_kqv:
            out.cpu_pins.append(cur)
    out.graph.expand(cur)
    return cur


def layer_rms_norm(out: BuiltGraph, x: Tensor, eps: float, il: int) -> Tensor:
    """build_norm's ggml_rms_norm, named "norm" as llama.cpp's graph callback sees it: "norm-il" and pinned to
    the layer's device for a layer (il >= 0), plain "norm" for the output norm (il = -1)."""
    n = B.rms_norm(x, eps, name=f"norm-{il}" if il >= 0 else "norm")
    if il >= 0:
        out.norm_pins.append((n, il))
    return n
