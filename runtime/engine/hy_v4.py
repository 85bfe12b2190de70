"""hy_v4 (Hunyuan Hy4): deepseek2's absorbed MLA and MoE (runtime/engine/deepseek2.py, with the DSA indexer of
runtime/engine/dsa.py when the file has one) inside independent hyper-connections, op for op as the pinned
llama.cpp builds it (src/models/hy-v4.cpp).

The residual is hc_mult streams [n_embd, hc, T] (the embedding repeated). Around each sub-block (attention, FFN):
  pre (build_hc_pre): mixes = hc_fn . rms_norm(streams flattened) [2 hc, T]; the read gate
    sigmoid(mixes[:hc] * scale[0] + base[:hc]) + eps and the write gate
    magnitude * sigmoid(mixes[hc:] * scale[1] + base[hc:]) + eps; the sub-block's input is the read-weighted sum
    of the streams (in f32: casts, per-stream views, mul, add);
  post (build_hc_post): stream i becomes residual_i + out * write_i (f32 casts, one concat per stream).
The attention adds learnable sinks and multiplies the merged heads by sigmoid(attn_gate x) before attn_output.
The indexer (hy_v4's build_indexer_top_k) ropes the last n_rot rows of its query and key heads and, unlike
deepseek32's, applies no Hadamard rotation. After the last layer the output rows are gathered from the
flattened streams, collapsed by the head gate (build_hc_head) and normed.
The runner sizes these graphs; decode is refused (sigmoid expert gating has no kernel: MlaHParams.missing_kernel).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from gguf import MODEL_TENSOR as T

from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD
from runtime.engine.builder import AttnInputs, BatchShape, BuiltGraph
from runtime.engine.clip import cast
from runtime.engine.deepseek2 import MlaBuilder, MlaHParams, concat, plain_lm_head
from runtime.engine.dsa import DsaBuilder
from runtime.engine.kvcache import KVCache
from runtime.engine.recurrent import token_embeddings
from runtime.ggml import build as B
from runtime.ggml.deltanet import repeat_4d
from runtime.ggml.graph import GGMLType, Tensor

F32 = GGMLType.F32


def _scale_bias(x: Tensor, s: float, bias: float, name: str) -> Tensor:
    """ggml_scale_bias: x * s + bias (one SCALE node)."""
    node = B.scale(x, s, name=name)
    node.op_params["bias"] = float(bias)
    return node


def hc_streams(x: Tensor, hc_mult: int) -> Tensor:
    """The token rows [n_embd, T] repeated into hc_mult hyper-connection streams [n_embd, hc_mult, T]."""
    n_embd, nt = x.ne[0], x.ne[1]
    return repeat_4d(B.reshape(x, (n_embd, 1, nt)), (n_embd, hc_mult, nt, 1), name="hc_init")


def hc_output_rows(x: Tensor, out_ids: Tensor) -> Tensor:
    """The streams [n_embd, hc, T] of the tokens that produce outputs: [n_embd, hc, n_outputs]."""
    n_embd, hc, nt = x.ne[0], x.ne[1], x.ne[2]
    flat = B.get_rows(B.reshape(x, (n_embd * hc, nt)), out_ids)
    return B.reshape(flat, (n_embd, hc, out_ids.ne[0]))


def hc_head_gate(x: Tensor, fn: Tensor, scale: Tensor, base: Tensor, eps: float, hc_eps: float) -> Tensor:
    """build_hc_head's stream weights [hc, T]: sigmoid(hc_head_fn . rms_norm(x) * scale + base) + hc_eps."""
    hc, n_embd, nt = x.ne[1], x.ne[0], x.ne[2]
    flat = B.rms_norm(B.reshape(x, (hc * n_embd, nt)), eps)
    mixes = B.mul_mat(fn, flat, name="hc_head_mixes")
    pre = B.add(B.mul(mixes, scale), base)
    return _scale_bias(B.unary(pre, "SIGMOID"), 1.0, hc_eps, "hc_head_pre")


class HyV4Builder(DsaBuilder):
    """DsaBuilder (or, without an indexer, MlaBuilder's graph) with hy_v4's iHC streams, sinks and gate."""

    def __init__(self, hp: MlaHParams, weights: Mapping[str, Tensor], kv: KVCache,
                 index_cache: Sequence[Tensor | None], *, flash_attn: bool, offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, index_cache, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self._attn_x: Tensor | None = None

    # --- inputs and attention -----------------------------------------------------------------
    def _inputs(self, shape: BatchShape) -> None:
        """build_attn_inp_k_dsa with an indexer, build_attn_inp_k without (hy_v4's full-attention files)."""
        if self.hp.dsa:
            super()._inputs(shape)
        else:
            MlaBuilder._inputs(self, shape)

    def _attn_block(self, x: Tensor, il: int, n_tokens: int) -> Tensor:
        """build_attention / build_attention_dsa: q_a, its norm and q_b (viewed unreshaped), the indexer of a
        layer that owns one, then the MLA attention."""
        self._attn_x = x
        if self.hp.dsa:
            return super()._attn_block(x, il, n_tokens)
        q = B.mul_mat(self._wl(T.ATTN_Q_A, il), x, name=f"q-{il}")
        q = self.norm(q, self._wl(T.ATTN_Q_A_NORM, il), il, f"q-{il}")
        q = B.mul_mat(self._wl(T.ATTN_Q_B, il), q, name=f"q-{il}")
        return self.attention(il, *self._qkv(x, il, n_tokens, q))

    def _mask(self, il: int, inp: AttnInputs) -> Tensor:
        return super()._mask(il, inp) if self.hp.dsa else inp.mask

    def _sinks(self, il: int) -> Tensor | None:
        return self._wl(T.ATTN_SINKS, il)

    def _attn_out(self, il: int, cur: Tensor) -> Tensor:
        """Gated MLA: the merged heads times sigmoid(attn_gate x), then attn_output."""
        assert self._attn_x is not None
        gate = B.mul_mat(self._wl(T.ATTN_GATE, il), self._attn_x, name=f"attn_gate-{il}")
        gate = B.unary(gate, "SIGMOID", name=f"attn_gate-{il}")
        cur = B.mul(cur, gate, name=f"attn_gated-{il}")
        return self.lora.mm(self._wl(T.ATTN_OUT, il), cur, name=f"attn_out-{il}")

    INDEX_ROTATED = False   # hy-v4.cpp scores the indexer's Q and K without dsa's Hadamard rotation

    # --- hyper-connections --------------------------------------------------------------------
    def _hc_reduce(self, x: Tensor, w: Tensor, out_type: GGMLType) -> Tensor:
        """hy_v4_hc_reduce: sum over streams of x[:, i, :] * w[i, :], in f32."""
        hc, n_embd, nt = self.hp.hc_mult, x.ne[0], x.ne[2]
        x32 = cast(x, F32)
        total: Tensor | None = None
        for ih in range(hc):
            xh = B.view(x32, (n_embd, nt), (x32.nb[0], x32.nb[2]), ih * x32.nb[1])
            wh = B.view(w, (1, nt), (w.nb[0], w.nb[1]), ih * w.nb[0])
            cur = B.mul(xh, wh)
            total = B.add(total, cur) if total is not None else cur
        assert total is not None
        return cast(total, out_type)

    def _gate(self, mixes: Tensor, scale: Tensor, base: Tensor, offset: int, name: str) -> Tensor:
        """mixes[offset:offset + hc] * scale + base, through a sigmoid (hy_v4_view_2d / view_1d)."""
        hc, nt = self.hp.hc_mult, mixes.ne[1]
        part = B.view(mixes, (hc, nt), (mixes.nb[0], mixes.nb[1]), offset * mixes.nb[0])
        part = B.mul(part, scale)
        part = B.add(part, base)
        return B.unary(part, "SIGMOID", name=name)

    def _hc_pre(self, x: Tensor, part: str, il: int) -> tuple[Tensor, Tensor]:
        """build_hc_pre: the sub-block's input and the write gate `post` [hc, T]."""
        hp = self.hp
        hc, n_embd, nt = hp.hc_mult, x.ne[0], x.ne[2]
        fn, sc, base = (self._need(f"blk.{il}.hc_{part}_{w}.weight") for w in ("fn", "scale", "base"))
        flat = B.reshape(x, (hc * n_embd, nt))
        flat = B.rms_norm(flat, hp.eps)
        mixes = B.mul_mat(fn, flat, name=f"hc_mixes-{il}")
        scale_pre = B.view(sc, (1,), (sc.nb[0],), 0)
        scale_post = B.view(sc, (1,), (sc.nb[0],), sc.nb[0])
        base_pre = B.view(base, (hc,), (base.nb[0],), 0)
        base_post = B.view(base, (hc,), (base.nb[0],), hc * base.nb[0])
        pre = self._gate(mixes, scale_pre, base_pre, 0, f"hc_pre-{il}")
        pre = _scale_bias(pre, 1.0, hp.hc_eps, f"hc_pre-{il}")
        post = self._gate(mixes, scale_post, base_post, hc, f"hc_post_gate-{il}")
        post = B.scale(post, hp.hc_magnitude)
        post = _scale_bias(post, 1.0, hp.hc_eps, f"hc_post_gate-{il}")
        return self._hc_reduce(x, pre, x.type), post

    def _hc_post(self, x: Tensor, residual: Tensor, post: Tensor) -> Tensor:
        """build_hc_post: stream i = residual_i + x * post_i (f32), the streams concatenated along dim 1."""
        hc, n_embd, nt = self.hp.hc_mult, x.ne[0], x.ne[1]
        x32, post32, res32 = cast(x, F32), cast(post, F32), cast(residual, F32)
        out: Tensor | None = None
        for i in range(hc):
            res_i = B.view(res32, (n_embd, nt), (res32.nb[0], res32.nb[2]), i * res32.nb[1])
            post_i = B.view(post32, (1, nt), (post32.nb[0], post32.nb[1]), i * post32.nb[0])
            cur = B.add(res_i, B.mul(x32, post_i))
            cur = B.reshape(cur, (n_embd, 1, nt))
            out = concat(out, cur, 1) if out is not None else cur
        assert out is not None
        return cast(out, residual.type)

    def _hc_head(self, x: Tensor) -> Tensor:
        """build_hc_head: the streams collapsed by sigmoid(hc_head_fn . rms_norm(x) * scale + base) + eps."""
        hp = self.hp
        pre = hc_head_gate(x, self._need("output_hc_fn.weight"), self._need("output_hc_scale.weight"),
                           self._need("output_hc_base.weight"), hp.eps, hp.hc_eps)
        return self._hc_reduce(x, pre, x.type)

    # --- the graph ----------------------------------------------------------------------------
    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        cur, post = self._hc_pre(x, "attn", il)
        cur = self.norm(cur, self._wl(T.ATTN_NORM, il), il, f"attn_norm-{il}")
        cur = self._attn_block(cur, il, n_tokens)
        x = self._hc_post(cur, x, post)
        cur, post = self._hc_pre(x, "ffn", il)
        cur = self.norm(cur, self._wl(T.FFN_NORM, il), il, f"ffn_norm-{il}")
        cur = self._ffn_block(cur, il)
        return self._hc_post(cur, x, post)

    def build(self, shape: BatchShape) -> BuiltGraph:
        self.top_k = None
        self._inputs(shape)
        hp, g = self.hp, self.out.graph
        tok_embd = self._need(TOKEN_EMBD)
        x = token_embeddings(g, tok_embd, self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        x = hc_streams(x, hp.hc_mult)
        for il in range(hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        cur = self._hc_head(hc_output_rows(x, self.out.out_ids))
        cur = self.norm(cur, self._need(OUTPUT_NORM), -1, "result_norm")
        return plain_lm_head(self.out, cur, self.w.get(OUTPUT) or tok_embd)

