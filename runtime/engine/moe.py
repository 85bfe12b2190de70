"""Routed-expert FFNs, op for op as llama.cpp's build_moe_ffn (src/llama-graph.cpp, pinned build):
router matmul (+ its bias) -> soft_max (SOFTMAX gating) or sigmoid (SIGMOID) -> (+ the selection bias
exp_probs_b, for choosing only) -> (expert groups: `group_mask` keeps the best groups' experts, the others
-inf; bailingmoe2 here, deepseek2.py's MLA models too) -> argsort (descending) -> top-k view -> get_rows
of the probabilities -> (SOFTMAX_WEIGHT gating: soft_max over the k) -> (norm_w: sum_rows / clamp / div) -> (scale by
expert_weights_scale unless 0 or 1) -> MUL_MAT_ID up (+ ADD_ID bias) and gate (+ ADD_ID bias) -> the GLU
(silu of up where the experts have no gate) -> MUL_MAT_ID down (+ ADD_ID bias) -> mul by the weights ->
one view per used expert, summed. qwen3moe: softmax gating, normalised weights, SwiGLU, no biases; gpt-oss:
softmax over the chosen logits, biases, SWIGLU_OAI; the other architectures' choices are MoeSpec rows
resolved per file (hparams.MoeRouting). `build_moe_layer` adds the shared expert (build_ffn's SwiGLU on
ffn_*_shexp), plain or scaled by sigmoid(ffn_gate_inp_shexp . x) as qwen2moe.cpp writes it (silu(g) / g).
Applied LoRA adapters join as llama.cpp puts them there: the router through build_lora_mm, the experts
through build_lora_mm_id (runtime/engine/lora.py Adapters.mm / mm_id; nothing without adapters).
"""
from __future__ import annotations

import math
from collections.abc import Callable

from gguf import MODEL_TENSOR as T

from planner.model.tensors import tensor_name
from runtime.engine.hparams import HParams, MoeGating, MoeRouting, SharedExpert
from runtime.engine.lora import Adapters
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor

# build_moe_ffn clamps the weight sum from below by the smallest normal f16 (6.1e-5)
WEIGHT_SUM_MIN = 6.103515625e-5
# LLM_FFN_SWIGLU_OAI_MOE's constants (build_moe_ffn)
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0
# moe26: llama-graph.cpp build_ffn / build_moe_ffn: a SwiGLU clamp at or below this is none
CLAMP_EPS = 1e-6


def _experts(weight: Callable[[str], Tensor], bias: Callable[[str], Tensor | None], lora: Adapters, kind: T,
             x: Tensor, selected: Tensor, il: int, name: str) -> Tensor:
    """build_lora_mm_id, then ggml_add_id of the experts' bias when the model has one."""
    out = lora.mm_id(weight(tensor_name(kind, il)), x, selected, name=f"ffn_moe_{name}-{il}")
    b = bias(tensor_name(kind, il, "bias"))
    return out if b is None else B.add_id(out, b, selected, name=f"ffn_moe_{name}_biased-{il}")


def routing(hp: HParams) -> MoeRouting:
    """The file's resolved routing, or the architecture's defaults (a builder given bare HParams)."""
    if hp.routing is not None:
        return hp.routing
    moe = hp.spec.moe
    return MoeRouting(moe.gating, moe.norm_w, 0.0, (True,) * hp.n_layer)


def build_moe_ffn(hp: HParams, weight: Callable[[str], Tensor], graph: Graph, cur: Tensor, il: int,
                  bias: Callable[[str], Tensor | None] = lambda _name: None, lora: Adapters | None = None,
                  logits: Tensor | None = None) -> Tensor:
    """`weight(name)` is the builder's weight lookup, `bias(name)` the lookup of optional tensors,
    `lora` the applied adapters; nodes that llama.cpp expands early go to `graph`. `logits`: the router's
    output when the graph computed it elsewhere (build_moe_ffn's probs_in)."""
    lora = lora or Adapters()
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    k, n_expert, moe, route = hp.n_expert_used, hp.n_expert, hp.spec.moe, routing(hp)
    if logits is None:
        logits = lora.mm(weight(tensor_name(T.FFN_GATE_INP, il)), cur, name=f"ffn_moe_logits-{il}")
    router_bias = bias(tensor_name(T.FFN_GATE_INP, il, "bias"))
    if router_bias is not None:
        logits = B.add(logits, router_bias, name=f"ffn_moe_logits_biased-{il}")
    probs = _gate(logits, route.gating, il)
    selection = _selection(probs, bias, hp, n_expert, n_tokens, il)
    order = B._node(Op.ARGSORT, selection.ne, [selection], f"ffn_moe_argsort-{il}", GGMLType.I32, order="DESC")
    selected = B.view(order, (k, n_tokens, 1, 1), (order.nb[0], order.nb[1], order.nb[2], order.nb[3]), 0,
                      name=f"ffn_moe_topk-{il}")
    weights = expert_weights(graph, probs, selected, il, route.norm_w, route.w_scale,
                             softmax=route.gating is MoeGating.SOFTMAX_WEIGHT)
    x = B.reshape(cur, (n_embd, 1, n_tokens))
    up = _experts(weight, bias, lora, T.FFN_UP_EXP, x, selected, il, "up")
    if moe.gate_optional and bias(tensor_name(T.FFN_GATE_EXP, il)) is None:   # no gate: silu(up)
        act = B.unary(up, "SILU", name=f"ffn_moe_silu-{il}")
    else:
        gate = _experts(weight, bias, lora, T.FFN_GATE_EXP, x, selected, il, "gate")
        clamp = hp.swiglu_clamp_exp[il] if hp.swiglu_clamp_exp else 0.0
        # moe26: step35's clamped SwiGLU
        act = clamped_swiglu(gate, up, clamp, il, "ffn_moe") if clamp > CLAMP_EPS else _glu(moe.glu, gate, up, il)
    experts = _experts(weight, bias, lora, T.FFN_DOWN_EXP, act, selected, il, "down")
    return weighted_sum(graph, experts, weights, n_embd, n_tokens, k, il)


def expert_weights(graph: Graph, probs: Tensor, selected: Tensor, il: int, norm_w: bool, w_scale: float,
                   softmax: bool = False) -> Tensor:
    """build_moe_ffn's weights of the chosen experts [1, k, n_tokens]: the rows of `probs` [n_expert, n_tokens]
    that `selected` [k, n_tokens] picks, (softmax: a soft_max over the k), normalised to sum 1 (norm_w) and
    scaled by w_scale unless it is 0 or 1; expanded into `graph`."""
    k, n_expert, n_tokens = selected.ne[0], probs.ne[0], probs.ne[1]
    weights = B.get_rows(B.reshape(probs, (1, n_expert, n_tokens)), selected, name=f"ffn_moe_weights-{il}")
    if softmax:
        weights = B.soft_max_ext(B.reshape(weights, (k, n_tokens)), None, 1.0, name=f"ffn_moe_weights_softmax-{il}")
        weights = B.reshape(weights, (1, k, n_tokens))
    if norm_w:
        weights = normalized_weights(weights, k, n_tokens, il)
    if w_scale not in (0.0, 1.0):
        weights = B.scale(weights, w_scale, name=f"ffn_moe_weights_scaled-{il}")
    graph.expand(weights)
    return weights


def _selection(probs: Tensor, bias: Callable[[str], Tensor | None], hp: HParams, n_expert: int, n_tokens: int,
               il: int) -> Tensor:
    """The scores the experts are chosen by: the probabilities plus the selection bias where the file has one
    (their weights stay the unbiased probabilities), with the experts outside the best groups masked."""
    route = routing(hp)
    selection_bias = bias(tensor_name(T.FFN_EXP_PROBS_B, il, "bias"))
    if selection_bias is None and hp.spec.moe.probs_b_bare:   # moe26: hy_v3's blk.N.exp_probs_b
        selection_bias = bias(tensor_name(T.FFN_EXP_PROBS_B, il, "bias").removesuffix(".bias"))
    selection = probs
    if selection_bias is not None:
        selection = B.add(probs, selection_bias, name=f"ffn_moe_probs_biased-{il}")
    if route.n_groups > 1 and n_tokens > 0:   # moe3: bailingmoe2's expert groups
        selection = group_mask(selection, n_expert, route.n_groups, route.n_group_used, n_tokens, il)
    return selection


def top_k(a: Tensor, k: int, sort_name: str, name: str) -> Tensor:
    """ggml_argsort_top_k: a descending argsort, viewed to its first k columns."""
    order = B._node(Op.ARGSORT, a.ne, [a], sort_name, GGMLType.I32, order="DESC")
    return B.view(order, (k, *a.ne[1:]), order.nb, 0, name=name)


def group_mask(selection: Tensor, n_expert: int, n_groups: int, n_group_used: int, n_tokens: int,
               il: int) -> Tensor:
    """build_moe_ffn's group selection (DeepSeek-V3, Ling 2.0): each group scored by its two best experts, the
    n_group_used best groups kept and every other expert's selection score set to -inf."""
    per_group = n_expert // n_groups
    groups = B.reshape(selection, (per_group, n_groups, n_tokens))
    best2 = top_k(groups, 2, f"ffn_moe_group_argsort-{il}", f"ffn_moe_group_top2-{il}")
    scores = B.get_rows(B.reshape(groups, (1, per_group, n_groups, n_tokens)), best2)
    scores = B.reshape(scores, (scores.ne[1], scores.ne[2], scores.ne[3]))
    scores = B._node(Op.SUM_ROWS, (1, scores.ne[1], scores.ne[2]), [scores], f"ffn_moe_group_scores-{il}")
    scores = B.reshape(scores, (scores.ne[1], scores.ne[2]))
    kept = top_k(scores, n_group_used, f"ffn_moe_group_argsort2-{il}", f"ffn_moe_group_topk-{il}")
    rows = B.get_rows(groups, kept)
    masked = B._node(Op.FILL, groups.ne, [groups], f"ffn_moe_group_fill-{il}", groups.type, c=-math.inf)
    masked = B.set_rows(masked, rows, kept, name=f"ffn_moe_probs_masked-{il}")
    return B.reshape(masked, (n_expert, n_tokens))


def _gate(logits: Tensor, gating: MoeGating, il: int) -> Tensor:
    """The router's probabilities: softmax or sigmoid of the logits (SOFTMAX_WEIGHT: the logits themselves)."""
    if gating is MoeGating.SOFTMAX:
        return B.soft_max_ext(logits, None, 1.0, name=f"ffn_moe_probs-{il}")
    if gating is MoeGating.SIGMOID:
        return B.unary(logits, "SIGMOID", name=f"ffn_moe_probs-{il}")
    return logits


def _glu(kind: str, gate: Tensor, up: Tensor, il: int) -> Tensor:
    """The experts' gated activation: ggml_swiglu_split, ggml_swiglu_oai or ggml_reglu_split (LLM_FFN_RELU)."""
    if kind == "SWIGLU_OAI":
        return B.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, name=f"ffn_moe_swiglu_oai-{il}")
    if kind == "REGLU":
        return B._node(Op.GLU, gate.ne, [gate, up], f"ffn_moe_reglu-{il}", gate.type, glu="REGLU")
    return B.swiglu(gate, up, name=f"ffn_moe_swiglu-{il}")


def build_moe_layer(hp: HParams, weight: Callable[[str], Tensor], graph: Graph, cur: Tensor, il: int,
                    optional: Callable[[str], Tensor | None], lora: Adapters,
                    dense: Callable[[Tensor, int, T, T, T, str], Tensor], layer_input: Tensor | None = None,
                    out_ids: Tensor | None = None) -> Tensor:
    """A layer's FFN as the MoE architectures' graphs write it: the dense FFN in a layer without experts
    (leading dense layers, ernie4_5-moe's step), else the routed experts plus the shared expert where the
    file has one. `dense(x, il, up, gate, down, name)` is the builder's build_ffn (SwiGLU). `layer_input`
    and `out_ids`: the layer's input and the output rows, for a router that reads the input (smallthinker:
    its logits keep the output rows only in the last layer, as the layer's other rows do)."""
    if not routing(hp).moe_layers[il]:
        return dense(cur, il, T.FFN_UP, T.FFN_GATE, T.FFN_DOWN, "ffn")
    logits = None
    if hp.spec.moe.router_on_input and layer_input is not None:
        logits = lora.mm(weight(tensor_name(T.FFN_GATE_INP, il)), layer_input, name=f"ffn_moe_logits-{il}")
        if il == hp.n_layer - 1 and out_ids is not None:
            logits = B.get_rows(logits, out_ids)
    routed = build_moe_ffn(hp, weight, graph, cur, il, optional, lora, logits)
    kind = hp.spec.moe.shared
    if kind is SharedExpert.NONE or optional(tensor_name(T.FFN_UP_SHEXP, il)) is None:
        return routed
    shared = dense(cur, il, T.FFN_UP_SHEXP, T.FFN_GATE_SHEXP, T.FFN_DOWN_SHEXP, "ffn_shexp")
    if kind is SharedExpert.SIGMOID_GATED:
        g = lora.mm(weight(tensor_name(T.FFN_GATE_INP_SHEXP, il)), cur, name=f"ffn_shexp_gate_inp-{il}")
        gate = B._node(Op.DIV, g.ne, [B.unary(g, "SILU"), g], f"ffn_shexp_gate-{il}")
        shared = B.mul(shared, gate, name=f"ffn_shexp_out-{il}")
    return B.add(routed, shared, name=f"ffn_out-{il}")


def clamped_swiglu(gate: Tensor, up: Tensor, limit: float, il: int, prefix: str) -> Tensor:
    """moe26: build_ffn / build_moe_ffn's SwiGLU with a limit (step35): clamp(up, -limit, limit) times
    silu(gate) clamped from above by limit."""
    up = B._node(Op.CLAMP, up.ne, [up], f"{prefix}_up_clamped-{il}", min=-limit, max=limit)
    act = B.unary(gate, "SILU", name=f"{prefix}_silu-{il}")
    act = B._node(Op.CLAMP, act.ne, [act], f"{prefix}_silu_clamped-{il}", min=float("-inf"), max=limit)
    return B.mul(act, up, name=f"{prefix}_swiglu_limited-{il}")


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
