"""jamba (AI21 Jamba): Mamba-1 layers where head_count_kv is 0, RoPE-less attention elsewhere, and in
every layer a SwiGLU FFN or softmax-routed SwiGLU experts (weights not normalised), node for node as
src/models/jamba.cpp builds them at the pinned build.

Graph order: the token embeddings, the hybrid memory's inputs (rs_s_copy, then the attention cache's),
out_ids (no positions: nothing is roped); per layer the input norm, the mixer
(runtime/engine/recurrent.py's Mamba1) or attention with attn_output, in the last layer the output
rows, the residual (the layer input first), the FFN norm, the FFN or the experts (runtime/engine/moe.py)
and the residual; the output norm and the output matrix.
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import BadInput
from planner.gguf.reader import ModelFile
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.moe import build_moe_ffn
from runtime.engine.recurrent import (
    Mamba1,
    RecurrentStates,
    RsInputs,
    read_mamba1_params,
    token_embeddings,
    ubatch_sequences,
)
from runtime.ggml import build as B
from runtime.ggml.graph import Tensor

JAMBA = "jamba"


class JambaBuilder(DecoderBuilder):
    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache,
                 states: RecurrentStates, *, flash_attn: bool, offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.states = states
        self.ssm = read_mamba1_params(model)
        w_scale = float(model.metadata.get(Keys.LLM.EXPERT_WEIGHTS_SCALE.format(arch=JAMBA), 0.0) or 0.0)
        if w_scale not in (0.0, 1.0):
            raise BadInput("jamba with expert_weights_scale is not implemented in the runtime")

    def _rope(self, x: Tensor, il: int) -> Tensor:
        return x   # "No RoPE :)" (jamba.cpp)

    def _ffn_block(self, x: Tensor, il: int) -> Tensor:
        if self._w(tensor_name(T.FFN_GATE_INP, il)) is not None:
            return build_moe_ffn(self.hp, self._need, self.out.graph, x, il, self._w, self.lora)
        up = self.lora.mm(self._need(tensor_name(T.FFN_UP, il)), x, name=f"ffn_up-{il}")
        gate = self.lora.mm(self._need(tensor_name(T.FFN_GATE, il)), x, name=f"ffn_gate-{il}")
        act = B.swiglu(gate, up, name=f"ffn_swiglu-{il}")
        return self.lora.mm(self._need(tensor_name(T.FFN_DOWN, il)), act, name=f"ffn_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        n_seqs = ubatch_sequences(self.states, shape.n_tokens)
        d_conv, d_inner, d_state, dt_rank = self.ssm
        mixer = Mamba1(d_conv, d_inner, d_state, dt_rank, self._need, self._w, self.norm, g,
                       RsInputs.reserve(self.states, n_seqs), self.states, self.lora)
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        for il in range(hp.n_layer):
            cur = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
            if il in self.states.r:
                cur = mixer(cur, il, n_seqs)
            else:
                qkv = self._qkv(cur, il, shape.n_tokens)
                cur = self.attention(il, qkv.q, qkv.k, qkv.v)
                cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
            if il == hp.n_layer - 1:  # keep only the rows that produce outputs
                cur = B.get_rows(cur, self.out.out_ids)
                x = B.get_rows(x, self.out.out_ids)
            ffn_inp = B.add(x, cur, name=f"ffn_inp-{il}")
            cur = self._ffn_block(self.norm(ffn_inp, tensor_name(T.FFN_NORM, il), il), il)
            x = B.add(ffn_inp, cur, name=f"l_out-{il}")
        cur = self.norm(x, OUTPUT_NORM, -1)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        g.expand(cur)
        self.out.logits = cur
        return self.out
