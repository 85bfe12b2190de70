"""Routed-expert FFNs, op for op as llama.cpp's build_moe_ffn (src/llama-graph.cpp, pinned build):
router matmul (+ its bias) -> soft_max (SOFTMAX gating) -> argsort (descending) -> top-k view ->
get_rows of the probabilities -> (SOFTMAX_WEIGHT gating: soft_max over the k) -> (norm_w: sum_rows /
clamp / div) -> MUL_MAT_ID up (+ ADD_ID bias) and gate (+ ADD_ID bias) -> the GLU -> MUL_MAT_ID down
(+ ADD_ID bias) -> mul by the weights -> one view per used expert, summed. qwen3moe: softmax gating,
normalised weights, SwiGLU, no biases; gpt-oss: softmax over the chosen logits, biases, SWIGLU_OAI.
Applied LoRA adapters join as llama.cpp puts them there: the router through build_lora_mm, the experts
through build_lora_mm_id (runtime/engine/lora.py Adapters.mm / mm_id; nothing without adapters).
"""
from __future__ import annotations

from collections.abc import Callable

from gguf import MODEL_TENSOR as T

from planner.model.tensors import tensor_name
from runtime.engine.hparams import HParams, MoeGating
from runtime.engine.lora import Adapters
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor

# build_moe_ffn clamps the weight sum from below by the smallest normal f16 (6.1e-5)
WEIGHT_SUM_MIN = 6.103515625e-5
# LLM_FFN_SWIGLU_OAI_MOE's constants (build_moe_ffn)
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


def _experts(weight: Callable[[str], Tensor], bias: Callable[[str], Tensor | None], lora: Adapters, kind: T,
             x: Tensor, selected: Tensor, il: int, name: str) -> Tensor:
    """build_lora_mm_id, then ggml_add_id of the experts' bias when the model has one."""
    out = lora.mm_id(weight(tensor_name(kind, il)), x, selected, name=f"ffn_moe_{name}-{il}")
    b = bias(tensor_name(kind, il, "bias"))
    return out if b is None else B.add_id(out, b, selected, name=f"ffn_moe_{name}_biased-{il}")


def build_moe_ffn(hp: HParams, weight: Callable[[str], Tensor], graph: Graph, cur: Tensor, il: int,
                  bias: Callable[[str], Tensor | None] = lambda _name: None, lora: Adapters | None = None) -> Tensor:
    """`weight(name)` is the builder's weight lookup, `bias(name)` the lookup of optional tensors,
    `lora` the applied adapters; nodes that llama.cpp expands early go to `graph`."""
    lora = lora or Adapters()
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    k, n_expert, moe = hp.n_expert_used, hp.n_expert, hp.spec.moe
    logits = lora.mm(weight(tensor_name(T.FFN_GATE_INP, il)), cur, name=f"ffn_moe_logits-{il}")
    router_bias = bias(tensor_name(T.FFN_GATE_INP, il, "bias"))
    if router_bias is not None:
        logits = B.add(logits, router_bias, name=f"ffn_moe_logits_biased-{il}")
    probs = logits
    if moe.gating is MoeGating.SOFTMAX:
        probs = B.soft_max_ext(logits, None, 1.0, name=f"ffn_moe_probs-{il}")
    order = B._node(Op.ARGSORT, probs.ne, [probs], f"ffn_moe_argsort-{il}", GGMLType.I32, order="DESC")
    selected = B.view(order, (k, n_tokens, 1, 1), (order.nb[0], order.nb[1], order.nb[2], order.nb[3]), 0,
                      name=f"ffn_moe_topk-{il}")
    weights = B.get_rows(B.reshape(probs, (1, n_expert, n_tokens)), selected, name=f"ffn_moe_weights-{il}")
    if moe.gating is MoeGating.SOFTMAX_WEIGHT:
        weights = B.soft_max_ext(B.reshape(weights, (k, n_tokens)), None, 1.0, name=f"ffn_moe_weights_softmax-{il}")
        weights = B.reshape(weights, (1, k, n_tokens))
    if moe.norm_w:
        weights = normalized_weights(weights, k, n_tokens, il)
    graph.expand(weights)
    x = B.reshape(cur, (n_embd, 1, n_tokens))
    up = _experts(weight, bias, lora, T.FFN_UP_EXP, x, selected, il, "up")
    gate = _experts(weight, bias, lora, T.FFN_GATE_EXP, x, selected, il, "gate")
    if moe.glu == "SWIGLU_OAI":
        act = B.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, name=f"ffn_moe_swiglu_oai-{il}")
    else:
        act = B.swiglu(gate, up, name=f"ffn_moe_swiglu-{il}")
    experts = _experts(weight, bias, lora, T.FFN_DOWN_EXP, act, selected, il, "down")
    return weighted_sum(graph, experts, weights, n_embd, n_tokens, k, il)


def normalized_weights(weights: Tensor, k: int, n_tokens: int, il: int) -> Tensor:
    """build_moe_ffn's norm_w: each token's k weights divided by their sum, clamped from below."""
    weights = B.reshape(weights, (k, n_tokens))
    total = B._node(Op.SUM_ROWS, (1, n_tokens), [weights], f"ffn_moe_weights_sum-{il}")
    total = B._node(Op.CLAMP, total.ne, [total], f"ffn_moe_weights_sum_clamped-{il}",
                    min=WEIGHT_SUM_MIN, max=float("inf"))
    weights = B._node(Op.DIV, weights.ne, [weights, total], f"ffn_moe_weights_norm-{il}")
    return B.reshape(weights, (1, k, n_tokens))


def weighted_sum(graph: Graph, experts: Tensor, weights: Tensor, n_embd: int, n_tokens: int, k: int,
                 il: int) -> Tensor:
    """build_moe_ffn's tail: each selected expert's rows scaled by its weight, then added one view
    at a time (the node order llama.cpp expands), made contiguous when one expert is used."""
    experts = B.mul(experts, weights, name=f"ffn_moe_weighted-{il}")
    graph.expand(experts)
    views = [B.view(experts, (n_embd, n_tokens), (experts.nb[0], experts.nb[2]), i * experts.nb[1],
                    name=f"ffn_moe_expert_{i}-{il}") for i in range(k)]
    for v in views:
        graph.expand(v)
    out = views[0]
    for v in views[1:]:
        out = B.add(out, v, name=f"ffn_moe_out-{il}")
        graph.expand(out)
    if k == 1:
        out = B.cont(out, name=f"ffn_moe_out-{il}")
    return out
