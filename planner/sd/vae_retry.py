"""What sd-cli tries when a VAE decode fails, in order: sd-fit plans those retries up front.

Seed 002: "If a VAE decode fails, decoding retries with spatial tiling even when --auto-fit is
off; supported video decoders try temporal tiling first and can then add spatial tiling. Spatial
retries use half-size tiles along each latent dimension."

In the pinned stable-diffusion.cpp (97d2990) the one decoder that tiles in time is LTX-2's video
VAE: `decode_first_stage` (src/stable-diffusion.cpp:3062-3076) prefers temporal tiling when the
decode is a video's (`decode_video`, true for generate_video's decode, :6581) and the first-stage
model is an LTXVideoVAE, which sd-cli builds for an LTXAV checkpoint unless a TAE decodes
(:1438, :1501). `prepare_vae_decode_retry_tiling` (src/core/backend_fit.cpp:366) then switches
temporal tiling on and leaves the spatial setting as it was; for any other decoder it switches
spatial tiling on. Spatial tiling decodes each tile through the decoder's own compute (vae.hpp
`decode` -> `tiled_compute`), and the LTX VAE streams a tile's frames when temporal tiling is on
(ltx_vae.hpp:1449): the two combine, which is what "can then add spatial tiling" is.

The pinned build retries once and only with auto-fit on; sd-fit follows the seed (issue 45: the
seed decides, the binary sizes), so every decoder gets every retry the seed names, auto-fit on or
off, and then sd-cli's default tile where half-size tiles are still too big.
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.sd.components import Component
from planner.sd.family import LTX2, family
from planner.sd.roles import Kind
from planner.sd.sd_compute import LATENT_FACTOR, MIN_TILE

# Diffusion families whose VAE sd-cli builds as a decoder that tiles in time (LTXVideoVAE)
TEMPORAL_DECODERS: frozenset[str] = frozenset({LTX2})
# Image pixels per latent pixel where not LATENT_FACTOR: src/model/vae/vae.hpp get_scale_factor (VERSION_LTXAV: 32)
VAE_SCALE: dict[str, int] = {LTX2: 32}
TAE_PREFIX = "tae."   # --taesd's tensors (planner/sd/roles.py): a TAE then decodes, not the VAE


@dataclass(frozen=True)
class Decoder:
    """What the retries depend on: whether the decoder tiles in time, and its image pixels per
    latent pixel (the retry tile is half the latent)."""

    temporal: bool = False
    scale: int = LATENT_FACTOR


@dataclass(frozen=True)
class Tiling:
    """A tiled VAE decode: spatial tiles of `tile` latent pixels (x, y), None for sd-cli's default
    tile, or none at all (`spatial` False); `temporal`: the frames streamed a few at a time."""

    tile: tuple[int, int] | None = None
    spatial: bool = True
    temporal: bool = False

    @property
    def args(self) -> list[str]:
        # --temporal-tiling: examples/common/common.cpp's switch for the LTX video VAE's decode
        out = ["--temporal-tiling"] if self.temporal else []
        if self.spatial:
            out.append("--vae-tiling")
            if self.tile is not None:
                out += ["--vae-tile-size", f"{self.tile[0]}x{self.tile[1]}"]
        return out


TEMPORAL = Tiling(spatial=False, temporal=True)


def retry_tile(width: int, height: int, scale: int = LATENT_FACTOR) -> tuple[int, int]:
    """Seed 002's retry tile: half the latent along each dimension (at least vae.hpp's minimum)."""
    def half(side: int) -> int:
        return max(-(-(side // scale) // 2), MIN_TILE)

    return half(width), half(height)


def decoder_of(components: tuple[Component, ...]) -> Decoder:
    """The video or image decode's VAE as sd-cli builds it: one that tiles in time where the
    diffusion model is one of TEMPORAL_DECODERS and no TAE takes the decode over."""
    diffusion = next((family(c) for c in components if c.kind is Kind.DIFFUSION and c.params_bytes), None)
    tae = any(t.name.startswith(TAE_PREFIX) for c in components if c.kind is Kind.VAE for t in c.tensors)
    if diffusion is None or tae:
        return Decoder()
    return Decoder(diffusion in TEMPORAL_DECODERS, VAE_SCALE.get(diffusion, LATENT_FACTOR))


def retry_order(decoder: Decoder, width: int, height: int, spatial_asked: bool = False) -> tuple[Tiling, ...]:
    """The tilings sd-fit tries, in order, when the decode as asked does not fit; `spatial_asked`:
    --vae-tiling was given, so the first decode was already spatially tiled at sd-cli's default tile."""
    half = retry_tile(width, height, decoder.scale)
    if decoder.temporal:
        if spatial_asked:
            return (Tiling(temporal=True),)
        return TEMPORAL, Tiling(half, temporal=True), Tiling(temporal=True)
    if spatial_asked:
        return ()
    return Tiling(half), Tiling()
