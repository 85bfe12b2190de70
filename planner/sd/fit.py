"""sd-fit: flags + model files + inventory -> an SdPlan (the one library call of the command)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from planner.core.errors import BadInput, FlagError
from planner.gguf.source import is_url
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
from planner.sd.check import device_needs, overcommit, ram_need
from planner.sd.components import KIND_MODULE, Component, read_components
from planner.sd.family import LTX_FAMILIES, family
from planner.sd.ladder import Rung, climb
from planner.sd.plan import Mode, SdPlan, search_limits, specs
from planner.sd.resolve import canonical_max_vram, canonical_token, resolve_compute, resolve_params
from planner.sd.roles import DEFAULT_STEPS, Kind, ModelSource
from planner.sd.sd_compute import FRAME_STEP, VIDEO_FAMILIES
from planner.sd.sd_placement import FitInput, GpuBudget, MappedFile, Placement, Where, ram_budget
from planner.sd.sd_simulated import PROMPT_FAMILIES
from planner.sd.sizing import DEFAULT_SIZE, Render, device_facts, runner_buffers, sized
from planner.sd.split import SPLITTABLE, SplitRange, row_shares, split_ranges
from planner.sd.traffic import traffic_bytes
from planner.sd.vae_retry import Tiling, decoder_of, retry_order

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
    mmap: bool = False              # sd-cli --mmap: mapped files count whole on devices that map them
    frames: int = 1                 # video models only (--frames / sd-cli's --video-frames)
    search_largest: bool = True     # also find the largest square that fits (a sweep does not need it)
    batch: int = 1                  # sd-cli's -b / --batch-count: images per run (image models)
    prompt_tokens: int | None = None   # the prompt's length in tokens; None: a short prompt (one chunk)


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


def _sized(fit: FitInput, render: Render, auto: bool, tiling: Tiling | None, frames: int = 1) -> FitInput:
    """`fit` with every component's compute buffer at `render`, on the devices it computes on,
    the VAE decode tiled as `tiling` says (None: untiled)."""
    where = compute_devices(fit) if auto else {c.kind: _explicit_or_default(fit, c.kind) for c in fit.present}
    diffusion = next((family(c) for c in fit.present if c.kind is Kind.DIFFUSION), None)
    spatial = tiling is not None and tiling.spatial
    tile = tiling.tile if tiling is not None else None
    temporal = tiling is not None and tiling.temporal
    comps = tuple(sized(c, render, device_facts(where.get(c.kind) or (), fit.gpus), spatial, diffusion, tile, frames,
                        temporal, runner_buffers(where.get(c.kind) or (), fit.gpus))
                  if c.params_bytes else c for c in fit.components)
    return replace(fit, components=comps)


def _place(fit: FitInput, request: SdFitRequest, auto: bool,
           param_targets: dict[Kind, tuple[Where, str | None] | None]) -> tuple[tuple[Placement, ...], Mode]:
    if request.optimal:
        from planner.sd.optimal import optimal_fit  # pulp loads in ~0.05 s; only --optimal needs it

        return optimal_fit(fit, request.steps), Mode.OPTIMAL
    if auto:
        return _actual(greedy_fit(_initial_reserves(fit)), fit), Mode.AUTO_FIT
    chosen = {k: v for k, v in param_targets.items() if v is not None}
    return follow_assignments(fit, chosen), Mode.MANUAL


def _initial_reserves(fit: FitInput) -> FitInput:
    """`fit` as sd-cli's auto-fit sees it: every component with the fixed initial compute reserve
    (seed 002: "Initial compute reserves are estimates (2 GiB for diffusion and text encoders,
    1 GiB for VAE)"; src/core/backend_fit.cpp gives them whatever the image size)."""
    return replace(fit, components=tuple(replace(c, compute_bytes=None, compute_mode="", compute_origin="")
                                         for c in fit.components))


def _actual(placements: tuple[Placement, ...], sized_fit: FitInput) -> tuple[Placement, ...]:
    """The placements with each component's real compute buffer at the planned size: what the
    runner's capacity checks hold the placement to (seed 002: "Actual segment weights, compute
    buffers and caches must still fit the runner's capacity checks")."""
    comps = {c.kind: c for c in sized_fit.components}
    return tuple(replace(p, reserve_bytes=comps[p.kind].reserve_bytes, compute_mode=comps[p.kind].compute_mode,
                         compute_origin=comps[p.kind].compute_origin)
                 for p in placements)


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
    render = _render(request, max_vram)
    base = _fit_input(inventory, read_components(list(request.sources)), backend, max_vram)
    if request.mmap:
        base = replace(base, mapped_files=mapped_files(request.sources))
    _check_frames(base, request.frames)
    _check_batch(base, request.batch)
    fit, placements, mode, tiling = _plan_at(base, request, auto, param_targets, render)
    kept = _kept(inventory, backend, Role.BACKEND), _kept(inventory, params, Role.PARAMS)
    auto_fails = _ladder_applies(request, auto) and bool(overcommit(fit, placements))
    closest: Rung | None = None
    if auto_fails:
        found, closest = _ladder(base, request, render)
        if found is not None:
            fit, placements, mode, tiling, closest = found.fit, found.placements, Mode.MANUAL, found.tiling, None
    searched = request.search_largest
    sides = _largest(base, request, auto, param_targets, render) if searched else Reach()
    frames = _largest_frames(base, request, auto, param_targets, render) if searched else Reach()
    tiled = tiling is not None
    ram = ram_need(fit, placements)
    runtime_spec, params_spec = specs(placements, *kept)
    return SdPlan(mode, fit.gpus, fit.ram_free_bytes, fit.ram_budget_bytes, placements,
                  _splits(fit, placements, modes), runtime_spec, params_spec, max_vram, _split_spec(modes),
                  traffic_bytes(fit, placements, request.steps), overcommit(fit, placements),
                  tuple(a for src in request.sources for a in (src.role.flag, src.path)),
                  _render_args(request, tiling), render.width, render.height, tiled,
                  tuple((c.kind, c.buffer_bytes) for c in fit.present),
                  sides.best, device_needs(fit, placements) + ((ram,) if ram is not None else ()), frames.best,
                  request.frames, request.batch, request.prompt_tokens,
                  _prompt_sized(base), auto_fails, closest.needs if closest is not None else (),
                  _closest_args(closest, kept),
                  sides.as_asked, frames.as_asked)


def _closest_args(closest: Rung | None, kept: tuple[list[tuple[str, str]], list[tuple[str, str]]]) -> tuple[str, ...]:
    """sd-cli's placement flags for the explicit placement that comes closest to fitting."""
    if closest is None:
        return ()
    runtime_spec, params_spec = specs(closest.placements, *kept)
    tiling = closest.tiling.args if closest.tiling is not None else []
    return ("--backend", runtime_spec, "--params-backend", params_spec, *tiling)


def _ladder_applies(request: SdFitRequest, auto: bool) -> bool:
    """Whether sd-fit looks for an explicit placement when auto-fit's is over budget: only where it
    reproduces sd-cli's auto-fit (not under --optimal, nor where the user placed parameters)."""
    return auto and not request.optimal


def _pinned(base: FitInput) -> FitInput:
    """`base` with each module's compute where auto-fit runs it, written out as --backend would."""
    where = compute_devices(base)
    return replace(base, compute=tuple((k, where.get(k, base.compute_of(k))) for k in Kind))


def _ladder(base: FitInput, request: SdFitRequest, render: Render) -> tuple[Rung | None, Rung | None]:
    """When auto-fit's placement is over budget: the first explicit placement that fits and the one
    that comes closest (planner/sd/ladder.py), each checked with the decode as asked, then at each of
    sd-cli's tiling retries (which it makes with auto-fit off too)."""
    pinned = _pinned(base)
    asked = Tiling() if render.vae_tiling else None
    sized = [(_sized(pinned, render, False, asked, request.frames), asked)]
    for tiling in retry_order(decoder_of(base.components), render.width, render.height, render.vae_tiling):
        tiled_fit = _sized(pinned, render, False, tiling, request.frames)
        if any(c.kind is Kind.VAE and c.compute_mode for c in tiled_fit.components):
            sized.append((tiled_fit, tiling))
    return climb(sized, request.steps)


def _fits_at(base: FitInput, request: SdFitRequest, auto: bool,
             param_targets: dict[Kind, tuple[Where, str | None] | None], render: Render) -> bool | None:
    """How sd-fit answers at `render` and request's frames: True where the plan as asked (auto-fit's
    placement) fits, False where only an explicit placement does (the size searches use the same
    ladder as the answer), None where nothing fits."""
    fit, placements, _, _ = _plan_at(base, request, auto, param_targets, render)
    if not overcommit(fit, placements):
        return True
    if _ladder_applies(request, auto) and _ladder(base, request, render)[0] is not None:
        return False
    return None


@dataclass(frozen=True)
class Reach:
    """A search's answer: the largest value that fits, and the largest auto-fit's own placement fits."""

    best: int | None = None
    as_asked: int | None = None


def _reach(values: range, fits_at: Callable[[int], bool | None]) -> Reach:
    """Walk `values` upwards while something fits."""
    best = as_asked = None
    still = True
    for value in values:
        how = fits_at(value)
        if how is None:
            break
        best = value
        still = still and how
        if still:
            as_asked = value
    return Reach(best, as_asked)



def _render(request: SdFitRequest, max_vram: str | None) -> Render:
    """The image as asked: size, attention and convolution modes, tiling, the prompt's length, and
    whether sd-cli plans graph cuts (it does under any --max-vram)."""
    if request.prompt_tokens is not None and request.prompt_tokens < 0:
        raise BadInput(f"--prompt-tokens {request.prompt_tokens}: expected 0 or more (the prompt's length in "
                       f"the text encoder's tokens)")
    return replace(Render.parse(request.width or DEFAULT_SIZE, request.height or DEFAULT_SIZE, request.flash_attn,
                                request.conv_direct, request.vae_tiling, request.prompt_tokens),
                   graph_cuts=max_vram is not None)


def _prompt_sized(base: FitInput) -> bool:
    """Whether the diffusion model's family sizes its buffers by the prompt's length."""
    return any(family(c) in PROMPT_FAMILIES for c in base.present if c.kind is Kind.DIFFUSION)

def mapped_files(sources: tuple[ModelSource, ...]) -> tuple[MappedFile, ...]:
    """Each local model file's size and the components its tensors belong to (a URL is not mapped)."""
    out = []
    for src in sources:
        if is_url(src.path):
            continue
        kinds = frozenset(c.kind for c in read_components([src]) if c.params_bytes)
        out.append(MappedFile(Path(src.path).stat().st_size, kinds))
    return tuple(out)


def _check_frames(fit: FitInput, frames: int) -> None:
    """--frames is a video model's; an image model makes one frame (sd-cli ignores the count there)."""
    if frames < 1:
        raise BadInput(f"--frames {frames}: expected 1 or more")
    diffusion = next((family(c) for c in fit.present if c.kind is Kind.DIFFUSION), None)
    if frames != 1 and diffusion not in VIDEO_FAMILIES | LTX_FAMILIES:
        what = f"{diffusion} is an image model" if diffusion else "this diffusion model is not a known video model"
        raise BadInput(f"--frames {frames}: {what}; --frames applies to video models only")


def _check_batch(fit: FitInput, batch: int) -> None:
    """sd-cli's -b N, checked as sd-cli checks it, and why it changes no figure of the plan.

    sd-cli rejects a count below 1 (examples/common/common.cpp `validate`). generate_image
    (src/stable-diffusion.cpp) computes the conditioning once, then samples the N images one after
    another, each from a latent of batch 1 (`generate_init_latent`), and decode_image_outputs decodes
    them one at a time: every runner's graph holds one image and its compute buffer is freed after each
    image and reserved again, the same size, for the next. So the plan at -b N is the plan at -b 1
    (tests/planner/sd/test_batch.py holds sd-cli's recorded buffers at -b 2 and 4 to those at 1).
    A video is one sequence: vid_gen has no batch count (sd_vid_gen_params_t), so sd-cli ignores -b there."""
    if batch < 1:
        raise BadInput(f"--batch {batch}: expected 1 or more (sd-cli's -b / --batch-count)")
    if batch != 1 and _video(fit):
        raise BadInput(f"--batch {batch}: a video model makes one clip per run (sd-cli's vid_gen has no batch "
                       f"count); --batch applies to image models only")


def _plan_at(base: FitInput, request: SdFitRequest, auto: bool,
             param_targets: dict[Kind, tuple[Where, str | None] | None],
             render: Render) -> tuple[FitInput, tuple[Placement, ...], Mode, Tiling | None]:
    """The placement at `render`'s size, with the VAE decode tiled when that is what makes it fit:
    the decode as asked first, then sd-cli's retries in their order (planner/sd/vae_retry.py: a
    decoder that tiles in time tries that first, any other half-size spatial tiles), each only
    where the VAE's figures at that tiling are known (else tiling cannot be shown to help)."""
    sizing = auto or request.optimal
    asked = Tiling() if render.vae_tiling else None
    fit = _sized(base, render, sizing, asked, request.frames)
    placements, mode = _place(fit, request, auto, param_targets)
    if not overcommit(fit, placements):
        return fit, placements, mode, asked
    order = retry_order(decoder_of(base.components), render.width, render.height, render.vae_tiling)
    for tiling in order:
        tiled_fit = _sized(base, render, sizing, tiling, request.frames)
        if not any(c.kind is Kind.VAE and c.compute_mode for c in tiled_fit.components):
            continue
        tiled_placements, _ = _place(tiled_fit, request, auto, param_targets)
        if not overcommit(tiled_fit, tiled_placements):
            return tiled_fit, tiled_placements, mode, tiling
    return fit, placements, mode, asked


def _largest(base: FitInput, request: SdFitRequest, auto: bool,
             param_targets: dict[Kind, tuple[Where, str | None] | None], render: Render) -> Reach:
    """The largest square side (a multiple of 64) at which the plan fits, or None when no
    component's compute depends on the size (no corpus curve) or nothing fits. The search ends at
    the largest size the corpus has recorded (CORPUS_MAX_SIDE) where a curve gives a figure (the curves
    are not extrapolated), at SIMULATED_MAX_SIDE where every figure is simulated (planner/sd/plan.py)."""
    comps = _sized(base, render, auto, None).components
    if _video(base) or not any(c.compute_bytes is not None for c in comps if c.kind is not Kind.TE):
        return Reach()
    max_side, _ = search_limits(c.compute_origin for c in comps)
    return _reach(range(SIZE_STEP, max_side + 1, SIZE_STEP),
                  lambda side: _fits_at(base, request, auto, param_targets, replace(render, width=side, height=side)))


def _video(fit: FitInput, families: frozenset[str] = VIDEO_FAMILIES | LTX_FAMILIES) -> bool:
    return any(family(c) in families for c in fit.present if c.kind is Kind.DIFFUSION)


def _largest_frames(base: FitInput, request: SdFitRequest, auto: bool,
                    param_targets: dict[Kind, tuple[Where, str | None] | None], render: Render) -> Reach:
    """A video model's largest frame count (1, 5, 9, ...: 4k+1) that fits at the planned size, up
    to the most frames the corpus records (MAX_RECORDED_FRAMES) where a curve gives a figure, to
    SIMULATED_MAX_FRAMES where every figure is simulated; None for an image model or when one frame
    does not fit."""
    if not _video(base, VIDEO_FAMILIES):   # Wan's 4k+1 frames; LTX-2's 8k+1 are not searched
        return Reach()
    _, max_frames = search_limits(c.compute_origin for c in _sized(base, render, auto, None).components)
    return _reach(range(1, max_frames + 1, FRAME_STEP),
                  lambda frames: _fits_at(base, replace(request, frames=frames), auto, param_targets, render))


def _render_args(request: SdFitRequest, tiling: Tiling | None) -> tuple[str, ...]:
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
    if tiling is not None:
        out += tiling.args
    if request.frames != 1:
        out += ["--video-frames", str(request.frames)]
    if request.batch != 1:
        out += ["-b", str(request.batch)]
    if request.mmap:
        out.append("--mmap")
    return tuple(out)
