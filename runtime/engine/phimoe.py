"""phimoe's graph (src/models/phi3.cpp, which phimoe uses; pinned build), where it differs from the
llama-shaped one: every RMS norm adds its bias after the weight (build_norm with mw and mb), the FFN's
residual is the first source of the layer's last add (ggml_add(residual, cur): the allocator reuses that
source's memory first), and the logits add output.bias. Everything else is DecoderBuilder's and the facts of
hparams.ARCHS["phimoe"]: Q/K/V and attention-output biases, NEOX RoPE, Q scaled by 1/sqrt(head_dim) after
RoPE with attention scale 1, and the routed experts (softmax, normalised) in every layer.

The rope factors (rope_factors_long / _short, longrope) are weights the RoPE reads; they take no compute
memory and are not part of the sized graph.
"""
from __future__ import annotations

from gguf import MODEL_TENSOR as T

from planner.model.tensors import OUTPUT, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.ggml import build as B
from runtime.ggml.graph import Tensor

PHIMOE = "phimoe"


class PhimoeBuilder(DecoderBuilder):
    def norm(self, x: Tensor, weight: str, il: int) -> Tensor:
        cur = super().norm(x, weight, il)
        bias = self._w(weight.removesuffix(".weight") + ".bias")
        return cur if bias is None else B.add(cur, bias, name=f"{weight}-bias")

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        self.layer_input = x
        cur = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
        qkv = self._qkv(cur, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
        bias = self._w(tensor_name(T.ATTN_OUT, il, "bias"))
        if bias is not None:
            cur = B.add(cur, bias)
        residual = x
        if il == self.hp.n_layer - 1:   # keep only the rows that produce outputs
            cur = B.get_rows(cur, self.out.out_ids)
            residual = B.get_rows(residual, self.out.out_ids)
        residual = B.add(cur, residual, name=f"ffn_inp-{il}")
        cur = self.ffn(self.norm(residual, tensor_name(T.FFN_NORM, il), il), il)
        return B.add(residual, cur, name=f"l_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        out = super().build(shape)
        bias = self._w(OUTPUT.removesuffix(".weight") + ".bias")
        if bias is not None:
            out.logits = B.add(out.logits, bias, name="result_output_b")
            out.graph.expand(out.logits)
        return out
