"""lfm2 (LiquidAI LFM2): short-convolution layers where head_count_kv is 0, attention layers with
per-head Q/K norms elsewhere, and a dense SwiGLU FFN in every layer, node for node as
src/models/lfm2.cpp builds them at the pinned build (DESIGN.md). lfm2moe (LFM2-8B-A1B) runs the same
graph (src/models/lfm2moe.cpp reuses it) with sigmoid-routed SwiGLU experts (runtime/engine/moe_sigmoid.py)
in place of the FFN from leading_dense_block_count on.

Graph order: the token embeddings, the hybrid memory's inputs (rs_s_copy, then the attention
cache's: llama-graph.cpp build_inp_mem_hybrid), positions and out_ids; per layer the operator
norm, the mixer, the residual (the previous hidden state first), the FFN norm, the FFN and the
residual; the output norm (token_embd_norm, lfm2's name for it) and the output matrix.

The short convolution of one layer (build_shortconv_block): in_proj makes B, C and x (three views
of one [3 n_embd] row); B * x is transposed to [tokens, n_embd] and appended to the layer's conv
state (build_rs over r, [d_conv = L_cache - 1, n_embd] per sequence); the last d_conv columns of
that are written back as the new state (one snapshot: n_rs_seq is 0 by default); SSM_CONV runs
the L_cache-tap depthwise filter, C gates it and out_proj projects it. The recurrent states and
build_rs are runtime/engine/recurrent.py's (the same memory granitehybrid's Mamba-2 layers use);
lfm2 has no s state (n_embd_s is 0), so only r is read.
"""
from __future__ import annotations

from collections.abc import Mapping

from gguf import MODEL_TENSOR as T
from gguf import Keys

from planner.core.errors import BadInput, GGUFError
from planner.gguf.reader import ModelFile
from planner.model.tensors import OUTPUT, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.engine.hparams import HParams
from runtime.engine.kvcache import KVCache
from runtime.engine.moe_sigmoid import SigmoidMoe
from runtime.engine.recurrent import ELEMENT, RecurrentStates, RsInputs, build_rs, token_embeddings, ubatch_sequences
from runtime.ggml import build as B
from runtime.ggml import ssm
from runtime.ggml.graph import Tensor

LFM2 = "lfm2"
LFM2MOE = "lfm2moe"
# llama_expert_gating_func_type's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (the value lfm2moe files carry)
GATING_SIGMOID = 2
OUTPUT_NORM_LFM2 = tensor_name(T.TOKEN_EMBD_NORM)   # llama-arch.cpp LLM_TENSOR_OUTPUT_NORM_LFM2
N_CHUNKS = 3   # in_proj's row holds B, C and x


def read_l_cache(model: ModelFile) -> int:
    """llama_hparams::n_shortconv_l_cache (load_arch_hparams: a required key, and more than 1 tap)."""
    key = Keys.ShortConv.L_CACHE.format(arch=model.architecture)
    if key not in model.metadata:
        raise GGUFError(model.path, f"missing required key {key}")
    l_cache = int(model.metadata[key])
    if l_cache < 2:
        raise GGUFError(model.path, f"{key} = {l_cache}: lfm2's short convolution needs at least 2 taps")
    return l_cache


class Lfm2Builder(DecoderBuilder):
    def __init__(self, model: ModelFile, hp: HParams, weights: Mapping[str, Tensor], kv: KVCache,
                 states: RecurrentStates, *, flash_attn: bool, offload_kqv: bool) -> None:
        if any(hp.swa):
            # a sliding window makes lfm2.cpp build graph<true> over llama_memory_hybrid_iswa
            raise BadInput("lfm2 with a sliding window (the hybrid iSWA memory) is not implemented in the runtime")
        super().__init__(hp, weights, kv, flash_attn=flash_attn, offload_kqv=offload_kqv)
        self.states = states
        self.d_conv = read_l_cache(model) - 1
        self.moe: SigmoidMoe | None = None
        self.n_dense_lead = hp.n_layer
        if model.architecture == LFM2MOE:
            # lfm2moe.cpp: blocks from leading_dense_block_count on route to experts (build_moe_ffn with
            # exp_probs_b, norm_w true, the file's gating function and expert_weights_scale)
            meta = model.metadata
            self.n_dense_lead = int(meta.get(Keys.LLM.LEADING_DENSE_BLOCK_COUNT.format(arch=LFM2MOE), 0) or 0)
            gating = int(meta.get(Keys.LLM.EXPERT_GATING_FUNC.format(arch=LFM2MOE), 0) or 0)
            if gating != GATING_SIGMOID:
                raise BadInput(f"lfm2moe with expert gating function {gating} (not sigmoid) is not implemented "
                               f"in the runtime")
            w_scale = float(meta.get(Keys.LLM.EXPERT_WEIGHTS_SCALE.format(arch=LFM2MOE), 0.0) or 0.0)
            self.moe = SigmoidMoe(hp.n_expert, hp.n_expert_used, True, w_scale)

    def _shortconv(self, cur: Tensor, il: int, rs: RsInputs, n_seqs: int) -> Tensor:
        """build_shortconv_block for a ubatch of n_seqs equal runs of tokens (causal attention)."""
        g, n_embd, d_conv = self.out.graph, self.hp.n_embd, self.d_conv
        n_seq_tokens = cur.ne[1] // n_seqs
        cur = B.reshape(cur, (n_embd, n_seq_tokens, n_seqs))
        bcx = self.lora.mm(self._need(tensor_name(T.SHORTCONV_INPROJ, il)), cur, name=f"shortconv_in-{il}")
        chunk = bcx.ne[0] // N_CHUNKS
        if chunk * N_CHUNKS != bcx.ne[0]:
            raise BadInput(f"lfm2 layer {il}: in_proj's width {bcx.ne[0]} is not 3 chunks")
        b, c, x = (B.view(bcx, (chunk, bcx.ne[1], bcx.ne[2]), (ELEMENT, bcx.nb[1], bcx.nb[2]), k * chunk * ELEMENT)
                   for k in range(N_CHUNKS))
        bx = B.transpose(B.mul(b, x, name=f"shortconv_bx-{il}"))
        r_all = self.states.r[il]
        conv = build_rs(g, rs, r_all, r_all.ne[0], n_seqs)
        conv = B.reshape(conv, (d_conv, n_embd, n_seqs))
        bx = ssm.concat(conv, bx, 0, name=f"shortconv_x-{il}")
        # the new state: the last d_conv columns, into the ubatch's cells (slot 0 of the memory)
        snap = B.view(bx, (d_conv, bx.ne[1], bx.ne[2]), (ELEMENT, bx.nb[1], bx.nb[2]), (bx.ne[0] - d_conv) * ELEMENT)
        row = d_conv * n_embd * ELEMENT
        g.expand(B.cpy(snap, B.view(r_all, (d_conv * n_embd, n_seqs), (ELEMENT, r_all.nb[1]), rs.head * row)))
        conv_out = ssm.ssm_conv(bx, self._need(tensor_name(T.SHORTCONV_CONV, il)), name=f"shortconv_conv-{il}")
        y = B.mul(c, conv_out, name=f"shortconv_y-{il}")
        y = self.lora.mm(self._need(tensor_name(T.SHORTCONV_OUTPROJ, il)), y, name=f"shortconv_out-{il}")
        return B.reshape(y, (n_embd, n_seq_tokens * n_seqs))

    def _attention_block(self, cur: Tensor, il: int, n_tokens: int) -> Tensor:
        """build_attn_block: Q, K, V; Q and K normed per head, then roped; build_attn with wo."""
        qkv = self._qkv(cur, il, n_tokens)
        cur = self.attention(il, qkv.q, qkv.k, qkv.v)
        return self.lora.mm(self._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")

    def build(self, shape: BatchShape) -> BuiltGraph:
        hp = self.hp
        self._inputs(shape)
        g = self.out.graph
        n_seqs = ubatch_sequences(self.states, shape.n_tokens)
        rs = RsInputs.reserve(self.states, n_seqs)
        x = token_embeddings(g, self._need(TOKEN_EMBD), self.out.tokens, self.out.embd, "inp_embd_rows", self.lora)
        for il in range(hp.n_layer):
            residual = x
            cur = self.norm(x, tensor_name(T.ATTN_NORM, il), il)
            if il in self.states.r:
                cur = self._shortconv(cur, il, rs, n_seqs)
            else:
                cur = self._attention_block(cur, il, shape.n_tokens)
            if il == hp.n_layer - 1:  # keep only the rows that produce outputs
                cur = B.get_rows(cur, self.out.out_ids)
                residual = B.get_rows(residual, self.out.out_ids)
            ffn_inp = B.add(residual, cur, name=f"ffn_inp-{il}")   # lfm2.cpp adds (previous, mixer)
            cur = self.norm(ffn_inp, tensor_name(T.FFN_NORM, il), il)
            if self.moe is not None and il >= self.n_dense_lead:
                cur = self.moe(g, self._need, self._w, self.lora, cur, il)
            else:
                cur = self.ffn(cur, il)
            x = B.add(ffn_inp, cur, name=f"l_out-{il}")
        cur = self.norm(x, OUTPUT_NORM_LFM2, -1)
        out_w = self._w(OUTPUT) or self._need(TOKEN_EMBD)
        cur = self.lora.mm(out_w, cur, name="result_output")
        g.expand(cur)
        self.out.logits = cur
        return self.out
