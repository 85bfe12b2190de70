"""Which model a component is, as far as the compute corpus (planner/sd/sd_compute.py) knows models.

Recognised from tensor names and the byte ratio of two tensors of one dtype, the way
stable-diffusion.cpp tells versions apart (src/model_loader.cpp `get_sd_version`: SDXL by its
`label_emb` and 2048-wide context, SD 1.x by its 768-wide cross-attention context):
- "sd15": the SD 1.x UNet (12 input blocks, no label_emb, to_k / to_q of the first cross
  attention 768 / 320) and its CLIP-L text encoder (`cond_stage_model.transformer.`);
- "sdxl": the SDXL base UNet (label_emb, 10 transformer blocks at the innermost level) and its
  two text encoders (`conditioner.embedders.0/1.`);
- "sd2": the SD 2.x UNet (the SD 1.x layout with linear proj_in / proj_out, to_k / to_q of the first
  cross attention 1024 / 320, 4 input channels: not the inpainting model) and its OpenCLIP ViT-H/14 text
  encoder under its original names (24 blocks under `cond_stage_model.model.`; sd-cli tells SD 2.x by
  that encoder's 1024-wide token embedding);
- "kl-f8": the 4-channel KL-f8 VAE of SD 1.x / 2.x / XL (decoder conv_in 4 -> 512 channels);
  beside an SDXL UNet sd-cli decodes it with a graph of its own, "kl-f8-sdxl" (planner/sd/sizing.py);
- "flux": the FLUX.1 DiT (19 double and 38 single blocks, any weight type) and its text encoders
  (CLIP-L and T5-XXL as separate files);
- "sd3": SD3.5 medium's MMDiT-X (24 joint blocks, a second self-attention in x blocks 0-12) and
  its three text encoders (CLIP-L, CLIP-G and T5-XXL's encoder, safetensors or llama.cpp-named GGUF);
- "sd3-large": SD3.5 large's MMDiT (38 joint blocks of 2432 = 64 x 38: the fused qkv 3 x 2432 / 4096 the
  context embedder's size, qk RMS norm, no second self-attention); its text encoders and VAE are medium's
  ("sd3", "ae16");
- "zimage": Z-Image-Turbo's DiT (30 layers after the caption embedder) and its Qwen3-4B text
  encoder (36 layers, FFN 9728 to 4096 query rows: 2.375, safetensors or GGUF names);
- "ae16": the 16-channel KL-f8 autoencoder of SD3, FLUX.1 and Z-Image (decoder conv_in 16 -> 512
  channels; sd-cli builds one decode graph for all three, only the latent scale and shift differ);
- "wan": the Wan2.1-T2V-1.3B DiT (30 blocks with a normed cross attention, FFN 8960 wide to
  1536, no image embedding or VACE blocks; any weight type); "wan-14b": Wan2.1-T2V-14B's (40 such
  blocks, FFN 13824 to 5120; sd-cli names its runner Wan2.x-T2V-14B) and its UMT5-XXL text encoder (24
  blocks, a relative-position bias in every block — T5 v1.1 has one in block 0 — llama.cpp's or
  the original names); "wan-vae": the Wan 2.1 causal 3-D VAE (16 latent channels into a
  384-wide decoder, 15 up-sampling stages);
- "wan22": Wan2.2-TI2V-5B's DiT (the 1.3B's 30-block layout at FFN 14336 to 3072 with a 48-channel
  patch embedding: sd.cpp's model_loader.cpp tells VERSION_WAN2_2_TI2V by those channels) with the same
  UMT5-XXL ("wan"); "wan22-vae": the Wan2.2 VAE (48 latent channels into a 1024-wide decoder, four
  Up_ResidualBlocks of residual blocks under `upsamples.{i}.upsamples.{j}`);
- "ltx2": an LTX-2 audio-video DiT, told the way sd.cpp tells it (`get_sd_version`: the AdaLN-single
  timestep embedder's bias makes a checkpoint VERSION_LTXAV), which also decides the VAE decode's retry
  order (planner/sd/vae_retry.py); "ltx2-vae": LTX-2's causal video VAE (src/model/vae/ltx_vae.hpp:
  the latent `per_channel_statistics`, a timestep-conditioned decoder from 128 latent channels into
  conv_in 1024 wide, 4 x 5 residual blocks down to 128 wide). The DiT has no graph here (fixed reserves).
Anything else is None: sd-fit then keeps seed 002's fixed compute reserves.
"""
from __future__ import annotations

from planner.sd.components import TENSOR_OVERHEAD_BYTES, Component
from planner.sd.roles import Kind

UNET = "model.diffusion_model."
SD15, SDXL, KL_F8, FLUX = "sd15", "sdxl", "kl-f8", "flux"
SD3, ZIMAGE = "sd3", "zimage"
SD3_LARGE = "sd3-large"
SD2 = "sd2"
OPEN_CLIP_H = "cond_stage_model.model.transformer.resblocks."   # SD 2.x's text encoder, original names
AE16 = "ae16"   # the 16-channel autoencoder (SD3's, FLUX.1's ae.safetensors, Z-Image's; the KL-f8 layout)
WAN, WAN_VAE = "wan", "wan-vae"
WAN_14B = "wan-14b"
WAN22, WAN22_VAE = "wan22", "wan22-vae"
LTX2, LTX2_VAE = "ltx2", "ltx2-vae"
LTX_FAMILIES = frozenset({LTX2, LTX2_VAE})   # video models without figures: fixed reserves, any frame count
LTXAV_PROBE = "adaln_single.emb.timestep_embedder.linear_1.bias"   # src/model_loader.cpp get_sd_version
T5XXL = "text_encoders.t5xxl.transformer."


def _sizes(comp: Component) -> dict[str, int]:
    return {t.name: t.n_bytes - TENSOR_OVERHEAD_BYTES for t in comp.tensors}


def _ratio(sizes: dict[str, int], num: str, den: str) -> float | None:
    if num not in sizes or den not in sizes or not sizes[den]:
        return None
    return sizes[num] / sizes[den]


# DiTs told apart by the tensors they have and the next ones they lack: (family, present, absent)
DIT_LAYOUTS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (SD3, ("joint_blocks.23.x_block.attn.qkv.weight", "joint_blocks.12.x_block.attn2.qkv.weight"),
     ("joint_blocks.24.x_block.attn.qkv.weight", "joint_blocks.13.x_block.attn2.qkv.weight")),
    (ZIMAGE, ("cap_embedder.1.weight", "layers.29.attention.qkv.weight"), ("layers.30.attention.qkv.weight",)),
)


def diffusion_family(comp: Component) -> str | None:
    s = _sizes(comp)
    if f"{UNET}label_emb.0.0.weight" in s and f"{UNET}input_blocks.8.1.transformer_blocks.9.norm1.weight" in s \
            and f"{UNET}input_blocks.9.0.in_layers.0.weight" not in s:
        return SDXL
    if f"{UNET}double_blocks.18.img_attn.qkv.weight" in s and f"{UNET}double_blocks.19.img_attn.qkv.weight" not in s \
            and f"{UNET}single_blocks.37.linear1.weight" in s and f"{UNET}single_blocks.38.linear1.weight" not in s:
        return FLUX
    for name, present, absent in DIT_LAYOUTS:
        if all(f"{UNET}{n}" in s for n in present) and not any(f"{UNET}{n}" in s for n in absent):
            return name
    for check, name in _DIT_CHECKS:
        if check(s):
            return name
    if f"{UNET}{LTXAV_PROBE}" in s:
        return LTX2
    attn = f"{UNET}input_blocks.1.1.transformer_blocks.0.attn2"
    if f"{UNET}input_blocks.11.0.in_layers.0.weight" in s and f"{UNET}label_emb.0.0.weight" not in s \
            and _ratio(s, f"{attn}.to_k.weight", f"{attn}.to_q.weight") == 768 / 320:
        return SD15
    if _is_sd2_unet(comp, s):
        return SD2
    return None


def _is_sd2_unet(comp: Component, s: dict[str, int]) -> bool:
    """SD 2.x's UNet: the SD 1.x levels without label_emb, a 1024-wide cross-attention context, linear
    projections (2-D proj_in: sd-cli builds 1x1 convolutions for 4-D ones) and 4 input channels."""
    attn = f"{UNET}input_blocks.1.1.transformer_blocks.0.attn2"
    proj_in = f"{UNET}input_blocks.1.1.proj_in.weight"
    if f"{UNET}input_blocks.11.0.in_layers.0.weight" not in s or f"{UNET}label_emb.0.0.weight" in s:
        return False
    if any(t.name == proj_in and t.n_dims != 2 for t in comp.tensors) or proj_in not in s:
        return False
    return _ratio(s, f"{attn}.to_k.weight", f"{attn}.to_q.weight") == 1024 / 320 \
        and _ratio(s, f"{UNET}input_blocks.0.0.weight", f"{UNET}out.2.weight") == 1


def _is_sd35_large(s: dict[str, int]) -> bool:
    """38 joint blocks with qk norm and no attn2, the fused qkv 3 x 2432 rows of 2432 to the context
    embedder's 2432 x 4096 (the same dtype: both F16 as released, or both quantized alike)."""
    last, block0 = f"{UNET}joint_blocks.37.x_block.", f"{UNET}joint_blocks.0.x_block."
    if f"{last}attn.qkv.weight" not in s or f"{UNET}joint_blocks.38.x_block.attn.qkv.weight" in s:
        return False
    if f"{block0}attn.ln_q.weight" not in s or f"{block0}attn2.qkv.weight" in s:
        return False
    return _ratio(s, f"{last}attn.qkv.weight", f"{UNET}context_embedder.weight") == 3 * 2432 / 4096


# a Wan T2V DiT's layout: (blocks, FFN width, hidden width)
WAN_1_3B_LAYOUT = (30, 8960, 1536)
WAN_14B_LAYOUT = (40, 13824, 5120)


def _is_wan_dit(s: dict[str, int], layout: tuple[int, int, int] = WAN_1_3B_LAYOUT) -> bool:
    blocks, ffn, dim = layout
    last, extra = f"{UNET}blocks.{blocks - 1}.", f"{UNET}blocks.{blocks}.cross_attn.norm_k.weight"
    if f"{last}cross_attn.norm_k.weight" not in s or extra in s:
        return False
    if any(n.startswith((f"{UNET}img_emb.", f"{UNET}vace_")) for n in s):
        return False
    return _ratio(s, f"{last}ffn.0.weight", f"{last}self_attn.q.weight") == ffn / dim


def _is_wan_14b(s: dict[str, int]) -> bool:
    return _is_wan_dit(s, WAN_14B_LAYOUT)


WAN22_5B_LAYOUT = (30, 14336, 3072)


def _is_wan22_ti2v(s: dict[str, int]) -> bool:
    """Wan2.2-TI2V-5B: the T2V layout at its widths, 48 latent channels out of each 1x2x2 patch (the head's
    bias to the patch embedding's, both biases of one type)."""
    return _is_wan_dit(s, WAN22_5B_LAYOUT) \
        and _ratio(s, f"{UNET}head.head.bias", f"{UNET}patch_embedding.bias") == 48 * 4 / 3072


# DiTs told apart by a check of their own
_DIT_CHECKS = ((_is_sd35_large, SD3_LARGE), (_is_wan_dit, WAN), (_is_wan_14b, WAN_14B), (_is_wan22_ti2v, WAN22))


def _is_umt5_xxl(names: set[str]) -> bool:
    """24 blocks with a relative-position bias in block 1 (UMT5's per-block bias), either naming."""
    for block, bias, last in (("enc.blk.", "attn_rel_b.weight", "ffn_down.weight"),
                              ("encoder.block.", "layer.0.SelfAttention.relative_attention_bias.weight",
                               "layer.1.DenseReluDense.wo.weight")):
        if f"{T5XXL}{block}1.{bias}" in names and f"{T5XXL}{block}23.{last}" in names \
                and f"{T5XXL}{block}24.{last}" not in names:
            return True
    return False


def te_family(comp: Component) -> str | None:
    names = {t.name for t in comp.tensors}
    if _is_umt5_xxl(names) and not any(n.startswith(("clip_l.", "clip_g.")) for n in names):
        return WAN
    clip_l = "cond_stage_model.transformer.text_model.encoder.layers.11.mlp.fc2.weight"
    if clip_l in names and not any(n.startswith(("cond_stage_model.model.", "conditioner.")) for n in names):
        return SD15
    if f"{OPEN_CLIP_H}23.mlp.c_proj.weight" in names and f"{OPEN_CLIP_H}24.mlp.c_proj.weight" not in names \
            and not any(n.startswith("conditioner.") for n in names):
        return SD2
    if _sd3_te(names):
        return SD3
    if _qwen3_4b(comp):
        return ZIMAGE
    if "text_encoders.t5xxl.transformer.encoder.block.23.layer.1.DenseReluDense.wo.weight" in names \
            and "clip_l.text_model.encoder.layers.11.mlp.fc2.weight" in names:
        return FLUX
    if "conditioner.embedders.0.transformer.text_model.encoder.layers.11.mlp.fc2.weight" in names \
            and "conditioner.embedders.1.model.transformer.resblocks.31.mlp.c_proj.weight" in names:
        return SDXL
    return None


def _t5xxl(names: set[str]) -> bool:
    """T5-XXL's 24-block encoder, Hugging Face or llama.cpp (GGUF) names."""
    t5 = T5XXL
    return (f"{t5}encoder.block.23.layer.1.DenseReluDense.wo.weight" in names
            and f"{t5}encoder.block.24.layer.1.DenseReluDense.wo.weight" not in names) \
        or (f"{t5}enc.blk.23.ffn_down.weight" in names and f"{t5}enc.blk.24.ffn_down.weight" not in names)


def _sd3_te(names: set[str]) -> bool:
    return _t5xxl(names) and "clip_l.text_model.encoder.layers.11.mlp.fc2.weight" in names \
        and "clip_g.text_model.encoder.layers.31.mlp.fc2.weight" in names


def _qwen3_4b(comp: Component) -> bool:
    """Qwen3-4B as the LLM text encoder: 36 layers, down projection 2.375 x the query projection."""
    s = _sizes(comp)
    llm = "text_encoders.llm."
    for last, past, down, q in (("blk.35.ffn_down.weight", "blk.36.ffn_down.weight", "blk.0.ffn_down.weight",
                                 "blk.0.attn_q.weight"),
                                ("model.layers.35.mlp.down_proj.weight", "model.layers.36.mlp.down_proj.weight",
                                 "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight")):
        if f"{llm}{last}" in s and f"{llm}{past}" not in s and _ratio(s, f"{llm}{down}", f"{llm}{q}") == 9728 / 4096:
            return True
    return False


def vae_family(comp: Component) -> str | None:
    s = _sizes(comp)
    for prefix in ("first_stage_model.decoder.", "vae.decoder."):
        ratio = _ratio(s, f"{prefix}conv_in.weight", f"{prefix}mid.block_1.conv1.weight")
        if ratio == 4 / 512 and f"{prefix}up.3.block.2.conv2.weight" in s:
            return KL_F8
        if ratio == 16 / 512 and f"{prefix}up.3.block.2.conv2.weight" in s:
            return AE16
        wan = _ratio(s, f"{prefix}conv1.weight", f"{prefix}middle.0.residual.2.weight")
        if wan == 16 / 384 and f"{prefix}upsamples.14.residual.6.weight" in s \
                and f"{prefix}upsamples.15.residual.6.weight" not in s:
            return WAN_VAE
        if wan == 48 / 1024 and f"{prefix}upsamples.3.upsamples.2.residual.6.weight" in s \
                and f"{prefix}upsamples.4.upsamples.0.residual.6.weight" not in s:
            return WAN22_VAE
        if _is_ltx2_vae(s, prefix):
            return LTX2_VAE
    return None


def _is_ltx2_vae(s: dict[str, int], prefix: str) -> bool:
    """LTX-2's decoder: conv_in 128 -> 1024 channels, 4 x 5 residual blocks down to 128 wide (7 up
    blocks), timestep-conditioned, beside the latent statistics (the layout runtime/sd sizes)."""
    last = f"{prefix}up_blocks.6.res_blocks.4.conv1.conv.weight"
    if f"{prefix.removesuffix('decoder.')}per_channel_statistics.mean-of-means" not in s \
            or f"{prefix}timestep_scale_multiplier" not in s:
        return False
    if f"{prefix}up_blocks.7.conv.conv.weight" in s or f"{prefix}up_blocks.6.res_blocks.5.conv1.conv.weight" in s:
        return False
    return _ratio(s, f"{prefix}conv_in.conv.weight", last) == 1024 * 128 / (128 * 128)


def family(comp: Component) -> str | None:
    return {Kind.DIFFUSION: diffusion_family, Kind.TE: te_family, Kind.VAE: vae_family}[comp.kind](comp)
