"""The models llama-server and llama-cli load beside the target, as the pinned llama.cpp derives their settings.

- A drafter (`-md`) gets the target's flags with its own layered on top
  (common/speculative.cpp common_base_params_to_speculative: -devd, -ngld, -otd/-cmoed/-ncmoed,
  -ctkd/-ctvd replace the target's; -c, -np, -b, -ub, -fa, -ts, -sm, -mg, -kvu, -nkvo, --swa-full
  are inherited; a drafter on one -devd device is split by layer even under -sm tensor). Its
  context holds as many cells as the target's (common_speculative_init_result: cparams.n_ctx =
  llama_n_ctx(ctx_tgt)) — no flag caps it, seed 003 §6 — and it keeps one output row per sequence
  (n_outputs_max = -np), or n_max + 1 per sequence when a block drafter (draft-dflash, draft-dspark)
  is enabled (common_base_params_to_speculative, has_block_draft).
- A drafter without an output matrix of its own (DFlash, EAGLE3) runs the target's (llama-context.cpp
  cparams.ctx_other; src/models/dflash.cpp, eagle3.cpp "lm_head from the target model"); its scheduler
  must have a backend for the buffer that matrix lies in (`borrows_target_output`).
- The target's own output rows in llama-server: common_speculative_get_output_limits via
  server_output_limits (tools/server/server-context.cpp): -np x (1 + the longest proposal),
  at most -b, at least 1.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from planner.llama.flags import LlamaFlags, MmprojFlags, SpecFlags
from planner.model.tensors import OUTPUT, TOKEN_EMBD

# common_base_params_to_speculative: the kinds that decode a whole block of draft positions in one pass
BLOCK_DRAFT_TYPES = frozenset({"draft-dflash", "draft-dspark"})
# common/speculative.cpp common_speculative_impl_draft_dflash: the drafter's trained block size and
# DSpark's block layout, read from these keys (16 and anchor-first when absent)
DFLASH_BLOCK_SIZE_KEY = "dflash.block_size"
DFLASH_SAMPLE_FROM_ANCHOR_KEY = "dflash.sample_from_anchor"
DFLASH_DEFAULT_BLOCK_SIZE = 16


# src/llama-arch.cpp llm_arch_supports_rs_rollback: the architectures whose recurrent states keep a drafter's
# rollback rows; llama_context clamps n_rs_seq to 0 for every other ("does not support recurrent partial rollback")
RS_ROLLBACK_ARCHS = frozenset({"kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
                               "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"})


def target_n_rs_seq(arch: str, flags: LlamaFlags) -> int:
    """cparams.n_rs_seq of the target's context: --spec-draft-n-max with a kind that needs rollback rows
    (SpecFlags.n_rs_seq), on an architecture that keeps them (llama-context.cpp)."""
    return flags.spec.n_rs_seq if arch in RS_ROLLBACK_ARCHS else 0


def draft_flags(target: LlamaFlags, n_ctx_target: int) -> LlamaFlags:
    """The drafter's flags, as if they had been given to it alone; `n_ctx_target` is the target
    context's resolved size (llama_n_ctx), which the drafter's context copies."""
    d = target.spec.draft
    devices = d.devices if d.devices is not None else target.devices
    one_device = d.devices is not None and len([x for x in d.devices if x != "none"]) == 1
    return replace(target, n_ctx=n_ctx_target, n_gpu_layers=d.n_gpu_layers, devices=devices,
                   override_args=d.override_args, cache_type_k=d.cache_type_k, cache_type_v=d.cache_type_v,
                   split_mode="layer" if one_device else target.split_mode,
                   spec=SpecFlags(), mmproj=MmprojFlags(), loras=(), ignored=())


def draft_outputs_max(target: LlamaFlags) -> int:
    """n_outputs_max of the drafter's context: one row per sequence, or max(1, n_max + 1) per
    sequence with a block drafter enabled (common_base_params_to_speculative)."""
    if BLOCK_DRAFT_TYPES.intersection(target.spec.types):
        return target.n_parallel * max(1, target.spec.draft.n_max + 1)
    return target.n_parallel


def server_outputs_max(n_batch: int, n_parallel: int, n_draft: int = 0) -> int:
    """The output rows llama-server reserves for its target: min(n_batch, n_parallel * (1 + n_draft)),
    at least 1 (server_output_limits, common_speculative_get_output_limits); llama-fit-params and
    llama-cli reserve n_batch."""
    return max(1, min(n_batch, n_parallel * (1 + max(0, n_draft))))


def server_target_outputs_max(flags: LlamaFlags) -> int:
    """server_outputs_max for these flags: the draft length is the longest enabled proposal."""
    return server_outputs_max(flags.n_batch, flags.n_parallel, flags.spec.n_max)


@dataclass(frozen=True)
class BlockDraftLimit:
    """The longest draft a block drafter yields: its block size less the anchor (DFlash), or the whole
    block (anchor-first DSpark)."""

    spec_type: str
    block_size: int
    n_draft_max: int


def block_draft_limit(types: tuple[str, ...], drafter_metadata: Mapping[str, Any]) -> BlockDraftLimit | None:
    """The tightest limit of the enabled block drafters, None without one. common_speculative_impl_draft_dflash:
    the input is [id_last, <mask> x (block_size - 1)], so DFlash drafts at most block_size - 1 tokens and
    anchor-first DSpark block_size; a larger --spec-draft-n-max is clamped to it with a warning."""
    try:
        block = int(drafter_metadata.get(DFLASH_BLOCK_SIZE_KEY, DFLASH_DEFAULT_BLOCK_SIZE))
    except (TypeError, ValueError):   # llama.cpp reads the key as text through atoi: not a number is 0
        block = 0
    anchor = str(drafter_metadata.get(DFLASH_SAMPLE_FROM_ANCHOR_KEY, "true")).lower() == "true"
    limits = [BlockDraftLimit(t, block, block if t == "draft-dspark" and anchor else block - 1)
              for t in BLOCK_DRAFT_TYPES if t in types]
    return min(limits, key=lambda lim: (lim.n_draft_max, lim.spec_type), default=None)


def borrows_target_output(arch: str, tensor_names: frozenset[str] | set[str]) -> bool:
    """Whether a drafter of this architecture and these tensors computes its logits with the target's
    output matrix: DFlash without output.weight or token_embd (it would duplicate its own), EAGLE3 without
    output.weight (src/models/dflash.cpp and eagle3.cpp load_arch_tensors and their graphs)."""
    if arch == "dflash":
        return OUTPUT not in tensor_names and TOKEN_EMBD not in tensor_names
    return arch == "eagle3" and OUTPUT not in tensor_names
