"""Sigmoid-routed experts of the hybrid families (nemotron_h's and lfm2moe's build_moe_ffn calls),
op for op as llama.cpp's build_moe_ffn (src/llama-graph.cpp, pinned build) takes that path: the
router logits (given, as nemotron-h.cpp computes them before the call, or made here), SIGMOID, the
exp_probs_b selection bias added for the top-k only, argsort (descending) and its top-k view, the
chosen probabilities as weights, optionally normalised (moe.py's normalized_weights) and scaled
(expert_weights_scale, when neither 0 nor 1), expanded early; then up (and gate, when the experts
have one) through MUL_MAT_ID, the activation (SwiGLU with a gate, relu^2 without), down, and
moe.py's weighted sum. Applied LoRA adapters join through Adapters.mm / mm_id.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gguf import MODEL_TENSOR as T

from planner.model.tensors import tensor_name
from runtime.engine.lora import Adapters
from runtime.engine.moe import expert_weights, weighted_sum
from runtime.ggml import build as B
from runtime.ggml.graph import GGMLType, Graph, Op, Tensor


def relu_sqr(x: Tensor, name: str) -> Tensor:
    """LLM_FFN_RELU_SQR: relu, then ggml_sqr."""
    return B.sqr(B.unary(x, "RELU"), name=name)


@dataclass(frozen=True)
class SigmoidMoe:
    """One architecture's settings: weights normalised (norm_w) and scaled (w_scale, 0 or 1: off)."""

    n_expert: int
    n_expert_used: int
    norm_w: bool
    w_scale: float

    def __call__(self, graph: Graph, weight: Callable[[str], Tensor], optional: Callable[[str], Tensor | None],
                 lora: Adapters, x: Tensor, il: int, logits: Tensor | None = None) -> Tensor:
        k, n_embd, n_tokens = self.n_expert_used, x.ne[0], x.ne[1]
        if logits is None:
            logits = lora.mm(weight(tensor_name(T.FFN_GATE_INP, il)), x, name=f"ffn_moe_logits-{il}")
        probs = B.unary(logits, "SIGMOID", name=f"ffn_moe_probs-{il}")
        selection = B.add(probs, weight(tensor_name(T.FFN_EXP_PROBS_B, il, "bias")), name=f"ffn_moe_probs_biased-{il}")
        order = B._node(Op.ARGSORT, selection.ne, [selection], f"ffn_moe_argsort-{il}", GGMLType.I32, order="DESC")
        selected = B.view(order, (k, n_tokens, 1, 1), (order.nb[0], order.nb[1], order.nb[2], order.nb[3]), 0,
                          name=f"ffn_moe_topk-{il}")
        weights = expert_weights(graph, probs, selected, il, self.norm_w, self.w_scale)
        h = B.reshape(x, (n_embd, 1, n_tokens))
        up = lora.mm_id(weight(tensor_name(T.FFN_UP_EXP, il)), h, selected, name=f"ffn_moe_up-{il}")
        gate_w = optional(tensor_name(T.FFN_GATE_EXP, il))
        if gate_w is None:
            act = relu_sqr(up, f"ffn_moe_relu_sqr-{il}")
        else:
            gate = lora.mm_id(gate_w, h, selected, name=f"ffn_moe_gate-{il}")
            act = B.swiglu(gate, up, name=f"ffn_moe_swiglu-{il}")
        down = lora.mm_id(weight(tensor_name(T.FFN_DOWN_EXP, il)), act, selected, name=f"ffn_moe_down-{il}")
        return weighted_sum(graph, down, weights, n_embd, n_tokens, k, il)
