"""Compute buffers of stable-diffusion.cpp's runners at a given image size, from sd-cli's own logs.

Each runner (the UNet, the VAE, a text encoder) reserves one compute buffer for its graph with
ggml's graph allocator (src/core/ggml_extend.hpp `alloc_compute_buffer`). For a fixed model and
mode, every tensor of a UNet or VAE graph has a size linear in the latent's pixel count
N = (width / 8) x (height / 8) (activations, im2col columns), or quadratic in it (the attention
scores KQ of ordinary attention, N_level^2 per head), so the allocator's peak is
a + b*N + c*N^2 while the set of tensors alive at the peak stays the same. The three
coefficients come from three sd-cli runs, the FIT_SIZES rows of the recorded corpus
planner/sd/data/sd_cli_corpus.json (written by scripts/record_sd_corpus.py); a runner whose peak
changes within the range gets one such piece per three consecutive sizes. Every other row of
the corpus and the peer test (tests/peer/test_sd_peer.py) check the figure at other sizes.
Text encoders see 77 tokens whatever the image size: one row, a constant.

VAE tiling decodes tiles of min(32, latent side) latent pixels per side (src/model/vae/vae.hpp
`get_tile_sizes`, the default --vae-tile-size), so a tiled decode reserves what an untiled decode
of one tile does.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from planner.core.errors import BadInput
from planner.sd.sd_simulated import simulated_bytes

CORPUS = Path(__file__).resolve().parent / "data" / "sd_cli_corpus.json"
LATENT_FACTOR = 8          # SD 1.x / 2.x / XL VAEs: 8 image pixels per latent pixel
VAE_TILE = 32              # vae.hpp get_tile_sizes: the default tile side, in latent pixels
SIZE_STEP = 64             # sd-cli rounds width and height to multiples of 64 for the UNet models
# The sizes each curve is solved from, by (model, runner). A UNet's span the range people ask
# about (the attention term dominates at the top); where the tensors alive at the allocator's peak
# change within the range (SDXL's UNet without flash attention above 512x512, FLUX.1's DiT below
# it, where its 256 text tokens weigh more) there are more sizes and a piece per three
# consecutive ones. The VAE's buffer is linear in N: any three sizes do. Text encoders: one.
CORPUS_MAX_SIDE = 1024   # the largest square the corpus records; sd-fit searches no further
FIT_SIZES: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    ("sd15", "unet"): ((256, 256), (512, 512), (1024, 1024)),
    ("sdxl", "unet"): ((256, 256), (384, 384), (512, 512), (640, 640), (1024, 1024)),
    ("flux", "flux"): ((256, 256), (384, 384), (512, 512), (768, 768), (1024, 1024)),
    ("kl-f8", "vae"): ((256, 256), (384, 384), (512, 512)),
    ("kl-f8-sdxl", "vae"): ((256, 256), (384, 384), (512, 512)),
    ("sd15", "clip"): ((256, 256),),
    ("sdxl", "clip"): ((256, 256),),
    ("flux", "clip"): ((256, 256),),
    ("flux", "t5"): ((256, 256),),
    # SD3.5 medium's MMDiT-X, Z-Image-Turbo's DiT, their text encoders, and the 16-channel KL-f8
    # autoencoder SD3, FLUX.1 and Z-Image share (one decode graph: only the latent scale differs)
    ("sd3", "mmdit"): ((256, 256), (384, 384), (512, 512), (768, 768), (1024, 1024)),
    ("sd3", "clip"): ((256, 256),),
    ("sd3", "t5"): ((256, 256),),
    ("zimage", "z_image"): ((256, 256), (512, 512), (1024, 1024)),
    ("zimage", "qwen3"): ((256, 256),),
    ("ae16", "vae"): ((256, 256), (384, 384), (512, 512)),
}


@dataclass(frozen=True)
class Mode:
    """The switches that change a runner's graph."""

    flash_attn: bool = False
    conv_direct: bool = False

    @property
    def key(self) -> str:
        return f"fa={'on' if self.flash_attn else 'off'},conv_direct={'on' if self.conv_direct else 'off'}"


@dataclass(frozen=True)
class Row:
    family: str        # "sd15", "sdxl"
    runner: str        # sd-cli's runner name: "unet", "vae", "clip"
    width: int
    height: int
    mode: Mode
    tiled: bool
    bytes: int

    @property
    def fit(self) -> bool:
        """One of the points the runner's curve is solved from."""
        return not self.tiled and (self.width, self.height) in FIT_SIZES.get((self.family, self.runner), ())


def _row(raw: dict) -> Row:
    return Row(raw["family"], raw["runner"], raw["width"], raw["height"],
               Mode(raw["flash_attn"], raw["conv_direct"]), raw.get("vae_tiling", False), raw["bytes"])


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[Row, ...]:
    return tuple(_row(r) for r in json.loads(CORPUS.read_text())["rows"])


def latent_pixels(width: int, height: int) -> int:
    return (width // LATENT_FACTOR) * (height // LATENT_FACTOR)


# DiTs that pad their image tokens to a multiple: family -> (patch side, multiple). Z-Image pads
# the patch sequence to a multiple of 32 (src/model/diffusion/z_image.hpp SEQ_MULTI_OF).
TOKEN_PADDING: dict[str, tuple[int, int]] = {"zimage": (2, 32)}


def curve_pixels(family: str, width: int, height: int) -> int:
    """The latent pixel count a runner's graph sees: the latent's, or for a DiT that pads its
    token sequence, the padded tokens' pixels (patch side squared per token)."""
    n = latent_pixels(width, height)
    if family not in TOKEN_PADDING:
        return n
    patch, multiple = TOKEN_PADDING[family]
    tokens = (width // LATENT_FACTOR // patch) * (height // LATENT_FACTOR // patch)
    return -(-tokens // multiple) * multiple * patch * patch


def _solve(points: list[tuple[int, int]]) -> tuple[Fraction, ...]:
    """a, b, c with a + b*n + c*n^2 through three (n, bytes) points (exact, by Lagrange)."""
    coeffs = [Fraction(0)] * 3
    for i, (ni, yi) in enumerate(points):
        others = [n for j, (n, _) in enumerate(points) if j != i]
        denom = Fraction((ni - others[0]) * (ni - others[1]))
        # (n - o0)(n - o1) = n^2 - (o0 + o1) n + o0 o1
        coeffs[0] += yi * Fraction(others[0] * others[1]) / denom
        coeffs[1] -= yi * Fraction(others[0] + others[1]) / denom
        coeffs[2] += yi / denom
    return tuple(coeffs)


Piece = tuple[int, tuple[Fraction, ...]]   # (the middle point's N, a, b, c)


@functools.cache
def _curve(family: str, runner: str, mode: Mode) -> tuple[Piece, ...] | None:
    """The quadratic through each three consecutive fit points, keyed by the middle one's N."""
    rows = sorted((r for r in corpus() if r.family == family and r.runner == runner and r.mode == mode
                   and r.fit and not r.tiled), key=lambda r: curve_pixels(family, r.width, r.height))
    if not rows:
        return None
    if len(rows) == 1:
        return ((0, (Fraction(rows[0].bytes), Fraction(0), Fraction(0))),)
    if len(rows) < 3:
        raise ValueError(f"sd_cli_corpus.json: {family} {runner} {mode.key}: {len(rows)} fit rows, expected 1 or 3+")
    points = [(curve_pixels(family, r.width, r.height), r.bytes) for r in rows]
    return tuple((points[i][0], _solve(points[i - 1:i + 2])) for i in range(1, len(points) - 1))


def has_curve(family: str, runner: str, mode: Mode) -> bool:
    return _curve(family, runner, mode) is not None


# Curves that hold for square images only. SD3's MMDiT with flash attention peaks, up to about
# 640x640, while the position table's crop is built: a [hidden, height / 16, 384] F32 tensor
# (src/model/diffusion/mmdit.hpp `cropped_pos_embed`), linear in the image's height alone, so
# the buffer of a tall image exceeds a square's of the same pixel count (576x832: 135 MiB against
# about 115); sd-fit keeps the fixed reserve for those sizes rather than a figure the corpus
# does not support.
SQUARE_ONLY: frozenset[tuple[str, str, Mode]] = frozenset(
    {("sd3", "mmdit", Mode(flash_attn=True)), ("sd3", "mmdit", Mode(flash_attn=True, conv_direct=True))})


def compute_bytes(family: str, runner: str, width: int, height: int, mode: Mode = Mode(),
                  tiled: bool = False) -> int | None:
    """The compute buffer sd-cli reserves for `runner` at width x height: simulated where runtime/sd builds
    the runner's graph, else from the corpus curve; None where neither knows this family, runner and mode."""
    if width <= 0 or height <= 0 or width % SIZE_STEP or height % SIZE_STEP:
        raise BadInput(f"image size {width}x{height}: expected positive multiples of {SIZE_STEP}")
    simulated = simulated_bytes(family, runner, width, height, mode.flash_attn, mode.conv_direct, tiled)
    if simulated is not None:   # the runner's graph reserved (planner/sd/sd_simulated.py)
        return simulated
    curve = _curve(family, runner, mode)
    if curve is None or (width != height and (family, runner, mode) in SQUARE_ONLY):
        return None
    lw, lh = width // LATENT_FACTOR, height // LATENT_FACTOR
    if tiled:
        lw, lh = min(lw, VAE_TILE), min(lh, VAE_TILE)
    n = curve_pixels(family, lw * LATENT_FACTOR, lh * LATENT_FACTOR)
    # the piece whose middle point is nearest: one quadratic where the peak's tensors stay the same,
    # consecutive pieces where they change
    _, (a, b, c) = min(curve, key=lambda piece: abs(piece[0] - n))
    return int(round(a + b * n + c * n * n))
