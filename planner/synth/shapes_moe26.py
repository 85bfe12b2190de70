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

from planner.synth.gguf_factory import ModelSpec
from planner.synth.shapes_moe import TINY, moe_layout, with_tokenizer


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
