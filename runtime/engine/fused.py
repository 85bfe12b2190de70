"""The decoders whose layers differ from llama's by facts hparams.ARCHS states in its "fused" block:
phi3, command-r, cohere2, stablelm, starcoder2, olmo, qwen3vl and qwen3vlmoe (its experts from moe.py), node for node as
src/models/<arch>.cpp builds them at the pinned build (DESIGN.md).

The facts, and where each graph reads them:
- Norms: RMSNorm, or LayerNorm (ggml_norm with f_norm_eps) times the weight plus the bias where the
  file has them; olmo's LayerNorm has neither, so llama.cpp never names it "norm" and never pins it.
- Q/K/V: one fused attn_qkv matmul viewed as Q, K and V (build_qkv; create_tensor_qkv accepts either
  layout in every one of these architectures), or three, with biases and olmo's clamp.
- RoPE: partial (n_rot < head_dim), NoPE on cohere2's global layers, phi3's long/short frequency
  factors chosen by the context (llama_model::get_rope_factors), qwen3vl's multi-section RoPE over
  four positions a token; phi3 scales Q by 1/sqrt(head_dim) after RoPE.
- Blocks: sequential (attention, residual, FFN, residual) or parallel (command-r, cohere2: the FFN
  reads the attention's normed input; the layer output is ffn + input + attention).
- FFN: SwiGLU of up and gate, phi3's one up matrix of both halves, starcoder2's GELU with biases.
- Output: command-r's logit scale; qwen3vl's deepstack inputs (the token embeddings padded to
  n_embd * (1 + n_deepstack); layer il < n_deepstack adds slice il + 1 of them to its output).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import BadInput, GGUFError
from planner.gguf.reader import ModelFile, row_size
from planner.model.tensors import (
    OUTPUT,
    OUTPUT_NORM,
    ROPE_FACTORS_LONG,
    ROPE_FACTORS_SHORT,
    TOKEN_EMBD,
    layer_copy_name,
    tensor_name,
)
from runtime.engine.builder import AttnInputs, BatchShape, BuiltGraph, DecoderBuilder, Qkv
from runtime.engine.hparams import ARCHS, FfnKind, HParams
from runtime.engine.kvcache import KVCache
from runtime.ggml import build as B
from runtime.ggml import fused_ops as F
from runtime.ggml.graph import GGMLType, Op, Tensor
from runtime.ggml.ssm import concat

I32, F32 = GGMLType.I32, GGMLType.F32
# llama-hparams.h GGML_MROPE_SECTIONS: positions per token under multi-section RoPE
MROPE_SECTIONS = 4


def _fused(arch: str) -> bool:
    s = ARCHS[arch]
    return (s.layer_norm or s.parallel or s.rope_swa_only or s.logit_scale or s.clamp_kqv or s.mrope
            or s.residual_first or s.ffn is FfnKind.GELU or s.fused_qkv)


# the architectures this module builds: those whose ARCHS row sets a fact of the "fused" block
FUSED_ARCHS = frozenset(a for a in ARCHS if _fused(a))


@dataclass(frozen=True)
class FusedFacts:
    """Keys these graphs read beyond HParams (load_arch_hparams of each architecture)."""

    norm_eps: float
    logit_scale: float
    clamp_kqv: float
    sections: tuple[int, ...]
    n_deepstack: int
    long_factors: bool   # phi3: n_ctx_seq > n_ctx_orig_yarn selects rope_factors_long


def read_fused_facts(model: ModelFile, hp: HParams, n_ctx_seq: int) -> FusedFacts:
    arch, meta = model.architecture, model.metadata
    spec = hp.spec

    def num(template: str, default: float) -> float:
        return float(meta.get(template.format(arch=arch), default))

    sections: tuple[int, ...] = ()
    if spec.mrope:
        raw = meta.get(Keys.Rope.DIMENSION_SECTIONS.format(arch=arch))
        if raw is None:
            raise GGUFError(model.path, f"missing required key {Keys.Rope.DIMENSION_SECTIONS.format(arch=arch)}")
        sections = tuple(int(x) for x in (raw if isinstance(raw, (list, tuple)) else [raw]))
    return FusedFacts(
        norm_eps=num(Keys.Attention.LAYERNORM_EPS, 1e-5),
        logit_scale=num(Keys.LLM.LOGIT_SCALE, 0.0) if spec.logit_scale else 0.0,
        clamp_kqv=num(Keys.Attention.CLAMP_KQV, 0.0) if spec.clamp_kqv else 0.0,
        sections=sections,
        n_deepstack=int(num(Keys.LLM.NUM_DEEPSTACK_LAYERS, 0)) if spec.mrope else 0,
        long_factors=n_ctx_seq > hp.n_ctx_orig,
    )


class FusedBuilder(DecoderBuilder):
    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache, *,
                 flash_attn: bool, offload_kqv: bool, n_ctx_seq: int) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.ff = read_fused_facts(model, hp, n_ctx_seq)
        normed = self._w(tensor_name(T.ATTN_NORM, 0)) is not None
        if (hp.spec.layer_norm and not hp.spec.parallel and not hp.spec.ffn_norm_optional and normed
                and self._w(tensor_name(T.FFN_NORM, 0)) is None):
            raise BadInput(f"{hp.arch} without ffn_norm (a parallel residual) is not implemented in the runtime")

    # --- norms ----------------------------------------------------------------------------------
    def norm(self, x: Tensor, weight: str, il: int) -> Tensor:
        """build_norm: RMS as the base builder, or LayerNorm with the weight and bias the file has;
        llama.cpp names the normed tensor "norm" (and pins it) only when there is either."""
        if not self.hp.spec.layer_norm:
            return super().norm(x, weight, il)
        w = self._w(weight)
        b = self._w(weight.removesuffix(".weight") + ".bias")
        n = F.norm(x, self.ff.norm_eps, name=(f"norm-{il}" if il >= 0 else "norm") if (w or b) else "")
        if il >= 0 and (w is not None or b is not None):
            self.out.norm_pins.append((n, il))
        if w is not None:
            n = B.mul(n, w, name=f"{weight}-mul")
        if b is not None:
            n = B.add(n, b, name=f"{weight}-add")
        return n

    # --- Q, K, V --------------------------------------------------------------------------------
    def _clamped(self, t: Tensor, name: str) -> Tensor:
        c = self.ff.clamp_kqv
        return F.clamp(t, -c, c, name=name) if c > 0 else t

    def _split_qkv(self, x: Tensor, il: int, n_tokens: int) -> tuple[Tensor, Tensor, Tensor]:
        hp = self.hp
        hd, nh, nkv = hp.head_dim, hp.n_head, hp.n_head_kv[il]
        wqkv = self._w(tensor_name(T.ATTN_QKV, il))
        if wqkv is not None:   # build_qkv's fused path: one matmul, three strided views
            qkv = self.lora.mm(wqkv, x, name=f"wqkv-{il}")
            bias = self._w(tensor_name(T.ATTN_QKV, il, "bias"))
            parts = [self._w(tensor_name(t, il, "bias")) for t in (T.ATTN_Q, T.ATTN_K, T.ATTN_V)]
            if bias is None and all(p is not None for p in parts):
                bias = concat(concat(parts[0], parts[1], 0), parts[2], 0)   # type: ignore[arg-type]
            if bias is not None:
                qkv = B.add(qkv, bias, name=f"wqkv_b-{il}")
            qkv = self._clamped(qkv, f"wqkv_clamped-{il}")
            el, row = row_size(qkv.type, 1), qkv.nb[1]
            q = B.view(qkv, (hd, nh, n_tokens), (el, el * hd, row), 0, name=f"Qcur-{il}")
            k = B.view(qkv, (hd, nkv, n_tokens), (el, el * hd, row), el * hd * nh, name=f"Kcur-{il}")
            v = B.view(qkv, (hd, nkv, n_tokens), (el, el * hd, row), el * hd * (nh + nkv), name=f"Vcur-{il}")
            return q, k, v
        out = []
        for part, tensor in (("Q", T.ATTN_Q), ("K", T.ATTN_K), ("V", T.ATTN_V)):
            t = self.lora.mm(self._need(tensor_name(tensor, il)), x, name=f"{part}cur-{il}")
            bias = self._w(tensor_name(tensor, il, "bias"))
            if bias is not None:
                t = B.add(t, bias, name=f"{part}cur_b-{il}")
            out.append(self._clamped(t, f"{part}cur_clamped-{il}"))
        return (B.reshape(out[0], (hd, nh, n_tokens)), B.reshape(out[1], (hd, nkv, n_tokens)),
                B.reshape(out[2], (hd, nkv, n_tokens)))

    def _rope(self, x: Tensor, il: int) -> Tensor:
        hp = self.hp
        if not hp.spec.mrope:
            r = super()._rope(x, il)
            if r.src[2] is None and self.w.get(layer_copy_name(ROPE_FACTORS_SHORT, il)) is not None:
                # phi3: get_rope_factors picks the long or the short table by the context
                table = ROPE_FACTORS_LONG if self.ff.long_factors else ROPE_FACTORS_SHORT
                r.src[2] = self._need(layer_copy_name(table, il))
            return r
        # ggml_rope_multi: four positions a token, the rotated dims split by sections
        return Tensor(x.type, x.ne, name=f"rope-{il}", op=Op.ROPE, src=[x, self.out.pos, None],
                      op_params={"n_dims": hp.n_rot, "mode": int(hp.spec.rope), "freq_base": hp.freq_base,
                                 "freq_scale": hp.freq_scale, "sections": self.ff.sections})

    def _qk_norm(self, t: Tensor, tensor: T, il: int) -> Tensor:
        name = tensor_name(tensor, il)
        if self.hp.spec.qk_norm or (self.hp.spec.layer_norm and self._w(name) is not None):
            return self.norm(t, name, il)
        return t

    def _roped(self, il: int) -> bool:
        """Whether layer il ropes Q and K (cohere2: only the sliding-window layers)."""
        return not (self.hp.spec.rope_swa_only and not self.hp.swa[il])

    def _qkv(self, x: Tensor, il: int, n_tokens: int) -> Qkv:
        hp = self.hp
        q, k, v = self._split_qkv(x, il, n_tokens)
        roped = self._roped(il)
        q = self._qk_norm(q, T.ATTN_Q_NORM, il)
        if hp.spec.ffn_norm_optional:   # stablelm.cpp norms K before roping Q
            k = self._qk_norm(k, T.ATTN_K_NORM, il)
        if roped:
            q = self._rope(q, il)
        if not hp.spec.ffn_norm_optional:
            k = self._qk_norm(k, T.ATTN_K_NORM, il)
        if roped:
            k = self._rope(k, il)
        if hp.q_scale != 1.0:
            q = B.scale(q, hp.q_scale, name=f"Qscaled-{il}")
        return Qkv(q, k, v)

    def _store(self, il: int, k: Tensor, v: Tensor, inp: AttnInputs) -> tuple[Tensor, Tensor]:
        """cpy_v of a transposed cache copies a V that is a view of the fused QKV row (ggml_cont_2d)
        before writing it element-wise; everything else as the base builder."""
        width, n_tokens = v.ne[0] * v.ne[1], v.ne[2]
        if not self.kv.v_trans or v.nb[2] == row_size(v.type, width):
            return super()._store(il, k, v, inp)
        kc = self.kv.k[il]
        k2 = B.view(k, (width, n_tokens), (k.nb[0], k.nb[2]), 0)
        if kc.ne[2] > 1:
            kc = B.reshape(kc, (kc.ne[0], kc.ne[1] * kc.ne[2]))
        store_k = B.set_rows(kc, k2, inp.k_idxs, name=f"cache_k_l{il} (set_rows)")
        vc = self.kv.v[il]
        if width != vc.ne[0]:
            raise BadInput("-fa off with layers of different V widths is not implemented in the runtime")
        v2 = B.reshape(B.cont(v, (width, n_tokens), name=f"v_cont_2d-{il}"), (1, width * n_tokens))
        v_all = B.reshape(vc, (1, vc.n_elements))
        return store_k, B.set_rows(v_all, v2, inp.v_idxs, name=f"cache_v_l{il} (set_rows)")

    # --- FFN ------------------------------------------------------------------------------------
    def ffn(self, x: Tensor, il: int) -> Tensor:
        kind = self.hp.spec.ffn
        if kind is FfnKind.GELU:
            up = self.lora.mm(self._need(tensor_name(T.FFN_UP, il)), x, name=f"ffn_up-{il}")
            b = self._w(tensor_name(T.FFN_UP, il, "bias"))
            if b is not None:
                up = B.add(up, b, name=f"ffn_up_b-{il}")
            cur = B.unary(up, "GELU", name=f"ffn_gelu-{il}")
            cur = self.lora.mm(self._need(tensor_name(T.FFN_DOWN, il)), cur, name=f"ffn_down-{il}")
            b = self._w(tensor_name(T.FFN_DOWN, il, "bias"))
            return B.add(cur, b, name=f"ffn_out-{il}") if b is not None else cur
        return super().ffn(x, il)

    # --- layers ---------------------------------------------------------------------------------
    def _attn_block(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        qkv = self._qkv(cur, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
        bias = self._w(tensor_name(T.ATTN_OUT, il, "bias"))
        return B.add(cur, bias) if bias is not None else cur

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        spec, last = self.hp.spec, il == self.hp.n_layer - 1
        normed = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
        cur = self._attn_block(normed, il, n_tokens)
        ids = self.out.out_ids
        if spec.parallel:   # command-r.cpp / cohere2.cpp
            if last:
                cur, x, normed = B.get_rows(cur, ids), B.get_rows(x, ids), B.get_rows(normed, ids)
            ffn = self.ffn(normed, il)
            return B.add(B.add(ffn, x), cur, name=f"l_out-{il}")
        if last:
            cur, x, normed = B.get_rows(cur, ids), B.get_rows(x, ids), B.get_rows(normed, ids)
        ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
        ffn_norm = tensor_name(T.FFN_NORM, il)
        if spec.ffn_norm_optional and self._w(ffn_norm) is None:   # stablelm.cpp's parallel residual
            ffn = self.ffn(normed, il)
        else:
            ffn = self.ffn(self.norm(ffn_inp, ffn_norm, il), il)
        out = B.add(ffn_inp, ffn) if spec.residual_first else B.add(ffn, ffn_inp)
        if il < self.ff.n_deepstack:   # qwen3vl: slice il + 1 of the padded embeddings
            emb = self.inp_embd
            ds = B.view(emb, (self.hp.n_embd, n_tokens), (emb.nb[0], emb.nb[1]), (il + 1) * self.hp.n_embd * 4)
            out = B.add(out, ds, name=f"deepstack_out-{il}")
        return out

    def _inputs(self, shape: BatchShape) -> None:
        super()._inputs(shape)
        t = shape.n_tokens
        if self.hp.spec.mrope:   # build_inp_pos: n_pos_per_embd positions a token
            self.out.pos = B.new_input(I32, (t * MROPE_SECTIONS,), "inp_pos")
        if self.ff.n_deepstack:   # build_inp_embd: the vector path is n_embd_inp wide
            self.out.embd = B.new_input(F32, (self.hp.n_embd * (1 + self.ff.n_deepstack), t), "inp_embd")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        tok_embd = self._need(TOKEN_EMBD)
        x = self.lora.embd(tok_embd, self.out.tokens, B.get_rows(tok_embd, self.out.tokens, name="inp_embd_rows"))
        if self.ff.n_deepstack:
            x = F.pad(x, (hp.n_embd * self.ff.n_deepstack,), name="inp_embd_padded")
        g.expand(x)            # ggml_build_forward_select: the token path, then the embeddings input
        g.expand(self.out.embd)
        self.inp_embd = x
        if self.ff.n_deepstack:
            x = B.view(x, (hp.n_embd, shape.n_tokens), (x.nb[0], x.nb[1]), 0, name="inp_embd_view")
        for il in range(hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        cur = self.norm(x, OUTPUT_NORM, -1)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        if self.ff.logit_scale:
            cur = B.scale(cur, self.ff.logit_scale)
        g.expand(cur)
        self.out.logits = cur
        return self.out
