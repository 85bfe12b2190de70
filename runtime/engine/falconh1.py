"""falcon-h1 (TII Falcon-H1): attention and a Mamba-2 mixer side by side in every block, then a
SwiGLU FFN, node for node as src/models/falcon-h1.cpp builds them at the pinned build. The hybrid
memory gives every block both an attention cache and recurrent states (llama-model.cpp create_memory:
both layer filters accept every layer); the converter folds Falcon-H1's multipliers into the weights,
so the graph has none.

Graph order: the token embeddings, positions, the hybrid memory's inputs (rs_s_copy, then the attention
cache's), out_ids; per block the input norm, Q/K/V (optional biases), RoPE, attention with
attn_output, the input norm again (llama.cpp builds it twice) and the Mamba-2 mixer
(runtime/engine/recurrent.py), their sum plus the residual (only the output rows in the last block),
the FFN norm, the FFN (optional biases) and the residual; the output norm and the output matrix.
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR as T

from planner.gguf.reader import ModelFile
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.recurrent import (
    Mamba2,
    RecurrentStates,
    RsInputs,
    read_ssm_params,
    token_embeddings,
    ubatch_sequences,
)
from runtime.ggml import build as B
from runtime.ggml.graph import Tensor

FALCON_H1 = "falcon-h1"
# falcon-h1.cpp names the FFN norm without a suffix: tn(LLM_TENSOR_FFN_NORM, i)
FFN_NORM_BARE = "blk.{il}.ffn_norm"


class FalconH1Builder(DecoderBuilder):
    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache,
                 states: RecurrentStates, *, flash_attn: bool, offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.states = states
        self.ssm = read_ssm_params(model)

    def _biased(self, kind: T, x: Tensor, il: int, name: str) -> Tensor:
        out = self.lora.mm(self._need(tensor_name(kind, il)), x, name=f"{name}-{il}")
        b = self._w(tensor_name(kind, il, "bias"))
        return out if b is None else B.add(out, b)

    def _ffn(self, x: Tensor, il: int) -> Tensor:
        """build_ffn: up (+ bias), gate (+ bias), SwiGLU, down (+ bias)."""
        up = self._biased(T.FFN_UP, x, il, "ffn_up")
        gate = self._biased(T.FFN_GATE, x, il, "ffn_gate")
        return self._biased(T.FFN_DOWN, B.swiglu(gate, up, name=f"ffn_swiglu-{il}"), il, "ffn_down")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        n_seqs = ubatch_sequences(self.states, shape.n_tokens)
        mixer = Mamba2(self.ssm, self._need, self._w, self.norm, g, RsInputs.reserve(self.states, n_seqs),
                       self.states, self.lora)
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        for il in range(hp.n_layer):
            cur = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
            qkv = self._qkv(cur, il, shape.n_tokens)
            attn = self.attention(il, qkv.q, qkv.k, qkv.v)
            attn = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), attn, name=f"attn_out-{il}")
            ssm_out = mixer(self.norm(x, tensor_name(T.ATTN_NORM, il), il), il, n_seqs)
            residual = B.add(B.add(attn, ssm_out, name=f"layer_out-{il}"), x)
            if il == hp.n_layer - 1:  # keep only the rows that produce outputs
                residual = B.get_rows(residual, self.out.out_ids)
            cur = self._ffn(self.norm(residual, FFN_NORM_BARE.format(il=il), il), il)
            x = B.add(cur, residual, name=f"l_out-{il}")
        cur = self.norm(x, OUTPUT_NORM, -1)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        g.expand(cur)
        self.out.logits = cur
        return self.out
