"""The BERT-family encoders: node for node as src/models/bert.cpp (bert, nomic-bert, jina-bert-v2, jina-bert-v3 all
use that graph) and src/models/modern-bert.cpp build them at the pinned build.

bert.cpp: post-norm blocks without a cache (llama_model::create_memory gives these architectures no memory). The
input is the token rows plus row 0 of the token-type table plus, for bert, the learned position rows (ggml_get_rows
over inp_pos), LayerNormed with weight and bias; each block projects Q/K/V (fused or separate, with the biases the
file has: build_qkv; jina-bert-v2's optional Q/K LayerNorms over the whole projection), ropes Q and K (NEOX) where
the architecture has neither a position table nor ALiBi (jina-bert-v2: max_bias 8 on every softmax), attends over
the ubatch itself (gemma_embedding's no-cache attention: an [n_tokens, n_tokens] mask, f32 K/V cast to f16 for flash
attention), adds the layer input and LayerNorms, runs the FFN (GELU over ffn_up; nomic-bert's SiLU-gated pair;
jina-bert-v2's GeGLU) and LayerNorms the sum again. The graph ends at the last block's output (res->t_embd): no
output norm and no logits. modern-bert.cpp: pre-norm blocks, sliding windows with a second mask, an output norm.
llama-fit-params takes no --embedding, so its reserve has no pooling (build_pooling returns early).
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR as T

from planner.gguf.reader import ModelFile, row_size
from planner.model.tensors import OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import AttnInputs, BatchShape, BuiltGraph
from runtime.engine.fused import FusedBuilder
from runtime.engine.gemma_embedding import GemmaEmbeddingBuilder
from runtime.engine.hparams import FfnKind, HParams
from runtime.engine.kvcache import CacheKind, KVCache
from runtime.engine.recurrent import token_embeddings
from runtime.ggml import build as B
from runtime.ggml.graph import FLAG_OUTPUT, GGMLType, Graph, Op, Tensor

I32, F16, F32 = GGMLType.I32, GGMLType.F16, GGMLType.F32
BERT_ARCHS = frozenset({"bert", "nomic-bert", "jina-bert-v2", "jina-bert-v3", "modern-bert"})
MODERN_BERT, JINA_BERT_V2 = "modern-bert", "jina-bert-v2"
TOKEN_TYPES = "token_types.weight"
POS_EMBD = "position_embd.weight"
TOKEN_EMBD_NORM = "token_embd_norm.weight"


class BertBuilder(FusedBuilder, GemmaEmbeddingBuilder):
    """FusedBuilder's LayerNorm, build_qkv and GELU FFN; GemmaEmbeddingBuilder's attention over the ubatch."""

    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache, *,
                 flash_attn: bool, offload_kqv: bool, n_ctx_seq: int) -> None:
        super().__init__(model, hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv, n_ctx_seq=n_ctx_seq)

    def _inputs(self, shape: BatchShape) -> None:
        """bert.cpp's order: inp_pos (not for jina-bert-v2, which never reads it), the token inputs, the no-cache
        mask, out_ids."""
        hp, t = self.hp, shape.n_tokens
        pos = B.new_input(I32, (t,), "inp_pos")   # left out of jina-bert-v2's graph: no op reads it
        tokens = B.new_input(I32, (t,), "inp_tokens")
        embd = B.new_input(F32, (hp.n_embd, t), "inp_embd")
        mask = B.new_input(F16 if self.flash_attn else F32, (t, t, 1, 1), "self_kq_mask")
        out_ids = B.new_input(I32, (shape.n_outputs,), "out_ids")
        attn = {CacheKind.BASE: AttnInputs(mask, mask, mask)}
        self.out = BuiltGraph(Graph(), shape, tokens, embd, pos, out_ids, attn, logits=tokens)

    def _rope(self, x: Tensor, il: int) -> Tensor:
        """bert has learned positions and jina-bert-v2 ALiBi, so neither ropes; nomic-bert and jina-bert-v3 rope
        Q and K."""
        spec = self.hp.spec
        return x if spec.learned_pos or spec.alibi_max_bias else super()._rope(x, il)

    def _qk_norm(self, t: Tensor, tensor: T, il: int) -> Tensor:
        """jina-bert-v2's optional Q/K LayerNorms span all heads: the projection flattened, normed, split again."""
        name = tensor_name(tensor, il)
        if self._w(name) is None:
            return t
        flat = self.norm(B.reshape(t, (t.ne[0] * t.ne[1], t.ne[2])), name, il)
        return B.reshape(flat, t.ne[:3])

    def ffn(self, x: Tensor, il: int) -> Tensor:
        """jina-bert-v2: a GeGLU over ffn_up's halves when ffn_up holds the gate too (2 * n_ff rows), else over
        ffn_gate and ffn_up (LLM_FFN_PAR); ffn_down's bias after. The others: FusedBuilder's FFN."""
        if self.hp.spec.ffn is not FfnKind.GEGLU:
            return super().ffn(x, il)
        up = self.lora.mm(self._need(tensor_name(T.FFN_UP, il)), x, name=f"ffn_up-{il}")
        b = self._w(tensor_name(T.FFN_UP, il, "bias"))
        if b is not None:
            up = B.add(up, b, name=f"ffn_up_b-{il}")
        gate_w = self._w(tensor_name(T.FFN_GATE, il))
        if gate_w is None:   # ggml_geglu: the first half of each row gates the second
            act = Tensor(up.type, (up.ne[0] // 2, *up.ne[1:]), name=f"ffn_geglu-{il}", op=Op.GLU, src=[up],
                         op_params={"glu": "GEGLU"})
        else:
            gate = self.lora.mm(gate_w, x, name=f"ffn_gate-{il}")
            act = Tensor(gate.type, gate.ne, name=f"ffn_geglu-{il}", op=Op.GLU, src=[gate, up],
                         op_params={"glu": "GEGLU"})
        cur = self.lora.mm(self._need(tensor_name(T.FFN_DOWN, il)), act, name=f"ffn_down-{il}")
        b = self._w(tensor_name(T.FFN_DOWN, il, "bias"))
        return B.add(cur, b, name=f"ffn_out-{il}") if b is not None else cur

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        cur = self._attn_block(x, il, n_tokens)
        if il == self.hp.n_layer - 1:   # keep only the rows that produce outputs
            cur, x = B.get_rows(cur, self.out.out_ids), B.get_rows(x, self.out.out_ids)
        cur = self.norm(B.add(cur, x), tensor_name(T.ATTN_OUT_NORM, il), il)
        if self._w(tensor_name(T.ATTN_NORM_2, il)) is not None:   # jina-bert-v2: the input re-added, normed again
            cur = self.norm(B.add(cur, x), tensor_name(T.ATTN_NORM_2, il), il)
        ffn_inp = cur
        cur = self.ffn(cur, il)
        cur = B.add(cur, ffn_inp)
        return self.norm(cur, tensor_name(T.LAYER_OUT_NORM, il), il)

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
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
        if hp.spec.alibi_max_bias:   # build_attn_mha hands hparams.f_max_alibi_bias to every softmax / flash attention
            for node in g.nodes:
                if node.op in (Op.SOFT_MAX, Op.FLASH_ATTN_EXT):
                    node.op_params["max_bias"] = hp.spec.alibi_max_bias
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
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        x = self.norm(x, TOKEN_EMBD_NORM, 0)
        for il in range(hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        cur = self.norm(x, OUTPUT_NORM, -1)
        cur.flags |= FLAG_OUTPUT     # res->t_embd
        g.expand(cur)
        self.out.logits = cur
        return self.out
