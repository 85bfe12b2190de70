"""sd-fit: flags + model files + inventory -> an SdPlan (the one library call of the command)."""
from __future__ import annotations

from dataclasses import dataclass, replace

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
from planner.sd.autofit import compute_devices, default_backend, follow_assignments, greedy_fit
from planner.sd.check import overcommit
from planner.sd.components import KIND_MODULE, Component, read_components
from planner.sd.family import family
from planner.sd.plan import Mode, SdPlan, specs
from planner.sd.resolve import canonical_max_vram, canonical_token, resolve_compute, resolve_params
from planner.sd.roles import DEFAULT_STEPS, Kind, ModelSource
from planner.sd.sd_compute import CORPUS_MAX_SIDE
from planner.sd.sd_placement import FitInput, GpuBudget, Placement, Where, ram_budget
from planner.sd.sizing import DEFAULT_SIZE, Render, device_facts, sized
from planner.sd.split import SPLITTABLE, SplitRange, row_shares, split_ranges
from planner.sd.traffic import traffic_bytes

SIZE_STEP = 64      # sd-cli's SD 1.x / XL image sizes


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
    width: int | None = None      # None: sd-cli's default, 512
    height: int | None = None
    flash_attn: str | None = None   # seed 002 mode strings ("auto,te=off")
    conv_direct: str | None = None
    vae_tiling: bool = False        # asked for; sd-fit also turns it on when the decode does not fit


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


def _explicit_or_default(fit: FitInput, kind: Kind) -> tuple[str, ...]:
    explicit = fit.compute_of(kind)
    return explicit if explicit is not None else default_backend(fit)


def _sized(fit: FitInput, render: Render, auto: bool, tiled: bool) -> FitInput:
    """`fit` with every component's compute buffer at `render`, on the devices it computes on."""
    where = compute_devices(fit) if auto else {c.kind: _explicit_or_default(fit, c.kind) for c in fit.present}
    diffusion = next((family(c) for c in fit.present if c.kind is Kind.DIFFUSION), None)
    comps = tuple(sized(c, render, device_facts(where.get(c.kind) or (), fit.gpus), tiled, diffusion)
                  if c.params_bytes else c for c in fit.components)
    return replace(fit, components=comps)


def _place(fit: FitInput, request: SdFitRequest, auto: bool,
           param_targets: dict[Kind, tuple[Where, str | None] | None]) -> tuple[tuple[Placement, ...], Mode]:
    if request.optimal:
        from planner.sd.optimal import optimal_fit  # pulp loads in ~0.05 s; only --optimal needs it

        return optimal_fit(fit, request.steps), Mode.OPTIMAL
    if auto:
        return greedy_fit(fit), Mode.AUTO_FIT
    chosen = {k: v for k, v in param_targets.items() if v is not None}
    return follow_assignments(fit, chosen), Mode.MANUAL


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
    render = Render.parse(request.width or DEFAULT_SIZE, request.height or DEFAULT_SIZE, request.flash_attn,
                          request.conv_direct, request.vae_tiling)
    base = _fit_input(inventory, read_components(list(request.sources)), backend, max_vram)
    fit, placements, mode, tiled = _plan_at(base, request, auto, param_targets, render)
    runtime_spec, params_spec = specs(placements, _kept(inventory, backend, Role.BACKEND),
                                       _kept(inventory, params, Role.PARAMS))
    return SdPlan(mode, fit.gpus, fit.ram_free_bytes, fit.ram_budget_bytes, placements,
                  _splits(fit, placements, modes), runtime_spec, params_spec, max_vram, _split_spec(modes),
                  traffic_bytes(fit, placements, request.steps), overcommit(fit, placements),
                  tuple(a for src in request.sources for a in (src.role.flag, src.path)),
                  _render_args(request, tiled), render.width, render.height, tiled,
                  tuple((c.kind, c.buffer_bytes) for c in fit.present),
                  _largest(base, request, auto, param_targets, render))


def _plan_at(base: FitInput, request: SdFitRequest, auto: bool,
             param_targets: dict[Kind, tuple[Where, str | None] | None],
             render: Render) -> tuple[FitInput, tuple[Placement, ...], Mode, bool]:
    """The placement at `render`'s size; with the VAE decode tiled when that is what makes it fit
    (seed 002: a failed decode is retried with spatial tiling; sd-fit plans it up front)."""
    fit = _sized(base, render, auto or request.optimal, render.vae_tiling)
    placements, mode = _place(fit, request, auto, param_targets)
    if render.vae_tiling or not overcommit(fit, placements):
        return fit, placements, mode, render.vae_tiling
    tiled_fit = _sized(base, render, auto or request.optimal, True)
    tiled_placements, _ = _place(tiled_fit, request, auto, param_targets)
    tiles = any(c.kind is Kind.VAE and c.compute_mode for c in tiled_fit.components)
    if tiles and not overcommit(tiled_fit, tiled_placements):
        return tiled_fit, tiled_placements, mode, True
    return fit, placements, mode, False


def _largest(base: FitInput, request: SdFitRequest, auto: bool,
             param_targets: dict[Kind, tuple[Where, str | None] | None], render: Render) -> int | None:
    """The largest square side (a multiple of 64) at which the plan fits, or None when no
    component's compute depends on the size (no corpus curve) or nothing fits. The search ends at
    the largest size the corpus has recorded (CORPUS_MAX_SIDE): the curves are not extrapolated."""
    if not any(c.compute_bytes is not None for c in _sized(base, render, auto, False).components
               if c.kind is not Kind.TE):
        return None
    best = None
    for side in range(SIZE_STEP, CORPUS_MAX_SIDE + 1, SIZE_STEP):
        at = replace(render, width=side, height=side)
        fit, placements, _, _ = _plan_at(base, request, auto, param_targets, at)
        if overcommit(fit, placements):
            break
        best = side
    return best


def _render_args(request: SdFitRequest, tiled: bool) -> tuple[str, ...]:
    """sd-cli's image and mode flags: the size and modes as asked, tiling where planned."""
    out: list[str] = []
    if request.width is not None:
        out += ["-W", str(request.width)]
    if request.height is not None:
        out += ["-H", str(request.height)]
    if request.flash_attn is not None:
        out += ["--flash-attn", request.flash_attn]
    if request.conv_direct is not None:
        out += ["--conv-direct", request.conv_direct]
    if tiled:
        out.append("--vae-tiling")
    return tuple(out)
