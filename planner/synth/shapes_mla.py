"""Shape-faithful sparse models of the MLA / DSA family (multi-head latent attention: mistral4, deepseek32,
glm-dsa) and llama4, and the layouts their tiny test files share with them.

Each `*_spec` lays out a published model's dimensions the way the pinned llama.cpp creates its tensors
(load_arch_tensors of the model class; mistral4 is deepseek2's class, src/models/models.h), with the
keys its converter writes (conversion/mistral3.py, conversion/deepseek.py). Types follow the common
Q4_K_M file (Q4_K matrices, Q6_K output and the use_more_bits layers' expert down-projections; rows
that are not a multiple of 256 fall back as llama-quantize falls them back). The peer test
tests/peer/test_arch_mla_peer.py lists them as ArchShape rows.
"""
from __future__ import annotations

import re

from gguf import Keys

from planner.gguf.keys import LLM_KV_ATTENTION_INDEXER_TYPES
from planner.synth.gguf_factory import ModelSpec, Q, T, deepseek2_spec, tname
from planner.synth.shapes_common import tokenized


def mistral4_layout(spec: ModelSpec, *, probs_bias: bool = False) -> ModelSpec:
    """A deepseek2_spec as conversion/mistral3.py writes Mistral 4: architecture mistral4, the experts'
    gate and up stacked into one ffn_gate_up_exps (gate rows first: build_moe_ffn's two views), and,
    unless `probs_bias`, no exp_probs_b (softmax routing without a selection bias)."""
    tensors = []
    for name, qtype, shape in spec.tensors:
        if name.endswith(".ffn_gate_exps.weight") or (not probs_bias and name.endswith(".exp_probs_b.bias")):
            continue
        if name.endswith(".ffn_up_exps.weight"):
            name, shape = name.replace("ffn_up_exps", "ffn_gate_up_exps"), (shape[0], 2 * shape[1], shape[2])
        tensors.append((name, qtype, shape))
    return ModelSpec("mistral4", dict(spec.metadata), tensors)


def _q4_k_m(spec: ModelSpec, n_layer: int) -> ModelSpec:
    """Q4_K_M-like types over a spec whose matrices are Q8_0: Q4_K, Q6_K for the expert down-projections of
    llama-quantize's use_more_bits layers, and Q5_0 / Q8_0 for rows not a multiple of 256 (its fallback)."""
    more_bits = {i for i in range(n_layer) if i < n_layer // 8 or i >= 7 * n_layer // 8
                 or (i - n_layer // 8) % 3 == 2}
    tensors = []
    for name, qtype, shape in spec.tensors:
        if qtype in (Q.Q8_0, Q.F16):
            m = re.match(r"blk\.(\d+)\.(\w+)\.weight$", name)
            more = m is not None and m.group(2) == "ffn_down_exps" and int(m.group(1)) in more_bits
            want = Q.Q6_K if name == "output.weight" or more else Q.Q4_K
            if shape[0] % 256:
                want = Q.Q8_0 if want == Q.Q6_K else Q.Q5_0
            qtype = want
        tensors.append((name, qtype, shape))
    spec.tensors = tensors
    return spec


def mistral_small_4() -> ModelSpec:
    """Mistral-Small-4-119B (mistral4): 36 layers, 4096 wide, 32 heads, q_lora 1024, kv_lora 256, head
    64 nope + 64 rope, v 128, every layer MoE: 128 experts (4 used) of 2048 in 8 groups (1 used) plus one
    shared expert, weights normalised, 131072 vocabulary, 1M positions (the published config.json:
    Mistral4Config's fields). RoPE scaling is left out: it changes no buffer's size."""
    n_layer = 36
    spec = deepseek2_spec(n_layer=n_layer, n_dense_lead=0, n_embd=4096, n_head=32, q_lora_rank=1024,
                          kv_lora_rank=256, qk_nope=64, qk_rope=64, v_head_dim=128, n_ff=12288, n_expert=128,
                          n_expert_used=4, n_expert_shared=1, n_ff_exp=2048, n_vocab=131072)
    spec.metadata.update({Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_WEIGHTS_SCALE: 1.0,
                          Keys.LLM.EXPERT_GROUP_COUNT: 8, Keys.LLM.EXPERT_GROUP_USED_COUNT: 1,
                          Keys.LLM.EXPERT_GATING_FUNC: 1})
    spec = tokenized(_q4_k_m(mistral4_layout(spec), n_layer), 131072, 1048576)
    spec.metadata[Keys.Rope.FREQ_BASE] = 10000.0
    return spec


def dsa_layout(spec: ModelSpec, arch: str, *, n_index_head: int, index_head: int, top_k: int,
               index_full: tuple[int, ...] | None = None) -> ModelSpec:
    """A deepseek2_spec (with query LoRA) as a DSA model: architecture `arch` (deepseek32, glm-dsa), the
    lightning indexer's tensors in every block (load_arch_tensors of src/models/deepseek32.cpp and
    glm-dsa.cpp: k_norm with bias, proj, attn_k, attn_q_b) and its keys; `index_full` writes
    attention.indexer.types (glm-dsa: 1 where a layer owns its indexer cache)."""
    md = dict(spec.metadata)
    n_embd, q_lora = md[Keys.LLM.EMBEDDING_LENGTH], md[Keys.Attention.Q_LORA_RANK]
    md.update({Keys.Attention.Indexer.HEAD_COUNT: n_index_head, Keys.Attention.Indexer.KEY_LENGTH: index_head,
               Keys.Attention.Indexer.TOP_K: top_k})
    md.setdefault(Keys.LLM.EXPERT_GATING_FUNC, 2)
    if index_full is not None:
        md[LLM_KV_ATTENTION_INDEXER_TYPES] = list(index_full)
    tensors = []
    for name, qtype, shape in spec.tensors:
        tensors.append((name, qtype, shape))
        m = re.match(r"blk\.(\d+)\.ffn_norm\.weight$", name)
        if m:
            il = int(m.group(1))
            tensors += [(tname(T.INDEXER_K_NORM, il), Q.F32, (index_head,)),
                        (tname(T.INDEXER_K_NORM, il, "bias"), Q.F32, (index_head,)),
                        (tname(T.INDEXER_PROJ, il), Q.Q8_0, (n_embd, n_index_head)),
                        (tname(T.INDEXER_ATTN_K, il), Q.Q8_0, (n_embd, index_head)),
                        (tname(T.INDEXER_ATTN_Q_B, il), Q.Q8_0, (q_lora, n_index_head * index_head))]
    return ModelSpec(arch, md, tensors)


def _nextn_block(spec: ModelSpec, n_layer: int) -> ModelSpec:
    """The last of the spec's blocks as the converter writes an MTP block (nextn_predict_layers 1): the layer's
    tensors plus eh_proj, enorm, hnorm and shared_head_norm. llama.cpp skips them unless it drafts with MTP."""
    n_embd = spec.metadata[Keys.LLM.EMBEDDING_LENGTH]
    spec.metadata[Keys.LLM.NEXTN_PREDICT_LAYERS] = 1
    spec.tensors += [(tname(T.NEXTN_EH_PROJ, n_layer), Q.Q8_0, (2 * n_embd, n_embd)),
                     (tname(T.NEXTN_ENORM, n_layer), Q.F32, (n_embd,)),
                     (tname(T.NEXTN_HNORM, n_layer), Q.F32, (n_embd,)),
                     (tname(T.NEXTN_SHARED_HEAD_NORM, n_layer), Q.F32, (n_embd,))]
    return spec


def deepseek_v32() -> ModelSpec:
    """DeepSeek-V3.2 (deepseek32): 61 layers (3 dense) plus one MTP block, 7168 wide, 128 heads, q_lora 1536,
    kv_lora 512, head 128 nope + 64 rope, v 128, n_ff 18432, 256 experts (8 used) of 2048 in 8 groups (4 used)
    plus one shared, sigmoid gating with a selection bias, weights normalised and scaled by 2.5, the lightning
    indexer of 64 heads of 128 keeping the top 2048, 129280 vocabulary, 163840 positions (the published
    config.json)."""
    n_layer = 61
    spec = deepseek2_spec(n_layer=n_layer + 1, n_dense_lead=3, n_embd=7168, n_head=128, q_lora_rank=1536,
                          kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head_dim=128, n_ff=18432, n_expert=256,
                          n_expert_used=8, n_expert_shared=1, n_ff_exp=2048, n_vocab=129280)
    spec.metadata.update({Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5,
                          Keys.LLM.EXPERT_GROUP_COUNT: 8, Keys.LLM.EXPERT_GROUP_USED_COUNT: 4,
                          Keys.LLM.EXPERT_GATING_FUNC: 2})
    spec = dsa_layout(spec, "deepseek32", n_index_head=64, index_head=128, top_k=2048)
    spec = tokenized(_q4_k_m(_nextn_block(spec, n_layer), n_layer), 129280, 163840)
    spec.metadata[Keys.Rope.FREQ_BASE] = 10000.0
    return spec


def glm_5() -> ModelSpec:
    """GLM-5 (glm-dsa): 78 layers (3 dense) plus one MTP block, 6144 wide, 64 heads, q_lora 2048, kv_lora 512,
    head 128 nope + 64 rope, v 256, n_ff 12288, 256 experts (8 used) of 2048 plus one shared, sigmoid gating
    with a selection bias, weights normalised and scaled by 2.5, the lightning indexer of 32 heads of 128 at
    every layer (a 202752-position file: glm-dsa.cpp's pre-GLM-5.2 default), 154880 vocabulary (the published
    config.json)."""
    n_layer = 78
    spec = deepseek2_spec(n_layer=n_layer + 1, n_dense_lead=3, n_embd=6144, n_head=64, q_lora_rank=2048,
                          kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head_dim=256, n_ff=12288, n_expert=256,
                          n_expert_used=8, n_expert_shared=1, n_ff_exp=2048, n_vocab=154880)
    spec.metadata.update({Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5,
                          Keys.LLM.EXPERT_GATING_FUNC: 2})
    spec = dsa_layout(spec, "glm-dsa", n_index_head=32, index_head=128, top_k=2048)
    spec = tokenized(_q4_k_m(_nextn_block(spec, n_layer), n_layer), 154880, 202752)
    spec.metadata[Keys.Rope.FREQ_BASE] = 1000000.0
    return spec


def llama4_spec(*, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int, n_ff_exp: int,
                n_expert: int, n_expert_used: int, moe_step: int, n_vocab: int, rope_freqs: bool) -> ModelSpec:
    """llama4 (src/models/llama4.cpp): GQA attention, a routed-expert layer every `moe_step` blocks (its
    experts plus one shared expert of the experts' width), dense SwiGLU FFNs of n_ff elsewhere; keys as
    conversion/llama.py's Llama4Model writes them, with rope_freqs where the file carries llama3 factors."""
    spec = ModelSpec("llama4")
    spec.metadata.update({
        Keys.LLM.BLOCK_COUNT: n_layer, Keys.LLM.EMBEDDING_LENGTH: n_embd, Keys.LLM.CONTEXT_LENGTH: 4096,
        Keys.LLM.VOCAB_SIZE: n_vocab, Keys.Attention.LAYERNORM_RMS_EPS: 1e-5, Keys.General.FILE_TYPE: 15,
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head, Keys.Attention.HEAD_COUNT_KV: n_head_kv,
        Keys.Rope.DIMENSION_COUNT: head_dim, Keys.LLM.EXPERT_COUNT: n_expert, Keys.LLM.EXPERT_USED_COUNT: n_expert_used,
        Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp, Keys.LLM.INTERLEAVE_MOE_LAYER_STEP: moe_step,
    })
    spec.add(T.TOKEN_EMBD, Q.Q8_0, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    spec.add(T.OUTPUT, Q.Q8_0, (n_embd, n_vocab))
    if rope_freqs:
        spec.add(T.ROPE_FREQS, Q.F32, (head_dim // 2,))
    for i in range(n_layer):
        spec.add(T.ATTN_NORM, Q.F32, (n_embd,), i)
        spec.add(T.ATTN_Q, Q.Q8_0, (n_embd, head_dim * n_head), i)
        spec.add(T.ATTN_K, Q.Q8_0, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_V, Q.Q8_0, (n_embd, head_dim * n_head_kv), i)
        spec.add(T.ATTN_OUT, Q.Q8_0, (head_dim * n_head, n_embd), i)
        spec.add(T.FFN_NORM, Q.F32, (n_embd,), i)
        if moe_step > 0 and (i + 1) % moe_step == 0:
            spec.add(T.FFN_GATE_INP, Q.F32, (n_embd, n_expert), i)
            spec.add(T.FFN_GATE_EXP, Q.Q8_0, (n_embd, n_ff_exp, n_expert), i)
            spec.add(T.FFN_DOWN_EXP, Q.Q8_0, (n_ff_exp, n_embd, n_expert), i)
            spec.add(T.FFN_UP_EXP, Q.Q8_0, (n_embd, n_ff_exp, n_expert), i)
            spec.add(T.FFN_GATE_SHEXP, Q.Q8_0, (n_embd, n_ff_exp), i)
            spec.add(T.FFN_DOWN_SHEXP, Q.Q8_0, (n_ff_exp, n_embd), i)
            spec.add(T.FFN_UP_SHEXP, Q.Q8_0, (n_embd, n_ff_exp), i)
        else:
            spec.add(T.FFN_GATE, Q.Q8_0, (n_embd, n_ff), i)
            spec.add(T.FFN_DOWN, Q.Q8_0, (n_ff, n_embd), i)
            spec.add(T.FFN_UP, Q.Q8_0, (n_embd, n_ff), i)
    return spec


def llama4_scout() -> ModelSpec:
    """Llama-4-Scout-17B-16E (llama4): 48 layers, 5120 wide, 40 heads / 8 KV of 128, every layer MoE: 16 experts
    (1 used) of 8192 plus a shared expert, dense width 16384 (unused: no dense layer), 202048 vocabulary, RoPE
    base 500000 with llama3 frequency factors (rope_freqs), 10M positions (the published config.json)."""
    n_layer = 48
    spec = llama4_spec(n_layer=n_layer, n_embd=5120, n_head=40, n_head_kv=8, head_dim=128, n_ff=16384,
                       n_ff_exp=8192, n_expert=16, n_expert_used=1, moe_step=1, n_vocab=202048, rope_freqs=True)
    spec = tokenized(_q4_k_m(spec, n_layer), 202048, 10485760)
    spec.metadata[Keys.Rope.FREQ_BASE] = 500000.0
    return spec
