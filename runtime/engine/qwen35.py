"""qwen35 and qwen35moe (Qwen3.5 / Qwen3.6): qwen3next's hybrid of Gated DeltaNet and gated full
attention, node for node as src/models/qwen35.cpp and src/models/qwen35moe.cpp build them at the
pinned build. The layer loop, the conv and SSM states, the fused GATED_DELTA_NET and the gated norm
are qwen3next's (runtime/engine/qwen3next.py); what differs:

- beta and alpha come from two projections, ssm_beta and ssm_alpha [n_embd, n_v_heads], not from
  one ssm_ba split per key head: beta = sigmoid(reshape(ssm_beta . x)), gate = softplus(ssm_alpha . x
  + dt_bias) * A;
- the key heads are not repeated over the value heads when the fused op runs (fused_gdn_ar and _ch
  on, as on every device the runtime simulates): GATED_DELTA_NET broadcasts them;
- the attention layer views Q and its gate straight out of attn_q's row (no 4-d reshape), makes the
  gate contiguous before RoPE, and ropes Q and K with interleaved M-RoPE (ggml_rope_multi over
  rope.dimension_sections), whose position input holds 4 ids per token (build_inp_pos,
  llama_hparams::n_pos_per_embd);
- qwen35 has a dense SwiGLU FFN in every layer; qwen35moe qwen3next's experts and sigmoid-gated
  shared expert.
"""
from __future__ import annotations

from gguf import MODEL_TENSOR as T

from planner.model.tensors import tensor_name
from runtime.engine.builder import BatchShape
from runtime.engine.qwen3next import Qwen3NextBuilder
from runtime.engine.recurrent import bare_name
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Op, Tensor

QWEN35 = "qwen35"
QWEN35MOE = "qwen35moe"
ELEMENT = 4
# ggml.h GGML_MROPE_SECTIONS: positions per token of an M-RoPE model (llama_hparams::n_pos_per_embd)
GGML_MROPE_SECTIONS = 4
# ggml.h GGML_ROPE_TYPE_IMROPE (llama_model_rope_type: qwen35 and qwen35moe)
GGML_ROPE_TYPE_IMROPE = 40


class Qwen35Builder(Qwen3NextBuilder):
    GDN_BROADCASTS_HEADS = True

    def _inputs(self, shape: BatchShape) -> None:
        super()._inputs(shape)
        self.out.pos = B.new_input(GGMLType.I32, (shape.n_tokens * GGML_MROPE_SECTIONS,), "inp_pos")

    def _beta_gate(self, cur: Tensor, il: int, nst: int, n_seqs: int) -> tuple[Tensor, Tensor]:
        nv = self.ssm.n_head
        beta = self.lora.mm(self._need(tensor_name(T.SSM_BETA, il)), cur, name=f"beta-{il}")
        beta = B.unary(B.reshape(beta, (1, nv, nst, n_seqs)), "SIGMOID", name=f"beta_sigmoid-{il}")
        alpha = self.lora.mm(self._need(tensor_name(T.SSM_ALPHA, il)), cur, name=f"alpha-{il}")
        alpha = B.add(B.reshape(alpha, (nv, nst, n_seqs)), self._need(tensor_name(T.SSM_DT, il, "bias")))
        gate = B.mul(B.unary(alpha, "SOFTPLUS", name=f"a_softplus-{il}"),
                     self._need(bare_name(T.SSM_A, il)), name=f"gate-{il}")
        return beta, B.reshape(gate, (1, nv, nst, n_seqs))

    def _rope_multi(self, x: Tensor, il: int) -> Tensor:
        """ggml_rope_multi: a ROPE node reading GGML_MROPE_SECTIONS position ids per token."""
        hp = self.hp
        return B._node(Op.ROPE, x.ne, [x, self.out.pos, None], f"rope-{il}", x.type, n_dims=hp.n_rot,
                       mode=GGML_ROPE_TYPE_IMROPE, freq_base=float(hp.freq_base), freq_scale=hp.freq_scale)

    def _gated_attention(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        hp = self.hp
        hd, nh, nkv = hp.head_dim, hp.n_head, hp.n_head_kv[il]
        q_full = self.lora.mm(self._need(tensor_name(T.ATTN_Q, il)), cur, name=f"Qcur_full-{il}")
        k = self.lora.mm(self._need(tensor_name(T.ATTN_K, il)), cur, name=f"Kcur-{il}")
        v = self.lora.mm(self._need(tensor_name(T.ATTN_V, il)), cur, name=f"Vcur-{il}")
        row = 2 * hd * ELEMENT
        nb = (ELEMENT, row, row * nh)
        q = B.view(q_full, (hd, nh, n_tokens), nb, 0, name=f"Qcur_reshaped-{il}")
        q = self.norm(q, tensor_name(T.ATTN_Q_NORM, il), il)
        k = self.norm(B.reshape(k, (hd, nkv, n_tokens)), tensor_name(T.ATTN_K_NORM, il), il)
        gate = B.cont(B.view(q_full, (hd, nh, n_tokens), nb, hd * ELEMENT), (hd * nh, n_tokens),
                      name=f"gate_reshaped-{il}")
        v = B.reshape(v, (hd, nkv, n_tokens))
        q, k = self._rope_multi(q, il), self._rope_multi(k, il)
        cur = self.attention(il, q, k, v)
        cur = B.mul(cur, B.unary(gate, "SIGMOID", name=f"gate_sigmoid-{il}"), name=f"attn_gated-{il}")
        return self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_output-{il}")

    def _layer_ffn(self, cur: Tensor, il: int) -> Tensor:
        if self.hp.arch == QWEN35:
            return self.ffn(cur, il)   # build_ffn: LLM_FFN_SILU, LLM_FFN_PAR
        return super()._layer_ffn(cur, il)

