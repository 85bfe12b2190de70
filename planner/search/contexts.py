"""Where a plan's context comes from, and the training context as its ceiling.

llama.cpp runs any -c it is given; past the context the model was trained at, what the model makes
of the extra positions depends on its RoPE scaling (the `{arch}.rope.scaling.*` header keys), which
fitplan cannot judge. So `--ctx max` stops at the training context unless the user allows more, and
an explicit -c above it is planned as asked, with a warning that says so.
"""
from __future__ import annotations

from typing import Any

from gguf import Keys

from planner.llama.context import ModelContext
from planner.llama.flags import LlamaFlags
from planner.llama.settings import context_params
from planner.search.result import PlanRequest

# `--ctx max --allow-ctx-above-train` searches up to the training context times the header's RoPE
# scaling factor, or times this when the header has none (a policy, not a llama.cpp rule: llama.cpp
# sets no ceiling; YaRN extensions are commonly published at factor 4)
ABOVE_TRAIN_FACTOR = 4


def rope_scaling(ctx: ModelContext) -> dict[str, Any]:
    """The header's RoPE-scaling keys ({arch}.rope.scaling.*), as written."""
    prefix = Keys.Rope.SCALING_TYPE.format(arch=ctx.facts.arch).rsplit(".", 1)[0] + "."
    return {k: v for k, v in sorted(ctx.model.metadata.items()) if k.startswith(prefix)}


def _scaling_text(ctx: ModelContext) -> str:
    keys = rope_scaling(ctx)
    if not keys:
        return "the header has no RoPE-scaling keys"
    return "RoPE scaling in the header: " + ", ".join(f"{k}={v}" for k, v in keys.items())


def train_ceiling(ctx: ModelContext, req: PlanRequest) -> int:
    """The training context for every slot: -c is shared by the -np sequences (each gets n_ctx / n_seq
    cells, src/llama-context.cpp), so -np 4 reaches each slot's training context at 4 x n_ctx_train."""
    return ctx.facts.n_ctx_train * max(1, req.n_parallel)


def max_context(ctx: ModelContext, req: PlanRequest) -> int:
    """The largest context a plan may be given: the request's -c, else the training context of every
    slot (or, with allow_ctx_above_train, that times the RoPE scaling factor)."""
    if req.n_ctx and not req.max_ctx:
        return req.n_ctx
    train = train_ceiling(ctx, req)
    if req.n_ctx:
        return req.n_ctx if req.allow_ctx_above_train else min(req.n_ctx, train or req.n_ctx)
    if not req.allow_ctx_above_train:
        return train
    key = Keys.Rope.SCALING_FACTOR.format(arch=ctx.facts.arch)
    factor = float(ctx.model.metadata.get(key, 0) or 0)
    return int(train * (factor if factor > 1 else ABOVE_TRAIN_FACTOR))


def above_train_warning(ctx: ModelContext, flags: LlamaFlags) -> str | None:
    """The warning a plan carries when each sequence's context is above the training context; None at or
    below it. llama.cpp compares n_ctx_seq, not n_ctx: without a unified cache each of -np sequences gets
    n_ctx / n_seq cells (src/llama-context.cpp: "n_ctx_seq (%u) > n_ctx_train (%u) -- possible training
    context overflow")."""
    train = ctx.facts.n_ctx_train
    if not train:
        return None
    cp = context_params(flags, train)
    if cp.n_ctx_seq <= train:
        return None
    what = (f"context {cp.n_ctx_seq}" if cp.n_ctx_seq == cp.n_ctx else
            f"context {cp.n_ctx_seq} per sequence (-c {cp.n_ctx} over -np {cp.n_seq})")
    return (f"{what} is above the model's training context {train}: llama.cpp runs it, but what the "
            f"model makes of positions past {train} depends on its RoPE scaling ({_scaling_text(ctx)})")


def _ceiling_why(ctx: ModelContext, req: PlanRequest, ceiling: int) -> str:
    train = ctx.facts.n_ctx_train
    if ceiling == train:
        return "the training context"
    if ceiling == train_ceiling(ctx, req):
        return f"the training context {train} for each of {req.n_parallel} slots"
    return f"--ctx max above the training context {train} (--allow-ctx-above-train)"


def context_source(ctx: ModelContext, req: PlanRequest, flags: LlamaFlags) -> str:
    """One --explain line: where the plan's context came from."""
    n_ctx = flags.n_ctx
    if req.max_ctx:
        ceiling = max_context(ctx, req)
        why = _ceiling_why(ctx, req, ceiling)
        head = f"context {n_ctx}: the largest that fits (--ctx max, at most {ceiling}: {why})"
    elif req.n_ctx:
        head = f"context {n_ctx}: given (-c {req.n_ctx})"
    else:
        head = f"context {n_ctx}: the model's training context ({Keys.LLM.CONTEXT_LENGTH.format(arch=ctx.facts.arch)})"
    warning = above_train_warning(ctx, flags)
    return head + (f"; {warning}" if warning else "")
