"""The Wan 2.1 video DiT (text-to-video) as stable-diffusion.cpp builds it for one denoising call.

Sources (stable-diffusion.cpp 97d2990, src/model/diffusion/wan.hpp): WanRunner's config by block count (30
blocks: Wan2.1-T2V-1.3B, dim 1536, 12 heads, FFN 8960, 16 channels in and out, 1x2x2 patches, a 4096-wide
512-token text context), Wan::forward (pad_to_patch_size builds a pad it then drops, forward_orig,
unpatchify, three slices that copy unless a dimension is 1), forward_orig (the patch embedding as a Conv3d:
core/ggml_extend.hpp ggml_ext_conv_3d over ggml_conv_3d — IM2COL_3D in f16 for the f16 kernel, a matmul, a
permuted copy — and the bias added in place; the time embedding's two Linears, the six-way time projection
over silu(e), the text embedding's two Linears around a GELU), WanAttentionBlock (the block's modulation
added to the projection and cut into six contiguous vectors; LayerNorms without affine, x + x*scale + shift;
WanSelfAttention: q, k, v Linears, RMSNorm'd q and k over the whole width, Rope::attention of
src/model/common/rope.hpp; the normed (affine) cross attention on the text; a tanh-GELU FFN in place), Head
(the time embedding repeated to two rows plus the head's modulation), unpatchify (four permuted copies,
each only where the permuted view is not already contiguous). Wan2.2-TI2V-5B (VERSION_WAN2_2_TI2V: dim 3072,
24 heads, FFN 14336, 48 channels) is the same graph with one timestep per latent frame
(stable-diffusion.cpp's process_timesteps for that runner): the embeddings are per frame and modulate_add /
modulate_mul view the tokens as [dim, tokens per frame, frames] for the broadcast.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import GGMLType, Tensor
from runtime.sd.flux_dit import _rope_attention
from runtime.sd.sd_blocks import Blocks, ext_scale

NORM_EPS = 1e-6


@dataclass(frozen=True)
class WanConfig:
    dim: int = 1536
    ffn_dim: int = 8960
    num_heads: int = 12
    num_layers: int = 30
    in_dim: int = 16
    out_dim: int = 16
    freq_dim: int = 256
    text_dim: int = 4096
    text_len: int = 512
    patch: tuple[int, int, int] = (1, 2, 2)   # (t, h, w)
    axes_dim_sum: int = 128
    # Wan2.2-TI2V: one timestep per latent frame (stable-diffusion.cpp process_timesteps), so the time
    # embedding and the six modulation vectors are per frame and each block's modulation is applied to the
    # tokens viewed frame by frame (wan.hpp modulate_add / modulate_mul where the vector has three dims)
    per_frame_time: bool = False


WAN21_T2V_1_3B = WanConfig()
WAN21_T2V_14B = WanConfig(dim=5120, ffn_dim=13824, num_heads=40, num_layers=40)
WAN22_TI2V_5B = WanConfig(dim=3072, ffn_dim=14336, num_heads=24, in_dim=48, out_dim=48, per_frame_time=True)


def _conv3d(b: Blocks, x: Tensor, c_out: int, kernel: tuple[int, int, int]) -> Tensor:
    """Conv3d with stride equal to the kernel, no padding: x [W, H, T, IC*N] -> [OW, OH, OD, OC*N]."""
    kt, kh, kw = kernel
    ic = x.ne[3]
    w = b.param((kw, kh, kt, ic * c_out), GGMLType.F16)
    bias = b.param((c_out,))
    return im.conv_3d(w, bias, x, c_out, (kw, kh, kt))


def _rms(b: Blocks, x: Tensor) -> Tensor:
    return im.mul_inplace(g.rms_norm(x, NORM_EPS), b.param((x.ne[0],)))


def _by_frame(op, x: Tensor, e: Tensor) -> Tensor:
    """op(x, e) for x [dim, tokens, N] and e [dim, 1] or, one per frame, [dim, 1, T] (T > 1): then x is viewed
    as [dim, tokens / T, T, N] for the broadcast and the result viewed back as [dim, tokens, N]."""
    frames = e.ne[2]
    if frames == 1:
        return op(x, e)
    y = op(im.reshape(x, (x.ne[0], x.ne[1] // frames, frames, x.ne[2])), e)
    return im.reshape(y, (y.ne[0], y.ne[1] * y.ne[2], y.ne[3]))


def _modulated(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return _by_frame(g.add, g.add(x, _by_frame(g.mul, x, scale)), shift)


def _six(b: Blocks, e0: Tensor, n: int) -> list[Tensor]:
    """e + modulation, cut along dim 1 into n contiguous [dim, 1, ...] vectors (ggml_ext_chunk)."""
    e = g.add(e0, b.param((e0.ne[0], n, 1)))
    nb = (e.nb[0], e.nb[1], e.nb[2], e.nb[3])
    return [g.cont(g.view(e, (e.ne[0], 1, e.ne[2], e.ne[3]), nb, e.nb[1] * i)) for i in range(n)]


def _self_attention(b: Blocks, x: Tensor, pe: Tensor, cfg: WanConfig) -> Tensor:
    length, n = x.ne[1], x.ne[2]
    head = cfg.dim // cfg.num_heads
    q = _rms(b, b.linear(x, cfg.dim))
    k = _rms(b, b.linear(x, cfg.dim))
    v = b.linear(x, cfg.dim)
    q, k, v = (im.reshape(t, (head, cfg.num_heads, length, n)) for t in (q, k, v))
    return b.linear(_rope_attention(b, q, k, v, pe), cfg.dim)


def _cross_attention(b: Blocks, x: Tensor, context: Tensor, cfg: WanConfig) -> Tensor:
    q = _rms(b, b.linear(x, cfg.dim))
    k = _rms(b, b.linear(context, cfg.dim))
    v = b.linear(context, cfg.dim)
    return b.linear(b.attention(q, k, v, cfg.num_heads, flash_attn=b.flash_attn), cfg.dim)


def block(b: Blocks, x: Tensor, e0: Tensor, pe: Tensor, context: Tensor, cfg: WanConfig) -> Tensor:
    es = _six(b, e0, 6)
    y = _modulated(im.norm(x, NORM_EPS), es[0], es[1])
    y = _self_attention(b, y, pe, cfg)
    x = g.add(x, _by_frame(g.mul, y, es[2]))
    x = g.add(x, _cross_attention(b, b.layer_norm(x, NORM_EPS), context, cfg))
    y = _modulated(im.norm(x, NORM_EPS), es[3], es[4])
    y = b.linear(im.unary_inplace(b.linear(y, cfg.ffn_dim), "GELU"), cfg.dim)
    return g.add(x, _by_frame(g.mul, y, es[5]))


def _permute_cont(x: Tensor, axes: tuple[int, int, int, int]) -> Tensor:
    return im.cont_if_needed(g.permute(x, axes))


def _unpatchify(x: Tensor, t_len: int, h_len: int, w_len: int, cfg: WanConfig) -> Tensor:
    pt, ph, pw = cfg.patch
    n = x.ne[3]
    c = x.ne[0] // (pt * ph * pw)
    x = _permute_cont(im.reshape(x, (c, pw * ph * pt, w_len * h_len * t_len, n)), (2, 0, 1, 3))
    x = _permute_cont(im.reshape(x, (pw, ph * pt, w_len, h_len * t_len * c * n)), (0, 2, 1, 3))
    x = _permute_cont(im.reshape(x, (pw * w_len, ph, pt, h_len * t_len * c * n)), (0, 2, 1, 3))
    x = _permute_cont(im.reshape(x, (pw * w_len, pt, ph * h_len, t_len * c * n)), (0, 2, 1, 3))
    return im.reshape(x, (pw * w_len, ph * h_len, pt * t_len, c * n))


def wan(b: Blocks, x: Tensor, timesteps: Tensor, context: Tensor, pe: Tensor,
        cfg: WanConfig = WAN21_T2V_1_3B) -> Tensor:
    """Wan::forward for x [W, H, T, 16] latents (sides a multiple of the patch), context [4096, 512, 1]."""
    width, height, frames = x.ne[0], x.ne[1], x.ne[2]
    pt, ph, pw = cfg.patch
    t_len, h_len, w_len = (frames + pt // 2) // pt, (height + ph // 2) // ph, (width + pw // 2) // pw
    h = _conv3d(b, x, cfg.dim, cfg.patch)
    h = im.reshape(h, (h.ne[0] * h.ne[1] * h.ne[2], h.ne[3], 1))
    h = _permute_cont(h, (1, 0, 2, 3))
    e = im.timestep_embedding(ext_scale(timesteps, 1.0), cfg.freq_dim)
    e = b.linear(im.unary_inplace(b.linear(e, cfg.dim), "SILU"), cfg.dim)
    e0 = b.linear(g.silu(e), cfg.dim * 6)
    e0 = im.reshape(e0, (cfg.dim, 6, e0.ne[1], e0.ne[2]))
    ctx = b.linear(g.unary(b.linear(context, cfg.dim), "GELU"), cfg.dim)
    for _ in range(cfg.num_layers):
        h = block(b, h, e0, pe, ctx, cfg)
    head = im.repeat(im.reshape(e, (e.ne[0], 1, e.ne[1], e.ne[2])), (e.ne[0], 2, e.ne[1], e.ne[2]))
    es = _six(b, head, 2)
    h = b.linear(_modulated(im.norm(h, NORM_EPS), es[0], es[1]), cfg.out_dim * pt * ph * pw)
    out = _unpatchify(h, t_len, h_len, w_len, cfg)
    for dim, size in ((2, frames), (1, height), (0, width)):
        if out.ne[dim] != 1:
            ne = tuple(size if i == dim else out.ne[i] for i in range(4))
            out = g.cont(g.view(out, ne, out.nb, 0))
    return out
