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

import enum
import functools
import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from planner.core.errors import BadInput
from planner.sd.sd_simulated import BACKEND_BUFFERS, CPU_ROWS, simulated_bytes, simulated_video_bytes
from runtime.sd.sd_reserve import SdBackend

CORPUS = Path(__file__).resolve().parent / "data" / "sd_cli_corpus.json"
# A row's "backend": absent for the CPU build's rows (CPU_ROWS), else a key of BACKEND_BUFFERS ("vulkan": the
# Vulkan build's on Mesa's lavapipe, scripts/build_sd_cpp.sh --vulkan, scripts/record_sd_corpus.py --vulkan).
BACKENDS = tuple(BACKEND_BUFFERS)
LATENT_FACTOR = 8          # SD 1.x / 2.x / XL VAEs: 8 image pixels per latent pixel
VAE_TILE = 32              # vae.hpp get_tile_sizes: the default tile side, in latent pixels
MIN_TILE = 4               # vae.hpp get_tile_sizes: min_tile_dimension
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
    # autoencoder SD3, FLUX.1 and Z-Image share (one decode graph: only the latent scale differs;
    # a piece per three consecutive sizes, 1024x1024 included, so every recorded square is a fit point)
    ("sd3", "mmdit"): ((256, 256), (384, 384), (512, 512), (768, 768), (1024, 1024)),
    ("sd3-large", "mmdit"): ((256, 256), (384, 384), (512, 512)),
    ("sd3", "clip"): ((256, 256),),
    ("sd3", "t5"): ((256, 256),),
    ("zimage", "z_image"): ((256, 256), (512, 512), (1024, 1024)),
    ("zimage", "qwen3"): ((256, 256),),
    ("ae16", "vae"): ((256, 256), (384, 384), (512, 512), (1024, 1024)),
    # SD 2.1 (768-v): the SD 1.x UNet with linear projections, 64-wide heads and a 1024-wide context, up to
    # its native 768x768; OpenCLIP-H's 77 tokens
    ("sd2", "unet"): ((256, 256), (512, 512), (768, 768)),
    ("sd2", "clip"): ((256, 256),),
}


@dataclass(frozen=True)
class Mode:
    """The switches that change a runner's graph."""

    flash_attn: bool = False
    conv_direct: bool = False
    # the runner plans graph cuts first (sd-cli given --max-vram, the runner on a GPU): simulated graphs only
    graph_cuts: bool = False

    @property
    def key(self) -> str:
        cuts = ",graph_cuts=on" if self.graph_cuts else ""
        return f"fa={'on' if self.flash_attn else 'off'},conv_direct={'on' if self.conv_direct else 'off'}{cuts}"


@dataclass(frozen=True)
class Row:
    family: str        # "sd15", "sdxl"
    runner: str        # sd-cli's runner name: "unet", "vae", "clip"
    width: int
    height: int
    mode: Mode
    tiled: bool
    bytes: int
    frames: int = 1    # video frames (video rows only)
    batch: int = 1     # sd-cli's -b: images made in the run (rows without the field made one)
    backend: str = CPU_ROWS   # the sd-cli build and device the row was logged on (BACKENDS)
    max_vram: str | None = None   # sd-cli's --max-vram in the run (rows without the field: none)

    @property
    def fit(self) -> bool:
        """One of the points the runner's curve is solved from (a batch row only checks: sd-cli makes
        a batch's images one at a time: planner/sd/fit.py `_check_batch`)."""
        if self.batch != 1:
            return False
        if self.family in VIDEO_FAMILIES:
            points = FIT_VIDEO.get((self.family, self.runner), ())
            checks_fa = self.mode.flash_attn and (self.family, self.runner) in FA_FREE
            return not self.tiled and not checks_fa and (self.width, self.height, self.frames) in points
        return not self.tiled and (self.width, self.height) in FIT_SIZES.get((self.family, self.runner), ())


def _row(raw: dict) -> Row:
    backend = raw.get("backend", CPU_ROWS)
    if backend not in BACKENDS:
        raise ValueError(f"sd_cli_corpus.json: row backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    return Row(raw["family"], raw["runner"], raw["width"], raw["height"],
               Mode(raw["flash_attn"], raw["conv_direct"]), raw.get("vae_tiling", False), raw["bytes"],
               raw.get("frames", 1), raw.get("batch", 1), backend, raw.get("max_vram"))


@functools.lru_cache(maxsize=1)
def _all_rows() -> tuple[Row, ...]:
    return tuple(_row(r) for r in json.loads(CORPUS.read_text())["rows"])


# Families whose rows are kept apart from the curves' rows: LTX-2's video VAE (planner/synth/shapes_ltx.py;
# whole and temporally tiled decodes, the "temporal_tiling" key), sized by simulation alone
# (planner/sd/sd_simulated.py simulated_ltx_vae_bytes; tests/runtime/sd/test_ltx2_vae_graph.py)
APART_FAMILIES = frozenset({"ltx2-vae"})


def corpus() -> tuple[Row, ...]:
    """The image models' CPU rows (the video models' are video_corpus(), the other backends'
    backend_corpus()): the rows the curves are solved from."""
    return tuple(r for r in _all_rows()
                 if r.family not in VIDEO_FAMILIES | APART_FAMILIES and r.backend == CPU_ROWS)


def video_corpus() -> tuple[Row, ...]:
    return tuple(r for r in _all_rows() if r.family in VIDEO_FAMILIES and r.backend == CPU_ROWS)


def backend_corpus(backend: str) -> tuple[Row, ...]:
    """The rows logged on `backend` (one of BACKENDS), image and video models alike."""
    return tuple(r for r in _all_rows() if r.backend == backend)


def params_rows(backend: str = CPU_ROWS) -> tuple[dict, ...]:
    """The corpus's params buffers ({"family", "component", "bytes"}) as sd-cli logged them on `backend`."""
    return tuple(p for p in json.loads(CORPUS.read_text())["params"] if p.get("backend", CPU_ROWS) == backend)


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
                  tiled: bool = False, tile: tuple[int, int] | None = None,
                  backend: str | SdBackend = CPU_ROWS) -> int | None:
    """The compute buffer sd-cli reserves for `runner` at width x height: simulated where runtime/sd builds
    the runner's graph, else from the corpus curve; None where neither knows this family, runner and mode.
    `tile`: a tiled decode's tile in latent pixels (x, y); None: sd-cli's default, VAE_TILE on each side.
    `backend`: the buffer type the simulation reserves in (the curves are the CPU build's); BackendFallback
    where that device refuses a node of the graph (planner/sd/sd_simulated.py)."""
    if width <= 0 or height <= 0 or width % SIZE_STEP or height % SIZE_STEP:
        raise BadInput(f"image size {width}x{height}: expected positive multiples of {SIZE_STEP}")
    if tiled and tile is not None:   # a tiled decode reserves what one tile's untiled decode does
        tw, th = tile
        simulated = simulated_bytes(family, runner, min(width, tw * LATENT_FACTOR), min(height, th * LATENT_FACTOR),
                                    mode.flash_attn, mode.conv_direct, False, backend, mode.graph_cuts)
    else:
        simulated = simulated_bytes(family, runner, width, height, mode.flash_attn, mode.conv_direct, tiled, backend,
                                    mode.graph_cuts)
    if simulated is not None:   # the runner's graph reserved (planner/sd/sd_simulated.py)
        return simulated
    mode = Mode(mode.flash_attn, mode.conv_direct)   # the curves are the CPU build's: no graph cuts
    curve = _curve(family, runner, mode)
    if curve is None or (width != height and (family, runner, mode) in SQUARE_ONLY):
        return None
    lw, lh = width // LATENT_FACTOR, height // LATENT_FACTOR
    if tiled:
        tw, th = tile or (VAE_TILE, VAE_TILE)
        lw, lh = min(lw, tw), min(lh, th)
    n = curve_pixels(family, lw * LATENT_FACTOR, lh * LATENT_FACTOR)
    # the piece whose middle point is nearest: one quadratic where the peak's tensors stay the same,
    # consecutive pieces where they change
    _, (a, b, c) = min(curve, key=lambda piece: abs(piece[0] - n))
    return int(round(a + b * n + c * n * n))


# ---- video models: Wan 2.x, where the frame count is an input
#
# Wan's VAE packs 4 video frames into a latent frame after the first (T = (frames - 1) / 4 + 1,
# src/stable-diffusion.cpp `video_frames_to_latent_frames`), and sd-cli aligns width and height to
# the VAE's 8 times the DiT's 2x2 patch (`align_image_size`). Every tensor of the DiT's graph is
# sized by its token count, (w/16) * (h/16) * T = N / 4 with N = latent pixels x latent frames,
# or by its square (ordinary attention's KQ): a + b*N + c*N^2 in pieces, as the image UNets are
# in N. The VAE decodes latent frame by latent frame inside one graph (src/model/vae/wan_vae.hpp
# `decode`): the first frame alone, each later one into 4 video frames, their outputs
# concatenated, the causal convolutions' caches carried from chunk to chunk (the second chunk
# builds them differently from the later ones: `chunk_idx == 1`). Every tensor scales with the
# latent pixels P, so one, two and three latent frames each have their own a + b*P. From the
# fourth on, the peak is a later chunk's activations with the caches of the one before, and what
# the growing output adds depends on where the allocator finds room for it: sd-cli logs the same
# buffer per latent pixel at 4 and 5 latent frames (to 0.02 %), 8.9 % more at 9. So T >= 4 is
# P * g(T), g the recorded bytes per latent pixel, linear between the recorded frame counts, flat
# below the first, and past the last continued along its last stretch (not checked there). UMT5
# always encodes 512 tokens: a constant.
VIDEO_FAMILIES = frozenset({"wan", "wan-vae", "wan-14b", "wan22", "wan22-vae"})
VIDEO_SIZE_STEP = 16
# Wan2.2-TI2V-5B: a 16x VAE under 2x2 patches, so its sides are multiples of 32 px
VIDEO_SIZE_STEPS = {"wan22": 32, "wan22-vae": 32}
FRAME_STEP = 4
WAN_DIT = "Wan2.1-T2V-1.3B"   # the DiT runner's name in sd-cli's log (wan.hpp `desc`)
WAN14_DIT = "Wan2.x-T2V-14B"  # the 14B T2V DiT's
WAN22_DIT = "Wan2.2-TI2V-5B"  # Wan2.2-TI2V-5B's
FIT_VIDEO: dict[tuple[str, str], tuple[tuple[int, int, int], ...]] = {
    ("wan", WAN_DIT): ((256, 256, 1), (256, 256, 5), (256, 256, 9), (256, 256, 17), (416, 240, 17)),
    ("wan", "t5"): ((256, 256, 1),),
    ("wan-14b", WAN14_DIT): ((128, 128, 1), (256, 256, 1), (128, 128, 5), (256, 256, 5)),
    ("wan-vae", "wan_vae"): ((128, 128, 1), (256, 256, 1), (128, 128, 5), (256, 256, 5),
                             (128, 128, 9), (192, 128, 9), (192, 128, 13), (128, 128, 17), (128, 128, 33)),
}


class Form(enum.Enum):
    TOKENS = "quadratic pieces in N = latent pixels x latent frames"
    FRAMES = "a + b*P for 1, 2 and 3 latent frames; P * g(T) for more"


FORMS: dict[tuple[str, str], Form] = {("wan", WAN_DIT): Form.TOKENS, ("wan-14b", WAN14_DIT): Form.TOKENS,
                                       ("wan-vae", "wan_vae"): Form.FRAMES}
# Runners whose peak holds no attention tensor, so flash attention leaves their buffer as it is:
# the Wan VAE attends once per frame in its middle block, at the latent resolution, long before
# the full-resolution up-sampling stages where the peak is (a recorded row with flash attention
# on checks it).
FA_FREE: frozenset[tuple[str, str]] = frozenset({("wan-vae", "wan_vae")})


def latent_frames(frames: int) -> int:
    return (frames - 1) // FRAME_STEP + 1


def check_video(width: int, height: int, frames: int, step: int = VIDEO_SIZE_STEP) -> None:
    if width <= 0 or height <= 0 or width % step or height % step:
        raise BadInput(f"video size {width}x{height}: expected positive multiples of {step}")
    if frames < 1 or (frames - 1) % FRAME_STEP:
        raise BadInput(f"--frames {frames}: Wan takes 4k+1 frames (1, 5, 9, 13, ...)")


def _exact(features: list[tuple[int, ...]], ys: list[int]) -> tuple[Fraction, ...]:
    """The coefficients x with features . x = ys, exactly (Gauss-Jordan on fractions)."""
    n = len(features)
    if any(len(f) != n for f in features):
        raise ValueError(f"sd_cli_corpus.json: {n} fit points for {len(features[0])} coefficients")
    m = [[Fraction(v) for v in f] + [Fraction(y)] for f, y in zip(features, ys, strict=True)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if m[r][col] != 0), None)
        if pivot is None:
            raise ValueError(f"sd_cli_corpus.json: fit points {features} do not determine the curve")
        m[col], m[pivot] = m[pivot], m[col]
        m[col] = [v / m[col][col] for v in m[col]]
        for r in range(n):
            if r != col and m[r][col] != 0:
                m[r] = [a - m[r][col] * b for a, b in zip(m[r], m[col], strict=True)]
    return tuple(row[-1] for row in m)


FRAME_PIECES = (1, 2, 3, 4)   # the VAE's pieces by latent frames: 1, 2, 3, and 4 or more
PER_PIXEL = FRAME_PIECES[-1]  # the piece sized per latent pixel, g(T)


def _frames_piece(t: int) -> int:
    return min(t, PER_PIXEL)


def _per_pixel(points: list[tuple[int, int, int]]) -> tuple[tuple[int, Fraction], ...]:
    """(T, bytes per latent pixel) at each recorded latent-frame count (the mean where several)."""
    by_t: dict[int, list[Fraction]] = {}
    for p, t, y in points:
        by_t.setdefault(t, []).append(Fraction(y, p))
    return tuple((t, sum(v, Fraction(0)) / len(v)) for t, v in sorted(by_t.items()))


def _g(table: tuple[tuple[int, Fraction], ...], t: int) -> Fraction:
    if t <= table[0][0] or len(table) == 1:
        return table[0][1]
    # the stretch t falls in, or the last one past the last recorded count
    i = next((i for i in range(1, len(table)) if t <= table[i][0]), len(table) - 1)
    (t0, g0), (t1, g1) = table[i - 1], table[i]
    return g0 + (g1 - g0) * (t - t0) / (t1 - t0)


@functools.cache
def _video_curve(family: str, runner: str, mode: Mode) -> tuple | None:
    rows = [r for r in video_corpus() if r.family == family and r.runner == runner and r.mode == mode and r.fit]
    if not rows:
        return None
    if len(rows) == 1:
        return ("constant", rows[0].bytes)
    pts = sorted((latent_pixels(r.width, r.height), latent_frames(r.frames), r.bytes) for r in rows)
    if FORMS[(family, runner)] is Form.TOKENS:
        points = sorted((p * t, y) for p, t, y in pts)
        return ("tokens", tuple((points[i][0], _solve(points[i - 1:i + 2])) for i in range(1, len(points) - 1)))
    pieces: dict[int, tuple] = {}
    for piece in FRAME_PIECES:
        at = [(p, t, y) for p, t, y in pts if _frames_piece(t) == piece]
        if at and piece == PER_PIXEL:
            pieces[piece] = _per_pixel(at)
        elif at:
            pieces[piece] = _exact([(1, p) for p, _, _ in at], [y for *_, y in at])
    return ("frames", pieces)


def video_compute_bytes(family: str, runner: str, width: int, height: int, frames: int, mode: Mode = Mode(),
                        tiled: bool = False, backend: str | SdBackend = CPU_ROWS) -> int | None:
    """The compute buffer sd-cli reserves for a video model's `runner` at width x height x frames,
    or None where the corpus has no figures for this runner and mode. A tiled decode reserves what
    an untiled decode of one tile (min(32, latent side) per side, all frames) does."""
    check_video(width, height, frames, VIDEO_SIZE_STEPS.get(family, VIDEO_SIZE_STEP))
    simulated = simulated_video_bytes(family, runner, width, height, frames, mode.flash_attn, mode.conv_direct, tiled,
                                      backend)
    if simulated is not None:   # the runner's graph reserved (planner/sd/sd_simulated.py)
        return simulated
    mode = Mode(False if (family, runner) in FA_FREE else mode.flash_attn, mode.conv_direct)
    curve = _video_curve(family, runner, mode)
    if curve is None:
        return None
    if curve[0] == "constant":
        return int(curve[1])
    lw, lh = width // LATENT_FACTOR, height // LATENT_FACTOR
    if tiled:
        lw, lh = min(lw, VAE_TILE), min(lh, VAE_TILE)
    p, t = lw * lh, latent_frames(frames)
    if curve[0] == "tokens":
        n = p * t
        _, (a, b, c) = min(curve[1], key=lambda piece: abs(piece[0] - n))
        return int(round(a + b * n + c * n * n))
    piece = curve[1].get(_frames_piece(t))
    if piece is None:
        return None
    if _frames_piece(t) == PER_PIXEL:
        return int(round(p * _g(piece, t)))
    a, b = piece
    return int(round(a + b * p))
