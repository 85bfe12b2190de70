"""LTX-2's video VAE decode as stable-diffusion.cpp builds it: the whole latent in one graph, or (temporal
tiling) one graph per tile of latent frames, carrying each convolution's last input frame to the next tile.

Sources (stable-diffusion.cpp 97d2990, src/model/vae/ltx_vae.hpp): LTXVideoVAE::build_graph (VideoVAE::decode:
the latent un-normalized by the per-channel statistics, a MUL and an ADD; Decoder::forward; WanVAE::unpatchify
of 4x4 patches), Decoder::forward (the timestep scaled by `timestep_scale_multiplier` cast to f32 through a
1x1 matmul with the runner's `one`; conv_in; mid blocks of residual blocks and depth-to-space up-samplings by
2 in time and space that drop the first frame; PixelNorm, the last timestep embedder's shift and scale, SiLU,
conv_out), CausalConv3d::forward non-causal (the first frame and the last frame concatenated around the input,
Conv3d 3x3x3 padded 1 in space: IM2COL_3D f16 columns, a matmul, a permuted copy, the bias added in place),
ResnetBlock3D (the timestep's four chunks of the scale-shift table copied out; PixelNorm, x + x * scale + shift,
SiLU in place, conv, twice; the input added), PixelNorm3D (channels moved first, RMS_NORM, moved back),
UNetMidBlock3D (its timestep embedder: TIMESTEP_EMBEDDING of 256, two f32 Linears around SiLU in place),
depth_to_space_3d (four permuted copies). Temporal tiling (decode_temporal_tiled_streaming, decode_tiled_chunk,
Decoder::forward_tiled_frame): tiles of DEFAULT_TEMPORAL_TILE_FRAMES latent frames overlapping by
DEFAULT_TEMPORAL_TILE_OVERLAP, each its own graph and buffer; each convolution first copies the last frame
before the tile's overlap (twice: ggml_ext_slice, then ggml_cont) into the feature cache, expanded into the
graph ahead of the output, and pads in front with the previous tile's copy (held in the runner's cache buffer,
not the compute buffer) or its own first frame; the overlap doubles at each up-sampling and is cut from the
output; only the first tile drops the up-samplings' first frame.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import GGMLType, Tensor
from runtime.sd.sd_blocks import Blocks, ext_scale

F16, F32 = GGMLType.F16, GGMLType.F32
RES_EPS, OUT_EPS = 1e-6, 1e-8    # ResnetBlock3D's PixelNorm3D eps, conv_norm_out's default
TIME_FREQ = 256                  # LTXV::TimestepEmbedder frequency_embedding_size
TILE_FRAMES, TILE_OVERLAP = 4, 1   # LTXVideoVAE DEFAULT_TEMPORAL_TILE_FRAMES / _OVERLAP


@dataclass(frozen=True)
class LtxVaeConfig:
    latent: int = 128
    widths: tuple[int, ...] = (1024, 512, 256, 128)   # a mid block at each, an up-sampling between
    res_blocks: int = 5
    patch: int = 4


LTX2_VAE = LtxVaeConfig()


def _slice_t(x: Tensor, start: int, end: int) -> Tensor:
    """ggml_ext_slice along time: x itself where it has one step, else a copied view."""
    if x.ne[2] == 1:
        return x
    return g.cont(g.view(x, (x.ne[0], x.ne[1], end - start, x.ne[3]), x.nb, start * x.nb[2]))


class _Feats:
    """The convolutions' time padding: whole-latent (no cache) or one temporal tile's cache."""

    def __init__(self, b: Blocks, tiled: bool, prev: list[tuple[int, ...]] | None = None, pad: int = 0) -> None:
        self.b, self.tiled, self.prev, self.pad = b, tiled, prev, pad
        self.new: list[Tensor] = []

    def conv(self, x: Tensor, c_out: int) -> Tensor:
        """CausalConv3d (3x3x3, non-causal) on x [W, H, T, C]."""
        if self.tiled:   # the chunked forward: the last frame taken after the front padding
            idx = len(self.new)
            end = x.ne[2] - self.pad
            self.new.append(g.cont(_slice_t(x, max(end - 1, 0), end)))
            prev = self.b.param(self.prev[idx]) if self.prev is not None and idx < len(self.prev) else None
            x = im.concat(prev if prev is not None else _slice_t(x, 0, 1), x, 2)   # prev: in the cache buffer
            last = _slice_t(x, x.ne[2] - 1, x.ne[2])
        else:
            first, last = _slice_t(x, 0, 1), _slice_t(x, x.ne[2] - 1, x.ne[2])
            x = im.concat(first, x, 2)
        x = im.concat(x, last, 2)
        w = self.b.param((3, 3, 3, x.ne[3] * c_out), F16)
        return im.conv_3d(w, self.b.param((c_out,)), x, c_out, (1, 1, 1), (1, 1, 0))


def _pixel_norm(x: Tensor, eps: float) -> Tensor:
    h = g.rms_norm(im.cont_if_needed(g.permute(x, (1, 2, 3, 0))), eps)
    return im.cont_if_needed(g.permute(h, (3, 0, 1, 2)))


def _time_embed(b: Blocks, t: Tensor, width: int) -> Tensor:
    e = im.timestep_embedding(ext_scale(t, 1.0), TIME_FREQ)
    e = im.unary_inplace(b.linear(e, width, True, F32), "silu")
    return b.linear(e, width, True, F32)


def _shift_scale(b: Blocks, temb: Tensor, c: int, parts: int) -> list[Tensor]:
    """The scale-shift table plus the timestep, cut into `parts` copied chunks of c channels."""
    values = g.add(b.param((c, parts)), im.reshape(temb, (c, parts)))
    return [im.reshape(g.cont(g.view(values, (c, 1, 1, 1), values.nb, values.nb[1] * i)), (1, 1, 1, c))
            for i in range(parts)]


def _modulate(h: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    return g.add(g.add(h, g.mul(h, scale)), shift)


def _resnet(b: Blocks, x: Tensor, temb: Tensor, feats: _Feats) -> Tensor:
    c = x.ne[3]
    shift1, scale1, shift2, scale2 = _shift_scale(b, temb, c, 4)
    h = im.unary_inplace(_modulate(_pixel_norm(x, RES_EPS), scale1, shift1), "silu")
    h = feats.conv(h, c)
    h = im.unary_inplace(_modulate(_pixel_norm(h, RES_EPS), scale2, shift2), "silu")
    return g.add(feats.conv(h, c), x)


def _depth_to_space(x: Tensor, c: int, drop_first: bool) -> Tensor:
    """depth_to_space_3d by 2 in time and space: [W, H, T, 8c] -> [2W, 2H, 2T (- 1), c]."""
    w, h, t = x.ne[0], x.ne[1], x.ne[2]
    x = im.reshape(im.cont_if_needed(g.permute(x, (0, 1, 3, 2))), (w, h, 2, 4 * c * t))
    x = im.reshape(im.cont_if_needed(g.permute(x, (1, 2, 0, 3))), (2 * w, h, 2, 2 * c * t))
    x = im.reshape(im.cont_if_needed(g.permute(x, (0, 2, 1, 3))), (4 * w * h, 2, c, t))
    x = im.reshape(im.cont_if_needed(g.permute(x, (0, 1, 3, 2))), (2 * w, 2 * h, 2 * t, c))
    return _slice_t(x, 1, x.ne[2]) if drop_first else x


def _unpatchify(x: Tensor, p: int) -> Tensor:
    w, h, f = x.ne[0], x.ne[1], x.ne[2]
    c = x.ne[3] // (p * p)
    x = im.reshape(im.cont_if_needed(g.permute(im.reshape(x, (w * h, f, p * p, c)), (0, 2, 1, 3))),
                   (w, h * p, p, f * c))
    x = im.reshape(im.cont_if_needed(g.permute(x, (1, 2, 0, 3))), (p * w, h, p, f * c))
    return im.reshape(im.cont_if_needed(g.permute(x, (0, 2, 1, 3))), (p * w, p * h, f, c))


def _decode(b: Blocks, z: Tensor, t: Tensor, feats: _Feats, first: bool, cfg: LtxVaeConfig) -> Tensor:
    """VideoVAE::decode (whole) or decode_tiled_chunk (a tile) of z [W, H, T, latent]."""
    x = g.add(g.mul(z, im.reshape(b.param((cfg.latent,)), (1, 1, 1, cfg.latent))),
              im.reshape(b.param((cfg.latent,)), (1, 1, 1, cfg.latent)))
    if b.one is None:
        raise ValueError("the LTX VAE decode needs the runner's `one` (runner_reserve sets it)")
    one = im.repeat(ext_scale(b.one, 1.0), (1, 1, 1, 1))   # ggml_ext_cast_f32 of the multiplier
    ts = g.mul(t, im.reshape(g.mul_mat(im.reshape(b.param((1,)), (1, 1)), one), (1,)))
    x = feats.conv(x, cfg.widths[0])
    for i, width in enumerate(cfg.widths):
        temb = _time_embed(b, ts, 4 * width)
        for _ in range(cfg.res_blocks):
            x = _resnet(b, x, temb, feats)
        if i + 1 < len(cfg.widths):
            x = _depth_to_space(feats.conv(x, 4 * width), width // 2, first)
            feats.pad *= 2
    last = cfg.widths[-1]
    x = _pixel_norm(x, OUT_EPS)
    shift, scale = _shift_scale(b, _time_embed(b, ts, 2 * last), last, 2)
    x = feats.conv(im.unary_inplace(_modulate(x, scale, shift), "silu"), 3 * cfg.patch * cfg.patch)
    if feats.pad > 0:
        x = _slice_t(x, 0, x.ne[2] - feats.pad)
    return _unpatchify(x, cfg.patch)


def decode(b: Blocks, z: Tensor, t: Tensor, cfg: LtxVaeConfig = LTX2_VAE) -> Tensor:
    """The whole latent z [W, H, T, 128] in one graph: [32W, 32H, 1 + 8(T-1), 3]."""
    return _decode(b, z, t, _Feats(b, False), True, cfg)


@dataclass(frozen=True)
class Tile:
    start: int     # the tile's first latent frame
    frames: int
    overlap: int   # latent frames decoded again by the next tile, cut from this one's output


def tiles(latent_t: int) -> tuple[Tile, ...]:
    """decode_temporal_tiled_streaming's tiles (resolve_temporal_tile_plan at the default frames and overlap)."""
    overlap = min(TILE_OVERLAP, max(latent_t - 1, 0))
    stride = TILE_FRAMES - overlap
    out = []
    for start in range(0, latent_t - overlap, stride):
        end = min(latent_t, start + TILE_FRAMES)
        out.append(Tile(start, end - start, overlap if end < latent_t else 0))
    return tuple(out)


def decode_tile(b: Blocks, z: Tensor, t: Tensor, tile: Tile, prev: list[tuple[int, ...]] | None,
                cfg: LtxVaeConfig = LTX2_VAE) -> tuple[Tensor, list[Tensor]]:
    """One temporal tile's graph: its output and the feature-cache copies expanded ahead of it;
    `prev`: the previous tile's copies' shapes (None for the first tile)."""
    feats = _Feats(b, True, prev, tile.overlap)
    out = _decode(b, z, t, feats, tile.start == 0, cfg)
    return out, feats.new
