"""granitehybrid (Granite-4.0-H): Mamba-2 layers where head_count_kv is 0, attention layers elsewhere,
a dense SwiGLU FFN or routed experts (with an optional shared expert) in every layer, and Granite's
multipliers, node for node as src/models/granite-hybrid.cpp builds them at the pinned build.

Graph order: the token embeddings (scaled by the embedding multiplier), the hybrid memory's inputs
(rs_s_copy, then the attention cache's), out_ids and (when RoPE is on) positions; per layer the
attention norm, the mixer (runtime/engine/recurrent.py) or attention (the llama-shaped builder's),
the residual scale, the FFN and the residual; the output norm, the output matrix and the logit
scale. The expand points are llama.cpp's, so a host attention layer's core lands where llama.cpp's
scheduler puts it (planner.llama.settings.pulled_attention describes the outcome).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.gguf.reader import ModelFile
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.moe import build_moe_ffn
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

GRANITE_HYBRID = "granitehybrid"


def _meta(model: ModelFile, template: str, default: float) -> float:
    return float(model.metadata.get(template.format(arch=model.architecture), default) or default)


class GraniteHybridBuilder(DecoderBuilder):
    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache,
                 states: RecurrentStates, *, flash_attn: bool, offload_kqv: bool) -> None:
        # granite-hybrid.cpp load_arch_hparams: the multipliers are optional (0: off)
        attention_scale = _meta(model, Keys.Attention.SCALE, 0.0)
        if attention_scale:
            hp = replace(hp, kq_scale=attention_scale)
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.states = states
        self.ssm = read_ssm_params(model)
        self.embedding_scale = _meta(model, Keys.LLM.EMBEDDING_SCALE, 0.0)
        self.residual_scale = _meta(model, Keys.LLM.RESIDUAL_SCALE, 0.0)
        self.logit_scale = _meta(model, Keys.LLM.LOGIT_SCALE, 0.0)
        # rope_finetuned switches RoPE for every layer (default on); Granite-4.0-H files turn it off
        self.has_rope = bool(model.metadata.get(Keys.Rope.SCALING_FINETUNED.format(arch=model.architecture), True))

    def _rope(self, x: Tensor, il: int) -> Tensor:
        return super()._rope(x, il) if self.has_rope else x

    def _ffn(self, x: Tensor, il: int, up: T, gate: T, down: T, name: str) -> Tensor:
        """build_ffn with LLM_FFN_SILU, LLM_FFN_PAR and the optional biases."""
        def proj(kind: T, t: Tensor, part: str) -> Tensor:
            out = self.lora.mm(self._need(tensor_name(kind, il)), t, name=f"{name}_{part}-{il}")
            bias = self._w(tensor_name(kind, il, "bias"))
            return B.add(out, bias) if bias is not None else out

        u = proj(up, x, "up")
        g = proj(gate, x, "gate")
        return proj(down, B.swiglu(g, u, name=f"{name}_swiglu-{il}"), "out")

    def _layer_ffn(self, cur: Tensor, residual: Tensor, il: int) -> Tensor:
        """build_layer_ffn: residual scale, residual, FFN (dense, or experts plus a shared expert)."""
        if self.residual_scale:
            cur = B.scale(cur, self.residual_scale)
        ffn_inp = B.add(cur, residual, name=f"ffn_inp-{il}")
        cur = self.norm(ffn_inp, tensor_name(T.FFN_NORM, il), il)
        if self._w(tensor_name(T.FFN_GATE_INP, il)) is None:
            cur = self._ffn(cur, il, T.FFN_UP, T.FFN_GATE, T.FFN_DOWN, "ffn")
        else:
            moe = build_moe_ffn(self.hp, self._need, self.out.graph, cur, il, lora=self.lora)
            if self._w(tensor_name(T.FFN_UP_SHEXP, il)) is not None:
                shared = self._ffn(cur, il, T.FFN_UP_SHEXP, T.FFN_GATE_SHEXP, T.FFN_DOWN_SHEXP, "ffn_shexp")
                moe = B.add(moe, shared, name=f"ffn_out-{il}")
            cur = moe
        if self.residual_scale:
            cur = B.scale(cur, self.residual_scale)
        return B.add(cur, ffn_inp, name=f"l_out-{il}")

    def _attention_layer(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        qkv = self._qkv(cur, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        cur = self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")
        bias = self._w(tensor_name(T.ATTN_OUT, il, "bias"))
        return B.add(cur, bias) if bias is not None else cur

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        n_seqs = ubatch_sequences(self.states, shape.n_tokens)
        mixer = Mamba2(self.ssm, self._need, self._w, self.norm, g, RsInputs.reserve(self.states, n_seqs),
                       self.states, self.lora)
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "embd", self.lora)
        if self.embedding_scale:
            x = B.scale(x, self.embedding_scale, name="embd_scaled")
        g.expand(x)
        for il in range(hp.n_layer):
            residual = x
            cur = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
            recurrent = il in self.states.r
            cur = mixer(cur, il, n_seqs) if recurrent else self._attention_layer(cur, il, shape.n_tokens)
            if il == hp.n_layer - 1:  # keep only the rows that produce outputs
                cur = B.get_rows(cur, self.out.out_ids)
                residual = B.get_rows(residual, self.out.out_ids)
            x = self._layer_ffn(cur, residual, il)
        cur = self.norm(x, OUTPUT_NORM, -1)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        if self.logit_scale:
            cur = B.scale(cur, 1.0 / self.logit_scale)
        g.expand(cur)
        self.out.logits = cur
        return self.out
