"""DeepSeek-V4 (deepseek4) files as the pinned llama.cpp loads them: a tiny layout for graph and cache checks
and a shape-faithful DeepSeek-V4-Flash.

The layout follows load_arch_tensors of src/models/deepseek4.cpp: per block a query LoRA, one shared K/V
head (attn_kv, K only in the cache), grouped low-rank output (attn_output_a/b), attention sinks, the
hyper-connection mixers (hc_attn_*, hc_ffn_*) and, by the block's compress ratio (attention.compress_ratios:
0 none, 4 CSA with a lightning indexer, 128 HCA), the compressor's and the indexer's tensors; every block is
MoE with one shared expert, the first hash_layer_count blocks routed by token id (ffn_gate_tid2eid) instead
of a selection bias. Keys as conversion/deepseek.py (DeepseekV4Model.set_gguf_parameters) writes them; the
main file carries no MTP block (the converter skips mtp.* unless exporting MTP alone).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType, Keys

from planner.gguf.keys import (
    LLM_KV_ATTENTION_COMPRESS_RATIOS,
    LLM_KV_ATTENTION_COMPRESS_ROPE_FREQ_BASE,
    LLM_KV_ATTENTION_INDEXER_TYPES,
    LLM_KV_ATTENTION_OUTPUT_GROUP_COUNT,
    LLM_KV_ATTENTION_OUTPUT_LORA_RANK,
    LLM_KV_HASH_LAYER_COUNT,
    LLM_KV_HC_COUNT,
    LLM_KV_HC_EPSILON,
    LLM_KV_HC_MAGNITUDE,
    LLM_KV_HC_SINKHORN_ITERATIONS,
    LLM_KV_SWIGLU_CLAMP_SHEXP,
)
from planner.synth.gguf_factory import ModelSpec, Typed, deepseek2_spec
from planner.synth.shapes_common import tokenized

# llama-hparams.h: LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS, the only routing deepseek4's loader accepts
GATING_SQRT_SOFTPLUS = 4
_ARRAY, _U32 = GGUFValueType.ARRAY, GGUFValueType.UINT32


def deepseek4_spec(*, n_embd: int, n_head: int, head_dim: int, rope_dim: int, q_lora: int, o_groups: int,
                   o_lora: int, ratios: Sequence[int], n_expert: int, n_expert_used: int, n_ff_exp: int,
                   n_index_head: int, index_head: int, index_top_k: int, window: int, hc_mult: int,
                   n_hash: int, n_vocab: int, mat: Q = Q.Q8_0) -> ModelSpec:
    """A deepseek4 file of len(ratios) blocks, matrices of type `mat` (F32 norms, vectors and mixers)."""
    n_layer = len(ratios)
    md: dict[str, object] = {
        Keys.LLM.BLOCK_COUNT: n_layer, Keys.LLM.EMBEDDING_LENGTH: n_embd, Keys.LLM.VOCAB_SIZE: n_vocab,
        Keys.LLM.CONTEXT_LENGTH: 4096, Keys.General.FILE_TYPE: 15,
        Keys.Attention.LAYERNORM_RMS_EPS: 1e-6, Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: 1,
        Keys.Attention.KEY_LENGTH: head_dim, Keys.Attention.VALUE_LENGTH: head_dim,
        Keys.Rope.DIMENSION_COUNT: rope_dim, Keys.Rope.FREQ_BASE: 10000.0,
        Keys.Attention.Q_LORA_RANK: q_lora, Keys.Attention.SLIDING_WINDOW: window,
        Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp, Keys.LLM.EXPERT_SHARED_COUNT: 1,
        Keys.LLM.EXPERT_WEIGHTS_SCALE: 1.5, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
        Keys.LLM.EXPERT_GATING_FUNC: GATING_SQRT_SOFTPLUS,
        Keys.LLM.SWIGLU_CLAMP_EXP: [10.0] * n_layer, LLM_KV_SWIGLU_CLAMP_SHEXP: [10.0] * n_layer,
        Keys.Attention.Indexer.HEAD_COUNT: n_index_head, Keys.Attention.Indexer.KEY_LENGTH: index_head,
        Keys.Attention.Indexer.TOP_K: index_top_k,
        LLM_KV_ATTENTION_OUTPUT_GROUP_COUNT: o_groups, LLM_KV_ATTENTION_OUTPUT_LORA_RANK: o_lora,
        LLM_KV_ATTENTION_COMPRESS_RATIOS: Typed(list(ratios), _ARRAY, _U32),
        LLM_KV_ATTENTION_COMPRESS_ROPE_FREQ_BASE: 160000.0, LLM_KV_HC_COUNT: hc_mult,
        LLM_KV_HC_SINKHORN_ITERATIONS: 20, LLM_KV_HC_EPSILON: 1e-6, LLM_KV_HASH_LAYER_COUNT: n_hash,
        Keys.LLM.EMBEDDING_LENGTH_OUT: hc_mult * n_embd,
    }
    hc_dim, mix = hc_mult * n_embd, (2 + hc_mult) * hc_mult
    t: list[tuple[str, Q, tuple[int, ...]]] = [
        ("token_embd.weight", mat, (n_embd, n_vocab)), ("output_norm.weight", Q.F32, (n_embd,)),
        ("output.weight", mat, (n_embd, n_vocab)), ("output_hc_fn.weight", Q.F32, (hc_dim, hc_mult)),
        ("output_hc_base.weight", Q.F32, (hc_mult,)), ("output_hc_scale.weight", Q.F32, (1,)),
    ]
    for i, ratio in enumerate(ratios):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", Q.F32, (n_embd,)), (b + "attn_sinks.weight", Q.F32, (n_head,)),
              (b + "attn_q_a.weight", mat, (n_embd, q_lora)), (b + "attn_q_a_norm.weight", Q.F32, (q_lora,)),
              (b + "attn_q_b.weight", mat, (q_lora, n_head * head_dim)),
              (b + "attn_kv.weight", mat, (n_embd, head_dim)), (b + "attn_kv_a_norm.weight", Q.F32, (head_dim,)),
              # the file stores attn_output_a 2-D; the loader reshapes it to {.., o_lora, o_groups}
              (b + "attn_output_a.weight", mat, (n_head * head_dim // o_groups, o_lora * o_groups)),
              (b + "attn_output_b.weight", mat, (o_groups * o_lora, n_embd))]
        for part in ("attn", "ffn"):
            t += [(b + f"hc_{part}_fn.weight", Q.F32, (hc_dim, mix)), (b + f"hc_{part}_base.weight", Q.F32, (mix,)),
                  (b + f"hc_{part}_scale.weight", Q.F32, (3,))]
        if ratio:
            coff = 2 if ratio == 4 else 1
            t += [(b + "attn_compressor_kv.weight", mat, (n_embd, coff * head_dim)),
                  (b + "attn_compressor_gate.weight", mat, (n_embd, coff * head_dim)),
                  (b + "attn_compressor_ape.weight", Q.F32, (coff * head_dim, ratio)),
                  (b + "attn_compressor_norm.weight", Q.F32, (head_dim,))]
        if ratio == 4:
            t += [(b + "indexer.proj.weight", mat, (n_embd, n_index_head)),
                  (b + "indexer.attn_q_b.weight", mat, (q_lora, n_index_head * index_head)),
                  (b + "indexer_compressor_kv.weight", mat, (n_embd, 2 * index_head)),
                  (b + "indexer_compressor_gate.weight", mat, (n_embd, 2 * index_head)),
                  (b + "indexer_compressor_ape.weight", Q.F32, (2 * index_head, ratio)),
                  (b + "indexer_compressor_norm.weight", Q.F32, (index_head,))]
        t.append((b + "ffn_gate_inp.weight", Q.F32, (n_embd, n_expert)))
        t.append((b + "ffn_gate_tid2eid.weight", Q.I32, (n_expert_used, n_vocab)) if i < n_hash
                 else (b + "exp_probs_b.bias", Q.F32, (n_expert,)))
        t += [(b + "ffn_norm.weight", Q.F32, (n_embd,)),
              (b + "ffn_gate_exps.weight", mat, (n_embd, n_ff_exp, n_expert)),
              (b + "ffn_down_exps.weight", mat, (n_ff_exp, n_embd, n_expert)),
              (b + "ffn_up_exps.weight", mat, (n_embd, n_ff_exp, n_expert)),
              (b + "ffn_gate_shexp.weight", mat, (n_embd, n_ff_exp)),
              (b + "ffn_down_shexp.weight", mat, (n_ff_exp, n_embd)),
              (b + "ffn_up_shexp.weight", mat, (n_embd, n_ff_exp))]
    return ModelSpec("deepseek4", md, t)


def _q4_k_m(spec: ModelSpec, n_layer: int) -> ModelSpec:
    """Q4_K_M-like types over a Q8_0 spec: Q4_K, Q6_K for the output and for the expert down-projections of
    llama-quantize's use_more_bits layers, Q5_0 / Q8_0 for rows that are not a multiple of 256."""
    more_bits = {i for i in range(n_layer) if i < n_layer // 8 or i >= 7 * n_layer // 8
                 or (i - n_layer // 8) % 3 == 2}
    out = []
    for name, qtype, shape in spec.tensors:
        if qtype is Q.Q8_0:
            m = re.match(r"blk\.(\d+)\.(\w+)\.weight$", name)
            more = m is not None and m.group(2) == "ffn_down_exps" and int(m.group(1)) in more_bits
            qtype = Q.Q6_K if name == "output.weight" or more else Q.Q4_K
            if shape[0] % 256:
                qtype = Q.Q8_0 if qtype is Q.Q6_K else Q.Q5_0
        out.append((name, qtype, shape))
    spec.tensors = out
    return spec


def deepseek4_tiny() -> ModelSpec:
    """Four blocks (no compression, CSA, HCA, CSA), the first hash-routed: every kind of DSV4 cache."""
    spec = deepseek4_spec(n_embd=256, n_head=4, head_dim=128, rope_dim=64, q_lora=128, o_groups=2, o_lora=64,
                          ratios=(0, 4, 128, 4), n_expert=8, n_expert_used=2, n_ff_exp=128, n_index_head=2,
                          index_head=64, index_top_k=16, window=32, hc_mult=4, n_hash=1, n_vocab=1000)
    spec = tokenized(spec, 1000, 4096)
    spec.metadata[Keys.Rope.FREQ_BASE] = 10000.0
    return spec


def deepseek_v4_flash() -> ModelSpec:
    """DeepSeek-V4-Flash (the published config.json): 43 blocks, 4096 wide, 64 heads of 512 (rope 64) over one
    shared K/V head, q_lora 1024, output in 8 groups of rank 1024, compress_ratios [0, 0] + [4, 128] x 20 + [4]
    (the file's 44th entry belongs to the MTP block the main file leaves out), 256 experts (6 used) of 2048
    plus one shared, the first 3 blocks hash-routed, the indexer of 64 heads of 128 keeping the top 512, a
    128-token window, 4 hyper-connection streams, 129280 vocabulary, 1M positions."""
    ratios = (0, 0) + (4, 128) * 20 + (4,)
    spec = deepseek4_spec(n_embd=4096, n_head=64, head_dim=512, rope_dim=64, q_lora=1024, o_groups=8, o_lora=1024,
                          ratios=ratios, n_expert=256, n_expert_used=6, n_ff_exp=2048, n_index_head=64,
                          index_head=128, index_top_k=512, window=128, hc_mult=4, n_hash=3, n_vocab=129280)
    spec.metadata[LLM_KV_ATTENTION_COMPRESS_RATIOS] = Typed([*ratios, 0], _ARRAY, _U32)
    spec = tokenized(_q4_k_m(spec, len(ratios)), 129280, 1048576)
    spec.metadata[Keys.Rope.FREQ_BASE] = 10000.0
    return spec


# --- hy_v4 (src/models/hy-v4.cpp): deepseek2's MLA and MoE with gated attention output, sinks, iHC streams ---
GATING_SIGMOID = 2


def hy_v4_spec(*, n_layer: int, n_dense_lead: int, n_embd: int, n_head: int, q_lora: int, kv_lora: int,
               qk_nope: int, qk_rope: int, v_head: int, n_ff: int, n_expert: int, n_expert_used: int, n_ff_exp: int,
               n_vocab: int, hc_mult: int, indexer_full: Sequence[bool] | None, n_index_head: int = 0,
               index_head: int = 0, index_top_k: int = 0, mat: Q = Q.Q8_0) -> ModelSpec:
    """A hy_v4 file as conversion/hy_v4.py writes it: deepseek2_spec's MLA blocks (one KV head; wk_b/wv_b split)
    with per block attn_sinks, the gate of the attention output (attn_gate), the iHC mixers (2 x hc_mult wide)
    and, with `indexer_full`, the DSA indexer of the blocks marked full (attention.indexer.types)."""
    spec = deepseek2_spec(n_layer=n_layer, n_dense_lead=n_dense_lead, n_embd=n_embd, n_head=n_head,
                          q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope=qk_nope, qk_rope=qk_rope,
                          v_head_dim=v_head, n_ff=n_ff, n_expert=n_expert, n_expert_used=n_expert_used,
                          n_expert_shared=1, n_ff_exp=n_ff_exp, n_vocab=n_vocab)
    md = dict(spec.metadata)
    md.update({Keys.LLM.EXPERT_GATING_FUNC: GATING_SIGMOID, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
               Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.827, Keys.LLM.SWIGLU_CLAMP_EXP: [10.0] * n_layer,
               LLM_KV_HC_COUNT: hc_mult, LLM_KV_HC_EPSILON: 1e-6, LLM_KV_HC_MAGNITUDE: 2.0})
    if indexer_full is not None:
        md.update({Keys.Attention.Indexer.HEAD_COUNT: n_index_head, Keys.Attention.Indexer.KEY_LENGTH: index_head,
                   Keys.Attention.Indexer.TOP_K: index_top_k,
                   LLM_KV_ATTENTION_INDEXER_TYPES: [bool(x) for x in indexer_full]})
    hc_dim = hc_mult * n_embd
    tensors = [(n, mat if q is Q.Q8_0 else q, s) for n, q, s in spec.tensors]
    tensors += [("output_hc_fn.weight", Q.F32, (hc_dim, hc_mult)), ("output_hc_base.weight", Q.F32, (hc_mult,)),
                ("output_hc_scale.weight", Q.F32, (1,))]
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors += [(b + "attn_sinks.weight", Q.F32, (n_head,)),
                    (b + "attn_gate.weight", mat, (n_embd, n_head * v_head))]
        for part in ("attn", "ffn"):
            tensors += [(b + f"hc_{part}_fn.weight", Q.F32, (hc_dim, 2 * hc_mult)),
                        (b + f"hc_{part}_base.weight", Q.F32, (2 * hc_mult,)),
                        (b + f"hc_{part}_scale.weight", Q.F32, (2,))]
        if indexer_full is not None and indexer_full[i]:
            tensors += [(b + "indexer.attn_q_b.weight", mat, (q_lora, n_index_head * index_head)),
                        (b + "indexer.attn_k.weight", mat, (n_embd, index_head)),
                        (b + "indexer.k_norm.weight", Q.F32, (index_head,)),
                        (b + "indexer.k_norm.bias", Q.F32, (index_head,)),
                        (b + "indexer.proj.weight", mat, (n_embd, n_index_head))]
    return ModelSpec("hy_v4", md, tensors)


def hy_v4_tiny(dsa: bool = True) -> ModelSpec:
    """Four blocks (the first dense), MLA of kv_lora 128 + rope 32; with `dsa` an indexer of 2 heads of 64 owned
    by blocks 0 and 2 (1 and 3 share their top-k), else the full-attention checkpoint (no indexer keys)."""
    spec = hy_v4_spec(n_layer=4, n_dense_lead=1, n_embd=256, n_head=4, q_lora=128, kv_lora=128, qk_nope=64,
                      qk_rope=32, v_head=64, n_ff=512, n_expert=8, n_expert_used=2, n_ff_exp=64, n_vocab=1000,
                      hc_mult=4, indexer_full=(True, False, True, False) if dsa else None, n_index_head=2,
                      index_head=64, index_top_k=16)
    spec = tokenized(spec, 1000, 4096)
    spec.metadata[Keys.Rope.FREQ_BASE] = 10000.0
    return spec


def hy4_preview() -> ModelSpec:
    """Hy4-preview (tencent, the published config.json): 78 blocks (the first dense, n_ff 18432), 6144 wide,
    64 heads, q_lora 2048, kv_lora 512, head 192 nope + 64 rope, v 256, 256 experts (8 used) of 2048 plus one
    shared, 4 iHC streams, the DSA indexer of 32 heads of 128 keeping the top 2048, owned by blocks 0, 1 and every
    fourth from 5 (indexer_types: 21 full, 57 shared), 120832 vocabulary, 1M positions. The converter drops the
    MTP block."""
    n_layer = 78
    full = [il < 2 or (il - 1) % 4 == 0 for il in range(n_layer)]
    spec = hy_v4_spec(n_layer=n_layer, n_dense_lead=1, n_embd=6144, n_head=64, q_lora=2048, kv_lora=512,
                      qk_nope=192, qk_rope=64, v_head=256, n_ff=18432, n_expert=256, n_expert_used=8, n_ff_exp=2048,
                      n_vocab=120832, hc_mult=4, indexer_full=full, n_index_head=32, index_head=128,
                      index_top_k=2048)
    spec.metadata[Keys.Attention.LAYERNORM_RMS_EPS] = 1e-5
    spec = tokenized(_q4_k_m(spec, n_layer), 120832, 1048576)
    spec.metadata[Keys.Rope.FREQ_BASE] = 10000000.0
    return spec
