"""Budget checks of a finished placement — chiefly for --auto-fit off and explicit
--params-backend, where sd-cli places exactly as told and its runtime capacity checks, not a
planner, find the overflow (seed 002, "Runtime capacity checks")."""
from __future__ import annotations

from planner.core.units import fmt_mib
from planner.sd.placement import FitInput, Placement, Where
from planner.sd.traffic import stored_bytes


def _work(fit: FitInput, p: Placement) -> int:
    """Room a component needs on its compute GPU beside stored weights: its compute reserve,
    plus staging room for its largest tensor when its weights live elsewhere."""
    largest = next(c.largest_tensor_bytes for c in fit.components if c.kind == p.kind)
    return p.reserve_bytes + (0 if p.params is Where.RESIDENT else largest)


def overcommit(fit: FitInput, placements: tuple[Placement, ...]) -> tuple[str, ...]:
    """One line per device whose budget the placement exceeds."""
    out = []
    for gpu in fit.gpus:
        stored = stored_bytes(placements, gpu.name)
        work = max((_work(fit, p) for p in placements if gpu.name in p.compute), default=0)
        if stored + work > gpu.budget_bytes:
            out.append(f"{gpu.name} needs {fmt_mib(stored + work)} MiB (weights {fmt_mib(stored)} + compute "
                       f"{fmt_mib(work)}) but its budget is {fmt_mib(gpu.budget_bytes)} MiB")
    in_ram = sum(p.params_bytes for p in placements if p.params is Where.CPU)
    if fit.ram_budget_bytes is not None and in_ram > fit.ram_budget_bytes:
        out.append(f"RAM holds {fmt_mib(in_ram)} MiB of weights but its params budget is "
                   f"{fmt_mib(fit.ram_budget_bytes)} MiB")
    return tuple(out)
