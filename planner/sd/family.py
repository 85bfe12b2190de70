"""Which model a component is, as far as the compute corpus (planner/sd/sd_compute.py) knows models.

Recognised from tensor names and the byte ratio of two tensors of one dtype, the way
stable-diffusion.cpp tells versions apart (src/model_loader.cpp `get_sd_version`: SDXL by its
`label_emb` and 2048-wide context, SD 1.x by its 768-wide cross-attention context):
- "sd15": the SD 1.x UNet (12 input blocks, no label_emb, to_k / to_q of the first cross
  attention 768 / 320) and its CLIP-L text encoder (`cond_stage_model.transformer.`);
- "sdxl": the SDXL base UNet (label_emb, 10 transformer blocks at the innermost level) and its
  two text encoders (`conditioner.embedders.0/1.`);
- "kl-f8": the 4-channel KL-f8 VAE of SD 1.x / 2.x / XL (decoder conv_in 4 -> 512 channels);
  beside an SDXL UNet sd-cli decodes it with a graph of its own, "kl-f8-sdxl" (planner/sd/sizing.py);
- "flux": the FLUX.1 DiT (19 double and 38 single blocks, any weight type) and its text encoders
  (CLIP-L and T5-XXL as separate files).
Anything else is None: sd-fit then keeps seed 002's fixed compute reserves.
"""
from __future__ import annotations

from planner.sd.components import TENSOR_OVERHEAD_BYTES, Component
from planner.sd.roles import Kind

UNET = "model.diffusion_model."
SD15, SDXL, KL_F8, FLUX = "sd15", "sdxl", "kl-f8", "flux"


def _sizes(comp: Component) -> dict[str, int]:
    return {t.name: t.n_bytes - TENSOR_OVERHEAD_BYTES for t in comp.tensors}


def _ratio(sizes: dict[str, int], num: str, den: str) -> float | None:
    if num not in sizes or den not in sizes or not sizes[den]:
        return None
    return sizes[num] / sizes[den]


def diffusion_family(comp: Component) -> str | None:
    s = _sizes(comp)
    if f"{UNET}label_emb.0.0.weight" in s and f"{UNET}input_blocks.8.1.transformer_blocks.9.norm1.weight" in s \
            and f"{UNET}input_blocks.9.0.in_layers.0.weight" not in s:
        return SDXL
    if f"{UNET}double_blocks.18.img_attn.qkv.weight" in s and f"{UNET}double_blocks.19.img_attn.qkv.weight" not in s \
            and f"{UNET}single_blocks.37.linear1.weight" in s and f"{UNET}single_blocks.38.linear1.weight" not in s:
        return FLUX
    attn = f"{UNET}input_blocks.1.1.transformer_blocks.0.attn2"
    if f"{UNET}input_blocks.11.0.in_layers.0.weight" in s and f"{UNET}label_emb.0.0.weight" not in s \
            and _ratio(s, f"{attn}.to_k.weight", f"{attn}.to_q.weight") == 768 / 320:
        return SD15
    return None


def te_family(comp: Component) -> str | None:
    names = {t.name for t in comp.tensors}
    clip_l = "cond_stage_model.transformer.text_model.encoder.layers.11.mlp.fc2.weight"
    if clip_l in names and not any(n.startswith(("cond_stage_model.model.", "conditioner.")) for n in names):
        return SD15
    if "text_encoders.t5xxl.transformer.encoder.block.23.layer.1.DenseReluDense.wo.weight" in names \
            and "clip_l.text_model.encoder.layers.11.mlp.fc2.weight" in names:
        return FLUX
    if "conditioner.embedders.0.transformer.text_model.encoder.layers.11.mlp.fc2.weight" in names \
            and "conditioner.embedders.1.model.transformer.resblocks.31.mlp.c_proj.weight" in names:
        return SDXL
    return None


def vae_family(comp: Component) -> str | None:
    s = _sizes(comp)
    for prefix in ("first_stage_model.decoder.", "vae.decoder."):
        ratio = _ratio(s, f"{prefix}conv_in.weight", f"{prefix}mid.block_1.conv1.weight")
        if ratio == 4 / 512 and f"{prefix}up.3.block.2.conv2.weight" in s:
            return KL_F8
    return None


def family(comp: Component) -> str | None:
    return {Kind.DIFFUSION: diffusion_family, Kind.TE: te_family, Kind.VAE: vae_family}[comp.kind](comp)
