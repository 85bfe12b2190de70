"""Layer split or tensor split, as a decision: the plan's layer split against `-sm tensor` on the same devices.

The planner solves the layer split (planner/search/search.py); here the same context, cache type
and -ub are estimated as llama.cpp would load them under `-sm tensor` — every layer on one meta
device over all the devices (planner/llama/tensor_parallel.py) — checked member by member against
the budgets (each member really holds its slices and a full compute buffer: Estimate.meta_members),
and predicted with the tensor-parallel cost (planner/speed/tensor_throughput.py). The tensor split
is chosen only where it is faster to decode: across unequal devices or a slow link it usually is
not (seed 003 §7), because every layer waits for its slowest member and two AllReduces.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from planner.core.errors import FitplanError
from planner.hardware.budgets import Budgets
from planner.hardware.inventory import Inventory
from planner.llama.commands import PLANNED_PROGRAM
from planner.llama.context import ModelContext
from planner.llama.flags import NGL_AUTO, LlamaFlags
from planner.llama.placement import HOST, HOST_ROWS
from planner.llama.tensor_parallel import META_NAME
from planner.memory.estimate import Estimate, estimate
from planner.search.problem import costs_for
from planner.speed.tensor_throughput import predict_tensor, reduce_steps
from planner.speed.throughput import Prediction, Rates, view_of_estimate

# a tensor split must beat the layer split's decode by this much to be chosen (the throughput model's
# own resolution: the planner ranks layer splits in 1 % steps too)
MIN_GAIN = 0.01


@dataclass(frozen=True)
class TensorOption:
    """`-sm tensor` on the plan's devices: its flags, estimate and prediction, or why it is out."""

    flags: LlamaFlags
    estimate: Estimate | None = None
    prediction: Prediction | None = None
    reason: str = ""             # "" when it fits the budgets

    @property
    def fits(self) -> bool:
        return not self.reason


def tensor_option(ctx: ModelContext, inventory: Inventory, budgets: Budgets, layer_flags: LlamaFlags) -> TensorOption:
    """The layer plan's flags as a tensor split over every device (-ngl all, no -ts, no -ot)."""
    flags = replace(layer_flags, split_mode="tensor", n_gpu_layers=NGL_AUTO, tensor_split=(), override_args=())
    try:
        est = estimate(ctx, flags, inventory, program=PLANNED_PROGRAM)
    except FitplanError as e:   # llama.cpp refuses it (architecture, -fa off, ...): the reason is its own
        return TensorOption(flags, reason=str(e))
    if not est.meta_members:   # the Meta() row is known, not what each member would hold
        return TensorOption(flags, est, reason=f"no per-device split sizes for {ctx.model.architecture} yet")
    over = _over(est, budgets)
    members = [m.name for m in est.meta_members]
    rates = Rates(inventory)
    view = view_of_estimate(ctx, est)
    pred = predict_tensor(ctx.facts, costs_for(ctx, flags.cache_type_k), view, members, rates, META_NAME)
    return TensorOption(flags, est, pred, over)


def _over(est: Estimate, budgets: Budgets) -> str:
    """What goes past a budget: each member (its slices and its full compute buffer) and the host."""
    use = {m.name: m.held_bytes for m in est.meta_members}   # each member holds its own overhead
    use[HOST] = sum(d.total_bytes for d in est.totals if d.name in HOST_ROWS)
    over = budgets.over(use)
    return ", ".join(f"{row} over its budget by {n / 2**20:.0f} MiB" for row, n in over.items())


def prefer_tensor(layer: Prediction, option: TensorOption | None) -> bool:
    return (option is not None and option.fits and option.prediction is not None
            and option.prediction.decode_tokens_s > layer.decode_tokens_s * (1 + MIN_GAIN))


def comparison_lines(layer: Prediction, option: TensorOption, chosen_tensor: bool) -> list[str]:
    """Both predictions, for --explain."""
    lines = [f"-sm layer: decode {layer.decode_tokens_s:.1f} tokens/s, prefill {layer.prefill_tokens_s:.0f} tokens/s"]
    if option.prediction is None:   # llama.cpp's refusals already say "-sm tensor: ..."
        return lines + [f"-sm tensor: not possible: {option.reason.removeprefix('-sm tensor: ')}"]
    p = option.prediction
    n = len(option.estimate.meta_members) if option.estimate else 0
    steps = reduce_steps(n) if n else 0
    verdict = ("chosen" if chosen_tensor else
               f"not chosen: {option.reason}" if option.reason else "not chosen: slower to decode")
    return lines + [f"-sm tensor over {n} devices: decode {p.decode_tokens_s:.1f} tokens/s, prefill "
                    f"{p.prefill_tokens_s:.0f} tokens/s ({p.n_boundaries} AllReduces per token, {steps} "
                    f"step{'s' if steps != 1 else ''} each) — {verdict}"]
