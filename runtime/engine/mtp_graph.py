"""The MTP draft context's graph and reserve: what llama-server allocates for `--spec-type draft-mtp`
without `-md` beside the target's own context.

llama-server makes a second llama_context on the target's model (common/speculative.cpp
common_speculative_init_result: ctx_type LLAMA_CONTEXT_TYPE_MTP, n_ctx the target's resolved
n_ctx, the target's -b/-ub/-np/-fa/-kvu, the -ctkd/-ctvd cache types, n_outputs_max = -np). Its
memory is a plain KV cache of the nextn blocks alone (llama-model.cpp create_memory: the layer
filter il >= n_layer, whatever cache the trunk uses), on the devices the nextn blocks were loaded
on. Its graph is the architecture's LLM_GRAPH_TYPE_DECODER_MTP head (graph_mtp of src/models/qwen35.cpp,
qwen35moe.cpp, qwen3next.cpp, glm4-moe.cpp, hy-v3.cpp, deepseek2.cpp, deepseek32.cpp, glm-dsa.cpp), node for
node:

  mtp_tok_embd = get_rows(nextn.embed_tokens or token_embd, tokens); h = the input mtp_h_input
  concat(rms_norm(tok) * enorm, rms_norm(h) * hnorm) -> nextn.eh_proj -> inpSA
  attn_norm -> the trunk's attention over the MTP cache -> + inpSA
  post-attention norm -> the block's FFN -> + residual
  rms_norm * (nextn.shared_head_norm or output_norm)  (res->t_h_nextn, a graph output)
  get_rows(out_ids) -> nextn.shared_head_head or output (or the tied token_embd)

The attention and FFN are the trunk builder's: qwen35's and qwen3next's gated attention (qwen3next picks the
output rows right after it, before the FFN), glm4moe's and hy_v3's projections and per-head norms (then the
norm the trunk's FFN takes: attn_post_norm, ffn_norm), deepseek2's
absorbed MLA over a K-only cache (MlaMtpGraph; deepseek32's and glm-dsa's head is the same dense MLA, without
their lightning indexer); dense SwiGLU, or the experts with the block's shared expert.

and, because the draft implementation offloads its top-10 sampling to the backend
(common_speculative_impl_draft_mtp: llama_set_sampler per sequence, backend_sampling on by default),
llm_graph_context::build_sampling after it: the logits padded by one row (ggml_pad), and per sequence
a row viewed out, TOP_K 10, and get_rows of the logits at those ids. Setting the samplers makes the
context reserve again; the allocator only grows, so its buffers are the larger of the two reserves.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Generic, TypeVar

from gguf import MODEL_TENSOR as T

from planner.core.errors import BadInput
from planner.llama.settings import LlamaSettings
from planner.model.tensors import OUTPUT, OUTPUT_NORM, TOKEN_EMBD, tensor_name
from runtime.engine.builder import BatchShape, BuiltGraph, DecoderBuilder
from runtime.engine.deepseek2 import MlaBuilder, MlaHParams, concat
from runtime.engine.deepseek4_hparams import Dsv4HParams
from runtime.engine.kvcache import CacheKind, KVCache
from runtime.engine.lora import Adapters
from runtime.engine.qwen3next import QWEN3NEXT, Qwen3NextBuilder
from runtime.engine.qwen35 import QWEN35, QWEN35MOE
from runtime.engine.runner import ModelRunner, ReserveReport
from runtime.ggml import build as B
from runtime.ggml.backend import alloc_tensors
from runtime.ggml.fused_ops import pad
from runtime.ggml.graph import FLAG_OUTPUT, BufferUsage, GGMLType, Graph, Op, Tensor

GLM4MOE = "glm4moe"
DEEPSEEK2 = "deepseek2"
DEEPSEEK32 = "deepseek32"
GLM_DSA = "glm-dsa"
HY_V3 = "hy_v3"
# the architectures whose MTP head the runtime builds (graph_mtp of src/models/<arch>.cpp)
MTP_GRAPHS = frozenset({QWEN35, QWEN35MOE, QWEN3NEXT, GLM4MOE, DEEPSEEK2, DEEPSEEK32, GLM_DSA, HY_V3})
# common_speculative_impl_draft_mtp: the backend sampler chain is one top-k of 10
MTP_SAMPLER_TOP_K = 10


Inner = TypeVar("Inner", DecoderBuilder, MlaBuilder)


class _MtpHead(Generic[Inner]):
    """What the MTP heads share: the trunk builder whose pieces they use (`inner`, its adapters as theirs),
    the nextn block `il`, and the graph's end (the output projection, then the backend sampling)."""

    def __init__(self, inner: Inner, il: int, n_seq: int, samplers: bool) -> None:
        self.inner: Inner = inner
        self.il, self.n_seq, self.samplers = il, n_seq, samplers

    @property
    def lora(self) -> Adapters:
        return self.inner.lora

    @lora.setter
    def lora(self, value: Adapters) -> None:
        self.inner.lora = value

    def _result(self, cur: Tensor, head: Tensor, shape: BatchShape) -> BuiltGraph:
        """result_output = head x cur, the graph's logits, and build_sampling after it when samplers are set."""
        out = self.inner.out
        cur = self.inner.lora.mm(head, cur, name="result_output")
        out.graph.expand(cur)
        out.logits = cur
        if self.samplers:
            sampling(out.graph, cur, shape, self.n_seq)
        return out


class MtpGraph(_MtpHead[DecoderBuilder]):
    """Builds the MTP head of one ubatch with the pieces of the architecture's trunk builder (`inner`)."""

    def __init__(self, inner: DecoderBuilder, il: int, n_seq: int, samplers: bool) -> None:
        super().__init__(inner, il, n_seq, samplers)
        self.rows_early = inner.hp.arch == QWEN3NEXT

    def build(self, shape: BatchShape) -> BuiltGraph:
        b, il = self.inner, self.il
        hp = b.hp
        b._inputs(shape)
        out = b.out
        h = B.new_input(GGMLType.F32, (hp.n_embd, shape.n_tokens), "mtp_h_input")
        embd_w = b._w(tensor_name(T.NEXTN_EMBED_TOKENS, il)) or b._need(TOKEN_EMBD)
        tok = B.get_rows(embd_w, out.tokens, name=f"mtp_tok_embd-{il}")
        h_norm = b.norm(h, tensor_name(T.NEXTN_HNORM, il), il)
        e_norm = b.norm(tok, tensor_name(T.NEXTN_ENORM, il), il)
        cur = b.lora.mm(b._need(tensor_name(T.NEXTN_EH_PROJ, il)), concat(e_norm, h_norm, 0, name=f"mtp_concat-{il}"),
                        name=f"mtp_eh_proj-{il}")
        inp_sa = cur
        cur = b.norm(cur, tensor_name(T.ATTN_NORM, il), il)
        cur = self._attention(cur, shape.n_tokens)
        if self.rows_early:   # qwen3next.cpp graph_mtp: the output rows are picked before the FFN
            cur, inp_sa = B.get_rows(cur, out.out_ids), B.get_rows(inp_sa, out.out_ids)
        cur = B.add(cur, inp_sa, name=f"mtp_attn_residual-{il}")
        residual = cur
        if isinstance(b, Qwen3NextBuilder):
            cur = b._layer_ffn(b.norm(cur, tensor_name(T.ATTN_POST_NORM, il), il), il)
        else:
            cur = b.ffn(b.norm(cur, tensor_name(hp.spec.ffn_norm, il), il), il)
        cur = B.add(cur, residual, name=f"mtp_post_ffn-{il}")
        head_norm = tensor_name(T.NEXTN_SHARED_HEAD_NORM, il)
        cur = b.norm(cur, head_norm if b._w(head_norm) is not None else OUTPUT_NORM, -1)
        cur.flags |= FLAG_OUTPUT   # res->t_h_nextn
        if not self.rows_early:
            cur = B.get_rows(cur, out.out_ids, name="mtp_shared_head_norm")
        head = b._w(tensor_name(T.NEXTN_SHARED_HEAD_HEAD, il)) or b._w(OUTPUT) or b._need(TOKEN_EMBD)
        return self._result(cur, head, shape)

    def _attention(self, cur: Tensor, n_tokens: int) -> Tensor:
        """The block's attention as the trunk builds it: qwen35's gated attention, or (glm4moe) build_qkv with
        its biases, the per-head norms where the file has them, RoPE, build_attn and attn_output."""
        b, il = self.inner, self.il
        if isinstance(b, Qwen3NextBuilder):
            return b._gated_attention(cur, il, n_tokens)
        qkv = b._qkv(cur, il, n_tokens)
        cur = b.attention(il, qkv.q, qkv.k, qkv.v)
        return b.lora.mm(b._need(tensor_name(T.ATTN_OUT, il)), cur, name=f"attn_out-{il}")


def sampling(g: Graph, logits: Tensor, shape: BatchShape, n_seq: int) -> None:
    """llm_graph_context::build_sampling with llama_sampler_top_k_backend_apply: one dummy row padded on,
    then per sequence's sampler a row of it, its top k ids and the logits at them (ggml_build_forward_select
    expands both outputs). A sequence with an output row samples it, one without the dummy row 0."""
    padded = pad(logits, (0, 1), name="logits_padded")
    n_vocab = logits.ne[0]
    for seq in range(n_seq):
        row = seq if seq < shape.n_outputs else 0
        seq_logits = B.view(padded, (n_vocab,), None, row * padded.nb[1], name=f"logits_seq_{seq}_0")
        top = Tensor(GGMLType.I32, (MTP_SAMPLER_TOP_K, 1, 1, 1), name="top_k", op=Op.TOP_K,
                     src=[seq_logits], op_params={"k": MTP_SAMPLER_TOP_K})
        rows = B.get_rows(B.reshape(seq_logits, (1, n_vocab)), top, name="top_k_rows")
        g.expand(logits)
        g.expand(rows)


class MlaMtpGraph(_MtpHead[MlaBuilder]):
    """deepseek2.cpp graph_mtp: the same head around a block of absorbed MLA (q_a, its norm, q_b viewed into
    the nope and rope parts, the compressed KV and its rope part) over a K-only cache, and the block's
    experts plus the shared expert, with MlaBuilder's pieces."""

    def build(self, shape: BatchShape) -> BuiltGraph:
        b, il = self.inner, self.il
        b._inputs(shape)
        out = b.out
        h = B.new_input(GGMLType.F32, (b.hp.n_embd, shape.n_tokens), "mtp_h_input")
        embd_w = b.w.get(tensor_name(T.NEXTN_EMBED_TOKENS, il)) or b._need(TOKEN_EMBD)
        tok = B.get_rows(embd_w, out.tokens, name=f"mtp_tok_embd-{il}")
        h_norm = b.norm(h, b._wl(T.NEXTN_HNORM, il), il, f"mtp_hnorm-{il}")
        e_norm = b.norm(tok, b._wl(T.NEXTN_ENORM, il), il, f"mtp_enorm-{il}")
        cur = b.lora.mm(b._wl(T.NEXTN_EH_PROJ, il), concat(e_norm, h_norm, 0, name=f"mtp_concat-{il}"),
                        name=f"mtp_eh_proj-{il}")
        inp_sa = cur
        cur = b.norm(cur, b._wl(T.ATTN_NORM, il), il, f"mtp_attn_norm-{il}")
        q = B.mul_mat(b._wl(T.ATTN_Q_A, il), cur, name=f"mtp_q_a-{il}")
        q = b.norm(q, b._wl(T.ATTN_Q_A_NORM, il), il, f"mtp_q_a_norm-{il}")
        q = B.mul_mat(b._wl(T.ATTN_Q_B, il), q, name=f"mtp_q_b-{il}")
        cur = b.attention(il, *b._qkv(cur, il, shape.n_tokens, q=q))
        ffn_inp = B.add(cur, inp_sa, name=f"mtp_ffn_inp-{il}")
        cur = b.norm(ffn_inp, b._wl(T.FFN_NORM, il), il, f"mtp_ffn_norm-{il}")
        moe = b._moe(cur, il)
        shared = b._ffn(cur, il, T.FFN_UP_SHEXP, T.FFN_GATE_SHEXP, T.FFN_DOWN_SHEXP, "mtp_ffn_shexp")
        cur = B.add(B.add(moe, shared, name=f"mtp_ffn_out-{il}"), ffn_inp, name=f"mtp_post_ffn-{il}")
        head_norm = b.w.get(tensor_name(T.NEXTN_SHARED_HEAD_NORM, il)) or b._need(OUTPUT_NORM)
        cur = b.norm(cur, head_norm, -1, "h_nextn")
        cur.flags |= FLAG_OUTPUT   # res->t_h_nextn
        cur = B.get_rows(cur, out.out_ids, name="mtp_shared_head_norm")
        head = b.w.get(tensor_name(T.NEXTN_SHARED_HEAD_HEAD, il)) or b.w.get(OUTPUT) or b._need(TOKEN_EMBD)
        return self._result(cur, head, shape)


class MtpRunner(ModelRunner):
    """The MTP context on the target's loaded model: its own scheduler, a KV cache of the nextn blocks and
    the MTP head's graphs. `settings`: the target's flags with the context's cache types and n_ctx."""

    def __init__(self, settings: LlamaSettings, n_outputs_max: int, samplers: bool = True) -> None:
        super().__init__(settings, {}, n_outputs_max)
        facts = settings.ctx.facts
        arch = settings.ctx.model.architecture
        if arch not in MTP_GRAPHS:
            raise BadInput(f"the runtime has no MTP head for {arch}")
        nextn = [lf for lf in facts.layers if lf.nextn]
        if len(nextn) != 1:   # graph_mtp asserts n_layer_nextn == 1
            raise BadInput(f"{arch}'s MTP head runs one nextn block; the file has {len(nextn)}")
        self.il = nextn[0].index
        self.samplers = samplers
        if isinstance(self.hp, MlaHParams):   # its heads and windows follow n_layer: one K-only head a block
            # deepseek32 / glm-dsa: the draft head runs dense MLA, no lightning indexer (create_memory's comment)
            self.hp = replace(self.hp, n_layer=len(facts.layers), index_full=())
            return
        assert not isinstance(self.hp, Dsv4HParams)   # dsv4: deepseek4 is not in MTP_GRAPHS
        heads = tuple(lf.n_head_kv for lf in facts.layers)
        routing = self.hp.routing
        if routing is not None:   # the nextn block routes experts where it has a router (glm4moe asserts one)
            names = {t.name for t in settings.ctx.model.tensors}
            moe = tuple(tensor_name(T.FFN_GATE_INP, lf.index) in names for lf in nextn)
            routing = replace(routing, moe_layers=routing.moe_layers + moe)
        self.hp = replace(self.hp, n_head_kv=heads, swa=(False,) * len(heads), routing=routing)

    def alloc_kv(self) -> None:
        """llama_kv_cache with the layer filter il >= n_layer: K and V of the nextn block alone, on its device."""
        hp, cp, settings = self.hp, self.cp, self.settings
        assert not isinstance(hp, Dsv4HParams)   # dsv4: deepseek4 is not in MTP_GRAPHS
        width = hp.n_embd_gqa(self.il)
        n_all = len(hp.n_head_kv)
        k_only = isinstance(hp, MlaHParams)   # an MLA cache holds K; V is a view of it
        self.auto_fa_off = self.flags.flash_attn == "auto" and not cp.flash_attn
        self.kv = KVCache([width] * n_all, [False] * n_all, {CacheKind.BASE: cp.n_ctx_seq}, 0,
                          v_trans=not cp.flash_attn and not self.auto_fa_off and not k_only, type_k=settings.type_k,
                          type_v=settings.type_v, n_stream=cp.n_stream, head_dim=hp.head_dim)
        dev = self.placement.layer_device[self.il] if self.flags.kv_offload else "CPU"
        tensors = [self.kv.k[self.il]] + ([] if k_only else [self.kv.v[self.il]])
        buffers = alloc_tensors(self.backends[dev].buffer_type, tensors, BufferUsage.ANY)
        self.kv_bytes[dev] = sum(x.size for x in buffers)

    def _builder(self) -> MtpGraph | MlaMtpGraph:   # type: ignore[override]
        inner = super()._builder()
        if isinstance(inner, MlaBuilder):
            return MlaMtpGraph(inner, self.il, self.cp.n_seq, self.samplers)
        assert isinstance(inner, DecoderBuilder)
        return MtpGraph(inner, self.il, self.cp.n_seq, self.samplers)

    def reserve(self, dry_run: bool = False) -> ReserveReport:
        """The context's first sched_reserve (no samplers yet), then the one llama_set_sampler triggers."""
        if not self.samplers:
            return super().reserve(dry_run)
        self.samplers = False
        super().reserve(dry_run)
        self.samplers = True
        self._graphs.clear()
        return super().reserve(dry_run)
