"""The KL-f8 VAE's decode graph (AutoencoderKL: SD 1.x, 2.x and XL), as stable-diffusion.cpp builds it.

Sources (stable-diffusion.cpp 97d2990, src/model/vae/auto_encoder_kl.hpp): AutoEncoderKLModel::decode
(post_quant_conv, then Decoder::forward), Decoder (conv_in to ch * ch_mult[-1] channels; mid.block_1,
mid.attn_1, mid.block_2; for each level from the deepest, num_res_blocks + 1 ResnetBlocks and an
UpSampleBlock but on the last; norm_out, SiLU in place, conv_out to 3 channels), ResnetBlock (norm1, SiLU
in place, conv1, norm2, SiLU in place, conv2, a 1x1 nin_shortcut where the width changes, the residual
add), AttnBlock with 1x1 convolutions for q, k, v and proj_out (the original checkpoints' 4-D weights;
one head over the h*w positions), src/model/common/block.hpp UpSampleBlock (nearest upscale by 2, a 3x3
convolution). The default config: ch 128, ch_mult (1, 2, 4, 4), 2 res blocks, 4 latent channels;
the DiT families' autoencoder (AE16) has 16 latent channels and no post_quant_conv.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.ggml import build as g
from runtime.ggml import image_ops as im
from runtime.ggml.graph import Tensor
from runtime.sd.sd_blocks import Blocks


@dataclass(frozen=True)
class VaeConfig:
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    z_channels: int = 4
    embed_dim: int = 4
    out_ch: int = 3
    use_quant: bool = True     # post_quant_conv (SD 1.x/2.x/XL; the DiT families' VAEs have none)


KL_F8 = VaeConfig()
# the 16-channel KL-f8 autoencoder of SD3, FLUX.1 and Z-Image (auto_encoder_kl.hpp: z_channels 16, no
# quant convolutions); its latent scale and shift are applied outside the decode graph
AE16 = VaeConfig(z_channels=16, embed_dim=16, use_quant=False)


def resnet_block(b: Blocks, x: Tensor, c_out: int) -> Tensor:
    h = b.conv2d(im.unary_inplace(b.group_norm32(x), "SILU"), c_out, 3, 1, 1)
    h = b.conv2d(im.unary_inplace(b.group_norm32(h), "SILU"), c_out, 3, 1, 1)
    if x.ne[2] != c_out:
        x = b.conv2d(x, c_out, 1)
    return g.add(h, x)


def _to_rows(x: Tensor, w: int, h: int, c: int, n: int) -> Tensor:
    """[w, h, c, n] -> [c, h*w, n]: cont(permute(1, 2, 0, 3)), then reshape_3d."""
    return im.reshape(g.cont(g.permute(x, (1, 2, 0, 3))), (c, h * w, n))


def attn_block(b: Blocks, x: Tensor) -> Tensor:
    h_ = b.group_norm32(x)
    w, h, c, n = h_.ne
    q = _to_rows(b.conv2d(h_, c, 1), w, h, c, n)
    k = _to_rows(b.conv2d(h_, c, 1), w, h, c, n)
    v = _to_rows(b.conv2d(h_, c, 1), w, h, c, n)
    out = b.attention(q, k, v, 1, flash_attn=b.flash_attn)
    out = im.reshape(g.cont(g.permute(out, (1, 0, 2, 3))), (w, h, c, n))
    return g.add(b.conv2d(out, c, 1), x)


def decoder(b: Blocks, z: Tensor, cfg: VaeConfig = KL_F8) -> Tensor:
    block_in = cfg.ch * cfg.ch_mult[-1]
    h = b.conv2d(z, block_in, 3, 1, 1)
    h = resnet_block(b, h, block_in)
    h = attn_block(b, h)
    h = resnet_block(b, h, block_in)
    for i in reversed(range(len(cfg.ch_mult))):
        for _ in range(cfg.num_res_blocks + 1):
            h = resnet_block(b, h, cfg.ch * cfg.ch_mult[i])
        if i != 0:
            h = b.conv2d(im.upscale(h, 2), h.ne[2], 3, 1, 1)
    h = im.unary_inplace(b.group_norm32(h), "SILU")
    return b.conv2d(h, cfg.out_ch, 3, 1, 1)


def decode(b: Blocks, z: Tensor, cfg: VaeConfig = KL_F8) -> Tensor:
    """AutoEncoderKLModel::decode of a latent z [w, h, z_channels, N]."""
    if cfg.use_quant:
        z = b.conv2d(z, cfg.embed_dim, 1)
    return decoder(b, z, cfg)
