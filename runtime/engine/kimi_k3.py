"""kimi-k3 (Kimi K3): kimi-linear's hybrid of KDA and MLA layers (runtime/engine/kimi.py) with what
src/models/kimi-k3.cpp adds, node for node at the pinned build:

- attention residuals (attn_res.block_size > 0): the raw input of every block_size-th layer is banked as a
  checkpoint [n_embd, 1, T] (the stack grows by CONCAT along dim 1); before each attention, each FFN and
  the output, the stack and the current stream are scored (rms_norm, times the layer's score weight,
  SUM_ROWS), the scores soft-maxed per token, the stack mixed by DSV4_HC_PRE and the stream added at its
  weight; a banked layer's stream restarts from its attention output;
- KDA: A is 1-d, the decay is the safe gate sigmoid(-(A (f_b(f_a x) + dt_bias))) times
  kda.gate_lower_bound when the file sets one (kimi-linear's softplus otherwise), and one full-rank ssm_g
  gives the output gate;
- MLA: RoPE-less, an optional query LoRA, and a full sigmoid gate attn_gate x on the heads before wo;
- situ(gate, up) = beta tanh(gate / beta) sigmoid(gate) times linear_beta tanh(up / linear_beta) (up alone
  when linear_beta <= 0) in place of SwiGLU, in the dense FFN, the experts and the shared expert;
- latent experts: the router scores the full-width input, the experts run on ffn_routed_down x, their sum
  is RMS-normed (ffn_routed_norm) and projected back by ffn_routed_up before the shared expert is added;
- the output rows are taken before the final norm.
"""
from __future__ import annotations

from gguf import MODEL_TENSOR as T

from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph
from runtime.engine.deepseek2 import Gating, plain_lm_head, top_k
from runtime.engine.kimi import KimiLinearBuilder
from runtime.engine.moe import expert_weights, weighted_sum
from runtime.engine.recurrent import RsInputs, bare_name, token_embeddings, ubatch_sequences
from runtime.ggml import attn_res, ssm
from runtime.ggml import build as B
from runtime.ggml.graph import Op, Tensor

ATTN_RES_SCORE, FFN_RES_SCORE, OUTPUT_RES_SCORE = "attn_res_score", "ffn_res_score", "output_res_score.weight"


class KimiK3Builder(KimiLinearBuilder):
    _stack: Tensor | None = None
    _gate_input: Tensor

    # --- situ and the FFNs ---------------------------------------------------------------------
    def _situ(self, gate: Tensor, up: Tensor) -> Tensor:
        hp = self.khp
        act = B.scale(B.unary(B.scale(gate, 1.0 / hp.situ_beta), "TANH"), hp.situ_beta)
        act = B.mul(act, B.unary(gate, "SIGMOID"))
        if hp.situ_linear_beta > 0.0:
            up = B.scale(B.unary(B.scale(up, 1.0 / hp.situ_linear_beta), "TANH"), hp.situ_linear_beta)
        return B.mul(act, up)

    def _situ_ffn(self, x: Tensor, il: int, gate: T, up: T, down: T) -> Tensor:
        g = B.mul_mat(self._wl(gate, il), x)
        u = B.mul_mat(self._wl(up, il), x)
        return B.mul_mat(self._wl(down, il), self._situ(g, u))

    def _latent_moe(self, cur: Tensor, il: int) -> Tensor:
        """build_latent_moe: build_moe_ffn(LLM_FFN_SITU) on the latent input with the full-width logits."""
        hp, g = self.khp, self.out.graph
        routed_w = self.w.get(tensor_name(T.FFN_GATE_INP, il).replace("ffn_gate_inp", "ffn_routed_down"))
        routed_in = B.mul_mat(routed_w, cur) if routed_w is not None else cur
        logits = B.mul_mat(self._wl(T.FFN_GATE_INP, il), cur, name=f"ffn_moe_logits-{il}")
        n_embd, n_tokens = routed_in.ne[0], routed_in.ne[1]
        k = hp.n_expert_used
        if hp.gating is Gating.SIGMOID:
            probs = B.unary(logits, "SIGMOID", name=f"ffn_moe_probs-{il}")
        else:
            probs = B.soft_max_ext(logits, None, 1.0, name=f"ffn_moe_probs-{il}")
        selection = probs
        bias = self.w.get(tensor_name(T.FFN_EXP_PROBS_B, il, "bias"))
        if bias is not None:
            selection = B.add(probs, bias, name=f"ffn_moe_probs_biased-{il}")
        selected = top_k(selection, k, f"ffn_moe_argsort-{il}", f"ffn_moe_topk-{il}")
        weights = expert_weights(g, probs, selected, il, hp.weights_norm, hp.weights_scale)
        x = B.reshape(routed_in, (n_embd, 1, n_tokens))
        up = self.lora.mm_id(self._wl(T.FFN_UP_EXP, il), x, selected, name=f"ffn_moe_up-{il}")
        gate = self.lora.mm_id(self._wl(T.FFN_GATE_EXP, il), x, selected, name=f"ffn_moe_gate-{il}")
        act = self._situ(gate, up)
        experts = self.lora.mm_id(self._wl(T.FFN_DOWN_EXP, il), act, selected, name=f"ffn_moe_down-{il}")
        out = weighted_sum(g, experts, weights, n_embd, n_tokens, k, il)
        base = tensor_name(T.FFN_GATE_INP, il).replace("ffn_gate_inp", "ffn_routed_norm")
        norm_w = self.w.get(base)
        if norm_w is not None:
            out = self.norm(out, norm_w, il, f"ffn_routed_norm-{il}")
        up_w = self.w.get(base.replace("ffn_routed_norm", "ffn_routed_up"))
        if up_w is not None:
            out = B.mul_mat(up_w, out)
        if self.w.get(tensor_name(T.FFN_GATE_SHEXP, il)) is not None:
            shared = self._situ_ffn(cur, il, T.FFN_GATE_SHEXP, T.FFN_UP_SHEXP, T.FFN_DOWN_SHEXP)
            out = B.add(out, shared)
        return out

    # --- KDA and MLA -----------------------------------------------------------------------------
    def _decay(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        hp, ns = self.khp, self.n_seqs
        hd, nh = hp.kda_head, hp.n_head
        g1 = B.mul_mat(self._wl(T.SSM_F_B, il), B.mul_mat(self._wl(T.SSM_F_A, il), cur))
        g1 = B.add(g1, self._wl(T.SSM_DT, il, "bias"))
        a = B.reshape(self._need(bare_name(T.SSM_A, il)), (1, nh, 1))
        if hp.gate_lower_bound > float("-inf"):
            g1 = B.mul(B.reshape(g1, (hd, nh, n_tokens)), a)
            g1 = B.scale(B.unary(B.scale(g1, -1.0), "SIGMOID"), hp.gate_lower_bound, name=f"kda_g1-{il}")
        else:
            g1 = B.mul(B.reshape(B.unary(g1, "SOFTPLUS"), (hd, nh, n_tokens)), a, name=f"kda_g1-{il}")
        return B.reshape(g1, (hd, nh, n_tokens // ns, ns))

    def _output_gate(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        hp, ns = self.khp, self.n_seqs
        x3 = B.reshape(cur, (cur.ne[0], n_tokens // ns, ns))
        x2 = B.reshape(x3, (x3.ne[0], n_tokens))
        g2 = B.mul_mat(self._need(f"blk.{il}.ssm_g.weight"), x2)
        return B.reshape(g2, (hp.kda_head, hp.n_head, n_tokens))

    def _attn_block(self, x: Tensor, il: int, n_tokens: int) -> Tensor:
        self._gate_input = x   # the MLA output gate reads the normed layer input
        return super()._attn_block(x, il, n_tokens)

    def _attn_out(self, il: int, cur: Tensor) -> Tensor:
        gate_w = self.w.get(tensor_name(T.ATTN_GATE, il))
        if gate_w is not None:
            cur = B.mul(cur, B.unary(B.mul_mat(gate_w, self._gate_input), "SIGMOID"), name=f"mla_gated-{il}")
        return B.mul_mat(self._wl(T.ATTN_OUT, il), cur, name=f"mla_out-{il}")

    # --- attention residuals ------------------------------------------------------------------
    def _res_push(self, cur: Tensor) -> None:
        ckpt = B.reshape(cur, (cur.ne[0], 1, cur.ne[1]))
        self._stack = ssm.concat(self._stack, ckpt, 1) if self._stack is not None else ckpt

    def _res_mix(self, cur: Tensor, score_w: Tensor, il: int) -> Tensor:
        src = self._stack
        if src is None:
            return cur
        eps, n_ckpt, n_tokens = self.hp.eps, src.ne[1], cur.ne[1]
        sc_src = B.mul(B.rms_norm(src, eps), score_w)
        sc_src = B._node(Op.SUM_ROWS, (1, n_ckpt, n_tokens), [sc_src], "")
        sc_src = B.reshape(sc_src, (n_ckpt, n_tokens))
        sc_cur = B.mul(B.rms_norm(cur, eps), score_w)
        sc_cur = B._node(Op.SUM_ROWS, (1, n_tokens), [sc_cur], "")
        probs = B.soft_max_ext(ssm.concat(sc_src, sc_cur, 0), None, 1.0, name=f"res_probs-{il}")
        p_src = B.cont(B.view(probs, (n_ckpt, n_tokens), (probs.nb[0], probs.nb[1]), 0))
        p_cur = B.cont(B.view(probs, (1, n_tokens), (probs.nb[0], probs.nb[1]), probs.nb[0] * n_ckpt))
        return B.add(attn_res.hc_pre(src, p_src), B.mul(cur, p_cur))

    def _score(self, il: int, which: str) -> Tensor:
        return self._need(f"blk.{il}.{which}.weight")

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        hp = self.khp
        use_res = hp.res_block > 0
        prefix = x
        cur = self._res_mix(prefix, self._score(il, ATTN_RES_SCORE), il) if use_res else prefix
        banked = use_res and il % hp.res_block == 0
        if banked:
            self._res_push(prefix)
        cur = self.norm(cur, self._wl(T.ATTN_NORM, il), il, f"attn_norm-{il}")
        self.out.graph.expand(cur)
        cur = self._attn_block(cur, il, n_tokens)
        prefix = cur if banked else B.add(prefix, cur)
        cur = self._res_mix(prefix, self._score(il, FFN_RES_SCORE), il) if use_res else prefix
        cur = self.norm(cur, self._wl(T.FFN_NORM, il), il, f"ffn_norm-{il}")
        if il < hp.n_dense_lead:
            cur = self._situ_ffn(cur, il, T.FFN_GATE, T.FFN_UP, T.FFN_DOWN)
        else:
            cur = self._latent_moe(cur, il)
        return B.add(prefix, cur, name=f"l_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        self.n_seqs = ubatch_sequences(self.states, shape.n_tokens)
        self.rs = RsInputs.reserve(self.states, self.n_seqs)
        self._stack = None
        self._inputs(shape)
        g = self.out.graph
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        for il in range(self.hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        if self.khp.res_block > 0:
            x = self._res_mix(x, self._need(OUTPUT_RES_SCORE), -1)
        x = B.get_rows(x, self.out.out_ids)
        cur = self.norm(x, self._need(OUTPUT_NORM), -1, "result_norm")
        return plain_lm_head(self.out, cur, self._need(OUTPUT))
