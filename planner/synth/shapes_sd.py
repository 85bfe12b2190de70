"""Shape-faithful stable-diffusion checkpoints: every tensor of the published single-file
checkpoints under its original name and shape (PyTorch order: out, in, kh, kw), sparse data.

SD 1.5 is the layout of `v1-5-pruned-emaonly` (CompVis LDM names: `model.diffusion_model.*`
UNet, `cond_stage_model.transformer.text_model.*` CLIP ViT-L/14 text encoder,
`first_stage_model.*` KL-f8 VAE); SDXL is `sd_xl_base_1.0` (the same VAE, CLIP-L under
`conditioner.embedders.0.transformer.text_model.*`, OpenCLIP ViT-bigG under
`conditioner.embedders.1.model.*`, a three-level UNet with 2 and 10 transformer blocks and the
`label_emb` vector conditioning); SD 2.1 is `v2-1_768-ema-pruned` (the SD 1.x UNet with a 1024-wide
context and linear proj_in / proj_out, the OpenCLIP ViT-H/14 text tower under `cond_stage_model.model.*`, the
same VAE; released as F32). The hyperparameters are those of the released configs
(v1-inference.yaml, sd_xl_base.yaml, v2-inference-v.yaml). The training-only buffers sd.cpp skips (position_ids,
logit_scale, the scheduler arrays) are left out. The fp16 releases store every tensor as F16.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.synth.safetensors_factory import write_safetensors

Shape = tuple[int, ...]
Tensors = dict[str, Shape]

TIME_EMBED = 1280          # 4 x model_channels(320), both families
CLIP_L = 768               # CLIP ViT-L/14 text width
CLIP_G = 1280              # OpenCLIP ViT-bigG/14 text width
CLIP_H = 1024              # OpenCLIP ViT-H/14 text width (SD 2.x)
CLIP_H_LAYERS = 24
CLIP_VOCAB = 49408
CLIP_CONTEXT = 77


def _norm(out: Tensors, name: str, c: int) -> None:
    out[f"{name}.weight"] = (c,)
    out[f"{name}.bias"] = (c,)


def _linear(out: Tensors, name: str, n_out: int, n_in: int, bias: bool = True) -> None:
    out[f"{name}.weight"] = (n_out, n_in)
    if bias:
        out[f"{name}.bias"] = (n_out,)


def _conv(out: Tensors, name: str, n_out: int, n_in: int, k: int) -> None:
    out[f"{name}.weight"] = (n_out, n_in, k, k)
    out[f"{name}.bias"] = (n_out,)


# ---- UNet (ldm openaimodel.py names)


def _res_block(out: Tensors, p: str, c_in: int, c_out: int) -> None:
    _norm(out, f"{p}.in_layers.0", c_in)
    _conv(out, f"{p}.in_layers.2", c_out, c_in, 3)
    _linear(out, f"{p}.emb_layers.1", c_out, TIME_EMBED)
    _norm(out, f"{p}.out_layers.0", c_out)
    _conv(out, f"{p}.out_layers.3", c_out, c_out, 3)
    if c_in != c_out:
        _conv(out, f"{p}.skip_connection", c_out, c_in, 1)


def _spatial_transformer(out: Tensors, p: str, c: int, context: int, depth: int, linear_proj: bool) -> None:
    _norm(out, f"{p}.norm", c)
    if linear_proj:
        _linear(out, f"{p}.proj_in", c, c)
    else:
        _conv(out, f"{p}.proj_in", c, c, 1)
    for d in range(depth):
        b = f"{p}.transformer_blocks.{d}"
        for attn, kv in (("attn1", c), ("attn2", context)):
            _linear(out, f"{b}.{attn}.to_q", c, c, bias=False)
            _linear(out, f"{b}.{attn}.to_k", c, kv, bias=False)
            _linear(out, f"{b}.{attn}.to_v", c, kv, bias=False)
            _linear(out, f"{b}.{attn}.to_out.0", c, c)
        _linear(out, f"{b}.ff.net.0.proj", 8 * c, c)   # GEGLU: value and gate, 4c each
        _linear(out, f"{b}.ff.net.2", c, 4 * c)
        for n in ("norm1", "norm2", "norm3"):
            _norm(out, f"{b}.{n}", c)
    if linear_proj:
        _linear(out, f"{p}.proj_out", c, c)
    else:
        _conv(out, f"{p}.proj_out", c, c, 1)


@dataclass(frozen=True)
class UnetConfig:
    channel_mult: tuple[int, ...]
    depth: tuple[int, ...]          # transformer blocks per level (0: no attention there)
    context: int
    linear_proj: bool
    adm_in: int = 0                 # label_emb input width (SDXL's vector conditioning)
    model_channels: int = 320
    num_res_blocks: int = 2


SD15_UNET = UnetConfig(channel_mult=(1, 2, 4, 4), depth=(1, 1, 1, 0), context=CLIP_L, linear_proj=False)
SD2_UNET = UnetConfig(channel_mult=(1, 2, 4, 4), depth=(1, 1, 1, 0), context=CLIP_H, linear_proj=True)
SDXL_UNET = UnetConfig(channel_mult=(1, 2, 4), depth=(0, 2, 10), context=CLIP_L + CLIP_G, linear_proj=True,
                       adm_in=2816)


def unet_tensors(cfg: UnetConfig, prefix: str = "model.diffusion_model.") -> Tensors:
    out: Tensors = {}
    mc = cfg.model_channels
    _linear(out, f"{prefix}time_embed.0", TIME_EMBED, mc)
    _linear(out, f"{prefix}time_embed.2", TIME_EMBED, TIME_EMBED)
    if cfg.adm_in:
        _linear(out, f"{prefix}label_emb.0.0", TIME_EMBED, cfg.adm_in)
        _linear(out, f"{prefix}label_emb.0.2", TIME_EMBED, TIME_EMBED)
    _conv(out, f"{prefix}input_blocks.0.0", mc, 4, 3)
    skips = [mc]
    ch = mc
    block = 1
    last_level = len(cfg.channel_mult) - 1
    for level, mult in enumerate(cfg.channel_mult):
        for _ in range(cfg.num_res_blocks):
            p = f"{prefix}input_blocks.{block}"
            _res_block(out, f"{p}.0", ch, mult * mc)
            ch = mult * mc
            if cfg.depth[level]:
                _spatial_transformer(out, f"{p}.1", ch, cfg.context, cfg.depth[level], cfg.linear_proj)
            skips.append(ch)
            block += 1
        if level != last_level:
            _conv(out, f"{prefix}input_blocks.{block}.0.op", ch, ch, 3)
            skips.append(ch)
            block += 1
    mid_depth = cfg.depth[-1] if cfg.depth[-1] else 1
    _res_block(out, f"{prefix}middle_block.0", ch, ch)
    _spatial_transformer(out, f"{prefix}middle_block.1", ch, cfg.context, mid_depth, cfg.linear_proj)
    _res_block(out, f"{prefix}middle_block.2", ch, ch)
    block = 0
    for level in reversed(range(len(cfg.channel_mult))):
        c_out = cfg.channel_mult[level] * mc
        for i in range(cfg.num_res_blocks + 1):
            p = f"{prefix}output_blocks.{block}"
            _res_block(out, f"{p}.0", ch + skips.pop(), c_out)
            ch = c_out
            sub = 1
            if cfg.depth[level]:
                _spatial_transformer(out, f"{p}.1", ch, cfg.context, cfg.depth[level], cfg.linear_proj)
                sub = 2
            if level and i == cfg.num_res_blocks:
                _conv(out, f"{p}.{sub}.conv", ch, ch, 3)
            block += 1
    _norm(out, f"{prefix}out.0", mc)
    _conv(out, f"{prefix}out.2", 4, mc, 3)
    return out


# ---- text encoders


def clip_text_tensors(prefix: str, width: int, layers: int) -> Tensors:
    """Hugging Face CLIPTextModel names (SD 1.x's and SDXL's CLIP-L)."""
    out: Tensors = {}
    out[f"{prefix}embeddings.token_embedding.weight"] = (CLIP_VOCAB, width)
    out[f"{prefix}embeddings.position_embedding.weight"] = (CLIP_CONTEXT, width)
    for i in range(layers):
        p = f"{prefix}encoder.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _linear(out, f"{p}.self_attn.{proj}", width, width)
        _norm(out, f"{p}.layer_norm1", width)
        _linear(out, f"{p}.mlp.fc1", 4 * width, width)
        _linear(out, f"{p}.mlp.fc2", width, 4 * width)
        _norm(out, f"{p}.layer_norm2", width)
    _norm(out, f"{prefix}final_layer_norm", width)
    return out


def open_clip_text_tensors(prefix: str, width: int, layers: int) -> Tensors:
    """OpenCLIP names (SDXL's ViT-bigG text tower, `conditioner.embedders.1.model.`)."""
    out: Tensors = {}
    out[f"{prefix}token_embedding.weight"] = (CLIP_VOCAB, width)
    out[f"{prefix}positional_embedding"] = (CLIP_CONTEXT, width)
    for i in range(layers):
        p = f"{prefix}transformer.resblocks.{i}"
        out[f"{p}.attn.in_proj_weight"] = (3 * width, width)
        out[f"{p}.attn.in_proj_bias"] = (3 * width,)
        _linear(out, f"{p}.attn.out_proj", width, width)
        _norm(out, f"{p}.ln_1", width)
        _linear(out, f"{p}.mlp.c_fc", 4 * width, width)
        _linear(out, f"{p}.mlp.c_proj", width, 4 * width)
        _norm(out, f"{p}.ln_2", width)
    _norm(out, f"{prefix}ln_final", width)
    out[f"{prefix}text_projection"] = (width, width)
    return out


# ---- the KL-f8 VAE (ldm autoencoder names)

VAE_CH = 128
VAE_MULT = (1, 2, 4, 4)
VAE_RES_BLOCKS = 2
Z_CHANNELS = 4


def _vae_res(out: Tensors, p: str, c_in: int, c_out: int) -> None:
    _norm(out, f"{p}.norm1", c_in)
    _conv(out, f"{p}.conv1", c_out, c_in, 3)
    _norm(out, f"{p}.norm2", c_out)
    _conv(out, f"{p}.conv2", c_out, c_out, 3)
    if c_in != c_out:
        _conv(out, f"{p}.nin_shortcut", c_out, c_in, 1)


def _vae_mid(out: Tensors, p: str, c: int) -> None:
    _vae_res(out, f"{p}.mid.block_1", c, c)
    _norm(out, f"{p}.mid.attn_1.norm", c)
    for n in ("q", "k", "v", "proj_out"):
        _conv(out, f"{p}.mid.attn_1.{n}", c, c, 1)
    _vae_res(out, f"{p}.mid.block_2", c, c)


def vae_tensors(prefix: str = "first_stage_model.") -> Tensors:
    out: Tensors = {}
    enc, dec = f"{prefix}encoder", f"{prefix}decoder"
    _conv(out, f"{enc}.conv_in", VAE_CH, 3, 3)
    ch = VAE_CH
    for level, mult in enumerate(VAE_MULT):
        for b in range(VAE_RES_BLOCKS):
            _vae_res(out, f"{enc}.down.{level}.block.{b}", ch, mult * VAE_CH)
            ch = mult * VAE_CH
        if level != len(VAE_MULT) - 1:
            _conv(out, f"{enc}.down.{level}.downsample.conv", ch, ch, 3)
    _vae_mid(out, enc, ch)
    _norm(out, f"{enc}.norm_out", ch)
    _conv(out, f"{enc}.conv_out", 2 * Z_CHANNELS, ch, 3)
    _conv(out, f"{dec}.conv_in", ch, Z_CHANNELS, 3)
    _vae_mid(out, dec, ch)
    for level in reversed(range(len(VAE_MULT))):
        c_out = VAE_MULT[level] * VAE_CH
        for b in range(VAE_RES_BLOCKS + 1):
            _vae_res(out, f"{dec}.up.{level}.block.{b}", ch, c_out)
            ch = c_out
        if level:
            _conv(out, f"{dec}.up.{level}.upsample.conv", ch, ch, 3)
    _norm(out, f"{dec}.norm_out", ch)
    _conv(out, f"{dec}.conv_out", 3, ch, 3)
    _conv(out, f"{prefix}quant_conv", 2 * Z_CHANNELS, 2 * Z_CHANNELS, 1)
    _conv(out, f"{prefix}post_quant_conv", Z_CHANNELS, Z_CHANNELS, 1)
    return out


# ---- whole checkpoints


def sd15_tensors() -> Tensors:
    out = unet_tensors(SD15_UNET)
    out.update(clip_text_tensors("cond_stage_model.transformer.text_model.", CLIP_L, 12))
    out.update(vae_tensors())
    return out


def sdxl_tensors() -> Tensors:
    out = unet_tensors(SDXL_UNET)
    out.update(clip_text_tensors("conditioner.embedders.0.transformer.text_model.", CLIP_L, 12))
    out.update(open_clip_text_tensors("conditioner.embedders.1.model.", CLIP_G, 32))
    out.update(vae_tensors())
    return out


def sd2_tensors() -> Tensors:
    """SD 2.1 (768-v): the whole OpenCLIP-H text tower is stored (24 blocks, text_projection), although
    SD 2.x reads the penultimate block's output."""
    out = unet_tensors(SD2_UNET)
    out.update(open_clip_text_tensors("cond_stage_model.model.", CLIP_H, CLIP_H_LAYERS))
    out.update(vae_tensors())
    return out


CHECKPOINTS = {"sd15": sd15_tensors, "sdxl": sdxl_tensors, "sd2": sd2_tensors}
# the type a released checkpoint stores every tensor in, where it is not F16 (v2-1_768-ema-pruned: F32)
RELEASED_DTYPE = {"sd2": "F32"}


def write_checkpoint(family: str, path: Path, dtype: str | None = None) -> Path:
    """One of CHECKPOINTS as a sparse single-file safetensors checkpoint, every tensor `dtype` (default: the
    released file's, RELEASED_DTYPE or F16)."""
    dtype = dtype or RELEASED_DTYPE.get(family, "F16")
    tensors = CHECKPOINTS[family]()
    return write_safetensors(path, {name: (dtype, shape) for name, shape in tensors.items()})


# ---- FLUX.1 [dev] as Black Forest Labs and the Comfy-Org text encoders distribute it: the DiT
# (flux1-dev.safetensors, BF16, names without a prefix: sd-cli's --diffusion-model adds
# `model.diffusion_model.`), T5-XXL's encoder (t5xxl_fp16.safetensors), CLIP-L's text model
# (clip_l.safetensors) and the 16-channel autoencoder (ae.safetensors). Hyperparameters from the
# released model: hidden 3072, 24 heads of 128, MLP ratio 4, 19 double and 38 single blocks,
# 64 input channels (2x2 patches of 16 latent channels), 4096-wide T5 context, 768-wide CLIP
# pooled vector, guidance embedding.

FLUX_HIDDEN = 3072
FLUX_HEAD = 128
FLUX_MLP = 4 * FLUX_HIDDEN
T5_WIDTH, T5_FF, T5_LAYERS, T5_VOCAB, T5_BUCKETS, T5_HEADS = 4096, 10240, 24, 32128, 32, 64


def _flux_embedder(out: Tensors, name: str, n_in: int) -> None:
    _linear(out, f"{name}.in_layer", FLUX_HIDDEN, n_in)
    _linear(out, f"{name}.out_layer", FLUX_HIDDEN, FLUX_HIDDEN)


def flux_tensors(double: int = 19, single: int = 38, guidance: bool = True) -> Tensors:
    out: Tensors = {}
    h = FLUX_HIDDEN
    _linear(out, "img_in", h, 64)
    _flux_embedder(out, "time_in", 256)
    _flux_embedder(out, "vector_in", CLIP_L)
    if guidance:
        _flux_embedder(out, "guidance_in", 256)
    _linear(out, "txt_in", h, T5_WIDTH)
    for i in range(double):
        for s in ("img", "txt"):
            p = f"double_blocks.{i}.{s}"
            _linear(out, f"{p}_mod.lin", 6 * h, h)
            _linear(out, f"{p}_attn.qkv", 3 * h, h)
            out[f"{p}_attn.norm.query_norm.scale"] = (FLUX_HEAD,)
            out[f"{p}_attn.norm.key_norm.scale"] = (FLUX_HEAD,)
            _linear(out, f"{p}_attn.proj", h, h)
            _linear(out, f"{p}_mlp.0", FLUX_MLP, h)
            _linear(out, f"{p}_mlp.2", h, FLUX_MLP)
    for i in range(single):
        p = f"single_blocks.{i}"
        _linear(out, f"{p}.linear1", 3 * h + FLUX_MLP, h)
        _linear(out, f"{p}.linear2", h, h + FLUX_MLP)
        out[f"{p}.norm.query_norm.scale"] = (FLUX_HEAD,)
        out[f"{p}.norm.key_norm.scale"] = (FLUX_HEAD,)
        _linear(out, f"{p}.modulation.lin", 3 * h, h)
    _linear(out, "final_layer.linear", 64, h)
    _linear(out, "final_layer.adaLN_modulation.1", 2 * h, h)
    return out


def t5xxl_tensors() -> Tensors:
    """T5 v1.1 XXL's encoder, Hugging Face T5EncoderModel names."""
    out: Tensors = {"shared.weight": (T5_VOCAB, T5_WIDTH)}
    for i in range(T5_LAYERS):
        p = f"encoder.block.{i}.layer"
        for proj in ("q", "k", "v", "o"):
            out[f"{p}.0.SelfAttention.{proj}.weight"] = (T5_WIDTH, T5_WIDTH)
        if i == 0:
            out[f"{p}.0.SelfAttention.relative_attention_bias.weight"] = (T5_BUCKETS, T5_HEADS)
        out[f"{p}.0.layer_norm.weight"] = (T5_WIDTH,)
        out[f"{p}.1.DenseReluDense.wi_0.weight"] = (T5_FF, T5_WIDTH)
        out[f"{p}.1.DenseReluDense.wi_1.weight"] = (T5_FF, T5_WIDTH)
        out[f"{p}.1.DenseReluDense.wo.weight"] = (T5_WIDTH, T5_FF)
        out[f"{p}.1.layer_norm.weight"] = (T5_WIDTH,)
    out["encoder.final_layer_norm.weight"] = (T5_WIDTH,)
    return out


def clip_l_tensors() -> Tensors:
    """A standalone CLIP-L text model (clip_l.safetensors: Hugging Face names and its projection)."""
    out = clip_text_tensors("text_model.", CLIP_L, 12)
    out["text_projection.weight"] = (CLIP_L, CLIP_L)
    return out


def ae16_tensors() -> Tensors:
    """FLUX.1's autoencoder (ae.safetensors): the KL-f8 layout with 16 latent channels and no
    quant_conv / post_quant_conv."""
    out = {n: s for n, s in vae_tensors("").items() if "quant_conv" not in n}
    out["encoder.conv_out.weight"] = (32, 512, 3, 3)
    out["encoder.conv_out.bias"] = (32,)
    out["decoder.conv_in.weight"] = (512, 16, 3, 3)
    return out


# sd-cli's file flag -> (tensors, dtype as distributed)
FLUX_FILES = {
    "--diffusion-model": (flux_tensors, "BF16"),
    "--t5xxl": (t5xxl_tensors, "F16"),
    "--clip_l": (clip_l_tensors, "F16"),
    "--vae": (ae16_tensors, "F32"),
}


def write_flux(directory: Path) -> dict[str, Path]:
    """FLUX.1 [dev]'s four files in `directory`, by the sd-cli flag that loads each."""
    out = {}
    for flag, (make, dtype) in FLUX_FILES.items():
        path = directory / f"flux-{flag.strip('-')}.safetensors"
        out[flag] = write_safetensors(path, {name: (dtype, shape) for name, shape in make().items()})
    return out


def write_flux_gguf(path: Path, qtype: str = "Q8_0") -> Path:
    """FLUX.1 [dev]'s DiT as the quantized GGUF files people download (flux1-dev-Q8_0.gguf,
    -Q4_0.gguf): every matrix in `qtype`, 1-D tensors (biases, norm scales) F32; names as in the
    safetensors file, no prefix; general.architecture "flux"."""
    from planner.synth.gguf_factory import Q, write_model

    q = Q.__members__[qtype]
    tensors = [(name, Q.F32 if len(shape) == 1 else q, tuple(reversed(shape)))
               for name, shape in flux_tensors().items()]
    return write_model(path, "flux", {}, tensors)[0]
