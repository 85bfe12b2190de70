"""gemma-embedding (EmbeddingGemma): node for node as src/models/gemma-embedding.cpp builds it at the pinned build.

Gemma 3's layer (Q/K norms, RoPE, Q pre-scaled by 1/sqrt(head_dim), post norms, GELU FFN, hparams.ARCHS'
row) without a cache: llama_model::create_memory gives this architecture no memory, so every layer attends
over the ubatch's own K and V (build_attn_inp_no_cache: an [n_tokens, n_tokens] mask, a second one for the
sliding layers; build_attn without store). K and V are f32 there, so flash attention casts both to f16 and
-fa off transposes V by a copy. The graph ends at the output norm (res->t_embd, a graph output): no logits.
"""
from __future__ import annotations

import math

from planner.model.tensors import OUTPUT_NORM, TOKEN_EMBD
from runtime.engine.builder import AttnInputs, BatchShape, BuiltGraph, DecoderBuilder, mha
from runtime.engine.kvcache import CacheKind
from runtime.engine.recurrent import token_embeddings
from runtime.ggml import build as B
from runtime.ggml.graph import FLAG_OUTPUT, GGMLType, Graph, Tensor

GEMMA_EMBEDDING = "gemma-embedding"
I32, F16, F32 = GGMLType.I32, GGMLType.F16, GGMLType.F32


class GemmaEmbeddingBuilder(DecoderBuilder):
    def _inputs(self, shape: BatchShape) -> None:
        hp, t = self.hp, shape.n_tokens
        tokens = B.new_input(I32, (t,), "inp_tokens")
        embd = B.new_input(F32, (hp.n_embd, t), "inp_embd")
        pos = B.new_input(I32, (t,), "inp_pos")
        mask_type = F16 if self.flash_attn else F32
        kinds = [CacheKind.BASE] + ([CacheKind.SWA] if any(hp.swa) else [])
        attn = {}
        for kind in kinds:   # no cache: no indices, only the masks over the ubatch itself
            mask = B.new_input(mask_type, (t, t, 1, 1), "self_kq_mask")
            attn[kind] = AttnInputs(mask, mask, mask)
        out_ids = B.new_input(I32, (shape.n_outputs,), "out_ids")
        self.out = BuiltGraph(Graph(), shape, tokens, embd, pos, out_ids, attn, logits=tokens)

    def attention(self, il: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """build_attn(llm_graph_input_attn_no_cache) and build_attn_mha over K and V themselves."""
        g = self.out.graph
        for t in (q, k, v):
            g.expand(t)
        mask = self.out.attn[CacheKind.SWA if self.hp.swa[il] else CacheKind.BASE].mask
        return mha(self.out, il, q, k, v, mask, self.hp.kq_scale, flash_attn=self.flash_attn,
                   offload_kqv=self.offload_kqv, q_name=f"q-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        x = B.scale(x, math.sqrt(hp.n_embd), name="inp_scaled")
        for il in range(hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        cur = self.norm(x, OUTPUT_NORM, -1)
        cur.flags |= FLAG_OUTPUT     # res->t_embd
        g.expand(cur)
        self.out.logits = cur
        return self.out

