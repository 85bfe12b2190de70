"""SD3's MMDiT (SD3.5 medium's MMDiT-X layout) as stable-diffusion.cpp builds it for one denoising call.

Sources (stable-diffusion.cpp 97d2990, src/model/diffusion/mmdit.hpp): MMDiTConfig (detected from the weights:
hidden 1536 = 64 x depth, depth 24 joint blocks with as many heads, MLP ratio 4, 2x2 patches of 16 latent
channels, a 2048-wide pooled vector, a 4096-wide context, pos_embed_max_size the side of the stored position
table, RMS qk norm, x blocks 0..d_self with a second self-attention), PatchEmbed (a pad to the patch size,
even when it adds nothing, then a strided Conv2d, flattened and transposed), TimestepEmbedder and
VectorEmbedder (two Linears around an in-place SiLU), MMDiT::cropped_pos_embed (the table viewed as rows,
cropped along the height and copied, cropped along the width and copied), SelfAttention::pre_attention
(fused qkv Linear split by split_qkv in core/ggml_extend.hpp, RMSNorm'd q and k per head),
DismantledBlock (adaLN Linear over silu(c) cut by ggml_ext_chunk into contiguous vectors — 6, 2 for the last
context block, 9 for an x block with attn2 — a LayerNorm without affine, modulate), block_mixing (the two
streams' q, k and v concatenated, context first; the context block's output is dropped in the last block),
Mlp in src/model/common/block.hpp (tanh GELU in place), FinalLayer, and DiT::unpatchify_and_crop with the
patch dimension first (src/model/diffusion/dit.hpp; its two slices copy unless a dimension is 1).
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import Tensor
from runtime.sd.sd_blocks import Blocks, ext_scale

NORM_EPS = 1e-6   # the LayerNorms (no affine) and the q / k RMSNorms
TIME_DIM = 256


@dataclass(frozen=True)
class MMDiTConfig:
    depth: int = 24
    hidden_size: int = 1536
    mlp_ratio: float = 4.0
    in_channels: int = 16
    out_channels: int = 16
    patch_size: int = 2
    adm_in_channels: int = 2048
    context_size: int = 4096
    pos_embed_max_size: int = 384
    d_self: int = 12           # x blocks 0..d_self have attn2 (-1: none)
    qk_norm: bool = True       # RMS

    @property
    def num_heads(self) -> int:
        return self.depth      # MMDiT passes depth as the head count


SD35_MEDIUM = MMDiTConfig()
# SD3.5 large: 38 joint blocks of 2432 (38 heads of 64), no second self-attention, a 192 x 192 table
SD35_LARGE = MMDiTConfig(depth=38, hidden_size=64 * 38, pos_embed_max_size=192, d_self=-1)


def _embedder(b: Blocks, x: Tensor, hidden: int) -> Tensor:
    return b.linear(im.unary_inplace(b.linear(x, hidden), "SILU"), hidden)


def _chunks(b: Blocks, c: Tensor, n_mods: int, hidden: int) -> list[Tensor]:
    """adaLN_modulation.1(silu(c)) cut into n_mods contiguous [hidden, N] vectors (ggml_ext_chunk, dim 0)."""
    m = b.linear(g.silu(c), n_mods * hidden)
    nb = (m.nb[0], m.nb[1], m.nb[2], m.nb[3])
    return [g.cont(g.view(m, (hidden, m.ne[1], m.ne[2], m.ne[3]), nb, hidden * m.nb[0] * i))
            for i in range(n_mods)]


def _modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    scale = im.reshape(scale, (scale.ne[0], 1, scale.ne[1]))
    shift = im.reshape(shift, (shift.ne[0], 1, shift.ne[1]))
    return g.add(g.add(x, g.mul(x, scale)), shift)


def _pre_attention(b: Blocks, x: Tensor, cfg: MMDiTConfig) -> list[Tensor]:
    """SelfAttention::pre_attention: q, k, v each [hidden, L, N]."""
    qkv = b.linear(x, 3 * cfg.hidden_size)
    c, length, n = qkv.ne[0] // 3, qkv.ne[1], qkv.ne[2]
    qkv = g.cont(g.permute(im.reshape(qkv, (c, 3, length, n)), (0, 3, 1, 2)))
    offset = qkv.nb[2] * qkv.ne[2]
    nb = (qkv.nb[0], qkv.nb[1], qkv.nb[2], qkv.nb[2] * qkv.ne[2])
    q, k, v = (g.view(qkv, qkv.ne[:3], nb, offset * i) for i in range(3))
    if cfg.qk_norm:
        head = c // cfg.num_heads
        normed = []
        for t in (q, k):
            t = im.reshape(t, (head, cfg.num_heads, length, n))
            t = im.mul_inplace(g.rms_norm(t, NORM_EPS), b.param((head,)))
            normed.append(im.reshape(t, (c, length, n)))
        q, k = normed
    return [q, k, v]


def _attention(b: Blocks, qkv: list[Tensor], cfg: MMDiTConfig) -> Tensor:
    return b.attention(qkv[0], qkv[1], qkv[2], cfg.num_heads, flash_attn=b.flash_attn)


def _gated(x: Tensor, out: Tensor, gate: Tensor) -> Tensor:
    return g.add(x, g.mul(out, gate))


def _mlp(b: Blocks, x: Tensor, cfg: MMDiTConfig) -> Tensor:
    h = im.unary_inplace(b.linear(x, int(cfg.hidden_size * cfg.mlp_ratio)), "GELU")
    return b.linear(h, cfg.hidden_size)


def _gate(t: Tensor) -> Tensor:
    return im.reshape(t, (t.ne[0], 1, t.ne[1]))


def _post_attention(b: Blocks, attn: Tensor, x: Tensor, mods: list[Tensor], cfg: MMDiTConfig,
                    attn2: Tensor | None = None) -> Tensor:
    """DismantledBlock::post_attention(_x); mods: gate_msa, shift_mlp, scale_mlp, gate_mlp[, gate_msa2]."""
    gate_msa, shift_mlp, scale_mlp, gate_mlp = mods[:4]
    gate_msa, gate_mlp = _gate(gate_msa), _gate(gate_mlp)
    gate_msa2 = _gate(mods[4]) if attn2 is not None else None
    attn_out = b.linear(attn, cfg.hidden_size)
    attn2_out = b.linear(attn2, cfg.hidden_size) if attn2 is not None else None
    x = _gated(x, attn_out, gate_msa)
    if attn2_out is not None and gate_msa2 is not None:
        x = _gated(x, attn2_out, gate_msa2)
    mlp_out = _mlp(b, _modulate(im.norm(x, NORM_EPS), shift_mlp, scale_mlp), cfg)
    return _gated(x, mlp_out, gate_mlp)


def joint_block(b: Blocks, context: Tensor, x: Tensor, c: Tensor, cfg: MMDiTConfig, index: int
                ) -> tuple[Tensor | None, Tensor]:
    """block_mixing for joint block `index`: (context or None after the last block, x)."""
    h = cfg.hidden_size
    pre_only = index == cfg.depth - 1
    self_attn = index <= cfg.d_self
    cmods = _chunks(b, c, 2 if pre_only else 6, h)
    ctx_qkv = _pre_attention(b, _modulate(im.norm(context, NORM_EPS), cmods[0], cmods[1]), cfg)
    xmods = _chunks(b, c, 9 if self_attn else 6, h)
    x_norm = im.norm(x, NORM_EPS)
    x_qkv = _pre_attention(b, _modulate(x_norm, xmods[0], xmods[1]), cfg)
    x_qkv2 = _pre_attention(b, _modulate(x_norm, xmods[6], xmods[7]), cfg) if self_attn else None
    qkv = [im.concat(ctx_qkv[i], x_qkv[i], 1) for i in range(3)]
    attn = _attention(b, qkv, cfg)
    nb = (attn.nb[0], attn.nb[1], attn.nb[2], attn.nb[2] * attn.ne[2])
    ctx_attn = g.view(attn, (attn.ne[0], context.ne[1], attn.ne[2]), nb, 0)
    x_attn = g.view(attn, (attn.ne[0], x.ne[1], attn.ne[2]), nb, context.ne[1] * attn.nb[1])
    new_context = None if pre_only else _post_attention(b, ctx_attn, context, cmods[2:6], cfg)
    if x_qkv2 is not None:
        attn2 = _attention(b, x_qkv2, cfg)
        x = _post_attention(b, x_attn, x, [*xmods[2:6], xmods[8]], cfg, attn2)
    else:
        x = _post_attention(b, x_attn, x, xmods[2:6], cfg)
    return new_context, x


def _pos_embed(b: Blocks, height: int, width: int, cfg: MMDiTConfig) -> Tensor:
    """MMDiT::cropped_pos_embed for a height x width latent."""
    h, w = (height + 1) // cfg.patch_size, (width + 1) // cfg.patch_size
    side, hid = cfg.pos_embed_max_size, cfg.hidden_size
    table = im.reshape(b.param((hid, side * side, 1)), (hid, side, side))
    top, left = (side - h) // 2, (side - w) // 2
    t = g.view(table, (hid, side, h), (table.nb[0], table.nb[1], table.nb[2], table.nb[2] * h), table.nb[2] * top)
    t = g.cont(g.permute(t, (0, 2, 1, 3)))
    t = g.view(t, (hid, h, w), (t.nb[0], t.nb[1], t.nb[2], t.nb[2] * w), t.nb[2] * left)
    t = g.cont(g.permute(t, (0, 2, 1, 3)))
    return im.reshape(t, (hid, h * w, 1))


def _unpatchify_and_crop(x: Tensor, height: int, width: int, p: int) -> Tensor:
    """DiT::unpatchify_and_crop with patch_last false (even sides: nothing to crop, the slices still copy)."""
    h, w = (height + (p - height % p) % p) // p, (width + (p - width % p) % p) // p
    n = x.ne[2]
    c = x.ne[0] // p // p
    x = g.cont(g.permute(im.reshape(x, (c, p * p, w * h, n)), (2, 0, 1, 3)))
    x = g.cont(g.permute(im.reshape(x, (p, p, w, h * c * n)), (0, 2, 1, 3)))
    x = im.reshape(x, (w * p, h * p, c, n))
    for dim, size in ((1, height), (0, width)):
        if x.ne[dim] != 1:
            ne = tuple(size if i == dim else x.ne[i] for i in range(4))
            x = g.cont(g.view(x, ne, x.nb, 0))
    return x


def mmdit(b: Blocks, x: Tensor, timesteps: Tensor, context: Tensor, y: Tensor,
          cfg: MMDiTConfig = SD35_MEDIUM) -> Tensor:
    """MMDiT::forward for x [W, H, 16, 1] latents, context [4096, n_ctx, 1], y [2048, 1]."""
    width, height = x.ne[0], x.ne[1]
    p = cfg.patch_size
    x = im.pad_ext(x, [(0, (p - width % p) % p), (0, (p - height % p) % p)])
    x = b.conv2d(x, cfg.hidden_size, p, p)
    x = im.reshape(x, (x.ne[0] * x.ne[1], x.ne[2], x.ne[3]))
    x = g.cont(g.permute(x, (1, 0, 2, 3)))
    x = g.add(x, _pos_embed(b, height, width, cfg))
    c = _embedder(b, im.timestep_embedding(ext_scale(timesteps, 1.0), TIME_DIM), cfg.hidden_size)
    c = g.add(c, _embedder(b, y, cfg.hidden_size))
    ctx: Tensor | None = b.linear(context, cfg.hidden_size)
    for i in range(cfg.depth):
        assert ctx is not None
        ctx, x = joint_block(b, ctx, x, c, cfg, i)
    shift, scale = _chunks(b, c, 2, cfg.hidden_size)
    x = b.linear(_modulate(im.norm(x, NORM_EPS), shift, scale), p * p * cfg.out_channels)
    return _unpatchify_and_crop(x, height, width, p)
