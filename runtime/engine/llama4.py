"""llama4 (Llama 4 Scout / Maverick), op for op as the pinned llama.cpp builds it (src/models/llama4.cpp;
build_moe_ffn's llama4 branch in src/llama-graph.cpp): the llama-shaped decoder of runtime/engine/builder.py with

- chunked attention: three blocks of four attend within 8192-token chunks (the iSWA cache, planner.model.arch's
  SWA_RULES), the fourth over the whole cache without RoPE (n_no_rope_layer_step 4, llama-hparams.h), its Q
  times the temperature-tuning input inp_attn_scale [1, 1, T] instead;
- Q and K of the roped blocks RMS-normed without weights (Llama4TextL2Norm) unless the model has 128 experts
  (Maverick: use_kq_norm = type != 17B_128E);
- a routed-expert FFN every interleave_moe_layer_step-th block, dense SwiGLU elsewhere: sigmoid gating, experts
  chosen by the raw logits, each token's rows scaled by its expert weight before the experts (weight_before_ffn:
  REPEAT, MUL), the experts' outputs summed without a second weighting, plus one shared expert.

The runner sizes these graphs and refuses to decode them (it fills no temperature-tuning input).
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.gguf.reader import ModelFile
from planner.model.tensors import tensor_name
from runtime.engine.builder import BatchShape, DecoderBuilder, Qkv
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.moe import expert_weights
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Op, Tensor

LLAMA4 = "llama4"
NO_ROPE_LAYER_STEP = 4       # llama-hparams.h n_no_rope_layer_step's default, which llama4.cpp keeps with chunking
MAVERICK_EXPERTS = 128       # llama4.cpp: LLM_TYPE_17B_128E has no Q/K L2 norm


class Llama4Builder(DecoderBuilder):
    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache, *,
                 flash_attn: bool, offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.moe_step = int(model.metadata.get(Keys.LLM.INTERLEAVE_MOE_LAYER_STEP.format(arch=LLAMA4), 0) or 0)
        self.kq_norm = hp.n_expert != MAVERICK_EXPERTS
        # llama4.cpp: a file that sets sliding_window 0 has no chunked layers and ropes every block
        self.rope_step = NO_ROPE_LAYER_STEP if any(hp.swa) else hp.n_layer

    def _inputs(self, shape: BatchShape) -> None:
        """build_inp_attn_scale comes between the positions and the attention inputs; inputs are leafs, so
        only their use orders them."""
        super()._inputs(shape)
        self.attn_scale = B.new_input(GGMLType.F32, (1, 1, shape.n_tokens), "inp_attn_scale")

    def _qkv(self, x: Tensor, il: int, n_tokens: int) -> Qkv:
        hp = self.hp
        out = []
        for part, tensor, heads in (("q", T.ATTN_Q, hp.n_head), ("k", T.ATTN_K, hp.n_head_kv[il]),
                                    ("v", T.ATTN_V, hp.n_head_kv[il])):
            t = self.lora.mm(self._need(tensor_name(tensor, il)), x, name=f"{part.upper()}cur-{il}")
            out.append(B.reshape(t, (hp.head_dim, heads, n_tokens)))
        q, k, v = out
        if (il + 1) % self.rope_step != 0:
            q, k = self._rope(q, il), self._rope(k, il)
            if self.kq_norm:
                q = B.rms_norm(q, hp.eps, name=f"Qcur_normed-{il}")
                k = B.rms_norm(k, hp.eps, name=f"Kcur_normed-{il}")
        else:
            q = B.mul(q, self.attn_scale, name=f"Qcur-{il}")
        return Qkv(q, k, v)

    def ffn(self, x: Tensor, il: int) -> Tensor:
        if not (self.moe_step > 0 and (il + 1) % self.moe_step == 0):
            return self._swiglu(x, il, T.FFN_UP, T.FFN_GATE, T.FFN_DOWN, "ffn_out")
        moe = self._moe(x, il)
        shared = self._swiglu(x, il, T.FFN_UP_SHEXP, T.FFN_GATE_SHEXP, T.FFN_DOWN_SHEXP, "ffn_moe_shexp")
        return B.add(moe, shared, name=f"ffn_moe_out_merged-{il}")

    def _swiglu(self, x: Tensor, il: int, up: T, gate: T, down: T, name: str) -> Tensor:
        """build_ffn(LLM_FFN_SILU, LLM_FFN_PAR)."""
        u = self.lora.mm(self._need(tensor_name(up, il)), x, name=f"ffn_up-{il}")
        g = self.lora.mm(self._need(tensor_name(gate, il)), x, name=f"ffn_gate-{il}")
        return self.lora.mm(self._need(tensor_name(down, il)), B.swiglu(g, u, name=f"ffn_swiglu-{il}"),
                            name=f"{name}-{il}")

    def _moe(self, cur: Tensor, il: int) -> Tensor:
        """build_moe_ffn for LLM_ARCH_LLAMA4: sigmoid probabilities, the top-k of the logits, weights applied to
        the input rows (weight_before_ffn), no normalisation (expert_weights_scale is read but 0 or 1 here)."""
        hp, g = self.hp, self.out.graph
        n_embd, n_tokens, k = cur.ne[0], cur.ne[1], hp.n_expert_used
        logits = self.lora.mm(self._need(tensor_name(T.FFN_GATE_INP, il)), cur, name=f"ffn_moe_logits-{il}")
        probs = B.unary(logits, "SIGMOID", name=f"ffn_moe_probs-{il}")
        order = B._node(Op.ARGSORT, logits.ne, [logits], f"ffn_moe_argsort-{il}", GGMLType.I32, order="DESC")
        selected = B.view(order, (k, n_tokens, 1, 1), order.nb, 0, name=f"ffn_moe_topk-{il}")
        weights = expert_weights(g, probs, selected, il, False, 0.0)
        x = B.reshape(cur, (n_embd, 1, n_tokens))
        repeated = B._node(Op.REPEAT, (n_embd, k, n_tokens, 1), [x], f"ffn_moe_repeat-{il}")
        x = B.mul(repeated, weights, name=f"ffn_moe_weighted-{il}")
        up = self.lora.mm_id(self._need(tensor_name(T.FFN_UP_EXP, il)), x, selected, name=f"ffn_moe_up-{il}")
        gate = self.lora.mm_id(self._need(tensor_name(T.FFN_GATE_EXP, il)), x, selected, name=f"ffn_moe_gate-{il}")
        act = B.swiglu(gate, up, name=f"ffn_moe_swiglu-{il}")
        experts = self.lora.mm_id(self._need(tensor_name(T.FFN_DOWN_EXP, il)), act, selected,
                                  name=f"ffn_moe_down-{il}")
        g.expand(experts)
        views = [B.view(experts, (n_embd, n_tokens), (experts.nb[0], experts.nb[2]), i * experts.nb[1],
                        name=f"ffn_moe_expert_{i}-{il}") for i in range(k)]
        for v in views:
            g.expand(v)
        out = views[0]
        for v in views[1:]:
            out = B.add(out, v, name=f"ffn_moe_out-{il}")
            g.expand(out)
        if k == 1:
            out = B.cont(out, name=f"ffn_moe_out-{il}")
        return out
