"""`sd-fit --optimal`: auto-fit's placement solved as a small MILP (PuLP + its bundled CBC).

Same budgets and the same memory model as planner.sd.autofit, without its one-at-a-time
order: for each component pick a compute GPU (only where --backend left it open) and a
parameter location, so that on every GPU, stored weights plus any one component's working
room (compute reserve, plus staging room when offloaded, plus its full weights when cached)
stay within budget, and RAM holds what is put there. Objective: weight traffic per image,
weighted by location (planner.sd.traffic), with a tiny tie-break toward auto-fit's main GPU.
PuLP stays inside this module (STYLE.md §5).
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import pulp

from planner.core.errors import InfeasiblePlacement
from planner.core.units import MiB
from planner.sd.autofit import auto_compute, main_gpu
from planner.sd.components import Component
from planner.sd.roles import Kind
from planner.sd.sd_placement import FitInput, Placement, Where
from planner.sd.traffic import TRAFFIC_WEIGHT, uses_per_image

log = logging.getLogger(__name__)
# MiB-scale cost of computing away from the main GPU, larger for higher-priority components
# (auto-fit's diffusion > te > vae): it only breaks ties between equal-traffic placements.
TIE_BREAK = 1e-3


@dataclass(frozen=True)
class Option:
    compute: tuple[str, ...]
    where: Where
    device: str | None = None

    def placement(self, comp: Component) -> Placement:
        return Placement(comp.kind, comp.params_bytes, comp.reserve_bytes, self.compute, self.where, self.device,
                         comp.compute_mode, comp.compute_origin)


def _options(fit: FitInput, comp: Component) -> list[Option]:
    explicit = fit.compute_of(comp.kind)
    usable = [g.name for g in fit.gpus if g.discrete and g.budget_bytes > 0]
    # Left open, a module may compute on any GPU with a budget; without one, where auto-fit
    # would put it (the default backend: an integrated GPU or the CPU).
    computes: list[tuple[str, ...]] = ([explicit] if explicit is not None
                                       else [(g,) for g in usable] or [auto_compute(fit)])
    ram = [Where.CPU] if fit.ram_budget_bytes is not None else []
    out = []
    for compute in computes:
        if not compute:  # CPU modules use RAM or disk (seed 002)
            out += [Option(compute, w) for w in (*ram, Where.DISK)]
            continue
        out += [Option(compute, w) for w in (Where.RESIDENT, *ram)]
        out += [Option(compute, Where.OTHER_GPU, g) for g in usable if g not in compute]
        out.append(Option(compute, Where.DISK))
    return out


def _cost(comp: Component, option: Option, steps: int, main: str | None) -> tuple[float, float]:
    """(cost when copied every use, cost when cached once per image), in weighted MiB."""
    tie = TIE_BREAK * (len(Kind) - comp.kind) if option.compute and option.compute != (main,) else 0.0
    if option.where is Where.RESIDENT or (option.where is Where.CPU and not option.compute):
        return tie, tie
    per_copy = comp.params_bytes / MiB * TRAFFIC_WEIGHT[option.where]
    return per_copy * uses_per_image(comp.kind, steps) + tie, per_copy + tie


def optimal_fit(fit: FitInput, steps: int) -> tuple[Placement, ...]:
    """The traffic-minimal placement; raises InfeasiblePlacement when none satisfies the model."""
    comps = fit.present
    main = main_gpu(fit)
    prob = pulp.LpProblem("sd_fit", pulp.LpMinimize)
    opts = {c.kind: _options(fit, c) for c in comps}
    x = {(c.kind, i): prob.add_variable(f"x_{c.kind.name}_{i}", 0, 1, cat="Binary")
         for c in comps for i in range(len(opts[c.kind]))}
    g = {k: prob.add_variable(f"g_{k[0].name}_{k[1]}", 0, 1, cat="Binary") for k in x}  # chosen and cached
    objective = []
    for c in comps:
        prob += pulp.lpSum(x[c.kind, i] for i in range(len(opts[c.kind]))) == 1
        for i, o in enumerate(opts[c.kind]):
            every, once = _cost(c, o, steps, main)
            objective.append(every * x[c.kind, i] - (every - once) * g[c.kind, i])
            prob += g[c.kind, i] <= x[c.kind, i]
    prob += pulp.lpSum(objective)
    if fit.ram_budget_bytes is not None:
        prob += pulp.lpSum(c.params_bytes * x[c.kind, i] for c in comps
                           for i, o in enumerate(opts[c.kind]) if o.where is Where.CPU) <= fit.ram_budget_bytes
    _gpu_constraints(prob, fit, comps, opts, x, g)
    with warnings.catch_warnings():
        # PuLP 3.3 deprecates the bundled-CBC class name; the bundled CBC is still what we want.
        warnings.simplefilter("ignore", DeprecationWarning)
        status = prob.solve(pulp.PULP_CBC_CMD(msg=False))
    if pulp.LpStatus[status] != "Optimal":
        raise InfeasiblePlacement(f"--optimal: no placement satisfies the budgets (solver: {pulp.LpStatus[status]})")
    chosen = []
    for c in comps:
        i = next(i for i in range(len(opts[c.kind])) if x[c.kind, i].value() > 0.5)
        chosen.append(opts[c.kind][i].placement(c))
    log.debug("optimal: objective %.3f", pulp.value(prob.objective))
    return tuple(chosen)


def _gpu_constraints(prob: pulp.LpProblem, fit: FitInput, comps: tuple[Component, ...],
                     opts: dict[Kind, list[Option]], x: dict[tuple[Kind, int], pulp.LpVariable],
                     g: dict[tuple[Kind, int], pulp.LpVariable]) -> None:
    """Per GPU: stored weights + one component's working room <= budget."""
    total = sum(c.params_bytes for c in comps) + max((c.reserve_bytes for c in comps), default=0)
    for gpu in fit.gpus:
        d = gpu.name
        stored = pulp.lpSum(c.params_bytes * x[c.kind, i] for c in comps
                            for i, o in enumerate(opts[c.kind]) if o.placement(c).stored_on(d))
        prob += stored <= max(gpu.budget_bytes, 0)
        for c in comps:
            on = [i for i, o in enumerate(opts[c.kind]) if d in o.compute]
            if not on:
                continue
            off = [i for i in on if opts[c.kind][i].where is not Where.RESIDENT]
            work = (c.reserve_bytes * pulp.lpSum(x[c.kind, i] for i in on)
                    + c.largest_tensor_bytes * pulp.lpSum(x[c.kind, i] for i in off)
                    + (c.params_bytes - c.largest_tensor_bytes) * pulp.lpSum(g[c.kind, i] for i in off))
            # Big-M: the row binds only when c computes on d.
            slack = total * (1 - pulp.lpSum(x[c.kind, i] for i in on))
            prob += stored + work <= max(gpu.budget_bytes, 0) + slack
