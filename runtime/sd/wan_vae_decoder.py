"""The Wan 2.1 causal 3-D VAE's decode as stable-diffusion.cpp builds it: one graph for all latent frames.

Sources (stable-diffusion.cpp 97d2990, src/model/vae/wan_vae.hpp): WanVAERunner::build_graph (the whole decode
in one graph), WanVAE::decode (conv2, a 1x1x1 CausalConv3d, over all frames; then Decoder3d once per latent
frame, each frame's slice copied unless there is one frame, the outputs concatenated along time), Decoder3d
(dec_dim 96, dim_mult 1 2 4 4, 2+1 ResidualBlocks per level, temporal up-sampling at the first two levels:
conv1 16 -> 384, middle ResidualBlock / AttentionBlock / ResidualBlock, the up levels whose input width
halves after each Resample, RMS_norm, SiLU, head conv to 3 channels), CausalConv3d (a cached tail of the
previous frame concatenated in front where the kernel reaches back, the rest of the causal padding by
ggml_pad_ext, ggml_conv_3d as IM2COL_3D f16 columns, a matmul and a permuted copy, the bias added in
place), the feature cache (each cached conv keeps the last two time steps of its input, or the previous
tail concatenated with a single step), RMS_norm (channels moved first, RMS_NORM, a MUL by gamma, moved
back), Resample (upsample3d: from the second frame on, time_conv doubles the time steps — the first
chunk without a cache, its cache padded in front; then per time step a nearest 2x upscale and a 3x3
Conv2d to half the channels), AttentionBlock (one head over h*w per time step through split_image_qkv).
The Wan2.2 VAE (wan2_2: dec_dim 256, z 48, 12 output channels) groups each level into an Up_ResidualBlock:
its Resample keeps the width, and a DupUp3D shortcut of the level's input (repeated along time, spread over
2x2 pixels and the time factor by three copied permutations, the first chunk's leading step dropped) is
added after it; WanVAE::unpatchify folds the 2x2 pixel patches back at the end.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import GGMLType, Tensor
from runtime.sd.sd_blocks import Blocks

RMS_EPS = 1e-12
CACHE_T = 2


@dataclass(frozen=True)
class WanVaeConfig:
    dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_upsample: tuple[bool, ...] = (True, True, False)
    out_channels: int = 3
    conv_num: int = 33
    # Wan2.2's VAE (WanVAE with wan2_2): each up level an Up_ResidualBlock whose re-sampler keeps the width
    # and whose DupUp3D shortcut is added after it; 2x2 pixel patches folded back at the end (unpatchify)
    wan2_2: bool = False
    patch: int = 1


WAN21_VAE = WanVaeConfig()
WAN22_VAE = WanVaeConfig(dim=256, z_dim=48, out_channels=12, conv_num=34, wan2_2=True, patch=2)


def _slice_t(x: Tensor, start: int, end: int) -> Tensor:
    """ggml_ext_slice along time (dim 2): x itself where it has one step, else a copied view."""
    if x.ne[2] == 1:
        return x
    start, end = (start + x.ne[2] if start < 0 else start), (end + x.ne[2] if end < 0 else end)
    ne = (x.ne[0], x.ne[1], end - start, x.ne[3])
    return g.cont(g.view(x, ne, x.nb, start * x.nb[2]))


def _conv3d(b: Blocks, x: Tensor, c_out: int, k: tuple[int, int, int], pad: tuple[int, int, int],
            cache: Tensor | None = None) -> Tensor:
    """CausalConv3d::forward on x [W, H, T, C]: kernel (kt, kh, kw), padding (pt, ph, pw)."""
    kt, kh, kw = k
    pt, ph, pw = pad
    ic = x.ne[3]
    w = b.param((kw, kh, kt, ic * c_out), GGMLType.F16)
    bias = b.param((c_out,))
    lp2 = 2 * pt
    if cache is not None and lp2 > 0:
        x = im.concat(cache, x, 2)
        lp2 -= cache.ne[2]
    if pw or ph or lp2:
        x = im.pad_ext(x, [(pw, pw), (ph, ph), (lp2, 0)])
    return im.conv_3d(w, bias, x, c_out, (1, 1, 1))


def _rms_norm(b: Blocks, x: Tensor) -> Tensor:
    h = im.cont_if_needed(g.permute(x, (1, 2, 3, 0)))
    h = g.mul(g.rms_norm(h, RMS_EPS), b.param((h.ne[0],)))
    return im.cont_if_needed(g.permute(h, (3, 0, 1, 2)))


class _Cache:
    """The decode's feature cache: one slot per cached convolution, filled frame by frame."""

    def __init__(self, n: int) -> None:
        self.slots: list[Tensor | None] = [None] * n
        self.idx = 0

    def conv(self, b: Blocks, x: Tensor, c_out: int) -> Tensor:
        """A 3x3x3 CausalConv3d through slot idx (ResidualBlock, conv1, head.2)."""
        idx = self.idx
        cache_x = _slice_t(x, -CACHE_T, x.ne[2])
        prev = self.slots[idx]
        if cache_x.ne[2] < 2 and prev is not None:
            cache_x = im.concat(_slice_t(prev, -1, prev.ne[2]), cache_x, 2)
        out = _conv3d(b, x, c_out, (3, 3, 3), (1, 1, 1), prev)
        self.slots[idx] = cache_x
        self.idx += 1
        return out


def _residual(b: Blocks, x: Tensor, c_out: int, cache: _Cache) -> Tensor:
    h = _conv3d(b, x, c_out, (1, 1, 1), (0, 0, 0)) if x.ne[3] != c_out else x
    x = cache.conv(b, g.silu(_rms_norm(b, x)), c_out)
    x = cache.conv(b, g.silu(_rms_norm(b, x)), c_out)
    return g.add(x, h)


def _attention(b: Blocks, x: Tensor) -> Tensor:
    identity = x
    x = im.cont_if_needed(g.permute(_rms_norm(b, x), (0, 1, 3, 2)))   # [W, H, C, T]
    w, h, c, n = x.ne
    qkv = b.conv2d(x, 3 * c, 1)
    nb1, nb2 = qkv.nb[1], qkv.nb[2]
    qkv = g.cont(g.permute(im.reshape(qkv, (w * h, c, 3, n)), (0, 1, 3, 2)))
    offset = qkv.nb[2] * qkv.ne[2]
    q, k, v = (g.view(qkv, (w, h, c, n), (qkv.nb[0], nb1, nb2, qkv.nb[3]), offset * i) for i in range(3))
    q = im.reshape(im.cont_if_needed(g.permute(q, (1, 2, 0, 3))), (c, h * w, n))
    k = im.reshape(im.cont_if_needed(g.permute(k, (1, 2, 0, 3))), (c, h * w, n))
    v = g.cont(g.permute(im.reshape(v, (h * w, c, n)), (1, 0, 2, 3)))
    out = b.attention(q, k, v, 1, flash_attn=b.flash_attn)
    out = im.reshape(im.cont_if_needed(g.permute(out, (1, 0, 2, 3))), (w, h, c, n))
    out = b.conv2d(out, c, 1)
    out = im.cont_if_needed(g.permute(out, (0, 1, 3, 2)))
    return g.add(out, identity)


def _resample(b: Blocks, x: Tensor, temporal: bool, cache: _Cache, chunk: int, keep_width: bool = False) -> Tensor:
    """Resample::forward, upsample3d (temporal) or upsample2d, on x [W, H, T, C]."""
    dim = x.ne[3]
    if temporal:
        idx = cache.idx
        cache.idx += 1
        if chunk > 0:
            w, h, t = x.ne[0], x.ne[1], x.ne[2]
            cache_x = _slice_t(x, -CACHE_T, x.ne[2])
            prev = cache.slots[idx]
            if cache_x.ne[2] < 2 and prev is not None:
                cache_x = im.concat(_slice_t(prev, -1, prev.ne[2]), cache_x, 2)
            if chunk == 1 and cache_x.ne[2] < 2:
                cache_x = im.pad_ext(cache_x, [(0, 0), (0, 0), (cache_x.ne[2], 0)])
            x = _conv3d(b, x, 2 * dim, (3, 1, 1), (1, 0, 0), None if chunk == 1 else prev)
            cache.slots[idx] = cache_x
            x = im.reshape(x, (w * h, t, dim, 2))
            x = im.cont_if_needed(g.permute(x, (0, 2, 3, 1)))
            x = im.reshape(x, (w, h, 2 * t, dim))
    x = im.cont_if_needed(g.permute(x, (0, 1, 3, 2)))   # [W, H, C, T]
    x = b.conv2d(im.upscale(x, 2), dim if keep_width else dim // 2, 3, 1, 1)
    return im.cont_if_needed(g.permute(x, (0, 1, 3, 2)))


def _dup_up(x: Tensor, c_out: int, factor_t: int, first_chunk: bool) -> Tensor:
    """DupUp3D::forward (factor_s 2) on x [W, H, T, C]: x repeated along time, its channels spread over 2x2
    pixels and factor_t time steps (three copied permutations); on the first chunk the first
    factor_t - 1 steps dropped."""
    w, h, t = x.ne[0], x.ne[1], x.ne[2]
    fs = 2
    repeats = c_out * factor_t * fs * fs // x.ne[3]
    y = x
    for _ in range(1, repeats):
        y = im.concat(y, x, 2)
    y = g.cont(g.permute(im.reshape(y, (w, h * t, fs, fs * factor_t * c_out)), (1, 2, 0, 3)))
    y = g.cont(g.permute(im.reshape(y, (fs * w, h * t, fs, factor_t * c_out)), (0, 2, 1, 3)))
    y = g.cont(g.permute(im.reshape(y, (fs * w * fs * h, t, factor_t, c_out)), (0, 2, 1, 3)))
    y = im.reshape(y, (fs * w, fs * h, factor_t * t, c_out))
    return _slice_t(y, factor_t - 1, y.ne[2]) if first_chunk else y


def _up_level(b: Blocks, x: Tensor, i: int, out_dim: int, cache: _Cache, chunk: int, cfg: WanVaeConfig) -> Tensor:
    """One up level: 2.1's residual blocks and Resample, or 2.2's Up_ResidualBlock."""
    x_in = x
    for _ in range(cfg.num_res_blocks + 1):
        x = _residual(b, x, out_dim, cache)
    if i == len(cfg.dim_mult) - 1:
        return x
    temporal = cfg.temporal_upsample[i]
    x = _resample(b, x, temporal, cache, chunk, keep_width=cfg.wan2_2)
    if cfg.wan2_2:
        x = g.add(x, _dup_up(x_in, out_dim, 2 if temporal else 1, chunk == 0))
    return x


def _unpatchify(x: Tensor, p: int) -> Tensor:
    """WanVAE::unpatchify: [W, H, F, C*p*p] -> [p*W, p*H, F, C] (copies only where the permuted view is not
    contiguous)."""
    if p == 1:
        return x
    w, h, f = x.ne[0], x.ne[1], x.ne[2]
    c = x.ne[3] // (p * p)
    x = im.cont_if_needed(g.permute(im.reshape(x, (w * h, f, p * p, c)), (0, 2, 1, 3)))
    x = im.cont_if_needed(g.permute(im.reshape(x, (w, h * p, p, f * c)), (1, 2, 0, 3)))
    x = im.cont_if_needed(g.permute(im.reshape(x, (p * w, h, p, f * c)), (0, 2, 1, 3)))
    return im.reshape(x, (p * w, p * h, f, c))


def _decoder(b: Blocks, x: Tensor, cache: _Cache, chunk: int, cfg: WanVaeConfig) -> Tensor:
    dims = [cfg.dim * cfg.dim_mult[-1]] + [cfg.dim * m for m in reversed(cfg.dim_mult)]
    x = cache.conv(b, x, dims[0])
    x = _residual(b, x, dims[0], cache)
    x = _attention(b, x)
    x = _residual(b, x, dims[0], cache)
    for i in range(len(dims) - 1):
        x = _up_level(b, x, i, dims[i + 1], cache, chunk, cfg)
    x = g.silu(_rms_norm(b, x))
    return cache.conv(b, x, cfg.out_channels)


def decode(b: Blocks, z: Tensor, cfg: WanVaeConfig = WAN21_VAE) -> Tensor:
    """WanVAE::decode of z [W, H, T, 16]: [8W, 8H, 1 + 4(T-1), 3]."""
    cache = _Cache(cfg.conv_num)
    x = _conv3d(b, z, cfg.z_dim, (1, 1, 1), (0, 0, 0))
    out: Tensor | None = None
    for i in range(z.ne[2]):
        cache.idx = 0
        frame = _decoder(b, _slice_t(x, i, i + 1), cache, i, cfg)
        out = frame if out is None else im.concat(out, frame, 2)
    assert out is not None
    return _unpatchify(out, cfg.patch)
