"""The BERT-family encoders (bert, nomic-bert, jina-bert-v3): node for node as src/models/bert.cpp builds them at
the pinned build (nomic-bert and jina-bert-v3 use that very graph).

An encoder of post-norm blocks without a cache (llama_model::create_memory gives these architectures no memory):
the input is the token rows plus row 0 of the token-type table plus, for bert, the learned position rows
(ggml_get_rows over inp_pos), LayerNormed with weight and bias; each block projects Q/K/V (fused or separate, with
the biases the file has: build_qkv), ropes Q and K where the architecture has no position table (NEOX), attends over
the ubatch itself (gemma_embedding's no-cache attention: an [n_tokens, n_tokens] mask, f32 K/V cast to f16 for
flash attention), adds the layer input and LayerNorms, runs the FFN (GELU over ffn_up, or nomic-bert's SiLU-gated
pair) and LayerNorms the sum again. The graph ends at the last block's output (res->t_embd): no output norm and no
logits. llama-fit-params takes no --embedding, so its reserve has no pooling (build_pooling returns early).
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR as T

from planner.gguf.reader import ModelFile, row_size
from planner.model.tensors import OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import AttnInputs, BatchShape, BuiltGraph
from runtime.engine.fused import FusedBuilder
from runtime.engine.gemma_embedding import GemmaEmbeddingBuilder
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import CacheKind, KVCache
from runtime.ggml import build as B
from runtime.ggml.graph import FLAG_OUTPUT, GGMLType, Graph, Op, Tensor

I32, F16, F32 = GGMLType.I32, GGMLType.F16, GGMLType.F32
BERT_ARCHS = frozenset({"bert", "nomic-bert", "jina-bert-v3", "modern-bert"})
MODERN_BERT = "modern-bert"
TOKEN_TYPES = "token_types.weight"
POS_EMBD = "position_embd.weight"
TOKEN_EMBD_NORM = "token_embd_norm.weight"


class BertBuilder(FusedBuilder, GemmaEmbeddingBuilder):
    """FusedBuilder's LayerNorm, build_qkv and GELU FFN; GemmaEmbeddingBuilder's attention over the ubatch."""

    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache, *,
                 flash_attn: bool, offload_kqv: bool, n_ctx_seq: int) -> None:
        super().__init__(model, hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv, n_ctx_seq=n_ctx_seq)

    def _inputs(self, shape: BatchShape) -> None:
        """bert.cpp's order: inp_pos, the token inputs, the no-cache mask, out_ids."""
        hp, t = self.hp, shape.n_tokens
        pos = B.new_input(I32, (t,), "inp_pos")
        tokens = B.new_input(I32, (t,), "inp_tokens")
        embd = B.new_input(F32, (hp.n_embd, t), "inp_embd")
        mask = B.new_input(F16 if self.flash_attn else F32, (t, t, 1, 1), "self_kq_mask")
        out_ids = B.new_input(I32, (shape.n_outputs,), "out_ids")
        attn = {CacheKind.BASE: AttnInputs(mask, mask, mask)}
        self.out = BuiltGraph(Graph(), shape, tokens, embd, pos, out_ids, attn, logits=tokens)

    def _rope(self, x: Tensor, il: int) -> Tensor:
        """bert has learned positions and ropes nothing; nomic-bert and jina-bert-v3 rope Q and K."""
        return x if self.hp.spec.learned_pos else super()._rope(x, il)

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        cur = self._attn_block(x, il, n_tokens)
        if il == self.hp.n_layer - 1:   # keep only the rows that produce outputs
            cur, x = B.get_rows(cur, self.out.out_ids), B.get_rows(x, self.out.out_ids)
        cur = self.norm(B.add(cur, x), tensor_name(T.ATTN_OUT_NORM, il), il)
        ffn_inp = cur
        cur = self.ffn(cur, il)
        cur = B.add(cur, ffn_inp)
        return self.norm(cur, tensor_name(T.LAYER_OUT_NORM, il), il)

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        tok_embd = self._need(TOKEN_EMBD)
        x = self.lora.embd(tok_embd, self.out.tokens, B.get_rows(tok_embd, self.out.tokens, name="inp_embd_rows"))
        g.expand(x)            # ggml_build_forward_select: the token path, then the embeddings input
        g.expand(self.out.embd)
        types = self._w(TOKEN_TYPES)
        if types is not None:   # token types are all 0 ("sentence A"): row 0 of the table
            x = B.add(x, B.view(types, (hp.n_embd,), (row_size(types.type, 1),), 0))
        if hp.spec.learned_pos:
            x = B.add(B.get_rows(self._need(POS_EMBD), self.out.pos), x)
        x = self.norm(x, TOKEN_EMBD_NORM, 0)
        for il in range(hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        x.flags |= FLAG_OUTPUT     # res->t_embd
        g.expand(x)
        self.out.logits = x
        return self.out


class ModernBertBuilder(BertBuilder):
    """src/models/modern-bert.cpp: pre-norm blocks (LayerNorm without bias; block 0 has no attn_norm), RoPE with the
    sliding layers' own base, attention over the ubatch with a second mask for the sliding layers (symmetric
    windows), a GeGLU over ffn_up's two halves, and an output norm closing the trunk."""

    def _inputs(self, shape: BatchShape) -> None:
        """modern-bert.cpp's order: inp_pos, the token inputs, out_ids, then the no-cache masks."""
        hp, t = self.hp, shape.n_tokens
        pos = B.new_input(I32, (t,), "inp_pos")
        tokens = B.new_input(I32, (t,), "inp_tokens")
        embd = B.new_input(F32, (hp.n_embd, t), "inp_embd")
        out_ids = B.new_input(I32, (shape.n_outputs,), "out_ids")
        attn = {}
        for kind in [CacheKind.BASE] + ([CacheKind.SWA] if any(hp.swa) else []):
            mask = B.new_input(F16 if self.flash_attn else F32, (t, t, 1, 1), "self_kq_mask")
            attn[kind] = AttnInputs(mask, mask, mask)
        self.out = BuiltGraph(Graph(), shape, tokens, embd, pos, out_ids, attn, logits=tokens)

    def ffn(self, x: Tensor, il: int) -> Tensor:
        """build_ffn(LLM_FFN_GEGLU, LLM_FFN_SEQ): ggml_geglu over ffn_up's halves, then ffn_down."""
        up = self.lora.mm(self._need(tensor_name(T.FFN_UP, il)), x, name=f"ffn_up-{il}")
        act = Tensor(up.type, (up.ne[0] // 2, *up.ne[1:]), name=f"ffn_geglu-{il}", op=Op.GLU, src=[up],
                     op_params={"glu": "GEGLU"})
        return self.lora.mm(self._need(tensor_name(T.FFN_DOWN, il)), act, name=f"ffn_out-{il}")

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        normed = self.norm(x, tensor_name(T.ATTN_NORM, il), il) if self._w(tensor_name(T.ATTN_NORM, il)) else x
        cur = self._attn_block(normed, il, n_tokens)
        if il == self.hp.n_layer - 1:
            cur, x = B.get_rows(cur, self.out.out_ids), B.get_rows(x, self.out.out_ids)
        ffn_inp = B.add(cur, x, name=f"ffn_inp-{il}")
        cur = self.ffn(self.norm(ffn_inp, tensor_name(T.FFN_NORM, il), il), il)
        return B.add(cur, ffn_inp)

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        tok_embd = self._need(TOKEN_EMBD)
        x = self.lora.embd(tok_embd, self.out.tokens, B.get_rows(tok_embd, self.out.tokens, name="inp_embd_rows"))
        g.expand(x)
        g.expand(self.out.embd)
        x = self.norm(x, TOKEN_EMBD_NORM, 0)
        for il in range(hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        cur = self.norm(x, OUTPUT_NORM, -1)
        cur.flags |= FLAG_OUTPUT     # res->t_embd
        g.expand(cur)
        self.out.logits = cur
        return self.out
