"""qwen3moe's routed-expert FFN, op for op as llama.cpp's build_moe_ffn with a softmax router,
normalised top-k weights and SwiGLU experts (src/llama-graph.cpp, pinned build):
router matmul -> soft_max -> argsort (descending) -> top-k view -> get_rows of the probabilities
-> sum_rows / clamp / div -> MUL_MAT_ID up and gate -> swiglu -> MUL_MAT_ID down -> mul by the
weights -> one view per used expert, summed.
"""
from __future__ import annotations

from collections.abc import Callable

from gguf import MODEL_TENSOR as T

from planner.model.tensors import tensor_name
from runtime.engine.hparams import HParams
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor

# build_moe_ffn clamps the weight sum from below by the smallest normal f16 (6.1e-5)
WEIGHT_SUM_MIN = 6.103515625e-5


def build_moe_ffn(hp: HParams, weight: Callable[[str], Tensor], graph: Graph, cur: Tensor, il: int) -> Tensor:
    """`weight(name)` is the builder's weight lookup; nodes that llama.cpp expands early go to `graph`."""
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    k, n_expert = hp.n_expert_used, hp.n_expert
    logits = B.mul_mat(weight(tensor_name(T.FFN_GATE_INP, il)), cur, name=f"ffn_moe_logits-{il}")
    probs = B.soft_max_ext(logits, None, 1.0, name=f"ffn_moe_probs-{il}")
    order = B._node(Op.ARGSORT, probs.ne, [probs], f"ffn_moe_argsort-{il}", GGMLType.I32, order="DESC")
    selected = B.view(order, (k, n_tokens, 1, 1), (order.nb[0], order.nb[1], order.nb[2], order.nb[3]), 0,
                      name=f"ffn_moe_topk-{il}")
    weights = B.get_rows(B.reshape(probs, (1, n_expert, n_tokens)), selected, name=f"ffn_moe_weights-{il}")
    weights = B.reshape(weights, (k, n_tokens))
    total = B._node(Op.SUM_ROWS, (1, n_tokens), [weights], f"ffn_moe_weights_sum-{il}")
    total = B._node(Op.CLAMP, total.ne, [total], f"ffn_moe_weights_sum_clamped-{il}",
                  min=WEIGHT_SUM_MIN, max=float("inf"))
    weights = B._node(Op.DIV, weights.ne, [weights, total], f"ffn_moe_weights_norm-{il}")
    weights = B.reshape(weights, (1, k, n_tokens))
    graph.expand(weights)
    x = B.reshape(cur, (n_embd, 1, n_tokens))
    up = B.mul_mat_id(weight(tensor_name(T.FFN_UP_EXP, il)), x, selected, name=f"ffn_moe_up-{il}")
    gate = B.mul_mat_id(weight(tensor_name(T.FFN_GATE_EXP, il)), x, selected, name=f"ffn_moe_gate-{il}")
    act = B.swiglu(gate, up, name=f"ffn_moe_swiglu-{il}")
    experts = B.mul_mat_id(weight(tensor_name(T.FFN_DOWN_EXP, il)), act, selected, name=f"ffn_moe_down-{il}")
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
