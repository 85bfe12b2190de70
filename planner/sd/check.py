"""Budget checks of a finished placement — chiefly for --auto-fit off and explicit
--params-backend, where sd-cli places exactly as told and its runtime capacity checks, not a
planner, find the overflow (seed 002, "Runtime capacity checks")."""
from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class DeviceNeed:
    """What a placement asks of one GPU: the weights stored there, the largest room one of its
    components needs while it computes there (compute buffer, plus staging when its weights live
    elsewhere), and what sd-cli's runtime checks let the device hold (`cap_bytes`)."""

    device: str
    weights_bytes: int
    compute_bytes: int
    cap_bytes: int
    scratch_capped: bool   # the cap is free memory less the 512 MiB scratch, not the budget

    @property
    def need_bytes(self) -> int:
        return self.weights_bytes + self.compute_bytes

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.cap_bytes


def mapped_bytes(fit: FitInput, placements: tuple[Placement, ...], device: str) -> int:
    """Weights on a device whose buffers map the model files (--mmap on a device that shares host
    memory): seed 002, "With --mmap, device-backed mappings count toward these budgets at their
    full mapped-file size, once per device buffer even when multiple parameter blocks share it" —
    each file holding a component stored there counts whole, once; components from files that
    are not mapped count their own bytes."""
    kinds = {p.kind for p in placements if p.stored_on(device)}
    files = [f for f in fit.mapped_files if f.kinds & kinds]
    covered = set().union(*(f.kinds for f in files)) if files else set()
    rest = sum(p.params_bytes for p in placements if p.stored_on(device) and p.kind not in covered)
    return sum(f.size_bytes for f in files) + rest


def device_needs(fit: FitInput, placements: tuple[Placement, ...]) -> tuple[DeviceNeed, ...]:
    """The figures behind the verdict, one row per GPU of the inventory."""
    out = []
    for gpu in fit.gpus:
        work = max((_work(fit, p) for p in placements if gpu.name in p.compute), default=0)
        cap = runtime_cap(gpu)
        stored = stored_bytes(placements, gpu.name)
        if fit.mapped_files and not gpu.discrete:
            stored = mapped_bytes(fit, placements, gpu.name)
        out.append(DeviceNeed(gpu.name, stored, work, cap, cap != gpu.budget_bytes))
    return tuple(out)


def overcommit(fit: FitInput, placements: tuple[Placement, ...]) -> tuple[str, ...]:
    """One line per device whose budget the placement exceeds."""
    out = []
    for d in device_needs(fit, placements):
        if not d.fits:
            free = next(g.free_bytes for g in fit.gpus if g.name == d.device)
            why = f" (free {fmt_mib(free)} MiB less 512 MiB of scratch)" if d.scratch_capped else ""
            out.append(f"{d.device} needs {fmt_mib(d.need_bytes)} MiB (weights {fmt_mib(d.weights_bytes)} + compute "
                       f"{fmt_mib(d.compute_bytes)}) but its budget is {fmt_mib(d.cap_bytes)} MiB{why}")
    ram = ram_need(fit, placements)
    if ram is not None and not ram.fits:
        extra = f" + {fmt_mib(ram.compute_bytes)} MiB of compute" if ram.compute_bytes else ""
        out.append(f"RAM holds {fmt_mib(ram.weights_bytes)} MiB of weights{extra} but its params budget is "
                   f"{fmt_mib(ram.cap_bytes)} MiB")
    return tuple(out)


RAM = "RAM"


def ram_need(fit: FitInput, placements: tuple[Placement, ...]) -> DeviceNeed | None:
    """The host's row: weights kept in RAM and the compute of CPU modules, which run one at a time
    (each frees its compute buffer after its phase), against the params budget; None when the
    available RAM is unknown."""
    if fit.ram_budget_bytes is None:
        return None
    in_ram = sum(p.params_bytes for p in placements if p.params is Where.CPU)
    cpu_work = max((p.reserve_bytes for p in placements if not p.compute), default=0)
    return DeviceNeed(RAM, in_ram, cpu_work, fit.ram_budget_bytes, False)
