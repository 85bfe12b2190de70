"""`--explain`: which constraint binds on each device, and what the next step would cost.

Every figure here comes from `estimate` on a neighbouring set of flags (double the context, one
more layer offloaded), never from interpolation (seed 003 §5: measure, never interpolate).
"""
from __future__ import annotations

from dataclasses import replace

from planner.core.units import fmt_bytes
from planner.hardware.apple import raise_advice, read_wired_limit, working_set
from planner.hardware.budgets import DEFAULT_DEVICE_MARGIN, pool_members
from planner.hardware.inventory import same_cards
from planner.llama.commands import PLANNED_PROGRAM
from planner.llama.context import ModelContext
from planner.llama.placement import HOST
from planner.memory.estimate import compute_note, estimate, overhead_notes
from planner.search.contexts import context_source, max_context
from planner.search.problem import costs_for, row_totals
from planner.search.result import PlanResult
from planner.speed.throughput import offloading, predict_estimate
from runtime.ggml.profiles import PROFILES


def _headroom(result: PlanResult) -> dict[str, int]:
    return {name: result.budget_of(name) - used for name, used in row_totals(result.estimate).items()}


def _context_step(ctx: ModelContext, result: PlanResult) -> list[str]:
    """What doubling the context would add on each device, and where it would not fit."""
    n = result.flags.n_ctx * 2
    if result.flags.n_ctx >= max_context(ctx, replace(result.request, n_ctx=None, max_ctx=True)):
        return []   # the context source line says why it goes no higher
    bigger = estimate(ctx, replace(result.flags, n_ctx=n), result.inventory, program=PLANNED_PROGRAM)
    now, then, room = row_totals(result.estimate), row_totals(bigger), _headroom(result)
    lines = []
    for name in now:
        delta = then.get(name, 0) - now[name]
        if delta > 0:
            verdict = "fits" if delta <= room[name] else f"short by {fmt_bytes(delta - room[name])}"
            lines.append(f"context {n}: +{fmt_bytes(delta)} on {name} ({verdict})")
    return lines


def _layer_step(ctx: ModelContext, result: PlanResult) -> list[str]:
    """If layers stay on the host: what offloading one more would need on its device."""
    f = result.flags
    n_all = ctx.facts.n_layer_all + 1
    if f.n_gpu_layers < 0 or f.n_gpu_layers >= n_all or not result.inventory.devices:
        return []
    first = next((name for name, layers in result.estimate.layers if name != "CPU" and layers), None)
    if first is None:
        first = result.inventory.devices[0].name
    ts = list(f.tensor_split)
    if ts:
        names = list(f.devices or result.inventory.names)
        ts[names.index(first) if first in names else 0] += 1
    more = estimate(ctx, replace(f, n_gpu_layers=f.n_gpu_layers + 1, tensor_split=tuple(ts)), result.inventory,
                    program=PLANNED_PROGRAM)
    delta = row_totals(more).get(first, 0) - row_totals(result.estimate).get(first, 0)
    room = _headroom(result).get(first, 0)
    layer = n_all - f.n_gpu_layers - 1
    return [f"layer {layer} stays on the host: moving it to {first} needs +{fmt_bytes(delta)}, "
            f"{first} has {fmt_bytes(max(room, 0))} left"]


def _op_offload_choice(ctx: ModelContext, result: PlanResult) -> list[str]:
    """Where a device offloads host-weight ops: what the other choice would cost and give."""
    if not offloading(result.inventory):
        return []
    f = result.flags
    other = estimate(ctx, replace(f, op_offload=not f.op_offload), result.inventory, program=PLANNED_PROGRAM)
    now, then, room = row_totals(result.estimate), row_totals(other), _headroom(result)
    costs = costs_for(ctx, f.cache_type_k)
    prefill = {f.op_offload: result.prediction.prefill_tokens_s,
               not f.op_offload: predict_estimate(ctx, costs, other, result.inventory, result.experts_on_host,
                                                  other.output_on_host).prefill_tokens_s}
    moved = {name: then[name] - now[name] for name in now if name != HOST and then.get(name, 0) != now[name]}
    if not moved:
        return [f"op offload {'on' if f.op_offload else 'off'}: no host weight is offloaded at -ub {f.n_ubatch}, "
                "either choice stages nothing"]
    over = [name for name, d in moved.items() if d > room.get(name, 0)]
    staged = ", ".join(f"{'+' if d > 0 else ''}{fmt_bytes(d)} on {name}" for name, d in moved.items())
    if f.op_offload:
        return [f"op offload on: prompt matmuls on host weights run on the device (prefill {prefill[True]:.0f} "
                f"tokens/s; --no-op-offload: {prefill[False]:.0f} tokens/s, {staged})"]
    why = f"it would not fit ({', '.join(over)})" if over else \
        f"prefill {prefill[True]:.0f} tokens/s with it, {prefill[False]:.0f} without"
    return [f"op offload off (--no-op-offload): offloading would move host-weight ops onto the device "
            f"({staged}: staged weights and their results); {why}"]


def _outside_breakdown(result: PlanResult) -> list[str]:
    """Memory each device's process holds outside llama.cpp's breakdown: the overhead term the plan counts
    in every device row (planner/llama/overhead.py), with its source, and what it is made of
    (runtime/ggml/profiles.py), once per backend."""
    lines = [line.replace("overhead ", "counted against the budget: overhead ", 1)
             for line in overhead_notes(result.estimate.overheads)]
    used = {d.name for d in result.estimate.devices}
    for backend in dict.fromkeys(d.backend for d in result.inventory.devices if d.name in used):
        terms = PROFILES[backend].outside_breakdown
        if terms:
            names = "; ".join(t.name + (f" {fmt_bytes(t.bytes)}" if t.bytes is not None else "") for t in terms)
            lines.append(f"{backend.value}: the overhead is made of {names}")
    return lines


def _working_sets(result: PlanResult) -> list[str]:
    """A Metal device whose budget is capped by macOS's GPU working set: the limit, and how to raise it when the
    plan leaves it less than the margin (planner/hardware/apple.py)."""
    lines = []
    held = row_totals(result.estimate)
    for d in result.inventory.devices:
        ws = working_set(d, read_wired_limit() if result.inventory.source == "detected" else None)
        if ws is None or d.name not in held or ws.bytes >= d.free_bytes:
            continue
        line = f"{d.name}: its budget is capped at the GPU working set, {fmt_bytes(ws.bytes)} ({ws.source})"
        if result.budget_of(d.name) - held[d.name] < DEFAULT_DEVICE_MARGIN:
            line += "; it binds: " + raise_advice(d, held[d.name] + 2 * DEFAULT_DEVICE_MARGIN)
        lines.append(line)
    return lines


def _devices_used(result: PlanResult) -> list[str]:
    """Which name the plan uses for a card llama.cpp lists under two backends, and the shared pool."""
    lines = [f"{same.used} and {same.skipped} are one card (id {same.id}): the plan uses {same.used}, as "
             f"llama.cpp's default device list does (a second backend's device with a seen id is skipped)"
             for same in same_cards(result.inventory.devices)]
    pool = result.budgets.uma_pool_bytes
    if pool is not None:
        members = pool_members(result.budgets)
        used = sum(n for name, n in row_totals(result.estimate).items() if name in members)
        lines.append(f"{', '.join(members)} share one pool of system RAM: {fmt_bytes(used)} of {fmt_bytes(pool)} "
                     f"used together (seed 003 §7)")
    return lines


def explain(ctx: ModelContext, result: PlanResult) -> tuple[str, ...]:
    lines = _devices_used(result)
    held = dict(result.estimate.overheads)
    for name, room in _headroom(result).items():
        of_it = f" ({fmt_bytes(held[name].bytes)} of it the overhead)" if name in held else ""
        lines.append(f"{name}: {fmt_bytes(result.budget_of(name) - room)} of {fmt_bytes(result.budget_of(name))} "
                     f"used{of_it}, {fmt_bytes(room)} headroom")
    if result.experts_on_host:
        lines.append(f"routed experts of {len(result.experts_on_host)} layer(s) stay in host memory (-ot ...=CPU): "
                     f"their device had no room for them")
    lines.append(context_source(ctx, result.request, result.flags))
    est = result.estimate
    lines.append(compute_note(est.compute_model, est.model_arch, est.compute_safety))
    if result.flags.split_mode == "tensor":   # no layer to move, no op offload (the meta device has none)
        lines += [f"{m.name} holds its slices and a full compute buffer: {fmt_bytes(m.total_bytes)} of "
                  f"{fmt_bytes(result.budgets.devices.get(m.name, 0))}" for m in result.estimate.meta_members]
        return tuple(lines + _context_step(ctx, result))
    lines += _op_offload_choice(ctx, result)
    lines += _layer_step(ctx, result)
    lines += _context_step(ctx, result)
    lines += _outside_breakdown(result) + _working_sets(result)
    return tuple(lines)
