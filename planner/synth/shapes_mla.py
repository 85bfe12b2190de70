"""Shape-faithful sparse models of the MLA / DSA family (multi-head latent attention): mistral4 and the
layouts its tiny test files share with it.

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

from planner.synth.gguf_factory import ModelSpec, Q, deepseek2_spec
from planner.synth.shapes import tokenized


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
