"""deepseek2 with multi-head latent attention (DeepSeek-V2 / V2-Lite, V3-style routing with or without expert
groups) and the architectures that share its model class (mistral4, with merged gate_up experts), op for op
as the pinned llama.cpp builds it (src/models/deepseek2.cpp; build_attn over llm_graph_input_attn_k,
build_attn_mha and build_moe_ffn in src/llama-graph.cpp; the K-only cache of src/llama-kv-cache.cpp).

MLA with the absorption optimisation is multi-query attention over a compressed cache: one KV head
whose K is the normed latent (kv_lora_rank) followed by the roped part (n_rot), and whose V is a view
of K's first kv_lora_rank columns, so the cache holds K only. Per layer:
norm -> Q (attn_q, or q_a -> norm -> q_b) -> split nope/rope -> RoPE the rope part -> the nope part
times wk_b (absorbed into the latent) -> concat -> K from wkv_a_mqa (latent normed, rope part roped)
-> set_rows into the cache -> attention (flash, or scores) -> times wv_b (back to per-head V) ->
attn_output -> residual -> dense FFN (the leading `leading_dense_block_count` blocks) or routed experts
plus shared experts. Graph order follows llama.cpp's ggml_build_forward_expand calls, so the
scheduler's splits and the allocator's reuse see the graph llama.cpp's do.

Decode runs these graphs too (CONCAT's kernel is registered below), except where a kernel is missing
(`MlaHParams.missing_kernel`: YaRN RoPE, sigmoid gating, grouped expert selection) and for the DSA models
(runtime/engine/dsa.py): the runner refuses that decode and only sizes.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import GGUFError
from planner.gguf.keys import LLM_KV_HC_COUNT, LLM_KV_HC_EPSILON, LLM_KV_HC_MAGNITUDE
from planner.gguf.reader import ModelFile, row_size
from planner.model.arch import ModelFacts, model_facts
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import AttnInputs, BatchShape, BuiltGraph, DecoderBuilder, layer_rms_norm
from runtime.engine.hparams import RopeMode
from runtime.engine.kvcache import CacheKind, KVCache
from runtime.engine.lora import Adapters
from runtime.engine.moe import expert_weights, group_mask, top_k, weighted_sum
from runtime.engine.recurrent import token_embeddings
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor
from runtime.ggml.kernels import KERNELS, read_f32

I32, I64, F16, F32 = GGMLType.I32, GGMLType.I64, GGMLType.F16, GGMLType.F32

# mistral4 is deepseek2's model class and graph at the pin (src/models/models.h: llama_model_mistral4 derives
# from llama_model_deepseek2; mistral4.cpp only builds deepseek2's graph): it ships merged gate_up experts.
# deepseek32 and glm-dsa add the DSA lightning indexer to it (src/models/deepseek32.cpp, glm-dsa.cpp), its RoPE
# mode theirs: NEOX for deepseek32's indexer, NORM for glm-dsa's
DSA_ARCHS: dict[str, RopeMode] = {"deepseek32": RopeMode.NEOX, "glm-dsa": RopeMode.NORM}
# dsv4: hy_v4 (src/models/hy-v4.cpp) is deepseek2's MLA with iHC streams, attention sinks and a gated output
# (runtime/engine/hy_v4.py); a DSA model only when the file sets attention.indexer.top_k
HY_V4 = "hy_v4"
MLA_ARCHS = frozenset({"deepseek2", "mistral4", *DSA_ARCHS, HY_V4})


class Gating(enum.IntEnum):
    """llama_expert_gating_func_type (src/llama-hparams.h); deepseek2 files without the key get SOFTMAX."""

    SOFTMAX = 1
    SIGMOID = 2


# glm-dsa.cpp: a file without expert_gating_func gates by sigmoid (deepseek32.cpp requires the key)
DEFAULT_GATING = {"glm-dsa": Gating.SIGMOID}


@dataclass(frozen=True)
class MlaHParams:
    """What the deepseek2 graph needs, read as llama_model_deepseek2::load_arch_hparams reads it.

    `head_dim` and `n_embd_gqa` describe the cache the runner allocates: one head of
    kv_lora_rank + n_rot per cell, K only."""

    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: int
    n_rot: int                 # qk_rope_head_dim
    kv_lora_rank: int
    head_k_mla: int            # qk_nope + qk_rope: a query head before absorption
    head_v_mla: int            # a value head after wv_b
    eps: float
    freq_base: float
    freq_scale: float
    kq_scale: float
    yarn: bool                 # YaRN rope scaling: sized, not executed (the RoPE kernel has no YaRN)
    n_dense_lead: int
    n_expert: int
    n_expert_used: int
    gating: Gating
    weights_norm: bool
    weights_scale: float
    n_expert_groups: int = 0   # expert_group_count: > 1 selects the experts within the best groups first
    n_group_used: int = 0
    # DSA (deepseek32, glm-dsa): the lightning indexer; index_full[il] when layer il owns one (glm-dsa's
    # other layers reuse the last owner's top-k)
    n_index_head: int = 0
    index_head: int = 0
    index_top_k: int = 0
    index_full: tuple[bool, ...] = ()
    index_rope: RopeMode = RopeMode.NORM
    # dsv4: hy_v4's iHC (hyper_connection.count streams; epsilon and magnitude of its gates), 0 elsewhere
    hc_mult: int = 0
    hc_eps: float = 0.0
    hc_magnitude: float = 0.0

    @property
    def dsa(self) -> bool:
        return bool(self.index_full)

    @property
    def head_dim(self) -> int:
        return self.kv_lora_rank + self.n_rot

    @property
    def n_head_kv(self) -> tuple[int, ...]:
        return (1,) * self.n_layer

    @property
    def swa(self) -> tuple[bool, ...]:
        return (False,) * self.n_layer

    @property
    def n_swa(self) -> int:
        return 0

    def n_embd_gqa(self, il: int) -> int:
        return self.head_dim

    @property
    def missing_kernel(self) -> str | None:
        """The op of this model's graph the runtime's kernels cannot compute, None when decode runs."""
        if self.yarn:
            return "ROPE with YaRN scaling"
        if self.gating is Gating.SIGMOID:
            return "UNARY SIGMOID (sigmoid expert gating)"
        if self.n_expert_groups > 1:
            return "FILL (grouped expert selection)"
        return None


def _get(model: ModelFile, template: str, default: float) -> float:
    return float(model.metadata.get(template.format(arch=model.architecture), default) or default)


def unsupported_reason(model: ModelFile, facts: ModelFacts) -> str | None:
    """Why the MLA builder cannot build this file's graph as llama.cpp does, or None when it can."""
    if model.architecture not in MLA_ARCHS:
        return f"architecture {model.architecture!r} is not built by the MLA builder"
    if not facts.mla:
        return "no MLA head sizes (key_length_mla / value_length_mla): the legacy wkv_b graph is not built"
    names = {t.name for t in model.tensors}
    if tensor_name(T.ATTN_K_B, 0) not in names or tensor_name(T.ATTN_V_B, 0) not in names:
        return "MLA without split wk_b / wv_b tensors"
    if _get(model, Keys.Attention.TEMPERATURE_SCALE, 0.0):
        return "attention temperature scaling is not built"
    gating = int(_get(model, Keys.LLM.EXPERT_GATING_FUNC, 0))
    if gating not in (0, *(g.value for g in Gating)):
        return f"expert gating function {gating} is not built"
    scale_type = str(model.metadata.get(Keys.Rope.SCALING_TYPE.format(arch=model.architecture), "none") or "none")
    if scale_type not in ("none", "linear", "yarn"):
        return f"rope scaling {scale_type!r} is not built"
    return None


def read_mla_hparams(model: ModelFile, facts: ModelFacts | None = None) -> MlaHParams:
    """MlaHParams of a deepseek2 MLA file; GGUFError for anything the builder does not build."""
    facts = facts or model_facts(model)
    reason = unsupported_reason(model, facts)
    if reason is not None:
        raise GGUFError(model.path, f"the runtime's deepseek2 builder: {reason}")
    arch = model.architecture
    n_rot = int(_get(model, Keys.Rope.DIMENSION_COUNT, 0))
    kv_lora = int(_get(model, Keys.Attention.KV_LORA_RANK, 0))
    head_k = int(_get(model, Keys.Attention.KEY_LENGTH_MLA, 0))
    if n_rot <= 0 or kv_lora <= 0 or head_k <= n_rot:
        raise GGUFError(model.path, "deepseek2: rope dimension, kv_lora_rank and key_length_mla are inconsistent")
    scale_type = str(model.metadata.get(Keys.Rope.SCALING_TYPE.format(arch=arch), "none") or "none")
    freq_scale = 1.0 / _get(model, Keys.Rope.SCALING_FACTOR, 1.0) if scale_type != "none" else 1.0
    # deepseek2.cpp pre-scales kq_scale by YaRN's mscale squared (the file stores log_mul times 0.1)
    log_mul = _get(model, Keys.Rope.SCALING_YARN_LOG_MUL, 0.0) / 0.1
    mscale = 1.0 + 0.1 * log_mul * math.log(1.0 / freq_scale) if scale_type == "yarn" else 1.0
    trunk = [lf for lf in facts.layers if not lf.nextn]
    gating = int(_get(model, Keys.LLM.EXPERT_GATING_FUNC, 0)) or DEFAULT_GATING.get(arch, Gating.SOFTMAX)
    dsa = arch in DSA_ARCHS or (arch == HY_V4 and int(_get(model, Keys.Attention.Indexer.TOP_K, 0)) > 0)
    return MlaHParams(
        arch=arch, n_layer=facts.n_layer, n_embd=facts.n_embd, n_vocab=facts.n_vocab, n_head=trunk[0].n_head,
        n_rot=n_rot, kv_lora_rank=kv_lora, head_k_mla=head_k,
        head_v_mla=int(_get(model, Keys.Attention.VALUE_LENGTH_MLA, 0)),
        eps=_get(model, Keys.Attention.LAYERNORM_RMS_EPS, 1e-6),
        freq_base=_get(model, Keys.Rope.FREQ_BASE, 10000.0), freq_scale=freq_scale,
        kq_scale=mscale * mscale / math.sqrt(head_k), yarn=scale_type == "yarn",
        n_dense_lead=int(_get(model, Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0)),
        n_expert=facts.n_expert, n_expert_used=facts.n_expert_used, gating=Gating(gating),
        weights_norm=bool(model.metadata.get(Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch=arch), False)),
        weights_scale=_get(model, Keys.LLM.EXPERT_WEIGHTS_SCALE, 0.0),
        n_expert_groups=int(_get(model, Keys.LLM.EXPERT_GROUP_COUNT, 0)),
        n_group_used=int(_get(model, Keys.LLM.EXPERT_GROUP_USED_COUNT, 0)),
        n_index_head=int(_get(model, Keys.Attention.Indexer.HEAD_COUNT, 0)) if dsa else 0,
        index_head=int(_get(model, Keys.Attention.Indexer.KEY_LENGTH, 0)) if dsa else 0,
        index_top_k=int(_get(model, Keys.Attention.Indexer.TOP_K, 0)) if dsa else 0,
        index_full=tuple(lf.index_k > 0 for lf in trunk) if dsa else (),
        index_rope=DSA_ARCHS.get(arch, RopeMode.NORM),
        hc_mult=int(_get(model, LLM_KV_HC_COUNT, 0)), hc_eps=_get(model, LLM_KV_HC_EPSILON, 0.0),
        hc_magnitude=_get(model, LLM_KV_HC_MAGNITUDE, 0.0),
    )


def _concat_kernel(node: Tensor) -> None:
    """ggml_compute_forward_concat: numpy's axes run ne3..ne0, so ggml's dim d is axis 3 - d."""
    a, b = read_f32(node.source(0)), read_f32(node.source(1))
    target = node.numpy()
    target[...] = np.concatenate([a, b], axis=3 - node.op_params["dim"]).astype(target.dtype)


def _fill_kernel(node: Tensor) -> None:
    """ggml_compute_forward_fill: every element set to the constant."""
    node.numpy()[...] = node.op_params["c"]


# deepseek2's graphs are CONCAT's and FILL's only users, so their kernels join the table where they are
# built (a device runs the ops that have kernels: runtime/ggml/backend.py Device.ops).
KERNELS.setdefault(Op.CONCAT, _concat_kernel)
KERNELS.setdefault(Op.FILL, _fill_kernel)


def concat(a: Tensor, b: Tensor, dim: int, name: str = "") -> Tensor:
    """ggml_concat: a and b joined along `dim` (a new contiguous tensor of a's type)."""
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    if any(a.ne[d] != b.ne[d] for d in range(4) if d != dim):
        raise ValueError(f"concat: {a.ne} and {b.ne} differ outside dim {dim}")
    return B._node(Op.CONCAT, ne, [a, b], name, a.type, dim=dim)


def plain_lm_head(out: BuiltGraph, cur: Tensor, out_w: Tensor) -> BuiltGraph:
    """The lm head of deepseek2.cpp and the graphs written after it: a plain ggml_mul_mat (no build_lora_mm)
    into result_output, expanded; the graph's logits."""
    cur = B.mul_mat(out_w, cur, name="result_output")
    out.graph.expand(cur)
    out.logits = cur
    return out


class MlaBuilder:
    """Builds one ubatch's deepseek2 graph from weights (name -> Tensor) and the K-only cache."""

    def __init__(self, hp: MlaHParams, weights: Mapping[str, Tensor], kv: KVCache, *, flash_attn: bool,
                 offload_kqv: bool, lora: Adapters | None = None) -> None:
        self.hp, self.w, self.kv = hp, weights, kv
        self.flash_attn, self.offload_kqv = flash_attn, offload_kqv
        # applied LoRA adapters where deepseek2.cpp goes through build_lora_mm / build_lora_mm_id: the
        # token rows, wo (build_attn), the FFNs and experts (build_ffn, build_moe_ffn); its attention
        # projections and the main graph's lm_head are plain ggml_mul_mat
        self.lora = lora or Adapters()

    def _need(self, name: str) -> Tensor:
        t = self.w.get(name)
        if t is None:
            raise KeyError(f"the model has no tensor {name}")
        return t

    def _wl(self, kind: T, il: int, suffix: str = "weight") -> Tensor:
        return self._need(tensor_name(kind, il, suffix))

    def norm(self, x: Tensor, weight: Tensor, il: int, name: str) -> Tensor:
        """build_norm(LLM_NORM_RMS): rms_norm named "norm" (pinned when il >= 0), times the weight."""
        return B.mul(layer_rms_norm(self.out, x, self.hp.eps, il), weight, name=name)

    def _rope(self, x: Tensor, il: int, name: str) -> Tensor:
        r = B.rope(x, self.out.pos, self.hp.n_rot, int(RopeMode.NORM), self.hp.freq_base, name=f"{name}-{il}")
        r.op_params["freq_scale"] = self.hp.freq_scale
        return r

    # --- attention --------------------------------------------------------------------------
    def _qkv(self, x: Tensor, il: int, n_tokens: int, q: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Qcur [kv_lora + n_rot, n_head, T], Kcur [kv_lora + n_rot, 1, T], Vcur [kv_lora, 1, T]. `q`: the
        query projection [n_head * head_k, T] where the caller made it (the DSA graphs view it unreshaped)."""
        hp = self.hp
        if q is None:
            wq = self.w.get(tensor_name(T.ATTN_Q, il))
            if wq is not None:   # V2-Lite: no query LoRA
                q = B.mul_mat(wq, x, name=f"q-{il}")
            else:
                q = B.mul_mat(self._wl(T.ATTN_Q_A, il), x, name=f"q-{il}")
                q = self.norm(q, self._wl(T.ATTN_Q_A_NORM, il), il, f"q-{il}")
                q = B.mul_mat(self._wl(T.ATTN_Q_B, il), q, name=f"q-{il}")
            q = B.reshape(q, (hp.head_k_mla, hp.n_head, n_tokens), name=f"q-{il}")
        width = hp.kv_lora_rank + hp.n_rot
        kv_pe = B.mul_mat(self._wl(T.ATTN_KV_A_MQA, il), x, name=f"kv_cmpr_pe-{il}")
        row = row_size(kv_pe.type, width)
        kv_cmpr = B.view(kv_pe, (hp.kv_lora_rank, n_tokens), (kv_pe.nb[0], row), 0, name=f"kv_cmpr-{il}")
        k_pe = B.view(kv_pe, (hp.n_rot, 1, n_tokens), (kv_pe.nb[0], row, row),
                      row_size(kv_pe.type, hp.kv_lora_rank), name=f"k_pe-{il}")
        k_pe = self._rope(k_pe, il, "k_pe")
        kv_cmpr = self.norm(kv_cmpr, self._wl(T.ATTN_KV_A_NORM, il), il, f"kv_cmpr-{il}")
        nope = hp.head_k_mla - hp.n_rot
        head = row_size(q.type, hp.head_k_mla)
        strides = (q.nb[0], head, head * hp.n_head)
        q_nope = B.view(q, (nope, hp.n_head, n_tokens), strides, 0, name=f"q_nope-{il}")
        q_pe = B.view(q, (hp.n_rot, hp.n_head, n_tokens), strides, row_size(q.type, nope), name=f"q_pe-{il}")
        q_pe = self._rope(q_pe, il, "q_pe")
        q_nope = B.permute(q_nope, (0, 2, 1, 3), name=f"q_nope_perm-{il}")
        absorbed = B.mul_mat(self._wl(T.ATTN_K_B, il), q_nope, name=f"q_nope_absorbed-{il}")
        absorbed = B.permute(absorbed, (0, 2, 1, 3), name=f"q_nope_absorbed_perm-{il}")
        q_cur = concat(absorbed, q_pe, 0, name=f"Qcur-{il}")
        v_cur = B.reshape(kv_cmpr, (hp.kv_lora_rank, 1, n_tokens), name=f"Vcur-{il}")
        k_cur = concat(v_cur, k_pe, 0, name=f"Kcur-{il}")
        return q_cur, k_cur, v_cur

    def _store(self, il: int, k: Tensor, inp: AttnInputs) -> Tensor:
        """cpy_k: set_rows of the tokens' K rows into the cache (one matrix over every stream)."""
        kc = self.kv.k[il]
        k2 = B.view(k, (k.ne[0] * k.ne[1], k.ne[2]), (k.nb[0], k.nb[2]), 0, name=f"{k.name} (view)")
        if kc.ne[2] > 1:
            kc = B.reshape(kc, (kc.ne[0], kc.ne[1] * kc.ne[2]))
        return B.set_rows(kc, k2, inp.k_idxs, name=f"cache_k_l{il} (set_rows)")

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """build_attn(llm_graph_input_attn_k) + build_attn_mha with v_mla = wv_b."""
        inp = self.out.attn[CacheKind.BASE]
        g = self.out.graph
        for t in (q, v, k):
            g.expand(t)
        g.expand(self._store(il, k, inp))
        mask = self._mask(il, inp)
        n_kv = dict(self.out.shape.n_kv)[CacheKind.BASE]
        kc = self.kv.k[il]
        hd, size, ns = kc.ne[0], kc.ne[1], kc.ne[2]
        row = row_size(kc.type, hd)
        kv_k = B.view(kc, (hd, 1, n_kv, ns), (kc.nb[0], row, row, row_size(kc.type, hd * size)), 0, name=f"k-{il}")
        kv_v = B.view(kv_k, (v.ne[0], 1, n_kv, ns), kv_k.nb, 0, name=f"v-{il}")
        per_stream = q.ne[2] // ns
        q4 = B.view(q, (q.ne[0], q.ne[1], per_stream, ns), (q.nb[0], q.nb[1], q.nb[2], q.nb[2] * per_stream), 0,
                    name=f"q-{il}")
        qp = B.permute(q4, (0, 2, 1, 3))
        kp, vp = B.permute(kv_k, (0, 2, 1, 3)), B.permute(kv_v, (0, 2, 1, 3))
        v_mla = self._wl(T.ATTN_V_B, il)
        sinks = self._sinks(il)
        if self.flash_attn:
            kp, vp = DecoderBuilder._f16_for_fa(kp), DecoderBuilder._f16_for_fa(vp)
            cur = B.flash_attn_ext(qp, kp, vp, mask, self.hp.kq_scale, sinks, name=f"__fattn__-{il}")
            cur = B.mul_mat(v_mla, B.permute(cur, (0, 2, 1, 3)), name=f"fattn_mla-{il}")
            cur = B.cont(B.permute(cur, (0, 2, 1, 3)))
            cur = B.reshape(cur, (cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3]), name=f"kqv_out-{il}")
        else:
            kq = B.mul_mat(kp, qp, name=f"kq-{il}")
            kq = B.soft_max_ext(kq, mask, self.hp.kq_scale, name=f"kq_soft_max-{il}", sinks=sinks)
            # the cache's V view is not transposed: build_attn_mha makes a transposed copy
            vt = B.cont(B.transpose(vp), name=f"v_cont-{il}")
            kqv = B.mul_mat(vt, kq, name=f"kqv-{il}")
            kqv = B.mul_mat(v_mla, kqv, name=f"kqv_mla-{il}")
            cur = B.permute(kqv, (0, 2, 1, 3))
            cur = B.cont(cur, (cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3]), name=f"kqv_out-{il}")
            if not self.offload_kqv:
                self.out.cpu_pins.append(cur)
        g.expand(cur)
        return self._attn_out(il, cur)

    def _sinks(self, il: int) -> Tensor | None:
        """The attention's sink logits (build_attn's sinks argument): none in deepseek2's graph."""
        return None

    def _attn_out(self, il: int, cur: Tensor) -> Tensor:
        """The merged heads [n_head * head_v, T] through attn_output (build_attn's wo)."""
        return self.lora.mm(self._wl(T.ATTN_OUT, il), cur, name=f"attn_out-{il}")

    def _mask(self, il: int, inp: AttnInputs) -> Tensor:
        """The attention's mask: the cache's (the DSA graphs unmask the indexer's top-k instead)."""
        return inp.mask

    def _attn_block(self, x: Tensor, il: int, n_tokens: int) -> Tensor:
        """The attention from the normed input to attn_output."""
        return self.attention(il, *self._qkv(x, il, n_tokens))

    # --- feed-forward -----------------------------------------------------------------------
    def _ffn(self, x: Tensor, il: int, up: T, gate: T, down: T, name: str) -> Tensor:
        """build_ffn(LLM_FFN_SILU, LLM_FFN_PAR): silu(gate x) * (up x), then down."""
        u = self.lora.mm(self._wl(up, il), x, name=f"ffn_up-{il}")
        g = self.lora.mm(self._wl(gate, il), x, name=f"ffn_gate-{il}")
        return self.lora.mm(self._wl(down, il), B.swiglu(g, u, name=f"ffn_swiglu-{il}"), name=f"{name}-{il}")

    def _ffn_block(self, cur: Tensor, il: int) -> Tensor:
        """deepseek2.cpp's FFN: build_ffn on the leading dense blocks, the routed experts plus the shared
        expert (ffn_out = moe + shexp) on the others."""
        if il < self.hp.n_dense_lead:
            return self._ffn(cur, il, T.FFN_UP, T.FFN_GATE, T.FFN_DOWN, "ffn_out")
        moe = self._moe(cur, il)
        shared = self._ffn(cur, il, T.FFN_UP_SHEXP, T.FFN_GATE_SHEXP, T.FFN_DOWN_SHEXP, "ffn_shexp")
        return B.add(moe, shared, name=f"ffn_out-{il}")

    def _moe(self, cur: Tensor, il: int) -> Tensor:
        """build_moe_ffn with deepseek2's options: softmax or sigmoid gating, the selection bias
        exp_probs_b, grouped selection, optional weight normalisation and scale, SwiGLU experts
        (separate gate and up, or one merged gate_up split into two views)."""
        hp, g = self.hp, self.out.graph
        n_embd, n_tokens = cur.ne[0], cur.ne[1]
        k = hp.n_expert_used
        logits = self.lora.mm(self._wl(T.FFN_GATE_INP, il), cur, name=f"ffn_moe_logits-{il}")
        if hp.gating is Gating.SIGMOID:
            probs = B.unary(logits, "SIGMOID", name=f"ffn_moe_probs-{il}")
        else:
            probs = B.soft_max_ext(logits, None, 1.0, name=f"ffn_moe_probs-{il}")
        selection = probs
        bias = self.w.get(tensor_name(T.FFN_EXP_PROBS_B, il, "bias"))
        if bias is not None:
            selection = B.add(probs, bias, name=f"ffn_moe_probs_biased-{il}")
        if hp.n_expert_groups > 1 and n_tokens > 0:
            selection = self._group_mask(selection, n_tokens, il)
        selected = top_k(selection, k, f"ffn_moe_argsort-{il}", f"ffn_moe_topk-{il}")
        weights = expert_weights(g, probs, selected, il, hp.weights_norm, hp.weights_scale)
        x = B.reshape(cur, (n_embd, 1, n_tokens))
        gate_up = self.w.get(tensor_name(T.FFN_GATE_UP_EXP, il))
        if gate_up is not None:
            both = self.lora.mm_id(gate_up, x, selected, name=f"ffn_moe_gate_up-{il}")
            n_ff = both.ne[0] // 2
            gate = B.view(both, (n_ff, both.ne[1], both.ne[2]), both.nb, 0, name=f"ffn_moe_gate-{il}")
            up = B.view(both, (n_ff, both.ne[1], both.ne[2]), both.nb, n_ff * both.nb[0], name=f"ffn_moe_up-{il}")
        else:
            up = self.lora.mm_id(self._wl(T.FFN_UP_EXP, il), x, selected, name=f"ffn_moe_up-{il}")
            gate = self.lora.mm_id(self._wl(T.FFN_GATE_EXP, il), x, selected, name=f"ffn_moe_gate-{il}")
        act = B.swiglu(gate, up, name=f"ffn_moe_swiglu-{il}")
        experts = self.lora.mm_id(self._wl(T.FFN_DOWN_EXP, il), act, selected, name=f"ffn_moe_down-{il}")
        if self.hp.arch == "mistral4":   # build_moe_ffn: "src1 can exceed F16 range" (ggml_prec_set_src)
            experts.op_params["prec_src_f32"] = True
        return weighted_sum(g, experts, weights, n_embd, n_tokens, k, il)

    def _group_mask(self, selection: Tensor, n_tokens: int, il: int) -> Tensor:
        hp = self.hp
        return group_mask(selection, hp.n_expert, hp.n_expert_groups, hp.n_group_used, n_tokens, il)

    # --- the graph --------------------------------------------------------------------------
    def _inputs(self, shape: BatchShape) -> None:
        """build_inp_embd, build_inp_pos, build_attn_inp_k (K indices and the mask), build_inp_out_ids."""
        hp, t, ns = self.hp, shape.n_tokens, self.kv.n_stream
        if t % ns:
            raise ValueError(f"a batch of {t} tokens does not split over {ns} KV streams")
        tokens = B.new_input(I32, (t,), "inp_tokens")
        embd = B.new_input(F32, (hp.n_embd, t), "inp_embd")
        pos = B.new_input(I32, (t,), "inp_pos")
        [(kind, n_kv)] = shape.n_kv
        k_idxs = B.new_input(I64, (t,), "attn_inp_k_idxs")
        mask = B.new_input(F16 if self.flash_attn else F32, (n_kv, t // ns, 1, ns), "attn_inp_kq_mask")
        # a K-only cache has no V indices (llm_graph_input_attn_k): the field holds K's
        attn = {kind: AttnInputs(k_idxs, k_idxs, mask)}
        out_ids = B.new_input(I32, (shape.n_outputs,), "out_ids")
        self.out = BuiltGraph(Graph(), shape, tokens, embd, pos, out_ids, attn, logits=tokens)

    # kimi.py's hybrids: the attention norm expanded before the mixer (kimi-linear), the output rows picked
    # after the trunk rather than in its last layer (bailingmoe3)
    EXPANDS_ATTN_NORM = False
    ROWS_IN_LAST_LAYER = True

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        hp = self.hp
        cur = self.norm(x, self._wl(T.ATTN_NORM, il), il, f"attn_norm-{il}")
        if self.EXPANDS_ATTN_NORM:
            self.out.graph.expand(cur)
        cur = self._attn_block(cur, il, n_tokens)
        residual = x
        if il == hp.n_layer - 1 and self.ROWS_IN_LAST_LAYER:   # keep only the rows that produce outputs
            cur = B.get_rows(cur, self.out.out_ids)
            residual = B.get_rows(residual, self.out.out_ids)
        ffn_inp = B.add(cur, residual, name=f"ffn_inp-{il}")
        cur = self.norm(ffn_inp, self._wl(T.FFN_NORM, il), il, f"ffn_norm-{il}")
        cur = self._ffn_block(cur, il)
        return B.add(cur, ffn_inp, name=f"l_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        self._inputs(shape)
        g = self.out.graph
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        for il in range(self.hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        cur = self.norm(x, self._need(OUTPUT_NORM), -1, "result_norm")
        out_w = self.w.get(OUTPUT) or self._need(TOKEN_EMBD)
        return plain_lm_head(self.out, cur, out_w)
