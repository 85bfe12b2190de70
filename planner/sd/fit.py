"""sd-fit: flags + model files + inventory -> an SdPlan (the one library call of the command)."""
from __future__ import annotations

from dataclasses import dataclass

from planner.core.errors import FlagError
from planner.hardware.budgets import resolve_budgets
from planner.hardware.inventory import DeviceKind, Inventory
from planner.sd.assign import (
    ALL_KEY,
    Assignment,
    Role,
    SplitMode,
    is_default_token,
    parse_assignment,
    parse_max_vram,
    with_compat,
)
from planner.sd.autofit import follow_assignments, greedy_fit
from planner.sd.check import overcommit
from planner.sd.components import KIND_MODULE, Component, read_components
from planner.sd.placement import FitInput, GpuBudget, Placement, ram_budget
from planner.sd.plan import Mode, SdPlan, specs
from planner.sd.resolve import canonical_max_vram, canonical_token, resolve_compute, resolve_params
from planner.sd.roles import DEFAULT_STEPS, Kind, ModelSource
from planner.sd.split import SPLITTABLE, SplitRange, row_shares, split_ranges
from planner.sd.traffic import traffic_bytes


@dataclass(frozen=True)
class SdFitRequest:
    sources: tuple[ModelSource, ...]
    backend: str | None = None
    params_backend: str | None = None
    max_vram: str | None = None
    auto_fit: bool = True
    optimal: bool = False
    steps: int = DEFAULT_STEPS
    split_mode: str | None = None
    compat: tuple[str, ...] = ()  # sd-cli compatibility flags, e.g. "--offload-to-cpu"


def gpu_budgets(inventory: Inventory, max_vram: str | None) -> tuple[GpuBudget, ...]:
    """Every non-CPU device with its --max-vram budget (planner.hardware.budgets: seed 002's rules)."""
    budgets = resolve_budgets(inventory, max_vram, None)
    # ggml's device order, not llama.cpp's: sd-cli registers RPC servers after the built-in
    # backends (ggml_extend_backend.cpp `add_rpc_devices`), so they come last — which matters
    # for auto-fit's first-on-a-tie rule.
    ordered = sorted(inventory.devices, key=lambda d: d.kind is DeviceKind.RPC)
    return tuple(GpuBudget(d.name, d.free_bytes, max(budgets.devices.get(d.name, 0), 0), d.description,
                           discrete=d.kind in (DeviceKind.GPU, DeviceKind.RPC), backend=d.backend.value)
                 for d in ordered)


def _fit_input(inventory: Inventory, components: tuple[Component, ...], backend: Assignment,
               max_vram: str | None) -> FitInput:
    available = inventory.host.ram_available_bytes
    ram_free = available if available is not None and available >= 0 else None
    compute = tuple((k, resolve_compute(inventory, backend, KIND_MODULE[k])) for k in Kind)
    return FitInput(components, gpu_budgets(inventory, max_vram), ram_free, ram_budget(ram_free), compute)


def _kept(inventory: Inventory, assignment: Assignment, role: Role) -> list[tuple[str, str]]:
    """The user's entries for modules sd-fit does not place: the default first (it still
    applies to them), then each other module (seed 002: auto-fit preserves explicit --backend
    assignments)."""
    placed = set(KIND_MODULE.values())
    entries = [(ALL_KEY, assignment.default)] if not is_default_token(assignment.default) else []
    entries += [(m.value, v) for m, v in assignment.modules if m not in placed and not is_default_token(v)]
    return [(key, canonical_token(inventory, value, role)) for key, value in entries]


def _splits(fit: FitInput, placements: tuple[Placement, ...],
            modes: Assignment) -> tuple[tuple[Kind, tuple[SplitRange, ...]], ...]:
    """Layer or row split of each multi-device component (--split-mode, default layer)."""
    free = {g.name: g.free_bytes for g in fit.gpus}
    limits = {g.name: g.budget_bytes for g in fit.gpus}
    backends = {g.name: g.backend for g in fit.gpus}
    comps = {c.kind: c for c in fit.components}
    out: list[tuple[Kind, tuple[SplitRange, ...]]] = []
    for p in placements:
        if len(p.compute) < 2 or p.kind not in SPLITTABLE:
            continue
        rows: tuple[SplitRange, ...] | None = None
        if modes.get(KIND_MODULE[p.kind]).strip().lower() == SplitMode.ROW.value:
            rows = row_shares(comps[p.kind], p.compute, free, backends)
        out.append((p.kind, rows or split_ranges(comps[p.kind], p.compute, free, limits)))
    return tuple(out)


def _split_spec(modes: Assignment) -> str | None:
    parts = [modes.default.strip().lower()] if modes.default else []
    parts += [f"{m.value}={v.strip().lower()}" for m, v in modes.modules]
    return ",".join(parts) or None


def sd_fit(request: SdFitRequest, inventory: Inventory) -> SdPlan:
    backend = parse_assignment(with_compat(request.backend, Role.BACKEND, request.compat), Role.BACKEND)
    params = parse_assignment(with_compat(request.params_backend, Role.PARAMS, request.compat), Role.PARAMS)
    modes = parse_assignment(request.split_mode, Role.SPLIT_MODE)
    max_vram = canonical_max_vram(inventory, parse_max_vram(request.max_vram))
    # Seed 002: explicit --params-backend disables auto-fit regardless of order or --auto-fit on.
    auto = request.auto_fit and params.empty
    if request.optimal and not auto:
        raise FlagError("--optimal plans parameter placement; it cannot be combined with "
                        "--params-backend or --auto-fit off")
    param_targets = {k: resolve_params(inventory, params, KIND_MODULE[k]) for k in Kind}
    components = read_components(list(request.sources))
    fit = _fit_input(inventory, components, backend, max_vram)
    if request.optimal:
        from planner.sd.optimal import optimal_fit  # pulp loads in ~0.05 s; only --optimal needs it

        placements, mode = optimal_fit(fit, request.steps), Mode.OPTIMAL
    elif auto:
        placements, mode = greedy_fit(fit), Mode.AUTO_FIT
    else:
        chosen = {k: v for k, v in param_targets.items() if v is not None}
        placements, mode = follow_assignments(fit, chosen), Mode.MANUAL
    runtime_spec, params_spec = specs(placements, _kept(inventory, backend, Role.BACKEND),
                                       _kept(inventory, params, Role.PARAMS))
    return SdPlan(mode, fit.gpus, fit.ram_free_bytes, fit.ram_budget_bytes, placements,
                  _splits(fit, placements, modes), runtime_spec, params_spec, max_vram, _split_spec(modes),
                  traffic_bytes(fit, placements, request.steps), overcommit(fit, placements),
                  tuple(a for src in request.sources for a in (src.role.flag, src.path)))
