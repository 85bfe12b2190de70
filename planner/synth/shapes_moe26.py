"""Files for tests of step35, mimo2 and hy_v3: tiny layouts and shape-faithful ones of real models, laid
out as the pinned llama.cpp's load_arch_tensors creates each architecture's tensors
(src/models/{step35,mimo2,hy-v3}.cpp).

hy_v3 is `shapes_moe.moe_layout`'s decoder (per-head Q/K norms, sigmoid routing with the selection bias, a
shared expert, leading dense blocks found by their lack of a router). The `*_spec` functions give real models'
widths, heads, vocabularies and Q4_K_M-like tensor types (published config.json of each model).
"""
from __future__ import annotations

from dataclasses import replace

from gguf import Keys

from planner.synth.gguf_factory import ModelSpec, Q, T, tname
from planner.synth.shapes_moe import Q4KM, TINY, MoeLayout, moe_layout, with_tokenizer

SIGMOID = 2   # expert_gating_func (llama-hparams.h LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID)


# --- hy_v3 (src/models/hy-v3.cpp) ---------------------------------------------------------------------
def tiny_hy_v3() -> ModelSpec:
    """Three blocks, block 0 dense, Q/K norms per head, sigmoid routing with the selection bias, normalised
    and scaled weights, a shared expert, one MTP block after the trunk."""
    lay = replace(TINY, qk_norm="head", n_dense_lead=1, n_ff_shexp=TINY.n_ff_exp, probs_bias=True, n_nextn=1)
    keys = {Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5, Keys.LLM.EXPERT_WEIGHTS_NORM: True}
    spec = moe_layout("hy_v3", lay, keys)
    # hy-v3.cpp reads no leading_dense_block_count: a block without ffn_gate_inp is dense
    del spec.metadata[Keys.LLM.LEADING_DENSE_BLOCK_COUNT]
    return with_tokenizer(_bare_probs_bias(spec), 1000, 4096, 10000.0)


def _bare_probs_bias(spec: ModelSpec) -> ModelSpec:
    """hy-v3.cpp creates the selection bias as tn(FFN_EXP_PROBS_B, i): blk.N.exp_probs_b, no ".bias"."""
    spec.tensors[:] = [(name.removesuffix(".bias") if name.endswith(".exp_probs_b.bias") else name, q, shape)
                       for name, q, shape in spec.tensors]
    return spec


TINY_SPECS = {
    "hy_v3": tiny_hy_v3,
}


# --- shape-faithful files (published config.json; Q4_K_M-like types) ------------------------------------
def hy3_preview_spec() -> ModelSpec:
    """Hy3-preview (tencent/Hy3-preview): 80 blocks 4096 wide and its MTP block (block_count 81), 64 heads
    (8 KV) of 128 with per-head Q/K norms, block 0 dense (13312), then 192 experts of 1536 (8 used, sigmoid with
    the selection bias, normalised, scaled 2.826) and one shared expert of 1536, vocabulary 120832, context
    262144, rope theta 11158840."""
    lay = replace(Q4KM, n_layer=80, n_embd=4096, n_head=64, n_head_kv=8, head_dim=128, n_ff=13312, n_expert=192,
                  n_expert_used=8, n_ff_exp=1536, n_ff_shexp=1536, n_vocab=120832, n_dense_lead=1,
                  qk_norm="head", probs_bias=True, down_type=Q.Q6_K, n_nextn=1)
    keys = {Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.826, Keys.LLM.EXPERT_WEIGHTS_NORM: True,
            Keys.LLM.EXPERT_GATING_FUNC: SIGMOID}
    spec = moe_layout("hy_v3", lay, keys)
    del spec.metadata[Keys.LLM.LEADING_DENSE_BLOCK_COUNT]
    return with_tokenizer(_bare_probs_bias(_moe_mtp_block(spec, lay)), 120832, 262144, 11158840.0)


def _moe_mtp_block(spec: ModelSpec, lay: MoeLayout) -> ModelSpec:
    """The MTP block as Hy3's checkpoint has it: a MoE block like the trunk's (router, selection bias,
    experts, shared expert) and its final norm as nextn.shared_head_norm (conversion/hunyuan.py)."""
    mtp = lay.n_layer
    dense = {tname(k, mtp) for k in (T.FFN_GATE, T.FFN_DOWN, T.FFN_UP)}
    spec.tensors[:] = [t for t in spec.tensors if t[0] not in dense]
    e, n = lay.n_embd, lay.n_expert
    spec.add(T.FFN_GATE_INP, Q.F32, (e, n), mtp)
    spec.add(T.FFN_EXP_PROBS_B, Q.F32, (n,), mtp, "bias")
    spec.add(T.FFN_GATE_EXP, lay.exp_type, (e, lay.n_ff_exp, n), mtp)
    spec.add(T.FFN_DOWN_EXP, lay.down_type, (lay.n_ff_exp, e, n), mtp)
    spec.add(T.FFN_UP_EXP, lay.exp_type, (e, lay.n_ff_exp, n), mtp)
    spec.add(T.FFN_GATE_SHEXP, lay.mat_type, (e, lay.n_ff_shexp), mtp)
    spec.add(T.FFN_DOWN_SHEXP, lay.down_type, (lay.n_ff_shexp, e), mtp)
    spec.add(T.FFN_UP_SHEXP, lay.mat_type, (e, lay.n_ff_shexp), mtp)
    spec.add(T.NEXTN_SHARED_HEAD_NORM, Q.F32, (e,), mtp)
    return spec
