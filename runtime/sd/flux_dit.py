"""The FLUX.1 DiT (dev / schnell layout) as stable-diffusion.cpp builds it for one denoising call.

Sources (stable-diffusion.cpp 97d2990): src/model/diffusion/flux.hpp FluxConfig (hidden 3072, 24 heads, 19
double and 38 single blocks, MLP ratio 4, 64 latent channels after 2x2 patches, 4096-wide T5 context, a
768-wide pooled CLIP vector; guidance_in where the weights have it), FluxRunner::build_graph (x, timesteps,
context, y, guidance and the rotary table pe [2, 2, 64, n_txt + n_img] are inputs), Flux::forward_flux_chroma
(patchify, forward_orig, unpatchify and crop), forward_orig (img_in, time_in / guidance_in / vector_in
MLPEmbedders on 256-wide timestep embeddings scaled by 1000, txt_in, the blocks, the final layer),
DoubleStreamBlock (per-stream Modulation of six vectors, LayerNorm without affine, modulate, fused qkv
projection viewed per head, RMSNorm'd q and k, the two streams concatenated for attention, gated residuals,
GELU MLPs), SingleStreamBlock (one linear1 giving q, k, v and the MLP input, linear2 over their
concatenation), LastLayer (adaLN shift and scale as contiguous chunks); src/model/common/rope.hpp
Rope::attention / apply_rope (interleaved: q and k permuted, split in halves, repeated, multiplied by the
permuted table and summed; ggml_ext_attention_ext with skip_reshape and the runner's flash switch);
src/model/diffusion/dit.hpp patchify / unpatchify_and_crop (its two slices copy even when they keep all).
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import Tensor
from runtime.sd.sd_blocks import Blocks, ext_scale

NORM_EPS = 1e-6          # the blocks' LayerNorms (no affine) and QKNorm's RMSNorms
TIME_FACTOR = 1000.0     # forward_orig: ggml_ext_timestep_embedding(..., 10000, 1000.f)
TIME_DIM = 256


@dataclass(frozen=True)
class FluxConfig:
    hidden_size: int = 3072
    num_heads: int = 24
    depth: int = 19
    depth_single_blocks: int = 38
    mlp_ratio: float = 4.0
    in_channels: int = 64
    out_channels: int = 64
    patch_size: int = 2
    context_in_dim: int = 4096
    vec_in_dim: int = 768
    axes_dim_sum: int = 128
    guidance_embed: bool = True

    @property
    def mlp_hidden(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


FLUX1 = FluxConfig()


def _mlp_embedder(b: Blocks, x: Tensor, hidden: int) -> Tensor:
    return b.linear(im.unary_inplace(b.linear(x, hidden), "SILU"), hidden)


def _timestep(b: Blocks, t: Tensor, hidden: int) -> Tensor:
    return _mlp_embedder(b, im.timestep_embedding(ext_scale(t, TIME_FACTOR), TIME_DIM), hidden)


def _modulation(b: Blocks, vec: Tensor, multiplier: int) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Modulation::forward: (shift, scale, gate) views of silu(vec)'s projection, one triple per 3 vectors."""
    dim = vec.ne[0]
    out = b.linear(g.silu(vec), dim * multiplier)
    m = g.cont(g.permute(im.reshape(out, (dim, multiplier, vec.ne[1])), (0, 2, 1, 3)))
    stride = m.nb[1] * m.ne[1]

    def row(i: int) -> Tensor:
        return g.view(m, (m.ne[0], m.ne[1]), (m.nb[0], m.nb[1], m.nb[1] * m.ne[1], m.nb[1] * m.ne[1]), stride * i)
    return [(row(3 * j), row(3 * j + 1), row(3 * j + 2)) for j in range(multiplier // 3)]


def _modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    scale = im.reshape(scale, (scale.ne[0], 1, scale.ne[1]))
    shift = im.reshape(shift, (shift.ne[0], 1, shift.ne[1]))
    return g.add(g.add(x, g.mul(x, scale)), shift)


def _rms_norm(b: Blocks, x: Tensor) -> Tensor:
    return g.mul(g.rms_norm(x, NORM_EPS), b.param((x.ne[0],)))


def _heads(qkv: Tensor, cfg: FluxConfig, offset_elems: int) -> Tensor:
    """A [head_dim, n_head, L, N] view of a fused projection, starting `offset_elems` into each row."""
    d = cfg.head_dim
    nb0 = qkv.nb[0]
    return g.view(qkv, (d, cfg.num_heads, qkv.ne[1], qkv.ne[2]), (nb0, nb0 * d, qkv.nb[1], qkv.nb[2]),
                  nb0 * offset_elems)


def _pre_attention(b: Blocks, x: Tensor, cfg: FluxConfig) -> tuple[Tensor, Tensor, Tensor]:
    qkv = b.linear(x, cfg.hidden_size * 3)
    q, k, v = (_heads(qkv, cfg, i * cfg.hidden_size) for i in range(3))
    return _rms_norm(b, q), _rms_norm(b, k), v


def _apply_rope(x: Tensor, pe: Tensor) -> Tensor:
    d_head, n_head, length, n = x.ne
    x = g.cont(g.permute(x, (0, 2, 1, 3)))
    x = g.cont(g.permute(im.reshape(x, (2, d_head // 2, length, n_head * n)), (3, 0, 1, 2)))
    offset = x.nb[2] * x.ne[2]
    nb3 = (x.nb[0], x.nb[1], x.nb[2], x.nb[2] * x.ne[2])
    halves = []
    for i in range(2):
        half = g.view(x, x.ne[:3], nb3, offset * i)
        half = im.reshape(half, (1, half.ne[0], half.ne[1], half.ne[2]))
        halves.append(im.repeat(half, (2, half.ne[1], half.ne[2], half.ne[3])))
    pe = g.cont(g.permute(pe, (3, 0, 1, 2)))
    pe_offset = pe.nb[2] * pe.ne[2]
    pe_nb = (pe.nb[0], pe.nb[1], pe.nb[2], pe.nb[2] * pe.ne[2])
    pe_0, pe_1 = (g.view(pe, pe.ne[:3], pe_nb, pe_offset * i) for i in range(2))
    out = im.add_inplace(g.mul(halves[0], pe_0), g.mul(halves[1], pe_1))
    return im.reshape(out, (d_head, length, n_head * n))


def _rope_attention(b: Blocks, q: Tensor, k: Tensor, v: Tensor, pe: Tensor) -> Tensor:
    n_head = q.ne[1]
    return b.attention_heads(_apply_rope(q, pe), _apply_rope(k, pe), v, n_head, flash_attn=b.flash_attn)


def _mlp(b: Blocks, x: Tensor, cfg: FluxConfig) -> Tensor:
    h = im.unary_inplace(b.linear(x, cfg.mlp_hidden), "GELU")
    return b.linear(h, cfg.hidden_size)


def double_block(b: Blocks, img: Tensor, txt: Tensor, vec: Tensor, pe: Tensor,
                 cfg: FluxConfig) -> tuple[Tensor, Tensor]:
    img_mod1, img_mod2 = _modulation(b, vec, 6)
    txt_mod1, txt_mod2 = _modulation(b, vec, 6)
    img_q, img_k, img_v = _pre_attention(b, _modulate(im.norm(img, NORM_EPS), img_mod1[0], img_mod1[1]), cfg)
    txt_q, txt_k, txt_v = _pre_attention(b, _modulate(im.norm(txt, NORM_EPS), txt_mod1[0], txt_mod1[1]), cfg)
    q = im.concat(txt_q, img_q, 2)
    k = im.concat(txt_k, img_k, 2)
    v = im.concat(txt_v, img_v, 2)
    attn = _rope_attention(b, q, k, v, pe)
    nb = (attn.nb[0], attn.nb[1], attn.nb[2], attn.nb[2] * attn.ne[2])
    txt_out = g.view(attn, (attn.ne[0], txt.ne[1], attn.ne[2]), nb, 0)
    img_out = g.view(attn, (attn.ne[0], img.ne[1], attn.ne[2]), nb, txt.ne[1] * attn.nb[1])
    img = g.add(img, g.mul(b.linear(img_out, cfg.hidden_size), img_mod1[2]))
    img_mlp = _mlp(b, _modulate(im.norm(img, NORM_EPS), img_mod2[0], img_mod2[1]), cfg)
    img = g.add(img, g.mul(img_mlp, img_mod2[2]))
    txt = g.add(txt, g.mul(b.linear(txt_out, cfg.hidden_size), txt_mod1[2]))
    txt_mlp = _mlp(b, _modulate(im.norm(txt, NORM_EPS), txt_mod2[0], txt_mod2[1]), cfg)
    txt = g.add(txt, g.mul(txt_mlp, txt_mod2[2]))
    return img, txt


def single_block(b: Blocks, x: Tensor, vec: Tensor, pe: Tensor, cfg: FluxConfig) -> Tensor:
    shift, scale, gate = _modulation(b, vec, 3)[0]
    qkv_mlp = b.linear(_modulate(im.norm(x, NORM_EPS), shift, scale), cfg.hidden_size * 3 + cfg.mlp_hidden)
    q, k, v = (_heads(qkv_mlp, cfg, i * cfg.hidden_size) for i in range(3))
    attn = _rope_attention(b, _rms_norm(b, q), _rms_norm(b, k), v, pe)
    nb = (qkv_mlp.nb[0], qkv_mlp.nb[1], qkv_mlp.nb[2], qkv_mlp.nb[2] * qkv_mlp.ne[2])
    mlp = g.view(qkv_mlp, (cfg.mlp_hidden, qkv_mlp.ne[1], qkv_mlp.ne[2]), nb, 3 * cfg.hidden_size * qkv_mlp.nb[0])
    mlp = im.unary_inplace(im.cont_if_needed(mlp), "GELU")
    out = b.linear(im.concat(attn, mlp, 0), cfg.hidden_size)
    return g.add(x, g.mul(out, gate))


def _patchify(x: Tensor, p: int) -> Tensor:
    w_, h_, c, n = x.ne
    h, w = h_ // p, w_ // p
    x = g.cont(g.permute(im.reshape(x, (p, w, p, h * c * n)), (0, 2, 1, 3)))
    x = g.cont(g.permute(im.reshape(x, (p * p, w * h, c, n)), (0, 2, 1, 3)))
    return im.reshape(x, (p * p * c, w * h, n))


def _unpatchify_and_crop(x: Tensor, height: int, width: int, p: int) -> Tensor:
    h, w = height // p, width // p
    n = x.ne[2]
    c = x.ne[0] // p // p
    x = g.cont(g.permute(im.reshape(x, (p * p, c, w * h, n)), (0, 2, 1, 3)))
    x = g.cont(g.permute(im.reshape(x, (p, p, w, h * c * n)), (0, 2, 1, 3)))
    x = im.reshape(x, (width, height, c, n))
    for dim in (1, 0):   # ggml_ext_slice: a view, copied, unless the dimension is 1
        if x.ne[dim] != 1:
            x = g.cont(g.view(x, x.ne, x.nb, 0))
    return x


def flux(b: Blocks, x: Tensor, timesteps: Tensor, context: Tensor, y: Tensor, guidance: Tensor | None, pe: Tensor,
         cfg: FluxConfig = FLUX1) -> Tensor:
    """Flux::forward for x [W, H, 16, 1] latents (even sides), context [4096, n_txt, 1], y [768, 1]."""
    width, height = x.ne[0], x.ne[1]
    img = b.linear(_patchify(x, cfg.patch_size), cfg.hidden_size)
    vec = _timestep(b, timesteps, cfg.hidden_size)
    if cfg.guidance_embed and guidance is not None:
        vec = g.add(vec, _timestep(b, guidance, cfg.hidden_size))
    if cfg.vec_in_dim > 0:
        vec = g.add(vec, _mlp_embedder(b, y, cfg.hidden_size))
    txt = b.linear(context, cfg.hidden_size)
    for _ in range(cfg.depth):
        img, txt = double_block(b, img, txt, vec, pe, cfg)
    txt_img = im.concat(txt, img, 1)
    for _ in range(cfg.depth_single_blocks):
        txt_img = single_block(b, txt_img, vec, pe, cfg)
    nb = (txt_img.nb[0], txt_img.nb[1], txt_img.nb[2], txt_img.nb[2] * txt_img.ne[2])
    img = g.view(txt_img, (txt_img.ne[0], img.ne[1], txt_img.ne[2]), nb, txt.ne[1] * txt_img.nb[1])
    m = b.linear(g.silu(vec), 2 * cfg.hidden_size)
    half = (cfg.hidden_size, m.ne[1], m.ne[2], m.ne[3])
    shift, scale = (g.cont(g.view(m, half, m.nb, cfg.hidden_size * m.nb[0] * i)) for i in range(2))
    img = b.linear(_modulate(im.norm(img, NORM_EPS), shift, scale), cfg.out_channels)
    return _unpatchify_and_crop(img, height, width, cfg.patch_size)
