"""Budget checks of a finished placement — chiefly for --auto-fit off and explicit
--params-backend, where sd-cli places exactly as told and its runtime capacity checks, not a
planner, find the overflow (seed 002, "Runtime capacity checks")."""
from __future__ import annotations

from planner.core.units import MiB, fmt_mib
from planner.sd.sd_placement import FitInput, GpuBudget, Placement, Where
from planner.sd.traffic import stored_bytes


def _work(fit: FitInput, p: Placement) -> int:
    """Room a component needs on its compute GPU beside stored weights: its compute reserve,
    plus staging room for its largest tensor when its weights live elsewhere."""
    largest = next(c.largest_tensor_bytes for c in fit.components if c.kind == p.kind)
    return p.reserve_bytes + (0 if p.params is Where.RESIDENT else largest)


# Seed 002, "Runtime capacity checks also leave 512 MiB of currently free device memory for backend
# scratch buffers and pipelines, including with explicit backend assignments."
RUNTIME_SCRATCH_BYTES = 512 * MiB


def runtime_cap(gpu: GpuBudget) -> int:
    """What sd-cli's runtime checks let a device hold: its budget, and never more than its free
    memory less the scratch margin (an explicit --max-vram above that does not buy more)."""
    return max(min(gpu.budget_bytes, gpu.free_bytes - RUNTIME_SCRATCH_BYTES), 0)


def overcommit(fit: FitInput, placements: tuple[Placement, ...]) -> tuple[str, ...]:
    """One line per device whose budget the placement exceeds."""
    out = []
    for gpu in fit.gpus:
        stored = stored_bytes(placements, gpu.name)
        work = max((_work(fit, p) for p in placements if gpu.name in p.compute), default=0)
        cap = runtime_cap(gpu)
        if stored + work > cap:
            why = "" if cap == gpu.budget_bytes else f" (free {fmt_mib(gpu.free_bytes)} MiB less 512 MiB of scratch)"
            out.append(f"{gpu.name} needs {fmt_mib(stored + work)} MiB (weights {fmt_mib(stored)} + compute "
                       f"{fmt_mib(work)}) but its budget is {fmt_mib(cap)} MiB{why}")
    in_ram = sum(p.params_bytes for p in placements if p.params is Where.CPU)
    # CPU modules compute in RAM, one runner at a time (each frees its compute buffer after its phase)
    cpu_work = max((p.reserve_bytes for p in placements if not p.compute), default=0)
    if fit.ram_budget_bytes is not None and in_ram + cpu_work > fit.ram_budget_bytes:
        extra = f" + {fmt_mib(cpu_work)} MiB of compute" if cpu_work else ""
        out.append(f"RAM holds {fmt_mib(in_ram)} MiB of weights{extra} but its params budget is "
                   f"{fmt_mib(fit.ram_budget_bytes)} MiB")
    return tuple(out)
