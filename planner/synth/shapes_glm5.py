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

from planner.synth.gguf_factory import ModelSpec, Q
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
