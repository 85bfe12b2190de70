"""Files for tests of minimax-m3 (MiniMax Sparse Attention) and glm5-next, laid out as the pinned
llama.cpp's load_arch_tensors creates them (src/models/minimax-m3.cpp, src/models/glm5-next.cpp).

minimax-m3: minimax-m2's attention with per-head Q/K norms and partial RoPE, leading dense blocks, then
sigmoid-gated routed experts with the selection bias and a shared expert; every sparse block carries the
MSA indexer (q_proj {n_embd, heads x key_length}, k_proj {n_embd, key_length}, q/k norms {key_length}).
gguf-py 0.19 names none of the indexer tensors of this layout, so they are spelled as llama-arch.cpp's
LLM_TENSOR_NAMES spells them.
"""
from __future__ import annotations

from dataclasses import replace

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q, T, _common
from planner.synth.shapes_moe import Q4KM, SIGMOID, TINY, MoeLayout, moe_layout, with_tokenizer

# llama-arch.cpp LLM_KV_NAMES (uint32 keys, planner.gguf.keys.LLAMA_CPP_U32_KEYS)
INDEXER_HEAD_COUNT = "{arch}.attention.indexer.head_count"
INDEXER_KEY_LENGTH = "{arch}.attention.indexer.key_length"
INDEXER_TOP_K = "{arch}.attention.indexer.top_k"
INDEXER_BLOCK_SIZE = "{arch}.attention.indexer.block_size"
INDEXER_LOCAL_BLOCKS = "{arch}.attention.indexer.local_blocks"


def minimax_m3_layout(lay: MoeLayout, *, n_index_head: int, index_dim: int, top_k: int, block: int,
                      local: int, index_type: Q, scale: float = 1.0) -> ModelSpec:
    """A minimax-m3 file: `lay`'s decoder (per-head Q/K norms, shared expert n_ff_exp x shared count) plus
    the indexer tensors and keys of every block past the leading dense ones."""
    shared = lay.n_ff_shexp // lay.n_ff_exp
    keys = {Keys.LLM.EXPERT_GATING_FUNC: SIGMOID, Keys.LLM.EXPERT_SHARED_COUNT: shared,
            Keys.LLM.EXPERT_WEIGHTS_NORM: True, Keys.LLM.EXPERT_WEIGHTS_SCALE: scale,
            INDEXER_HEAD_COUNT: n_index_head, INDEXER_KEY_LENGTH: index_dim, INDEXER_TOP_K: top_k,
            INDEXER_BLOCK_SIZE: block, INDEXER_LOCAL_BLOCKS: local}
    spec = moe_layout("minimax-m3", replace(lay, qk_norm="head", probs_bias=True), keys)
    for il in range(lay.n_dense_lead, lay.n_layer):
        spec.tensors += [(f"blk.{il}.indexer.q_proj.weight", index_type, (lay.n_embd, n_index_head * index_dim)),
                         (f"blk.{il}.indexer.k_proj.weight", index_type, (lay.n_embd, index_dim)),
                         (f"blk.{il}.indexer.q_norm.weight", Q.F32, (index_dim,)),
                         (f"blk.{il}.indexer.k_norm.weight", Q.F32, (index_dim,))]
    return spec


def tiny_minimax_m3() -> ModelSpec:
    """3 blocks 256 wide (block 0 dense), 4 heads (2 KV) of 64 with 32 rotated, 4 experts of 64 (2 used) and
    one shared; an indexer of 2 heads (one per KV group, as the MSA graph asserts) of 32, blocks of 64
    positions, the top 2 kept and 1 local."""
    lay = replace(TINY, n_rot=TINY.head_dim // 2, n_dense_lead=1, n_ff_shexp=TINY.n_ff_exp)
    spec = minimax_m3_layout(lay, n_index_head=2, index_dim=32, top_k=2, block=64, local=1, index_type=Q.Q8_0)
    return with_tokenizer(spec, 1000, 4096, 10000.0)


def minimax_m3_spec() -> ModelSpec:
    """MiniMax-M3 (published config.json of its text model): 60 blocks 6144 wide, 64 heads (4 KV) of 128 with 64
    rotated, the first 3 blocks dense (12288) and without the indexer, then 128 experts of 3072 (4 used,
    sigmoid with the selection bias, routed scale 2) and one shared expert of 3072; MSA indexer of 4 heads of
    128 over blocks of 128 positions, the top 16 kept and 1 local; vocabulary 200064, context 524288, RoPE base
    5e6. Q4_K_M-like types; the indexer projections stay F32 as convert_hf_to_gguf writes them and
    llama-quantize keeps them (src/llama-quant.cpp)."""
    lay = replace(Q4KM, n_layer=60, n_embd=6144, n_head=64, n_head_kv=4, head_dim=128, n_rot=64, n_ff=12288,
                  n_expert=128, n_expert_used=4, n_ff_exp=3072, n_ff_shexp=3072, n_vocab=200064, n_dense_lead=3,
                  down_type=Q.Q6_K)
    spec = minimax_m3_layout(lay, n_index_head=4, index_dim=128, top_k=16, block=128, local=1, index_type=Q.F32,
                             scale=2.0)
    return with_tokenizer(spec, 200064, 524288, 5000000.0)


# --- glm5-next (GLM-5.3-Flash): KDA and MLA+kpool-indexer blocks, 4 hyper-connection streams, MoE ----------------
HC_COUNT = 4   # glm5-next.cpp asserts hyper_connection.count == 4


def glm5_next_layout(*, kv_heads: tuple[int, ...], n_dense_lead: int, n_embd: int, n_head: int, kda_head: int,
                     d_conv: int, q_lora: int, kv_lora: int, qk_nope: int, qk_rope: int, v_head: int,
                     n_index_head: int, index_dim: int, top_k: int, kpool: int, n_ff: int, n_expert: int,
                     n_expert_used: int, n_ff_exp: int, n_vocab: int, mat: Q, exp: Q, down: Q,
                     small: Q | None = None, n_nextn: int = 0, extra: dict | None = None) -> ModelSpec:
    """A glm5-next file as load_arch_tensors creates it: a KDA block where head_count_kv is 0, else an MLA block
    with the k-pool indexer; every trunk block with its hyper-connection mixers; dense FFNs first, then experts.
    `small`: the type of the KDA gates' kda_head-wide rows (f_b, g_b; `mat` when None). The last `n_nextn` blocks
    are MTP blocks (MLA, indexer and experts without mixers, plus the nextn head); `extra`: more metadata."""
    arch = "glm5-next"
    small = small or mat
    spec = ModelSpec(arch)
    _common(spec, len(kv_heads), n_embd, n_vocab)
    mix = (2 + HC_COUNT) * HC_COUNT
    spec.metadata.update({
        Keys.LLM.FEED_FORWARD_LENGTH: n_ff, Keys.Attention.HEAD_COUNT: n_head,
        Keys.Attention.HEAD_COUNT_KV: list(kv_heads), Keys.LLM.LEADING_DENSE_BLOCK_COUNT: n_dense_lead,
        Keys.Attention.Q_LORA_RANK: q_lora, Keys.Attention.KV_LORA_RANK: kv_lora,
        Keys.Attention.KEY_LENGTH: kv_lora + qk_rope, Keys.Attention.VALUE_LENGTH: kv_lora,
        Keys.Attention.KEY_LENGTH_MLA: qk_nope + qk_rope, Keys.Attention.VALUE_LENGTH_MLA: v_head,
        Keys.Rope.DIMENSION_COUNT: qk_rope, Keys.SSM.CONV_KERNEL: d_conv, Keys.KDA.HEAD_DIM: kda_head,
        Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: n_ff_exp, Keys.LLM.EXPERT_COUNT: n_expert,
        Keys.LLM.EXPERT_USED_COUNT: n_expert_used, Keys.LLM.EXPERT_SHARED_COUNT: 1,
        INDEXER_HEAD_COUNT: n_index_head, INDEXER_KEY_LENGTH: index_dim, INDEXER_TOP_K: top_k,
        "{arch}.attention.indexer.kpool": kpool, "{arch}.hyper_connection.count": HC_COUNT,
        "{arch}.hyper_connection.sinkhorn_iterations": 20, "{arch}.hyper_connection.epsilon": 1e-6,
        **({Keys.LLM.NEXTN_PREDICT_LAYERS: n_nextn} if n_nextn else {}), **(extra or {}),
    })
    spec.metadata = {k.format(arch=arch) if "{arch}" in k else k: v for k, v in spec.metadata.items()}
    spec.add(T.TOKEN_EMBD, mat, (n_embd, n_vocab))
    spec.add(T.OUTPUT_NORM, Q.F32, (n_embd,))
    spec.add(T.OUTPUT, Q.Q6_K if mat != Q.Q8_0 else Q.Q8_0, (n_embd, n_vocab))
    d_inner = kda_head * n_head
    n_trunk = len(kv_heads) - n_nextn
    for i, kv in enumerate(kv_heads):
        t: list[tuple[str, Q, tuple[int, ...]]] = [
            ("attn_norm.weight", Q.F32, (n_embd,)), ("ffn_norm.weight", Q.F32, (n_embd,))]
        if i < n_trunk:
            t += [("hc_attn_fn.weight", Q.F32, (HC_COUNT * n_embd, mix)), ("hc_attn_base.weight", Q.F32, (mix,)),
                  ("hc_attn_scale.weight", Q.F32, (3,)), ("hc_ffn_fn.weight", Q.F32, (HC_COUNT * n_embd, mix)),
                  ("hc_ffn_base.weight", Q.F32, (mix,)), ("hc_ffn_scale.weight", Q.F32, (3,))]
        if kv == 0:   # KDA
            t += [(f"ssm_conv1d_{p}.weight", Q.F32, (d_conv, 1, d_inner)) for p in "qkv"]
            t += [(f"attn_{p}.weight", mat, (n_embd, d_inner)) for p in "qkv"]
            t += [("ssm_f_a.weight", mat, (n_embd, kda_head)), ("ssm_f_b.weight", small, (kda_head, d_inner)),
                  ("ssm_beta.weight", Q.F32, (n_embd, n_head)), ("ssm_a", Q.F32, (n_head,)),
                  ("ssm_dt.bias", Q.F32, (d_inner,)), ("ssm_g_a.weight", mat, (n_embd, kda_head)),
                  ("ssm_g_b.weight", small, (kda_head, d_inner)), ("ssm_norm.weight", Q.F32, (kda_head,)),
                  ("attn_output.weight", mat, (d_inner, n_embd))]
        else:         # MLA with the k-pool indexer
            t += [("attn_q_a_norm.weight", Q.F32, (q_lora,)), ("attn_kv_a_norm.weight", Q.F32, (kv_lora,)),
                  ("attn_q_a.weight", mat, (n_embd, q_lora)),
                  ("attn_q_b.weight", mat, (q_lora, n_head * (qk_nope + qk_rope))),
                  ("attn_kv_a_mqa.weight", mat, (n_embd, kv_lora + qk_rope)),
                  ("attn_k_b.weight", Q.F16, (qk_nope, kv_lora, n_head)),
                  ("attn_v_b.weight", Q.F16, (kv_lora, v_head, n_head)),
                  ("attn_output.weight", mat, (n_head * v_head, n_embd)),
                  ("indexer.k_norm.weight", Q.F32, (index_dim,)), ("indexer.k_norm.bias", Q.F32, (index_dim,)),
                  ("indexer.proj.weight", Q.F32, (n_embd, n_index_head)),
                  ("indexer.attn_k.weight", Q.F32, (n_embd, index_dim)),
                  ("indexer.attn_q_b.weight", Q.F32, (q_lora, n_index_head * index_dim)),
                  ("indexer_compressor_gate.weight", Q.F32, (n_embd, index_dim)),
                  ("indexer_compressor_ape.weight", Q.F32, (index_dim, kpool))]
        if i < n_dense_lead:
            t += [("ffn_gate.weight", mat, (n_embd, n_ff)), ("ffn_down.weight", down, (n_ff, n_embd)),
                  ("ffn_up.weight", mat, (n_embd, n_ff))]
        else:
            t += [("ffn_gate_inp.weight", Q.F32, (n_embd, n_expert)), ("exp_probs_b.bias", Q.F32, (n_expert,)),
                  ("ffn_gate_exps.weight", exp, (n_embd, n_ff_exp, n_expert)),
                  ("ffn_down_exps.weight", down, (n_ff_exp, n_embd, n_expert)),
                  ("ffn_up_exps.weight", exp, (n_embd, n_ff_exp, n_expert)),
                  ("ffn_gate_shexp.weight", mat, (n_embd, n_ff_exp)),
                  ("ffn_down_shexp.weight", down, (n_ff_exp, n_embd)),
                  ("ffn_up_shexp.weight", mat, (n_embd, n_ff_exp))]
        if i >= n_trunk:
            t += [("nextn.eh_proj.weight", mat, (2 * n_embd, n_embd)), ("nextn.enorm.weight", Q.F32, (n_embd,)),
                  ("nextn.hnorm.weight", Q.F32, (n_embd,)), ("nextn.shared_head_norm.weight", Q.F32, (n_embd,))]
        spec.tensors += [(f"blk.{i}.{name}", q, shape) for name, q, shape in t]
    return spec


def tiny_glm5_next() -> ModelSpec:
    """4 blocks 256 wide: KDA, MLA, KDA, MLA (block 0 dense); 4 heads, KDA heads of 64 with a 4-wide conv; MLA
    latent 128 without RoPE (glm5-next asserts it); an indexer of 4 heads of 64 keeping 64 cells pooled by 4;
    4 experts of 64 (2 used)."""
    spec = glm5_next_layout(kv_heads=(0, 1, 0, 1), n_dense_lead=1, n_embd=256, n_head=4, kda_head=64, d_conv=4,
                            q_lora=128, kv_lora=128, qk_nope=64, qk_rope=0, v_head=64, n_index_head=4,
                            index_dim=64, top_k=64, kpool=4, n_ff=512, n_expert=4, n_expert_used=2, n_ff_exp=64,
                            n_vocab=1000, mat=Q.Q8_0, exp=Q.Q8_0, down=Q.Q8_0)
    return with_tokenizer(spec, 1000, 4096, 10000.0)


GLM53_FLASH_BLOCKS = 45   # the trunk; one MTP block follows


def glm5_next_spec() -> ModelSpec:
    """GLM-5.3-Flash (published config.json of its text model): 45 blocks 4096 wide and one MTP block; blocks
    3, 7, .. 43 (and the MTP block) MLA with 64 heads (q_lora 1536, kv_lora 512, nope heads of 256, values of
    256, no RoPE) and the k-pool indexer (32 heads of 128, the top 2048 cells in pools of 4), the others KDA with
    64 heads of 128 and a 4-wide conv (gate_lower_bound -5); 3 dense blocks (12288), then 288 experts of 2048 (8
    used, sigmoid with the selection bias, normalised, scaled 2.5) and one shared expert, SwiGLU clamped at 10;
    4 hyper-connection streams; vocabulary 154880, context 1048576. Q4_K_M-like types (Q8_0 for the KDA gates'
    128-wide rows, which are not whole Q4_K blocks)."""
    kv = tuple(1 if i % 4 == 3 else 0 for i in range(GLM53_FLASH_BLOCKS)) + (1,)
    extra = {Keys.LLM.EXPERT_GATING_FUNC: SIGMOID, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
             Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5, Keys.LLM.SWIGLU_CLAMP_EXP: 10.0,
             "{arch}.kda.gate_lower_bound": -5.0, Keys.Attention.LAYERNORM_RMS_EPS: 1e-5}
    spec = glm5_next_layout(kv_heads=kv, n_dense_lead=3, n_embd=4096, n_head=64, kda_head=128, d_conv=4,
                            q_lora=1536, kv_lora=512, qk_nope=256, qk_rope=0, v_head=256, n_index_head=32,
                            index_dim=128, top_k=2048, kpool=4, n_ff=12288, n_expert=288, n_expert_used=8,
                            n_ff_exp=2048, n_vocab=154880, mat=Q.Q4_K, exp=Q.Q4_K, down=Q.Q6_K, small=Q.Q8_0,
                            n_nextn=1, extra=extra)
    return with_tokenizer(spec, 154880, 1048576, 10000.0)
