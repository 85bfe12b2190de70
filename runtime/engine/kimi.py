"""kimi-linear (Kimi-Linear-48B-A3B): Kimi Delta Attention (KDA) layers where head_count_kv is 0, MLA
layers elsewhere, a SwiGLU FFN in the first leading_dense_block_count layers and sigmoid-routed experts
plus shared experts in the others, node for node as src/models/kimi-linear.cpp builds them at the
pinned build. The layer loop, the MLA cache (K only, kv_lora_rank + n_rot per cell), the FFNs and the
output are deepseek2's (runtime/engine/deepseek2.py MlaBuilder); what differs:

- the memory is hybrid (llama_memory_hybrid: the MLA layers' K cache and the KDA layers' states): per
  KDA layer r holds the d_conv - 1 last columns of Q, K and V (3 (d_conv - 1) n_head kda_head f32) and
  s one kda_head x kda_head state per head (llama_hparams::n_embd_r / n_embd_s);
- a KDA layer: Q, K and V each projected, joined to its stored columns (a view of build_rs's rows,
  offset by which of the three it is), its last d_conv - 1 columns written back, convolved
  (SSM_CONV), SiLU; the per-channel decay g = softplus(f_b(f_a x) + dt_bias) * A; beta = sigmoid(b x);
  Q and K L2-normed (RMS_NORM then SCALE); one fused GATED_DELTA_NET (llama.cpp turns fused_gdn_ar /
  _ch on where the layer's device runs the op: every device the runtime simulates does) whose output
  is made contiguous and whose state tail is copied into s; the output RMS-normed by ssm_norm, times
  sigmoid(g_b(g_a x)), and projected by wo;
- the MLA layers have no RoPE (llama_model_rope_type: NONE) and no query LoRA: Q is viewed straight
  out of wq's rows, k_pe out of wkv_a_mqa's, and neither is rotated;
- the experts' weights are always normalised (build_moe_ffn's norm_w is true) and scaled by
  expert_weights_scale.

bailingmoe3 (Ling-3.0, src/models/bailingmoe3.cpp) is the same hybrid with these changes: the KDA decay
is the "safe gate" sigmoid((f_a x + dt_bias) * A) * kda.gate_lower_bound from one full-rank f_a, the
output gate sigmoid(g_a x) from one full-rank g_a; the MLA layers rope q_pe and k_pe (NORM mode), may
have a query LoRA, and gate each head's output by sigmoid(attn_gate x) before wo; the attention norm is
not expanded early, and the output rows are taken after the final norm (a graph output, t_h_nextn). Its
recurrent states have no rollback rows unless --rs-seq asks for them (n_rs_seq 0 by default).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import GGUFError
from planner.gguf.keys import (
    LLM_KV_ATTN_RES_BLOCK_SIZE,
    LLM_KV_EXPERT_LATENT_LENGTH,
    LLM_KV_KDA_GATE_LOWER_BOUND,
    LLM_KV_SITU_BETA,
    LLM_KV_SITU_LINEAR_BETA,
)
from planner.gguf.reader import ModelFile, row_size
from planner.model.arch import ModelFacts, model_facts
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph
from runtime.engine.deepseek2 import Gating, MlaBuilder, MlaHParams, concat, plain_lm_head
from runtime.engine.kvcache import KVCache
from runtime.engine.recurrent import (
    ELEMENT,
    RecurrentStates,
    RsInputs,
    bare_name,
    build_rs,
    token_embeddings,
    ubatch_sequences,
)
from runtime.ggml import build as B
from runtime.ggml import deltanet, ssm
from runtime.ggml.graph import FLAG_OUTPUT, Tensor

KIMI_LINEAR = "kimi-linear"
BAILINGMOE3 = "bailingmoe3"
KIMI_K3 = "kimi-k3"
KDA_ARCHS = frozenset({KIMI_LINEAR, BAILINGMOE3, KIMI_K3})


@dataclass(frozen=True)
class KimiHParams(MlaHParams):
    """MlaHParams with the KDA layers: `recurrent[il]` where layer il is KDA (no cache of its own)."""

    recurrent: tuple[bool, ...] = ()
    kda_head: int = 0
    d_conv: int = 0
    gate_lower_bound: float = 0.0   # bailingmoe3's and kimi-k3's safe gate: sigmoid(...) scaled by this (< 0)
    # kimi-k3: attention residuals banked every res_block layers (0: none), situ's betas, the experts' width
    res_block: int = 0
    situ_beta: float = 0.0
    situ_linear_beta: float = 0.0
    latent: int = 0

    @property
    def n_head_kv(self) -> tuple[int, ...]:
        return tuple(0 if r else 1 for r in self.recurrent)

    def n_embd_gqa(self, il: int) -> int:
        return 0 if self.recurrent[il] else self.head_dim


def _meta(model: ModelFile, template: str, default: float = 0.0) -> float:
    return float(model.metadata.get(template.format(arch=model.architecture), default) or default)


def _unsupported_metadata(model: ModelFile, facts: ModelFacts) -> str | None:
    arch = model.architecture
    if not facts.mla:
        return "no MLA head sizes (key_length_mla / value_length_mla)"
    if any(lf.nextn for lf in facts.layers):
        return "next-token-prediction blocks are not built"
    scale_type = str(model.metadata.get(Keys.Rope.SCALING_TYPE.format(arch=arch), "none") or "none")
    if arch == BAILINGMOE3 and (scale_type != "none" or model.metadata.get(Keys.Rope.DIMENSION_SECTIONS.format(
            arch=arch)) is not None):
        return "rope scaling and M-RoPE sections (the VL files) are not built"
    for clamp in (Keys.LLM.SWIGLU_CLAMP_EXP, Keys.LLM.SWIGLU_CLAMP_SHEXP):
        value = model.metadata.get(clamp.format(arch=arch))
        if value is not None and any(float(v) for v in (value if isinstance(value, list) else [value])):
            return "clamped SwiGLU experts are not built"
    return None


def unsupported_reason(model: ModelFile, facts: ModelFacts) -> str | None:
    """Why this builder cannot build the file's graph as llama.cpp does, or None when it can."""
    arch = model.architecture
    if arch not in KDA_ARCHS:
        return f"architecture {arch!r} is not built by the KDA builder"
    reason = _unsupported_metadata(model, facts)
    if reason is not None:
        return reason
    names = {t.name for t in model.tensors}
    for lf in facts.layers:
        if lf.state_s:
            if tensor_name(T.ATTN_QKV, lf.index) in names:
                return "KDA layers with a fused attn_qkv projection are not built"
        elif tensor_name(T.ATTN_K_B, lf.index) not in names or tensor_name(T.ATTN_V_B, lf.index) not in names:
            return "MLA without split wk_b / wv_b tensors (the MHA fallback) is not built"
        elif arch == KIMI_LINEAR and tensor_name(T.ATTN_Q_A, lf.index) in names:
            return "MLA with a query LoRA is not built"
    return None


def read_kimi_hparams(model: ModelFile, facts: ModelFacts | None = None) -> KimiHParams:
    """KimiHParams of a kimi-linear or bailingmoe3 file (load_arch_hparams); GGUFError for what the builder
    does not build."""
    facts = facts or model_facts(model)
    reason = unsupported_reason(model, facts)
    arch = model.architecture
    if reason is not None:
        raise GGUFError(model.path, f"the runtime's {arch} builder: {reason}")
    trunk = [lf for lf in facts.layers if not lf.nextn]
    head_k = int(_meta(model, Keys.Attention.KEY_LENGTH_MLA))
    gating = int(_meta(model, Keys.LLM.EXPERT_GATING_FUNC))
    if gating not in tuple(g.value for g in Gating):
        raise GGUFError(model.path, f"the runtime's {arch} builder: expert gating function {gating} is not built")
    # kimi-linear.cpp always normalises the experts' weights; bailingmoe3.cpp as expert_weights_norm says
    norm = arch == KIMI_LINEAR or bool(model.metadata.get(Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch=arch), False))
    return KimiHParams(
        arch=arch, n_layer=facts.n_layer, n_embd=facts.n_embd, n_vocab=facts.n_vocab, n_head=trunk[0].n_head,
        n_rot=int(_meta(model, Keys.Rope.DIMENSION_COUNT)), kv_lora_rank=int(_meta(model, Keys.Attention.KV_LORA_RANK)),
        head_k_mla=head_k, head_v_mla=int(_meta(model, Keys.Attention.VALUE_LENGTH_MLA)),
        eps=_meta(model, Keys.Attention.LAYERNORM_RMS_EPS, 1e-6), freq_base=_meta(model, Keys.Rope.FREQ_BASE, 10000.0),
        freq_scale=1.0, kq_scale=1.0 / math.sqrt(head_k), yarn=False,
        n_dense_lead=int(_meta(model, Keys.LLM.LEADING_DENSE_BLOCK_COUNT)), n_expert=facts.n_expert,
        n_expert_used=facts.n_expert_used, gating=Gating(gating), weights_norm=norm,
        weights_scale=_meta(model, Keys.LLM.EXPERT_WEIGHTS_SCALE),
        recurrent=tuple(bool(lf.state_s) for lf in trunk), kda_head=int(_meta(model, Keys.KDA.HEAD_DIM)),
        d_conv=int(_meta(model, Keys.SSM.CONV_KERNEL)),
        gate_lower_bound=_meta(model, LLM_KV_KDA_GATE_LOWER_BOUND)
        if LLM_KV_KDA_GATE_LOWER_BOUND.format(arch=arch) in model.metadata else -math.inf,
        res_block=int(_meta(model, LLM_KV_ATTN_RES_BLOCK_SIZE)), situ_beta=_meta(model, LLM_KV_SITU_BETA),
        situ_linear_beta=_meta(model, LLM_KV_SITU_LINEAR_BETA), latent=int(_meta(model, LLM_KV_EXPERT_LATENT_LENGTH)),
    )


class KimiLinearBuilder(MlaBuilder):
    """deepseek2's MLA trunk with KDA layers and the hybrid memory's recurrent states."""

    def __init__(self, model: ModelFile, hp: KimiHParams, weights: Mapping[str, Tensor], kv: KVCache,
                 states: RecurrentStates, *, flash_attn: bool, offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.khp = hp
        self.states = states
        self.n_seqs = 1
        self.rs: RsInputs | None = None

    # --- KDA --------------------------------------------------------------------------------
    def _causal_conv(self, x: Tensor, il: int, which: int, proj: T, conv: T, conv_all: Tensor,
                     n_seq_tokens: int) -> Tensor:
        """kimi-linear.cpp causal_conv1d: one of Q, K, V (`which` 0, 1, 2) projected, convolved with
        its stored columns, the last d_conv - 1 columns written back; [head, n_head, n_seq_tokens, n_seqs]."""
        hp, g, ns = self.khp, self.out.graph, self.n_seqs
        d_inner, taps = hp.n_head * hp.kda_head, hp.d_conv - 1
        r_all = self.states.r[il]
        n_embd_r = r_all.ne[0]
        part = taps * d_inner
        state = B.view(conv_all, (taps, d_inner, ns), (ELEMENT, taps * ELEMENT, n_embd_r * ELEMENT),
                       which * part * ELEMENT)
        xp = B.mul_mat(self._wl(proj, il), x)
        xp = B.reshape(xp, (d_inner, n_seq_tokens, ns))
        conv_x = ssm.concat(state, B.transpose(xp), 0)
        last = B.view(conv_x, (taps, d_inner, ns), (ELEMENT, conv_x.nb[1], conv_x.nb[2]), n_seq_tokens * ELEMENT)
        assert self.rs is not None
        dst = B.view(r_all, (taps, d_inner, ns), (ELEMENT, taps * ELEMENT, n_embd_r * ELEMENT),
                     (self.rs.head * n_embd_r + which * part) * ELEMENT)
        g.expand(B.cpy(last, dst))
        w = B.reshape(self._wl(conv, il), (hp.d_conv, d_inner))
        out = ssm.ssm_conv(conv_x, w)
        out = B.silu(B.reshape(out, (d_inner, n_seq_tokens * ns)))
        return B.reshape(out, (hp.kda_head, hp.n_head, n_seq_tokens, ns))

    def _l2_norm(self, x: Tensor) -> Tensor:
        """build_gdn_l2_norm (src/models/models.h): rms_norm with eps / n, scaled by 1 / sqrt(n)."""
        n = x.ne[0]
        return B.scale(B.rms_norm(x, self.hp.eps / n), 1.0 / math.sqrt(n))

    def _decay(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        """g1 = softplus(f_b(f_a x) + dt_bias) * A, [kda_head, n_head, n_seq_tokens, n_seqs]."""
        hp, ns = self.khp, self.n_seqs
        hd, nh = hp.kda_head, hp.n_head
        g1 = B.mul_mat(self._wl(T.SSM_F_B, il), B.mul_mat(self._wl(T.SSM_F_A, il), cur))
        g1 = B.unary(B.add(g1, self._wl(T.SSM_DT, il, "bias")), "SOFTPLUS")
        g1 = B.reshape(g1, (hd, nh, n_tokens))
        a = self._need(bare_name(T.SSM_A, il))
        g1 = B.mul(g1, B.reshape(a, (1, nh, 1)), name=f"kda_g1-{il}")
        return B.reshape(g1, (hd, nh, n_tokens // ns, ns))

    def _output_gate(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        """g2 = g_b(g_a x) over x seen as [n_embd, n_seq_tokens, n_seqs] then 2-d; [kda_head, n_head, n_tokens]."""
        hp, ns = self.khp, self.n_seqs
        x3 = B.reshape(cur, (cur.ne[0], n_tokens // ns, ns))
        x2 = B.reshape(x3, (x3.ne[0], n_tokens))
        g2 = B.mul_mat(self._wl(T.SSM_G_B, il), B.mul_mat(self._wl(T.SSM_G_A, il), x2))
        return B.reshape(g2, (hp.kda_head, hp.n_head, n_tokens))

    def _kda(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        hp, g, ns = self.khp, self.out.graph, self.n_seqs
        assert self.rs is not None
        nst = n_tokens // ns
        hd, nh = hp.kda_head, hp.n_head
        d_inner = hd * nh
        r_all, s_all = self.states.r[il], self.states.s[il]
        conv_all = build_rs(g, self.rs, r_all, r_all.ne[0], ns)
        q = self._causal_conv(cur, il, 0, T.ATTN_Q, T.SSM_CONV1D_Q, conv_all, nst)
        k = self._causal_conv(cur, il, 1, T.ATTN_K, T.SSM_CONV1D_K, conv_all, nst)
        v = self._causal_conv(cur, il, 2, T.ATTN_V, T.SSM_CONV1D_V, conv_all, nst)
        g1 = self._decay(cur, il, n_tokens)
        beta = B.reshape(B.mul_mat(self._wl(T.SSM_BETA, il), cur), (1, nh, nst, ns))
        beta = B.unary(beta, "SIGMOID")
        state = B.reshape(build_rs(g, self.rs, s_all, s_all.ne[0], ns), (hd, hd, nh, ns))
        q, k = self._l2_norm(q), self._l2_norm(k)
        gdn = deltanet.gated_delta_net(q, k, v, g1, beta, state, 1, name=f"gdn-{il}")
        out = B.view(gdn, (hd, nh, nst, ns), (ELEMENT, hd * ELEMENT, d_inner * ELEMENT, d_inner * nst * ELEMENT), 0)
        new_state = B.view(gdn, (hd, hd, nh, ns), (ELEMENT, hd * ELEMENT, hd * hd * ELEMENT, hd * hd * nh * ELEMENT),
                           d_inner * nst * ns * ELEMENT)
        out = B.cont(out, name=f"attn_output-{il}")
        n_embd_s = s_all.ne[0]
        g.expand(B.cpy(new_state, B.view(s_all, (n_embd_s * ns,), None, self.rs.head * n_embd_s * ELEMENT)))
        g2 = self._output_gate(cur, il, n_tokens)
        normed = self.norm(B.reshape(out, (hd, nh, nst * ns)), self._wl(T.SSM_NORM, il), il, f"kda_normed-{il}")
        gated = B.mul(normed, B.unary(g2, "SIGMOID"))
        gated = B.cont(gated, (d_inner, n_tokens))
        return B.mul_mat(self._wl(T.ATTN_OUT, il), gated, name=f"kda_out-{il}")

    # --- MLA without RoPE ---------------------------------------------------------------------
    def _query(self, x: Tensor, il: int) -> Tensor:
        """Q [n_head * head_k, T]: wq, or (kimi-k3) the query LoRA q_b(norm(q_a x))."""
        wq = self.w.get(tensor_name(T.ATTN_Q, il))
        if wq is not None:
            return B.mul_mat(wq, x, name=f"q-{il}")
        q = B.mul_mat(self._wl(T.ATTN_Q_A, il), x, name=f"q_a-{il}")
        q = self.norm(q, self._wl(T.ATTN_Q_A_NORM, il), il, f"q_a_norm-{il}")
        return B.mul_mat(self._wl(T.ATTN_Q_B, il), q, name=f"q_b-{il}")

    def _mla_qkv(self, x: Tensor, il: int, n_tokens: int) -> tuple[Tensor, Tensor, Tensor]:
        hp = self.hp
        q = self._query(x, il)
        width = hp.kv_lora_rank + hp.n_rot
        kv_pe = B.mul_mat(self._wl(T.ATTN_KV_A_MQA, il), x, name=f"kv_cmpr_pe-{il}")
        row = row_size(kv_pe.type, width)
        kv_cmpr = B.view(kv_pe, (hp.kv_lora_rank, n_tokens), (kv_pe.nb[0], row), 0, name=f"kv_cmpr-{il}")
        k_pe = B.view(kv_pe, (hp.n_rot, 1, n_tokens), (kv_pe.nb[0], row, row),
                      row_size(kv_pe.type, hp.kv_lora_rank), name=f"k_pe-{il}")
        kv_cmpr = self.norm(kv_cmpr, self._wl(T.ATTN_KV_A_NORM, il), il, f"kv_cmpr-{il}")
        nope = hp.head_k_mla - hp.n_rot
        head = row_size(q.type, hp.head_k_mla)
        strides = (q.nb[0], head, head * hp.n_head)
        q_nope = B.view(q, (nope, hp.n_head, n_tokens), strides, 0, name=f"q_nope-{il}")
        q_pe = B.view(q, (hp.n_rot, hp.n_head, n_tokens), strides, row_size(q.type, nope), name=f"q_pe-{il}")
        q_nope = B.permute(q_nope, (0, 2, 1, 3), name=f"q_nope_perm-{il}")
        absorbed = B.mul_mat(self._wl(T.ATTN_K_B, il), q_nope, name=f"q_nope_absorbed-{il}")
        absorbed = B.permute(absorbed, (0, 2, 1, 3), name=f"q_nope_absorbed_perm-{il}")
        q_cur = concat(absorbed, q_pe, 0, name=f"Qcur-{il}")
        v_cur = B.reshape(kv_cmpr, (hp.kv_lora_rank, 1, n_tokens), name=f"Vcur-{il}")
        k_cur = concat(v_cur, k_pe, 0, name=f"Kcur-{il}")
        return q_cur, k_cur, v_cur

    def _attn_block(self, x: Tensor, il: int, n_tokens: int) -> Tensor:
        if self.khp.recurrent[il]:
            return self._kda(x, il, n_tokens)
        return self.attention(il, *self._mla_qkv(x, il, n_tokens))

    # kimi-linear.cpp expands the attention norm before the mixer and keeps the output rows inside the last
    # layer; bailingmoe3.cpp does neither (it takes the rows after the final norm, embeddings_nextn_masked off)
    EXPANDS_ATTN_NORM = True
    ROWS_IN_LAST_LAYER = True

    def build(self, shape: BatchShape) -> BuiltGraph:
        self.n_seqs = ubatch_sequences(self.states, shape.n_tokens)
        self.rs = RsInputs.reserve(self.states, self.n_seqs)
        self._inputs(shape)
        g = self.out.graph
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        for il in range(self.hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        cur = self.norm(x, self._need(OUTPUT_NORM), -1, "result_norm")
        if not self.ROWS_IN_LAST_LAYER:
            cur.flags |= FLAG_OUTPUT   # res->t_h_nextn: set_outputs keeps it
            cur = B.get_rows(cur, self.out.out_ids, name="result_norm_rows")
        return plain_lm_head(self.out, cur, self._need(OUTPUT))


class BailingMoe3Builder(KimiLinearBuilder):
    """bailingmoe3 (src/models/bailingmoe3.cpp): kimi-linear's KDA with full-rank gates, gated MLA with
    RoPE, and the output rows taken after the final norm."""

    EXPANDS_ATTN_NORM = False
    ROWS_IN_LAST_LAYER = False
    _gate_input: Tensor   # the normed layer input the MLA output gate reads

    def _decay(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        """The safe gate: sigmoid((f_a x + dt_bias) * A) scaled by gate_lower_bound."""
        hp, ns = self.khp, self.n_seqs
        hd, nh = hp.kda_head, hp.n_head
        g = B.add(B.mul_mat(self._wl(T.SSM_F_A, il), cur), self._wl(T.SSM_DT, il, "bias"))
        g = B.reshape(g, (hd, nh, n_tokens))
        g = B.mul(g, B.reshape(self._need(bare_name(T.SSM_A, il)), (1, nh, 1)))
        g = B.scale(B.unary(g, "SIGMOID"), hp.gate_lower_bound, name=f"kda_gate-{il}")
        return B.reshape(g, (hd, nh, n_tokens // ns, ns))

    def _output_gate(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        return B.reshape(B.mul_mat(self._wl(T.SSM_G_A, il), cur), (self.khp.kda_head, self.khp.n_head, n_tokens))

    def _mla_qkv(self, x: Tensor, il: int, n_tokens: int) -> tuple[Tensor, Tensor, Tensor]:
        hp = self.hp
        wq = self.w.get(tensor_name(T.ATTN_Q, il))
        if wq is not None:
            q = B.mul_mat(wq, x, name=f"q-{il}")
        else:
            q = B.mul_mat(self._wl(T.ATTN_Q_A, il), x, name=f"q_a-{il}")
            q = self.norm(q, self._wl(T.ATTN_Q_A_NORM, il), il, f"q_a_norm-{il}")
            q = B.mul_mat(self._wl(T.ATTN_Q_B, il), q, name=f"q_b-{il}")
        nope = hp.head_k_mla - hp.n_rot
        head = row_size(q.type, hp.head_k_mla)
        strides = (q.nb[0], head, head * hp.n_head)
        q_nope = B.view(q, (nope, hp.n_head, n_tokens), strides, 0, name=f"q_nope-{il}")
        q_pe = B.view(q, (hp.n_rot, hp.n_head, n_tokens), strides, row_size(q.type, nope), name=f"q_pe-{il}")
        width = hp.kv_lora_rank + hp.n_rot
        kv_all = B.mul_mat(self._wl(T.ATTN_KV_A_MQA, il), x, name=f"kv_all-{il}")
        row = row_size(kv_all.type, width)
        kv = B.view(kv_all, (hp.kv_lora_rank, n_tokens), (kv_all.nb[0], row), 0, name=f"kv-{il}")
        k_pe = B.view(kv_all, (hp.n_rot, 1, n_tokens), (kv_all.nb[0], row, row),
                      row_size(kv_all.type, hp.kv_lora_rank), name=f"k_pe-{il}")
        q_pe, k_pe = self._rope(q_pe, il, "q_pe"), self._rope(k_pe, il, "k_pe")
        kv = self.norm(kv, self._wl(T.ATTN_KV_A_NORM, il), il, f"kv_norm-{il}")
        q_nope = B.permute(q_nope, (0, 2, 1, 3))
        q_nope = B.permute(B.mul_mat(self._wl(T.ATTN_K_B, il), q_nope), (0, 2, 1, 3))
        q_cur = concat(q_nope, q_pe, 0, name=f"Qcur-{il}")
        v_cur = B.reshape(kv, (hp.kv_lora_rank, 1, n_tokens), name=f"Vcur-{il}")
        return q_cur, concat(v_cur, k_pe, 0, name=f"Kcur-{il}"), v_cur

    def _attn_block(self, x: Tensor, il: int, n_tokens: int) -> Tensor:
        """KDA, or MLA whose heads are gated per head by sigmoid(attn_gate x) before wo (_attn_out)."""
        self._gate_input = x
        return super()._attn_block(x, il, n_tokens)

    def _attn_out(self, il: int, cur: Tensor) -> Tensor:
        hp, n_tokens = self.hp, cur.ne[1]
        gate = B.mul_mat(self._wl(T.ATTN_GATE, il), self._gate_input, name=f"attn_gate-{il}")
        gate = B.unary(B.reshape(gate, (1, hp.n_head, n_tokens)), "SIGMOID")
        cur = B.mul(B.reshape(cur, (hp.head_v_mla, hp.n_head, n_tokens)), gate)
        cur = B.cont(cur, (hp.head_v_mla * hp.n_head, n_tokens))
        return B.mul_mat(self._wl(T.ATTN_OUT, il), cur, name=f"mla_out-{il}")
