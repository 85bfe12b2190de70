"""Hand-built auto-fit problems (no files, no inventory)."""
from __future__ import annotations

from planner.core.units import GiB, MiB
from planner.sd.components import Component
from planner.sd.roles import Kind
from planner.sd.sd_placement import FitInput, GpuBudget


def gib(x: float) -> int:
    return int(round(x * GiB))


def comp(kind: Kind, params_gib: float, largest_gib: float = 0.01) -> Component:
    return Component(kind, gib(params_gib), gib(largest_gib))


def gpu(name: str, budget_gib: float, discrete: bool = True) -> GpuBudget:
    # free = budget + the 512 MiB default margin; the planners read only the budget
    return GpuBudget(name, gib(budget_gib) + 512 * MiB, gib(budget_gib), discrete=discrete)


def problem(comps, gpus, ram_budget_gib=None, compute=None) -> FitInput:
    compute = compute or {}
    ram = None if ram_budget_gib is None else gib(ram_budget_gib)
    return FitInput(tuple(comps), tuple(gpus), ram, ram, tuple((k, compute.get(k)) for k in Kind))
