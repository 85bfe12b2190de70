"""The SD 1.x / 2.x / XL UNet (ldm's UNetModel) as stable-diffusion.cpp builds it for one denoising call.

Sources (stable-diffusion.cpp 97d2990): src/model/diffusion/unet.hpp UNetConfig (SD 1.x: 320 model channels,
channel_mult (1, 2, 4, 4), 2 res blocks, attention at ds 1, 2, 4 with 8 heads, depth 1, context 768, 1x1
convolutions for proj_in/proj_out; SD 2.x and SDXL: 64-channel heads and linear projections),
UnetModelBlock::forward (the time embedding MLP, input blocks with their skips kept, the middle block, output
blocks concatenating each skip on the channel axis, out.0/out.2) and UNetModelRunner::build_graph (x, timesteps
and the text context are inputs set from the host);
src/model/common/block.hpp ResBlock (the embedding's SiLU is a new tensor, its projection added to h),
DownSampleBlock (a stride-2 3x3 convolution), UpSampleBlock, SpatialTransformer, BasicTransformerBlock
(self-attention, cross-attention over the context, GEGLU feed-forward, each with a residual add),
CrossAttention (q/k/v without bias; ggml_ext_attention_ext takes the runner's flash-attention switch), GEGLU
(the projection's two halves as views, the gate made contiguous, GELU in place, a MUL).
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import Tensor
from runtime.sd.sd_blocks import Blocks


@dataclass(frozen=True)
class UnetConfig:
    model_channels: int = 320
    in_channels: int = 4
    out_channels: int = 4
    num_res_blocks: int = 2
    attention_resolutions: tuple[int, ...] = (4, 2, 1)
    channel_mult: tuple[int, ...] = (1, 2, 4, 4)
    transformer_depth: tuple[int, ...] = (1, 1, 1, 1)
    num_heads: int = 8
    num_head_channels: int = -1
    context_dim: int = 768
    use_linear_projection: bool = False
    adm_in_channels: int = 0   # SDXL's label_emb input y (0: none)

    @property
    def time_embed_dim(self) -> int:
        return self.model_channels * 4

    def heads(self, ch: int) -> tuple[int, int]:
        """(n_head, d_head) of a transformer at `ch` channels."""
        if self.num_head_channels != -1:
            return ch // self.num_head_channels, self.num_head_channels
        return self.num_heads, ch // self.num_heads


SD1 = UnetConfig()
# SD 2.x (UNetConfig::detect_from_weights for sd_version_is_sd2): the SD 1.x layout with heads of 64 channels
# (5, 10 and 20 heads by level), linear proj_in / proj_out and OpenCLIP-H's 1024-wide context
SD2 = UnetConfig(num_heads=-1, num_head_channels=64, context_dim=1024, use_linear_projection=True)
SDXL = UnetConfig(attention_resolutions=(4, 2), channel_mult=(1, 2, 4), transformer_depth=(1, 2, 10), num_heads=-1,
                  num_head_channels=64, context_dim=2048, use_linear_projection=True, adm_in_channels=2816)


def res_block(b: Blocks, x: Tensor, emb: Tensor, c_out: int) -> Tensor:
    h = b.conv2d(im.unary_inplace(b.group_norm32(x), "SILU"), c_out, 3, 1, 1)
    emb_out = b.linear(g.silu(emb), c_out)
    h = g.add(h, im.reshape(emb_out, (1, 1, emb_out.ne[0], emb_out.ne[1])))
    h = b.conv2d(im.unary_inplace(b.group_norm32(h), "SILU"), c_out, 3, 1, 1)
    if x.ne[2] != c_out:
        x = b.conv2d(x, c_out, 1)
    return g.add(h, x)


def cross_attention(b: Blocks, x: Tensor, context: Tensor, n_head: int, d_head: int) -> Tensor:
    inner = n_head * d_head
    q = b.linear(x, inner, bias=False)
    k = b.linear(context, inner, bias=False)
    v = b.linear(context, inner, bias=False)
    return b.linear(b.attention(q, k, v, n_head, flash_attn=b.flash_attn), x.ne[0])


def geglu(b: Blocks, x: Tensor, dim_out: int) -> Tensor:
    x = b.linear(x, dim_out * 2)
    stride = dim_out * x.nb[0]
    half = (dim_out, x.ne[1], x.ne[2], x.ne[3])
    value = g.view(x, half, x.nb, 0)
    gate = g.view(x, half, x.nb, stride)
    gate = im.unary_inplace(g.cont(gate), "GELU")
    return g.mul(value, gate)


def transformer_block(b: Blocks, x: Tensor, context: Tensor, n_head: int, d_head: int) -> Tensor:
    h = b.layer_norm(x)
    x = g.add(cross_attention(b, h, h, n_head, d_head), x)
    x = g.add(cross_attention(b, b.layer_norm(x), context, n_head, d_head), x)
    dim = x.ne[0]
    return g.add(b.linear(geglu(b, b.layer_norm(x), dim * 4), dim), x)


def spatial_transformer(b: Blocks, x: Tensor, context: Tensor, cfg: UnetConfig, depth: int) -> Tensor:
    w, h, c, n = x.ne
    n_head, d_head = cfg.heads(c)
    inner = n_head * d_head
    y = b.group_norm32(x)
    if cfg.use_linear_projection:
        y = b.linear(im.reshape(g.cont(g.permute(y, (1, 2, 0, 3))), (c, w * h, n)), inner)
    else:
        y = b.conv2d(y, inner, 1)
        y = im.reshape(g.cont(g.permute(y, (1, 2, 0, 3))), (inner, w * h, n))
    for _ in range(depth):
        y = transformer_block(b, y, context, n_head, d_head)
    if cfg.use_linear_projection:
        y = b.linear(y, c)
        y = im.reshape(g.cont(g.permute(y, (1, 0, 2, 3))), (w, h, c, n))
    else:
        y = im.reshape(g.cont(g.permute(y, (1, 0, 2, 3))), (w, h, inner, n))
        y = b.conv2d(y, c, 1)
    return g.add(y, x)


def unet(b: Blocks, x: Tensor, timesteps: Tensor, context: Tensor, cfg: UnetConfig = SD1,
         y: Tensor | None = None) -> Tensor:
    """UnetModelBlock::forward for x [w, h, in_channels, 1], timesteps [1], context [context_dim, n_ctx, 1]
    and, for SDXL, y [adm_in_channels, 1]."""
    t_emb = im.timestep_embedding(g.scale(timesteps, 1.0), cfg.model_channels)
    emb = b.linear(im.unary_inplace(b.linear(t_emb, cfg.time_embed_dim), "SILU"), cfg.time_embed_dim)
    if y is not None:
        label = b.linear(im.unary_inplace(b.linear(y, cfg.time_embed_dim), "SILU"), cfg.time_embed_dim)
        emb = g.add(emb, label)
    h = b.conv2d(x, cfg.model_channels, 3, 1, 1)
    hs = [h]
    ds = 1
    for i, mult in enumerate(cfg.channel_mult):
        for _ in range(cfg.num_res_blocks):
            h = res_block(b, h, emb, mult * cfg.model_channels)
            if ds in cfg.attention_resolutions:
                h = spatial_transformer(b, h, context, cfg, cfg.transformer_depth[i])
            hs.append(b.cut(h))
        if i != len(cfg.channel_mult) - 1:
            h = b.conv2d(h, h.ne[2], 3, 2, 1)
            hs.append(h)
            ds *= 2
    h = res_block(b, h, emb, h.ne[2])
    h = spatial_transformer(b, h, context, cfg, cfg.transformer_depth[-1])
    h = b.cut(res_block(b, h, emb, h.ne[2]))
    for i in reversed(range(len(cfg.channel_mult))):
        for j in range(cfg.num_res_blocks + 1):
            h = im.concat(h, hs.pop(), 2)
            h = res_block(b, h, emb, cfg.channel_mult[i] * cfg.model_channels)
            if ds in cfg.attention_resolutions:
                h = spatial_transformer(b, h, context, cfg, cfg.transformer_depth[i])
            if i > 0 and j == cfg.num_res_blocks:
                h = b.conv2d(im.upscale(h, 2), h.ne[2], 3, 1, 1)
                ds //= 2
            b.cut(h)
    h = im.unary_inplace(b.group_norm32(h), "SILU")
    return b.conv2d(h, cfg.out_channels, 3, 1, 1)
