"""nemotron_h and nemotron_h_moe (NVIDIA Nemotron-H, Nemotron-Nano-v2, Nemotron 3): every block is one
of three kinds, node for node as src/models/nemotron-h.cpp builds them at the pinned build (the MoE
architecture runs the same graph):

- Mamba-2 where head_count_kv and feed_forward_length are both 0 (runtime/engine/recurrent.py's mixer,
  the one granitehybrid uses);
- attention where only feed_forward_length is 0: Q, K, V projections, no RoPE (Nemotron-H has no
  position encoding), build_attn with attn_output and its optional bias;
- an FFN where head_count_kv is 0 and feed_forward_length is not: up, ReLU, square, down (with the
  optional biases), or, in a file with experts, routed experts of up and down only (relu^2), their
  router logits computed once before build_moe_ffn, sigmoid gating with the exp_probs_b selection
  bias, the weights optionally normalised and scaled, an optional latent projection around the
  experts, plus a relu^2 shared expert.

Graph order: the token embeddings (expanded), the hybrid memory's inputs, out_ids; per block the
input norm, the block and the residual; the output norm (a graph output: the MTP head's input,
res->t_h_nextn), the output rows, the output matrix. No rows are dropped inside the last block
(embeddings_nextn_masked is off by default).
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.gguf.reader import ModelFile
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.moe_sigmoid import SigmoidMoe, relu_sqr
from runtime.engine.recurrent import (
    Mamba2,
    RecurrentStates,
    RsInputs,
    read_ssm_params,
    token_embeddings,
    ubatch_sequences,
)
from runtime.ggml import build as B
from runtime.ggml.graph import FLAG_OUTPUT, Tensor

NEMOTRON_H = "nemotron_h"
NEMOTRON_H_MOE = "nemotron_h_moe"


class NemotronHBuilder(DecoderBuilder):
    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache,
                 states: RecurrentStates, *, flash_attn: bool, offload_kqv: bool) -> None:
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.states = states
        self.ssm = read_ssm_params(model)
        arch = model.architecture
        self.moe = SigmoidMoe(hp.n_expert, hp.n_expert_used,
                              bool(model.metadata.get(Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch=arch), False)),
                              float(model.metadata.get(Keys.LLM.EXPERT_WEIGHTS_SCALE.format(arch=arch), 0.0) or 0.0))

    def _rope(self, x: Tensor, il: int) -> Tensor:
        return x   # nemotron-h.cpp ropes nothing

    def _bias(self, x: Tensor, kind: T, il: int) -> Tensor:
        b = self._w(tensor_name(kind, il, "bias"))
        return x if b is None else B.add(x, b)

    def _relu2_ffn(self, x: Tensor, il: int, up: T, down: T, name: str) -> Tensor:
        """build_ffn(LLM_FFN_RELU_SQR) without a gate."""
        h = self._bias(self.lora.mm(self._need(tensor_name(up, il)), x, name=f"{name}_up-{il}"), up, il)
        h = relu_sqr(h, f"{name}_sqr(relu)-{il}")
        return self._bias(self.lora.mm(self._need(tensor_name(down, il)), h, name=f"{name}_down-{il}"), down, il)

    def _experts(self, x: Tensor, il: int) -> Tensor:
        """build_moe_ffn on the latent input, with router logits computed from the block input first."""
        latent_down = self._w(tensor_name(T.MOE_LATENT_DOWN, il))
        inp = B.mul_mat(latent_down, x) if latent_down is not None else x
        logits = self.lora.mm(self._need(tensor_name(T.FFN_GATE_INP, il)), x, name=f"ffn_moe_logits-{il}")
        out = self.moe(self.out.graph, self._need, self._w, self.lora, inp, il, logits)
        latent_up = self._w(tensor_name(T.MOE_LATENT_UP, il))
        return B.mul_mat(latent_up, out) if latent_up is not None else out

    def _ffn_block(self, x: Tensor, il: int) -> Tensor:
        if self._w(tensor_name(T.FFN_GATE_INP, il)) is None:
            return self._relu2_ffn(x, il, T.FFN_UP, T.FFN_DOWN, "ffn")
        moe = self._experts(x, il)
        shared = self._relu2_ffn(x, il, T.FFN_UP_SHEXP, T.FFN_DOWN_SHEXP, "ffn_shexp")
        return B.add(moe, shared, name=f"ffn_out-{il}")

    def _attention_block(self, x: Tensor, il: int, n_tokens: int) -> Tensor:
        qkv = self._qkv(x, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
        return self._bias(cur, T.ATTN_OUT, il)

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
            if il in self.states.r:
                cur = mixer(cur, il, n_seqs)
            elif hp.n_head_kv[il]:
                cur = self._attention_block(cur, il, shape.n_tokens)
            else:
                cur = self._ffn_block(cur, il)
            x = B.add(cur, x, name=f"nemotron_h_block_out-{il}")
        cur = self.norm(x, OUTPUT_NORM, -1)
        cur.flags |= FLAG_OUTPUT   # res->t_h_nextn: set_outputs keeps it
        cur = B.get_rows(cur, self.out.out_ids, name="result_norm")
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        g.expand(cur)
        self.out.logits = cur
        return self.out
