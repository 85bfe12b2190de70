"""stable-diffusion.cpp's auto-fit, as seed 002 ("Automatic placement") describes it.

Components are taken in diffusion, te, vae order; each one's parameters go to the first of
(1) its compute GPU(s), leaving headroom for compute and staging, (2) CPU RAM, (3) the other
GPU with the most budget left, (4) disk. The headroom on a GPU is the largest, over the
components computing there, of its compute reserve plus — when it is not resident — the room
its weights need while cached: full weights for higher-priority components, the largest
tensor (staging) for lower-priority ones (the arithmetic of src/core/backend_fit.cpp,
`compute_plan`). CPU modules reserve no GPU space and use RAM or disk.
"""
from __future__ import annotations

import logging

from planner.sd.components import Component
from planner.sd.roles import Kind
from planner.sd.sd_placement import FitInput, Placement, Where

log = logging.getLogger(__name__)


def main_gpu(fit: FitInput) -> str | None:
    """Seed 002: the GPU with the largest budget (the first on a tie); None if none has any."""
    best = None
    for gpu in fit.gpus:
        if gpu.discrete and gpu.budget_bytes > 0 and (best is None or gpu.budget_bytes > best.budget_bytes):
            best = gpu
    return best.name if best else None


def auto_compute(fit: FitInput) -> tuple[str, ...]:
    """Where auto-fit runs a module --backend left open: the main GPU; with no discrete GPU at
    all, the default backend (an integrated GPU, else the CPU); with GPUs but no budget, the
    CPU (backend_fit.cpp `derive_backend_specs`)."""
    main = main_gpu(fit)
    if main is not None:
        return (main,)
    if any(g.discrete for g in fit.gpus):
        return ()
    return default_backend(fit)


def compute_devices(fit: FitInput) -> dict[Kind, tuple[str, ...]]:
    """Explicit --backend assignments are kept; the rest compute where auto-fit puts them."""
    auto = auto_compute(fit)
    out = {}
    for comp in fit.present:
        explicit = fit.compute_of(comp.kind)
        out[comp.kind] = explicit if explicit is not None else auto
    return out


def _headroom(fit: FitInput, device: str, comp: Component, compute: dict[Kind, tuple[str, ...]],
              decided: dict[Kind, Placement], include_self: bool) -> int:
    """Room `device` must keep free beside stored weights while `comp` is being placed."""
    need = 0
    for other in fit.present:
        if device not in compute[other.kind]:
            continue
        if other.kind == comp.kind:
            if include_self:
                need = max(need, other.reserve_bytes)
            continue
        placed = decided.get(other.kind)
        resident = placed is not None and placed.params is Where.RESIDENT
        cached = other.params_bytes if other.kind < comp.kind else other.largest_tensor_bytes
        need = max(need, other.reserve_bytes + (0 if resident else cached))
    return need


def _fits(fit: FitInput, device: str, comp: Component, remaining: dict[str, int],
          compute: dict[Kind, tuple[str, ...]], decided: dict[Kind, Placement], own: bool) -> bool:
    headroom = _headroom(fit, device, comp, compute, decided, include_self=own)
    return headroom <= remaining[device] and comp.params_bytes <= remaining[device] - headroom


def _place_one(fit: FitInput, comp: Component, compute: dict[Kind, tuple[str, ...]],
               remaining: dict[str, int], ram_left: list[int | None],
               decided: dict[Kind, Placement]) -> Placement:
    devices = compute[comp.kind]

    def placed(where: Where, device: str | None = None) -> Placement:
        return Placement(comp.kind, comp.params_bytes, comp.reserve_bytes, devices, where, device, comp.compute_mode,
                         comp.compute_origin)

    if devices and all(_fits(fit, d, comp, remaining, compute, decided, own=True) for d in devices):
        for d in devices:
            remaining[d] -= comp.params_bytes
        return placed(Where.RESIDENT)
    ram = ram_left[0]
    if ram is not None and comp.params_bytes <= ram:
        ram_left[0] = ram - comp.params_bytes
        return placed(Where.CPU)
    if devices:
        others = [g.name for g in fit.gpus if g.discrete and g.name not in devices
                  and _fits(fit, g.name, comp, remaining, compute, decided, own=False)]
        if others:
            best = max(others, key=lambda n: remaining[n])  # max() keeps the first on a tie
            remaining[best] -= comp.params_bytes
            return placed(Where.OTHER_GPU, best)
    return placed(Where.DISK)


def greedy_fit(fit: FitInput) -> tuple[Placement, ...]:
    """Auto-fit's placement of every present component, in priority order."""
    compute = compute_devices(fit)
    remaining = {g.name: max(g.budget_bytes, 0) for g in fit.gpus}
    ram_left: list[int | None] = [fit.ram_budget_bytes]
    decided: dict[Kind, Placement] = {}
    for comp in fit.present:
        decided[comp.kind] = _place_one(fit, comp, compute, remaining, ram_left, decided)
        log.debug("auto-fit: %s -> %s", comp.kind.name, decided[comp.kind])
    return tuple(decided[c.kind] for c in fit.present)


def follow_assignments(fit: FitInput, params: dict[Kind, tuple[Where, str | None]]) -> tuple[Placement, ...]:
    """Auto-fit disabled: compute as assigned (default backend otherwise), parameters as
    --params-backend says or, unset, on the runtime backend (seed 002, "Outside --auto-fit,
    disk is never selected implicitly")."""
    default = default_backend(fit)
    out = []
    for comp in fit.present:
        devices = fit.compute_of(comp.kind)
        devices = default if devices is None else devices
        where, device = params.get(comp.kind, (Where.RESIDENT, None))
        if where is Where.OTHER_GPU and device in devices:
            where, device = Where.RESIDENT, None
        if where is Where.RESIDENT and not devices:
            where = Where.CPU  # a CPU module's own parameters live in RAM
        out.append(Placement(comp.kind, comp.params_bytes, comp.reserve_bytes, devices, where, device,
                             comp.compute_mode, comp.compute_origin))
    return tuple(out)


def default_backend(fit: FitInput) -> tuple[str, ...]:
    """Seed 002: the default backend is the first GPU, then integrated GPU, then the CPU
    (`fit.gpus` is already in that order)."""
    ranked = sorted(fit.gpus, key=lambda g: not g.discrete)
    return (ranked[0].name,) if ranked else ()
