"""qwen3next (Qwen3-Next): Gated DeltaNet layers where (il + 1) % full_attention_interval != 0, gated
full attention elsewhere, routed experts plus a sigmoid-gated shared expert in every layer, node for
node as src/models/qwen3next.cpp and src/models/delta-net-base.cpp build them at the pinned build.

Graph order: the token embeddings; per layer the input norm (expanded at once), the mixer, the
residual, the post-attention norm, the FFN and the residual; the output norm (a graph output: the
MTP head's input, res->t_h_nextn), the output rows, the output matrix. No rows are dropped inside
the last layer (embeddings_nextn_masked is off by default).

A DeltaNet layer (build_layer_attn_linear, the attn_qkv / attn_gate layout): qkv and z projections,
beta = sigmoid(b) and gate = softplus(a + dt_bias) * A from ssm_ba; the conv state (build_rs over r,
the stored d_conv - 1 columns joined to this ubatch's, the last d_conv - 1 written back), the SSM
state (build_rs over s), SSM_CONV + SiLU, Q and K L2-normed (RMS_NORM then SCALE) and repeated to
the V heads, one fused GATED_DELTA_NET (llama.cpp turns fused_gdn_ar / _ch on when the layer's device
runs the op: every device the runtime simulates does), its state tail copied into s, a gated RMS norm
with z and ssm_out. An attention layer: Q carries its gate (attn_q is 2 n_head head_dim wide), Q and K
are normed per head and roped, the attention output is multiplied by sigmoid(gate) before attn_output.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.moe import build_moe_ffn
from runtime.engine.recurrent import (
    ELEMENT,
    RecurrentStates,
    RsInputs,
    SsmParams,
    bare_name,
    build_rs,
    read_ssm_params,
    token_embeddings,
    ubatch_sequences,
)
from runtime.ggml import build as B
from runtime.ggml import deltanet, ssm
from runtime.ggml.graph import FLAG_OUTPUT, Tensor

QWEN3NEXT = "qwen3next"


class Qwen3NextBuilder(DecoderBuilder):
    # qwen3next.cpp repeats the key heads over the value heads whatever the fused flags say;
    # qwen35*.cpp leaves them to the fused op's broadcast when fused_gdn_ar and _ch are on
    GDN_BROADCASTS_HEADS = False

    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache,
                 states: RecurrentStates, *, flash_attn: bool, offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.states = states
        self.ssm: SsmParams = read_ssm_params(model)
        p = self.ssm
        if p.n_head % p.n_group or p.head_dim != p.d_state:
            raise BadInput(f"qwen3next: {p.n_head} value heads of {p.head_dim} over {p.n_group} key heads of "
                           f"{p.d_state} is not a Gated DeltaNet layout llama.cpp builds")
        # build_moe_ffn scales the expert weights when expert_weights_scale is set (not 0 or 1)
        w_scale = float(model.metadata.get(Keys.LLM.EXPERT_WEIGHTS_SCALE.format(arch=model.architecture), 0.0) or 0.0)
        if w_scale not in (0.0, 1.0):
            raise BadInput("qwen3next with expert_weights_scale is not implemented in the runtime")
        for il in states.r:
            if self._w(tensor_name(T.ATTN_QKV, il)) is None:
                raise BadInput("qwen3next with the legacy ssm_in projection is not implemented in the runtime")

    # --- Gated DeltaNet ------------------------------------------------------------------------
    def _beta_gate(self, cur: Tensor, il: int, nst: int, n_seqs: int) -> tuple[Tensor, Tensor]:
        """beta = sigmoid(b) and gate = softplus(a + dt_bias) * A, each [1, n_v_heads, nst, n_seqs]."""
        p = self.ssm
        nk, nv = p.n_group, p.n_head
        per = nv // nk
        ba = self.lora.mm(self._need(tensor_name(T.SSM_BETA_ALPHA, il)), cur, name=f"linear_attn_mixed_ba-{il}")
        ba = B.reshape(ba, (2 * per, nk, nst, n_seqs))
        nb = (ba.nb[0], ba.nb[1], ba.nb[2], ba.nb[3])
        b = B.view(ba, (per, nk, nst, n_seqs), nb, 0, name=f"b-{il}")
        a = B.view(ba, (per, nk, nst, n_seqs), nb, per * ELEMENT, name=f"a-{il}")
        beta = B.unary(B.cont(b), "SIGMOID")
        alpha = B.add(B.cont(a, (nv, nst, n_seqs)), self._need(tensor_name(T.SSM_DT, il, "bias")))
        gate = B.mul(B.unary(alpha, "SOFTPLUS", name=f"a_softplus-{il}"), self._need(bare_name(T.SSM_A, il)),
                     name=f"gate-{il}")
        return B.reshape(beta, (1, nv, nst, n_seqs)), B.reshape(gate, (1, nv, nst, n_seqs))

    def _l2_norm(self, x: Tensor) -> Tensor:
        """build_gdn_l2_norm (src/models/models.h): rms_norm with eps / n, scaled by 1 / sqrt(n)."""
        n = x.ne[0]
        return B.scale(B.rms_norm(x, self.hp.eps / n), 1.0 / math.sqrt(n))

    def _delta_net(self, cur: Tensor, il: int, rs: RsInputs, n_seqs: int) -> Tensor:
        p, g = self.ssm, self.out.graph
        nk, nv, hk, hv = p.n_group, p.n_head, p.d_state, p.head_dim
        nst = cur.ne[1] // n_seqs
        qkv = self.lora.mm(self._need(tensor_name(T.ATTN_QKV, il)), cur, name=f"linear_attn_qkv_mixed-{il}")
        qkv = B.reshape(qkv, (qkv.ne[0], nst, n_seqs))
        z = self.lora.mm(self._need(tensor_name(T.ATTN_GATE, il)), cur, name=f"z-{il}")
        beta, gate = self._beta_gate(cur, il, nst, n_seqs)
        r_all, s_all = self.states.r[il], self.states.s[il]
        # build_conv_state: the stored columns, then this ubatch's; the last d_conv - 1 become the new r
        conv = B.reshape(build_rs(g, rs, r_all, r_all.ne[0], n_seqs), (p.d_conv - 1, p.conv_dim, n_seqs))
        conv_in = ssm.concat(conv, B.transpose(qkv), 0, name=f"conv_input-{il}")
        row = (p.d_conv - 1) * p.conv_dim * ELEMENT
        # mtp: with rollback rows, the last K = n_rs_seq + 1 windows, window t into group K - t (build_conv_state)
        n_snap = self.states.n_rs_seq + 1
        for t in range(1, n_snap + 1):
            idx = max(0, conv_in.ne[0] - conv.ne[0] - n_snap + t) if n_snap > 1 else conv_in.ne[0] - conv.ne[0]
            last = B.view(conv_in, (p.d_conv - 1, p.conv_dim, n_seqs), (ELEMENT, conv_in.nb[1], conv_in.nb[2]),
                          idx * ELEMENT)
            slot = n_snap - t
            g.expand(B.cpy(last, B.view(r_all, ((p.d_conv - 1) * p.conv_dim, n_seqs), (ELEMENT, r_all.nb[1]),
                                        (slot * self.states.size + rs.head) * row)))
        state = B.reshape(build_rs(g, rs, s_all, s_all.ne[0], n_seqs), (hv, hv, nv, n_seqs))
        mixed = B.silu(ssm.ssm_conv(conv_in, self._need(tensor_name(T.SSM_CONV1D, il)), name=f"conv_output_raw-{il}"))
        row_b = p.conv_dim * ELEMENT
        qk_nb = (ELEMENT, hk * ELEMENT, row_b, row_b * nst)
        q = self._l2_norm(B.view(mixed, (hk, nk, nst, n_seqs), qk_nb, 0, name=f"q_conv-{il}"))
        k = self._l2_norm(B.view(mixed, (hk, nk, nst, n_seqs), qk_nb, hk * nk * ELEMENT, name=f"k_conv-{il}"))
        v = B.view(mixed, (hv, nv, nst, n_seqs), (ELEMENT, hv * ELEMENT, row_b, row_b * nst), 2 * hk * nk * ELEMENT,
                   name=f"v_conv-{il}")
        if nk != nv and not self.GDN_BROADCASTS_HEADS:   # repeat each key head over its value heads
            rep = (hk, nv // nk, nk, nst * n_seqs)
            q = B.reshape(deltanet.repeat_4d(B.reshape(q, (hk, 1, nk, nst * n_seqs)), rep), (hk, nv, nst, n_seqs))
            k = B.reshape(deltanet.repeat_4d(B.reshape(k, (hk, 1, nk, nst * n_seqs)), rep), (hk, nv, nst, n_seqs))
        gdn = deltanet.gated_delta_net(q, k, v, gate, beta, state, n_snap, name=f"gdn-{il}")
        out = B.view(gdn, (hv, nv, nst, n_seqs), (ELEMENT, hv * ELEMENT, hv * nv * ELEMENT, hv * nv * nst * ELEMENT),
                     0, name=f"attn_output-{il}")
        if n_snap > 1:   # mtp: build_recurrent_attn keeps the last min(nst, K) states, snapshot i into group i
            n_written, d = min(nst, n_snap), hv * hv * nv
            src = B.view(gdn, (d, n_seqs, n_written), (ELEMENT, d * ELEMENT, d * n_seqs * ELEMENT),
                         hv * nv * nst * n_seqs * ELEMENT)
            dst = B.view(s_all, (d, n_seqs, n_written), (ELEMENT, s_all.nb[1], self.states.size * s_all.nb[1]),
                         rs.head * s_all.nb[1])
            g.expand(B.cpy(src, dst))
        else:
            new_state = B.view(gdn, (hv, hv, nv, n_seqs),
                               (ELEMENT, hv * ELEMENT, hv * hv * ELEMENT, hv * hv * nv * ELEMENT),
                               hv * nv * nst * n_seqs * ELEMENT, name=f"new_state-{il}")
            n_embd_s = s_all.ne[0]
            g.expand(B.cpy(new_state, B.view(s_all, (n_embd_s, n_seqs), (ELEMENT, s_all.nb[1]),
                                             rs.head * n_embd_s * ELEMENT)))
        # build_norm_gated: RMS norm times ssm_norm, times silu(z)
        y = B.mul(self.norm(out, tensor_name(T.SSM_NORM, il), il), B.silu(B.reshape(z, (hv, nv, nst, n_seqs))))
        y = B.reshape(y, (hv * nv, nst, n_seqs))
        y = self.lora.mm(self._need(tensor_name(T.SSM_OUT, il)), y, name=f"linear_attn_out-{il}")
        return B.reshape(y, (self.hp.n_embd, nst * n_seqs))

    # --- gated attention ------------------------------------------------------------------------
    def _gated_attention(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        hp = self.hp
        hd, nh, nkv = hp.head_dim, hp.n_head, hp.n_head_kv[il]
        q_full = self.lora.mm(self._need(tensor_name(T.ATTN_Q, il)), cur, name=f"Qcur_full-{il}")
        k = self.lora.mm(self._need(tensor_name(T.ATTN_K, il)), cur, name=f"Kcur-{il}")
        v = self.lora.mm(self._need(tensor_name(T.ATTN_V, il)), cur, name=f"Vcur-{il}")
        q_full = B.reshape(q_full, (2 * hd, nh, n_tokens, 1))
        nb = (q_full.nb[0], q_full.nb[1], q_full.nb[2], q_full.nb[3])
        q = B.view(q_full, (hd, nh, n_tokens, 1), nb, 0, name=f"Qcur_view-{il}")
        gate = B.view(q_full, (hd, nh, n_tokens, 1), nb, hd * ELEMENT, name=f"gate-{il}")
        k = B.reshape(k, (hd, nkv, n_tokens))
        v = B.reshape(v, (hd, nkv, n_tokens))
        q = self._rope(self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il), il)
        k = self._rope(self.norm(k, tensor_name(T.ATTN_K_NORM, il), il), il)
        cur = self.attention(il, q, k, v)
        gate = B.unary(B.cont(gate, (hd * nh, n_tokens)), "SIGMOID", name=f"gate_sigmoid-{il}")
        cur = B.mul(cur, gate, name=f"attn_gated-{il}")
        return self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_output-{il}")

    # --- FFN --------------------------------------------------------------------------------------
    def _layer_ffn(self, cur: Tensor, il: int) -> Tensor:
        """Routed experts plus the shared expert scaled by sigmoid(ffn_gate_inp_shexp . x)."""
        moe = build_moe_ffn(self.hp, self._need, self.out.graph, cur, il, lora=self.lora)
        if self._w(tensor_name(T.FFN_UP_SHEXP, il)) is None:
            return moe
        up = self.lora.mm(self._need(tensor_name(T.FFN_UP_SHEXP, il)), cur, name=f"ffn_shexp_up-{il}")
        gate = self.lora.mm(self._need(tensor_name(T.FFN_GATE_SHEXP, il)), cur, name=f"ffn_shexp_gate-{il}")
        shared = self.lora.mm(self._need(tensor_name(T.FFN_DOWN_SHEXP, il)), B.swiglu(gate, up), name=f"ffn_shexp-{il}")
        s_gate = self.lora.mm(self._need(tensor_name(T.FFN_GATE_INP_SHEXP, il)), cur, name=f"shared_expert_gate-{il}")
        shared = B.mul(shared, B.unary(s_gate, "SIGMOID"), name=f"ffn_shexp_gated-{il}")
        return B.add(moe, shared, name=f"ffn_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        n_seqs = ubatch_sequences(self.states, shape.n_tokens)
        rs = RsInputs.reserve(self.states, n_seqs)
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "model.embed_tokens",
                             self.lora)
        for il in range(hp.n_layer):
            residual = x
            cur = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
            g.expand(cur)
            if il in self.states.r:
                cur = self._delta_net(cur, il, rs, n_seqs)
            else:
                cur = self._gated_attention(cur, il, shape.n_tokens)
            cur = B.add(cur, residual, name=f"attn_residual-{il}")
            ffn = self._layer_ffn(self.norm(cur, tensor_name(T.ATTN_POST_NORM, il), il), il)
            x = B.add(ffn, cur, name=f"l_out-{il}")
        cur = self.norm(x, OUTPUT_NORM, -1)
        cur.flags |= FLAG_OUTPUT   # res->t_h_nextn: set_outputs keeps it
        cur = B.get_rows(cur, self.out.out_ids, name="result_norm")
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        g.expand(cur)
        self.out.logits = cur
        return self.out
