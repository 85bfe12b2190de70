"""cohere2moe (Cohere's North models): cohere2's parallel layer over experts, node for node as
src/models/cohere2moe.cpp builds its trunk at the pinned build (DESIGN.md).

What differs from the fused cohere2 layer (runtime/engine/fused.py):
- Norms: RMSNorm when the file has attention.layer_norm_rms_epsilon, else LayerNorm (weights only).
- RoPE: the sliding-window layers, and also the leading dense layers whatever their attention.
- FFN: a dense SwiGLU in the leading dense layers, the file's gating (sigmoid by default) over the
  experts elsewhere; a shared expert is added to the routed sum and the sum halved.
- Output: no rows are dropped inside the last layer; the output norm's result is a graph output
  (res->t_h_nextn) and the output rows are picked after it, then the logit scale.
The MTP block the file may carry is not part of the trunk's graph.
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.gguf.reader import ModelFile
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph
from runtime.engine.fused import FusedBuilder
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.moe import routing
from runtime.engine.recurrent import token_embeddings
from runtime.ggml import build as B
from runtime.ggml import fused_ops as F
from runtime.ggml.graph import FLAG_OUTPUT, Tensor

COHERE2MOE = "cohere2moe"
SHARED_EXPERT_MEAN = 0.5   # cohere2moe.cpp: (routed + shared) * 0.5


class Cohere2MoeBuilder(FusedBuilder):
    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache, *,
                 flash_attn: bool, offload_kqv: bool, n_ctx_seq: int) -> None:
        super().__init__(model, hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv, n_ctx_seq=n_ctx_seq)
        # load_arch_hparams: without the RMS epsilon key, f_norm_rms_eps is 0 and the graph uses LLM_NORM
        self.rms = Keys.Attention.LAYERNORM_RMS_EPS.format(arch=model.architecture) in model.metadata
        self.dense = tuple(not m for m in routing(hp).moe_layers)

    def norm(self, x: Tensor, weight: str, il: int) -> Tensor:
        if self.rms:
            return super(FusedBuilder, self).norm(x, weight, il)
        n = F.norm(x, self.ff.norm_eps, name=f"norm-{il}" if il >= 0 else "norm")
        if il >= 0:
            self.out.norm_pins.append((n, il))
        return B.mul(n, self._need(weight), name=f"{weight}-mul")

    def _roped(self, il: int) -> bool:
        return self.hp.swa[il] or self.dense[il]   # force_rope on the leading dense layers

    def ffn(self, x: Tensor, il: int) -> Tensor:
        out = super().ffn(x, il)
        if not self.dense[il] and self._w(tensor_name(T.FFN_UP_SHEXP, il)) is not None:
            out = B.scale(out, SHARED_EXPERT_MEAN, name=f"ffn_out-{il}")
        return out

    def _layer(self, il: int, x: Tensor, n_tokens: int) -> Tensor:
        normed = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
        attn = self._attn_block(normed, il, n_tokens)
        ffn = self.ffn(normed, il)
        return B.add(B.add(ffn, x), attn, name=f"l_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        for il in range(hp.n_layer):
            x = self._layer(il, x, shape.n_tokens)
        cur = self.norm(x, OUTPUT_NORM, -1)
        cur.flags |= FLAG_OUTPUT   # res->t_h_nextn: set_outputs keeps it
        cur = B.get_rows(cur, self.out.out_ids, name="result_norm")
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        if self.ff.logit_scale:
            cur = B.scale(cur, self.ff.logit_scale)
        g.expand(cur)
        self.out.logits = cur
        return self.out
