"""Z-Image's DiT (Z-Image-Turbo) as stable-diffusion.cpp builds it for one denoising call.

Sources (stable-diffusion.cpp 97d2990, src/model/diffusion/z_image.hpp): ZImageConfig (detected: hidden 3840,
heads of 128 — 30 for queries, keys and values alike —, 30 layers, 2 noise and 2 context refiner blocks, an
FFN of int(8/3 * 3840) rounded up to 256, a 2560-wide caption feature, 2x2 patches of 16 channels),
ZImageModel::forward (pad_and_patchify with the patch dimension first, forward_core, a slice of the image
tokens, unpatchify_and_crop, a scale by -1), forward_core (the timestep embedder to 256 wide, the caption
RMSNorm and Linear, the patch Linear, pad tokens repeated and concatenated up to a multiple of 32 for text
and image, the rotary table sliced and copied for each, the refiners, the joint layers, the final layer,
the image tokens sliced out), JointTransformerBlock (adaLN Linear over the 256-wide embedding cut into four
contiguous vectors; RMSNorm, x + x*scale, attention, RMSNorm, times tanh(gate), residual; the same around
the SwiGLU FeedForward whose w2 Linear runs at scale 1/128), JointAttention (one qkv Linear viewed as q, k
and v heads, RMSNorm'd q and k, Rope::attention with kv_scale 1/128 — used by the flash-attention path
only), FinalLayer (scale from silu(c), a LayerNorm without affine, the output Linear).
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import Tensor
from runtime.sd.flux_dit import _apply_rope
from runtime.sd.sd_blocks import Blocks, ext_scale

SEQ_MULTI_OF = 32
ADALN_DIM = 256
KV_SCALE = 1.0 / 128.0
W2_SCALE = 1.0 / 128.0


@dataclass(frozen=True)
class ZImageConfig:
    hidden_size: int = 3840
    head_dim: int = 128
    num_heads: int = 30
    num_kv_heads: int = 30
    num_layers: int = 30
    num_refiner_layers: int = 2
    ffn_hidden: int = 10240
    in_channels: int = 16
    out_channels: int = 16
    patch_size: int = 2
    cap_feat_dim: int = 2560
    norm_eps: float = 1e-5
    axes_dim_sum: int = 128


Z_IMAGE_TURBO = ZImageConfig()


def pad_to(n: int, multiple: int = SEQ_MULTI_OF) -> int:
    """Rope::bound_mod: the tokens that pad n up to a multiple."""
    return (multiple - n % multiple) % multiple


def _rms(b: Blocks, x: Tensor, eps: float) -> Tensor:
    return im.mul_inplace(g.rms_norm(x, eps), b.param((x.ne[0],)))


def _slice(x: Tensor, dim: int, start: int, end: int) -> Tensor:
    """ggml_ext_slice: a view copied, unless the dimension is 1."""
    if x.ne[dim] == 1:
        return x
    ne = tuple(end - start if i == dim else x.ne[i] for i in range(4))
    return g.cont(g.view(x, ne, x.nb, start * x.nb[dim]))


def _attention(b: Blocks, x: Tensor, pe: Tensor, cfg: ZImageConfig) -> Tensor:
    d, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    qkv = b.linear(x, (nh + 2 * nkv) * d, bias=False)
    qkv = im.reshape(qkv, (d, nh + 2 * nkv, qkv.ne[1], qkv.ne[2]))
    nb = qkv.nb

    def heads(count: int, first: int) -> Tensor:
        return g.view(qkv, (d, count, qkv.ne[2], qkv.ne[3]), nb, first * nb[1])
    q, k, v = heads(nh, 0), heads(nkv, nh), heads(nkv, nh + nkv)
    q, k = _rms(b, q, 1e-6), _rms(b, k, 1e-6)
    out = b.attention_heads(_apply_rope(q, pe), _apply_rope(k, pe), v, nh, flash_attn=b.flash_attn,
                            kv_scale=KV_SCALE)
    return b.linear(out, cfg.hidden_size, bias=False)


def _feed_forward(b: Blocks, x: Tensor, cfg: ZImageConfig) -> Tensor:
    x1 = b.linear(x, cfg.ffn_hidden, bias=False)
    x3 = b.linear(x, cfg.ffn_hidden, bias=False)
    return b.linear(g.swiglu(x1, x3), cfg.hidden_size, bias=False, scale=W2_SCALE)


def _modulate(x: Tensor, scale: Tensor) -> Tensor:
    return g.add(x, g.mul(x, im.reshape(scale, (scale.ne[0], 1, scale.ne[1]))))


def block(b: Blocks, x: Tensor, pe: Tensor, cfg: ZImageConfig, t_emb: Tensor | None) -> Tensor:
    eps = cfg.norm_eps
    if t_emb is None:
        h = _rms(b, _attention(b, _rms(b, x, eps), pe, cfg), eps)
        x = g.add(h, x)
        h = _rms(b, _feed_forward(b, _rms(b, x, eps), cfg), eps)
        return g.add(h, x)
    m = b.linear(t_emb, 4 * cfg.hidden_size)
    hid = cfg.hidden_size
    scale_msa, gate_msa, scale_mlp, gate_mlp = (
        g.cont(g.view(m, (hid, m.ne[1], m.ne[2], m.ne[3]), m.nb, hid * m.nb[0] * i)) for i in range(4))
    h = _attention(b, _modulate(_rms(b, x, eps), scale_msa), pe, cfg)
    h = g.mul(_rms(b, h, eps), g.unary(gate_msa, "TANH"))
    x = g.add(h, x)
    h = _feed_forward(b, _modulate(_rms(b, x, eps), scale_mlp), cfg)
    h = g.mul(_rms(b, h, eps), g.unary(gate_mlp, "TANH"))
    return g.add(h, x)


def _patchify(x: Tensor, p: int) -> Tensor:
    """DiT::patchify with the patch dimension first: [W, H, C, N] -> [C*p*p, h*w, N]."""
    w_, h_, c, n = x.ne
    h, w = h_ // p, w_ // p
    x = g.cont(g.permute(im.reshape(x, (p, w, p, h * c * n)), (0, 2, 1, 3)))
    x = im.reshape(x, (p * p, w * h, c, n))
    x = g.cont(g.permute(x, (1, 2, 0, 3)))
    return im.reshape(x, (c * p * p, w * h, n))


def _unpatchify(x: Tensor, height: int, width: int, p: int) -> Tensor:
    h, w = height // p, width // p
    n = x.ne[2]
    c = x.ne[0] // p // p
    x = g.cont(g.permute(im.reshape(x, (c, p * p, w * h, n)), (2, 0, 1, 3)))
    x = g.cont(g.permute(im.reshape(x, (p, p, w, h * c * n)), (0, 2, 1, 3)))
    x = im.reshape(x, (width, height, c, n))
    return _slice(_slice(x, 1, 0, height), 0, 0, width)


def z_image(b: Blocks, x: Tensor, timesteps: Tensor, context: Tensor, pe: Tensor,
            cfg: ZImageConfig = Z_IMAGE_TURBO) -> Tensor:
    """ZImageModel::forward for x [W, H, 16, 1] latents (even sides), context [2560, n_txt, 1]."""
    width, height = x.ne[0], x.ne[1]
    img = _patchify(x, cfg.patch_size)
    n_img = img.ne[1]
    n_txt = context.ne[1]
    t = im.timestep_embedding(ext_scale(timesteps, 1.0), 256)
    t_emb = b.linear(im.unary_inplace(b.linear(t, 1024), "SILU"), ADALN_DIM)
    txt = b.linear(_rms(b, context, cfg.norm_eps), cfg.hidden_size)
    img = b.linear(img, cfg.hidden_size)
    hid = cfg.hidden_size
    if pad_to(n_txt):
        pads = im.repeat(b.param((hid,)), (hid, pad_to(n_txt), 1, 1))
        txt = im.concat(txt, pads, 1)
    if pad_to(n_img):
        pads = im.repeat(b.param((hid,)), (hid, pad_to(n_img), 1, 1))
        img = im.concat(img, pads, 1)
    txt_pe = _slice(pe, 3, 0, txt.ne[1])
    img_pe = _slice(pe, 3, txt.ne[1], pe.ne[3])
    for _ in range(cfg.num_refiner_layers):
        txt = block(b, txt, txt_pe, cfg, None)
    for _ in range(cfg.num_refiner_layers):
        img = block(b, img, img_pe, cfg, t_emb)
    txt_img = im.concat(txt, img, 1)
    for _ in range(cfg.num_layers):
        txt_img = block(b, txt_img, pe, cfg, t_emb)
    scale = b.linear(g.silu(t_emb), hid)
    txt_img = b.linear(_modulate(im.norm(txt_img, 1e-6), scale), cfg.patch_size ** 2 * cfg.out_channels)
    start = txt.ne[1]
    out = _slice(txt_img, 1, start, start + n_img)
    out = _slice(out, 1, 0, n_img)
    out = _unpatchify(out, height, width, cfg.patch_size)
    return ext_scale(out, -1.0)
