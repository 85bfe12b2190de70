"""The models a llama-server or llama-cli process loads beside the target, estimated with it.

Each companion reports its own rows (planner/memory/rows.py); `Estimate.totals` adds them per
device, and budgets judge the totals. The pinned server loads them in this order after the
target (tools/server/server-context.cpp load_model): the target with its adapters
(common_init_from_params), the drafter and its context or draft-mtp's context on the target's model
(common_speculative_init_from_params), the projector (mtmd_init_from_file).
"""
from __future__ import annotations

import functools

from planner.hardware.inventory import Inventory
from planner.llama.context import ModelContext, model_context
from planner.llama.settings import LlamaSettings
from planner.memory.draft import estimate_draft
from planner.memory.lora_memory import estimate_loras
from planner.memory.mmproj import estimate_mmproj
from planner.memory.mtp import estimate_mtp
from planner.memory.rows import CompanionEstimate


def estimate_companions(target: LlamaSettings, inventory: Inventory | None,
                        exact_compute: bool = True) -> tuple[CompanionEstimate, ...]:
    """Every companion the flags name, in the order llama-server loads them."""
    flags = target.flags
    out: list[CompanionEstimate] = list(estimate_loras(target)) if flags.loras else []
    if flags.spec.has_draft:   # the planner estimates hundreds of flag sets: read the drafter's header once
        out.append(estimate_draft(target, inventory, exact_compute, draft=_drafter(flags.spec.draft.model)))
    elif flags.spec.mtp_context:   # draft-mtp without -md: a second context on the target's model
        out.append(estimate_mtp(target))
    if flags.mmproj.path:
        out.append(estimate_mmproj(target, exact_compute))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def _drafter(path: str) -> ModelContext:
    return model_context(path)
