"""The KL-f8 VAE's encode graph (img2img's init image, inpainting, references), as stable-diffusion.cpp
builds it.

Sources (stable-diffusion.cpp 97d2990, src/model/vae/auto_encoder_kl.hpp): AutoEncoderKLModel::encode
(Encoder::forward, then quant_conv), Encoder (conv_in to ch; per level num_res_blocks ResnetBlocks and, but
on the last level, a DownSampleBlock; mid.block_1, mid.attn_1, mid.block_2; norm_out, SiLU in place, conv_out
to 2 * z_channels), src/model/common/block.hpp DownSampleBlock with vae_downsample (ggml_ext_pad by one on the
right and bottom, then a stride-2 3x3 convolution without padding). The ResnetBlock and AttnBlock are the
decoder's (runtime/sd/vae_decoder.py).
"""
from __future__ import annotations

from runtime.ggml import image_ops as im
from runtime.ggml.graph import Tensor
from runtime.sd.sd_blocks import Blocks
from runtime.sd.vae_decoder import KL_F8, VaeConfig, attn_block, resnet_block


def encoder(b: Blocks, x: Tensor, cfg: VaeConfig = KL_F8, double_z: bool = True) -> Tensor:
    h = b.conv2d(x, cfg.ch, 3, 1, 1)
    for i, mult in enumerate(cfg.ch_mult):
        for _ in range(cfg.num_res_blocks):
            h = resnet_block(b, h, cfg.ch * mult)
        if i != len(cfg.ch_mult) - 1:
            h = b.conv2d(im.pad_ext(h, [(0, 1), (0, 1)]), h.ne[2], 3, 2, 0)
    h = resnet_block(b, h, h.ne[2])
    h = attn_block(b, h)
    h = resnet_block(b, h, h.ne[2])
    h = im.unary_inplace(b.group_norm32(h), "SILU")
    return b.conv2d(h, cfg.z_channels * (2 if double_z else 1), 3, 1, 1)


def encode(b: Blocks, x: Tensor, cfg: VaeConfig = KL_F8) -> Tensor:
    """AutoEncoderKLModel::encode of an image x [W, H, 3, N] (already scaled to [-1, 1] on the host)."""
    z = encoder(b, x, cfg)
    if cfg.use_quant:
        z = b.conv2d(z, 2 * cfg.embed_dim, 1)
    return z
