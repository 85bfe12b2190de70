"""Next-token-prediction (MTP, `nextn`) blocks: whether the pinned llama.cpp loads their weights.

A file with `{arch}.nextn_predict_layers` = k keeps k MTP blocks after the trunk (`blk.{n_layer}` ..
`blk.{n_layer_all - 1}`). llama.cpp still counts them as layers when it places layers (load_tensors
assigns a device to each of the n_layer_all blocks, and -ngl counts them), but each architecture's
`load_arch_tensors` (src/models/<arch>.cpp) creates their tensors with TENSOR_SKIP: the loader logs
"model has unused tensor blk.N... -- ignoring" and allocates nothing for them
(llama-model-loader.cpp create_tensor). Two kinds of architecture:

- `MTP_ARCHS` drop the skip when the model is loaded for MTP drafting (`ml.load_mtp`, set by
  common_model_params_to_llama when `--spec-type` lists draft-mtp): the blocks' weights are then
  allocated with the layer they belong to;
- `NEXTN_SKIPPED_ARCHS` skip them always (no MTP implementation).

An architecture in neither table does not create the blocks at all; fitplan keeps their tensors as
loaded there (llama.cpp refuses such a file: "wrong number of tensors").
"""
from __future__ import annotations

from planner.llama.flags import DRAFT_MTP, LlamaFlags

# src/models/<arch>.cpp: `if (!ml.load_mtp) mtp_flags |= TENSOR_SKIP` (or `mtp_flags = !ml.load_mtp ?
# TENSOR_SKIP : 0`); nemotron_h_moe shares nemotron_h's loader
MTP_ARCHS = frozenset({
    "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "glm-dsa", "glm4moe", "glm5-next",
    "hy_v3", "mimo2", "nemotron_h", "nemotron_h_moe", "qwen35", "qwen35moe", "qwen3next", "step35",
})
# src/models/<arch>.cpp: `if (i >= n_layer) flags |= TENSOR_SKIP` whatever load_mtp says
NEXTN_SKIPPED_ARCHS = frozenset({"bailingmoe2", "dots3note", "exaone-moe", "exaone4", "glm4"})

# moe26: tensors of the MTP blocks that load_arch_tensors creates with TENSOR_NOT_REQUIRED alone (no
# mtp_flags), so llama.cpp allocates them whether or not the model is loaded for MTP drafting
# (src/models/hy-v3.cpp load_block: the FFN, router, experts and shared expert; the nextn head tensors;
# step35.cpp load_block_mtp: those and the Q/K norms, the rope factors and the head-wise attention gate).
# Keyed by the tensor name after `blk.N.`, up to its last dot.
NEXTN_ALWAYS_LOADED: dict[str, frozenset[str]] = {
    "hy_v3": frozenset({
        "ffn_gate", "ffn_down", "ffn_up", "ffn_gate_inp", "exp_probs_b", "ffn_gate_exps", "ffn_down_exps",
        "ffn_up_exps", "ffn_gate_up_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
        "nextn.embed_tokens", "nextn.shared_head_head", "nextn.shared_head_norm",
    }),
    "step35": frozenset({
        "attn_q_norm", "attn_k_norm", "rope_freqs", "rope_factors_long", "rope_factors_short", "attn_gate",
        "ffn_gate", "ffn_down", "ffn_up", "ffn_gate_inp", "exp_probs_b", "ffn_gate_exps", "ffn_down_exps",
        "ffn_up_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
        "nextn.embed_tokens", "nextn.shared_head_head", "nextn.shared_head_norm",
    }),
}


def loads_mtp(flags: LlamaFlags) -> bool:
    """llama_model_params.load_mtp: --spec-type lists draft-mtp (common/common.cpp
    common_model_params_to_llama)."""
    return DRAFT_MTP in flags.spec.types


def nextn_loaded(arch: str, load_mtp: bool) -> bool:
    """Whether llama.cpp allocates the weights of this architecture's nextn blocks."""
    if arch in MTP_ARCHS:
        return load_mtp
    return arch not in NEXTN_SKIPPED_ARCHS


def nextn_tensor_loaded(arch: str, name: str) -> bool:
    """Whether an MTP block's tensor `blk.N.<part>.<suffix>` is allocated when its block is not loaded."""
    parts = NEXTN_ALWAYS_LOADED.get(arch)
    if not parts:
        return False
    rest = name.split(".", 2)[-1]
    part, _, suffix = rest.rpartition(".")
    return (part if suffix in ("weight", "bias") else rest) in parts
