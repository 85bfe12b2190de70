"""afmoe's layer (src/models/afmoe.cpp, pinned build), where it differs from the llama-shaped one: the
attention output is gated by sigmoid(attn_gate . x) before attn_output, and each sub-block ends in its own
norm, the attention's before the last layer keeps its output rows. Everything else is DecoderBuilder's and
the facts of hparams.ARCHS["afmoe"] (embeddings scaled by sqrt(n_embd), per-head Q/K norms before RoPE,
every fourth layer unroped, routed experts and a shared one after leading dense layers).

Per layer: norm -> Q/K/V, Q/K norms, RoPE -> attention (no output projection) -> * sigmoid(attn_gate . x)
-> attn_output -> post_attention_norm -> (last layer: output rows) -> + input -> ffn_norm -> FFN ->
post_ffw_norm -> + residual.
"""
from __future__ import annotations

from gguf import MODEL_TENSOR as T

from planner.model.tensors import tensor_name
from runtime.engine.builder import DecoderBuilder
from runtime.ggml import build as B
from runtime.ggml.graph import Tensor

AFMOE = "afmoe"


class AfmoeBuilder(DecoderBuilder):
    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        self.layer_input = x
        normed = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
        qkv = self._qkv(normed, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        gate = self.lora.mm(self._need(tensor_name(T.ATTN_GATE, il)), normed, name=f"attn_gate-{il}")
        cur = B.mul(cur, B.unary(gate, "SIGMOID"), name=f"attn_gated-{il}")
        cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
        cur = self.norm(cur, tensor_name(T.ATTN_POST_NORM, il), il)
        residual = x
        if il == self.hp.n_layer - 1:   # keep only the rows that produce outputs
            cur = B.get_rows(cur, self.out.out_ids)
            residual = B.get_rows(residual, self.out.out_ids)
        ffn_inp = B.add(cur, residual, name=f"ffn_inp-{il}")
        cur = self.ffn(self.norm(ffn_inp, tensor_name(T.FFN_NORM, il), il), il)
        cur = self.norm(cur, tensor_name(T.FFN_POST_NORM, il), il)
        return B.add(cur, ffn_inp, name=f"l_out-{il}")
