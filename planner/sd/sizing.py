"""Each component's compute buffer at the planned image size (and, for a video model, frame
count): the model (planner/sd/family.py), the flash-attention and direct-convolution decisions for
its compute devices (planner/sd/modes.py) and the corpus curve (planner/sd/sd_compute.py)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from planner.core.errors import BadInput
from planner.sd.components import CURVE, FALLBACK, KIND_MODULE, SIMULATED, Component
from planner.sd.family import LTX2_VAE, LTX_FAMILIES, family
from planner.sd.modes import Feature, ModeSpec, decide, parse_modes
from planner.sd.roles import Kind
from planner.sd.sd_compute import (
    VIDEO_FAMILIES,
    WAN14_DIT,
    WAN22_DIT,
    WAN_DIT,
    Mode,
    compute_bytes,
    video_compute_bytes,
)
from planner.sd.sd_placement import GpuBudget
from planner.sd.sd_simulated import CPU_ROWS, LTX_VAE, device_buffers, is_simulated, simulated_ltx_vae_bytes
from runtime.sd.sd_reserve import BackendFallback, SdBackend

# sd-cli's runners of each component, by model: a component whose runners run one after the other
# (FLUX.1's CLIP-L, then T5-XXL) needs the largest of their buffers
RUNNERS: dict[tuple[Kind, str], tuple[str, ...]] = {
    (Kind.DIFFUSION, "sd15"): ("unet",), (Kind.DIFFUSION, "sdxl"): ("unet",), (Kind.DIFFUSION, "flux"): ("flux",),
    (Kind.TE, "sd15"): ("clip",), (Kind.TE, "sdxl"): ("clip",), (Kind.TE, "flux"): ("clip", "t5"),
    (Kind.VAE, "kl-f8"): ("vae",), (Kind.VAE, "kl-f8-sdxl"): ("vae",),
    (Kind.DIFFUSION, "sd3"): ("mmdit",), (Kind.TE, "sd3"): ("clip", "t5"),
    (Kind.DIFFUSION, "sd3-large"): ("mmdit",),
    (Kind.DIFFUSION, "zimage"): ("z_image",), (Kind.TE, "zimage"): ("qwen3",), (Kind.VAE, "ae16"): ("vae",),
    (Kind.DIFFUSION, "wan"): (WAN_DIT,), (Kind.TE, "wan"): ("t5",), (Kind.VAE, "wan-vae"): ("wan_vae",),
    (Kind.DIFFUSION, "wan-14b"): (WAN14_DIT,),
    (Kind.DIFFUSION, "wan22"): (WAN22_DIT,), (Kind.VAE, "wan22-vae"): ("wan_vae",),
    (Kind.DIFFUSION, "sd2"): ("unet",), (Kind.TE, "sd2"): ("clip",),
    (Kind.VAE, LTX2_VAE): (LTX_VAE[1],),
}
# A VAE whose decode figures depend on the diffusion model it decodes for: (VAE, diffusion) -> the
# corpus family of that decode (sd-cli builds SDXL's KL-f8 decode its own way). The 16-channel
# autoencoder needs no row: SD3, FLUX.1 and Z-Image decode it with one graph ("ae16").
VAE_FOR: dict[tuple[str, str], str] = {("kl-f8", "sdxl"): "kl-f8-sdxl"}
DEFAULT_SIZE = 512          # sd-cli's default -W / -H


@dataclass(frozen=True)
class Render:
    """What sd-cli is asked to make, as far as memory is concerned."""

    width: int = DEFAULT_SIZE
    height: int = DEFAULT_SIZE
    flash_attn: ModeSpec = ModeSpec(Feature.FLASH_ATTN)
    conv_direct: ModeSpec = ModeSpec(Feature.CONV_DIRECT)
    vae_tiling: bool = False
    graph_cuts: bool = False   # the plan sets --max-vram: a runner on a GPU plans its graph cuts first

    @classmethod
    def parse(cls, width: int, height: int, flash_attn: str | None, conv_direct: str | None,
              vae_tiling: bool) -> Render:
        return cls(width, height, parse_modes(flash_attn, Feature.FLASH_ATTN),
                   parse_modes(conv_direct, Feature.CONV_DIRECT), vae_tiling)


# Graphs without a convolution, where --conv-direct changes nothing: FLUX.1's and Z-Image's DiTs
# (their patch embeddings are matmuls)
NO_CONV: frozenset[tuple[Kind, str]] = frozenset({(Kind.DIFFUSION, "flux"), (Kind.DIFFUSION, "zimage")})


def component_mode(comp: Component, render: Render, devices: tuple[tuple[str, str], ...],
                   fam: str | None = None) -> Mode:
    module = KIND_MODULE[comp.kind].value
    conv = module in Feature.CONV_DIRECT.modules and (comp.kind, fam) not in NO_CONV \
        and decide(render.conv_direct, module, devices)
    return Mode(decide(render.flash_attn, module, devices), conv, render.graph_cuts and bool(devices))


def device_facts(names: tuple[str, ...], gpus: tuple[GpuBudget, ...]) -> tuple[tuple[str, str], ...]:
    """(backend, description) of each compute device; () for the CPU."""
    by_name = {g.name: g for g in gpus}
    return tuple((by_name[n].backend, by_name[n].description) for n in names if n in by_name)


def runner_buffers(names: tuple[str, ...], gpus: tuple[GpuBudget, ...]) -> str | SdBackend:
    """The buffer type a component's runners reserve in: a Vulkan device's own where the component computes
    on one (planner/sd/sd_simulated.py device_buffers); the CPU's on the host, on any other backend (sized as
    the CPU build logs), and for a component split across devices."""
    by_name = {g.name: g for g in gpus}
    if len(names) != 1 or names[0] not in by_name:
        return CPU_ROWS
    gpu = by_name[names[0]]
    return device_buffers(gpu.backend, gpu.description, gpu.name) or CPU_ROWS


def sized(comp: Component, render: Render, devices: tuple[tuple[str, str], ...], tiled: bool,
          diffusion: str | None = None, tile: tuple[int, int] | None = None, frames: int = 1,
          temporal: bool = False, buffers: str | SdBackend = CPU_ROWS) -> Component:
    """`comp` with its compute buffer at `render` (None where the corpus lacks the model).
    `diffusion`: the diffusion model's family, which picks the VAE's decode graph (sd-cli decodes
    SDXL's KL-f8 VAE with a graph of its own). `tile`: a tiled decode's tile in latent pixels
    (None: sd-cli's default). `frames`: the video's frame count (4k+1 for Wan);
    an image model takes 1. `temporal`: the decode's frames streamed a few at a time (LTX-2's
    video VAE, planner/sd/vae_retry.py), a decode no family has figures for yet. `buffers`: the buffer type
    its runners reserve in (runner_buffers); where that device refuses a node of a runner's graph, sd-cli runs
    the graph through its CPU-fallback scheduler, which is not modelled: no figure, origin FALLBACK."""
    fam = _decode_family(comp, diffusion, frames)
    temporal = temporal and comp.kind is Kind.VAE
    if fam is None or (temporal and fam != LTX2_VAE):
        return replace(comp, compute_bytes=None, compute_mode="")
    mode = component_mode(comp, render, devices, fam)
    tiled = tiled and comp.kind is Kind.VAE
    try:
        sizes = _runner_sizes(comp.kind, fam, render, mode, frames, tiled, tile, temporal, buffers)
    except BackendFallback:
        return replace(comp, compute_bytes=None, compute_mode="", compute_origin=FALLBACK)
    known = [s for s in sizes if s is not None]
    size = max(known) if known and len(known) == len(sizes) else None
    tiles = f",vae_tiling=on,tile={tile[0]}x{tile[1]}" if tile else ",vae_tiling=on"
    label = mode.key + (tiles if tiled else "") + (",temporal_tiling=on" if temporal else "") \
        if size is not None else ""
    origin = origin_of(fam, RUNNERS.get((comp.kind, fam), ()), size)
    return replace(comp, compute_bytes=size, compute_mode=label, compute_origin=origin)


def _runner_sizes(kind: Kind, fam: str, render: Render, mode: Mode, frames: int, tiled: bool,
                  tile: tuple[int, int] | None, temporal: bool, buffers: str | SdBackend) -> list[int | None]:
    """Each of the component's runners' buffers (None where unknown)."""
    runners = RUNNERS.get((kind, fam), ())
    if fam == LTX2_VAE:
        # LTX-2's VAE: whole or tiled in time; its spatial tiles are not recorded (no figure)
        return [None if tiled else simulated_ltx_vae_bytes(render.width, render.height, frames, temporal)]
    if fam in VIDEO_FAMILIES:
        # a video VAE's tiles are sized at sd-cli's default tile only (`tile` unknown: no figure)
        return [video_compute_bytes(fam, runner, render.width, render.height, frames, mode, tiled, buffers)
                if tile is None or not tiled else None for runner in runners]
    return [compute_bytes(fam, runner, render.width, render.height, mode, tiled, tile, buffers) for runner in runners]


def _decode_family(comp: Component, diffusion: str | None, frames: int) -> str | None:
    """The corpus family of `comp`'s graph (VAE_FOR: the decode picked by the diffusion model); a
    frame count other than 1 only for a video model's components."""
    fam = family(comp)
    if fam is not None and diffusion is not None:
        fam = VAE_FOR.get((fam, diffusion), fam)
    if frames != 1 and fam is not None and fam not in VIDEO_FAMILIES | LTX_FAMILIES:
        raise BadInput(f"--frames {frames}: {fam} makes images, not videos (only 1 frame)")
    return fam


def origin_of(fam: str, runners: tuple[str, ...], size: int | None) -> str:
    """SIMULATED where runtime/sd builds every one of the component's runners, else CURVE; "" where
    the component has no figure (`size` None: the fixed reserve stands in)."""
    if size is None:
        return ""
    return SIMULATED if runners and all(is_simulated(fam, r) for r in runners) else CURVE
