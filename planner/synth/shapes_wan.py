"""Shape-faithful Wan 2.1 T2V 1.3B files as people download them for stable-diffusion.cpp
(docs/wan.md at the pin): every tensor under its published name and shape, sparse data.

- the DiT, `wan2.1_t2v_1.3B_fp16.safetensors` (Comfy-Org's repackage, F16, names without a
  prefix: sd-cli's --diffusion-model adds `model.diffusion_model.`). Hyperparameters of the
  released config (and of src/model/diffusion/wan.hpp, which keys them on 30 blocks): hidden 1536,
  12 heads, FFN 8960, 16 latent channels in and out, patch (1, 2, 2), 4096-wide text context,
  256-wide sinusoidal time embedding, QK RMS norms and an affine cross-attention norm (norm3);
- UMT5-XXL's encoder as city96's `umt5-xxl-encoder-Q8_0.gguf` / `-Q4_0.gguf` (llama.cpp's T5
  names, general.architecture "t5encoder"): 24 blocks of width 4096, 64 heads, gated-GELU FFN
  10240, a 256384-token vocabulary, and — unlike T5 v1.1 — a relative-position bias in every
  block. Every matrix in the file's type except the bias tables, which llama-quantize leaves F32
  (llama-quant.cpp skips `attn_rel_b`); norms F32;
- the causal 3-D VAE, `wan_2.1_vae.safetensors` (the original Wan2.1_VAE names, BF16): base
  width 96, multipliers (1, 2, 4, 4), two residual blocks per level (three in the decoder), z 16,
  temporal down-sampling at the second and third levels, RMS-norm gammas shaped (C, 1, 1, 1)
  ((C, 1, 1) in the 2-D middle attention).
"""
from __future__ import annotations

from pathlib import Path

from planner.synth.gguf_factory import Q, write_model
from planner.synth.safetensors_factory import write_safetensors

Shape = tuple[int, ...]
Tensors = dict[str, Shape]

# ---- the DiT (Wan2.1-T2V-1.3B)
WAN_DIM, WAN_FFN, WAN_HEADS, WAN_LAYERS = 1536, 8960, 12, 30
WAN_IN, WAN_OUT, WAN_FREQ, WAN_TEXT = 16, 16, 256, 4096
WAN_PATCH = (1, 2, 2)


def _linear(out: Tensors, name: str, n_out: int, n_in: int) -> None:
    out[f"{name}.weight"] = (n_out, n_in)
    out[f"{name}.bias"] = (n_out,)


# Wan2.1-T2V-14B (Comfy-Org's `wan2.1_t2v_14B_fp16.safetensors`): the same layout at hidden 5120, 40 heads,
# FFN 13824, 40 blocks (src/model/diffusion/wan.hpp keys them on 40 blocks and no img_emb); the same
# VAE and UMT5-XXL as the 1.3B
WAN14_DIM, WAN14_FFN, WAN14_HEADS, WAN14_LAYERS = 5120, 13824, 40, 40


def wan_dit_tensors(layers: int = WAN_LAYERS, dim: int = WAN_DIM, ffn: int = WAN_FFN) -> Tensors:
    """The T2V DiT: the 1.3B by default, the 14B with wan14b_dit_tensors's sizes."""
    d = dim
    out: Tensors = {"patch_embedding.weight": (d, WAN_IN, *WAN_PATCH), "patch_embedding.bias": (d,)}
    _linear(out, "text_embedding.0", d, WAN_TEXT)
    _linear(out, "text_embedding.2", d, d)
    _linear(out, "time_embedding.0", d, WAN_FREQ)
    _linear(out, "time_embedding.2", d, d)
    _linear(out, "time_projection.1", 6 * d, d)
    for i in range(layers):
        p = f"blocks.{i}"
        for attn in ("self_attn", "cross_attn"):
            for proj in ("q", "k", "v", "o"):
                _linear(out, f"{p}.{attn}.{proj}", d, d)
            out[f"{p}.{attn}.norm_q.weight"] = (d,)
            out[f"{p}.{attn}.norm_k.weight"] = (d,)
        out[f"{p}.norm3.weight"] = (d,)
        out[f"{p}.norm3.bias"] = (d,)
        _linear(out, f"{p}.ffn.0", ffn, d)
        _linear(out, f"{p}.ffn.2", d, ffn)
        out[f"{p}.modulation"] = (1, 6, d)
    _linear(out, "head.head", WAN_OUT * WAN_PATCH[0] * WAN_PATCH[1] * WAN_PATCH[2], d)
    out["head.modulation"] = (1, 2, d)
    return out


def wan14b_dit_tensors() -> Tensors:
    return wan_dit_tensors(WAN14_LAYERS, WAN14_DIM, WAN14_FFN)


# ---- UMT5-XXL's encoder, llama.cpp names (ggml order: ne0 first)
UMT5_WIDTH, UMT5_FF, UMT5_LAYERS, UMT5_VOCAB, UMT5_BUCKETS, UMT5_HEADS = 4096, 10240, 24, 256384, 32, 64


def umt5_gguf_tensors(qtype: str = "Q8_0", layers: int = UMT5_LAYERS) -> list[tuple[str, Q, Shape]]:
    q = Q.__members__[qtype]
    w, ff = UMT5_WIDTH, UMT5_FF
    out: list[tuple[str, Q, Shape]] = [("token_embd.weight", q, (w, UMT5_VOCAB))]
    for i in range(layers):
        p = f"enc.blk.{i}"
        out += [(f"{p}.attn_rel_b.weight", Q.F32, (UMT5_HEADS, UMT5_BUCKETS)),
                (f"{p}.attn_norm.weight", Q.F32, (w,))]
        out += [(f"{p}.attn_{n}.weight", q, (w, w)) for n in ("q", "k", "v", "o")]
        out += [(f"{p}.ffn_norm.weight", Q.F32, (w,)),
                (f"{p}.ffn_gate.weight", q, (w, ff)), (f"{p}.ffn_up.weight", q, (w, ff)),
                (f"{p}.ffn_down.weight", q, (ff, w))]
    out.append(("enc.output_norm.weight", Q.F32, (w,)))
    return out


def write_umt5_gguf(path: Path, qtype: str = "Q8_0", layers: int = UMT5_LAYERS) -> Path:
    """UMT5-XXL's encoder as a sparse GGUF; `layers` < 24 makes a stand-in whose output (and so the
    DiT's 512 x 4096 context) has the same shape, for runs that need the DiT's or VAE's buffers
    without running 24 blocks of UMT5 on the CPU first."""
    meta = {"{arch}.context_length": 512, "{arch}.embedding_length": UMT5_WIDTH,
            "{arch}.feed_forward_length": UMT5_FF, "{arch}.block_count": layers,
            "{arch}.attention.head_count": UMT5_HEADS}
    return write_model(path, "t5encoder", meta, umt5_gguf_tensors(qtype, layers))[0]


# ---- the Wan 2.1 VAE (original names)
VAE_DIM, VAE_Z = 96, 16
VAE_MULT = (1, 2, 4, 4)
VAE_RES = 2
VAE_TIME_DOWN = (False, True, True)
VAE_TIME_UP = (True, True, False)


def _conv3d(out: Tensors, name: str, n_out: int, n_in: int, k: tuple[int, int, int]) -> None:
    out[f"{name}.weight"] = (n_out, n_in, *k)
    out[f"{name}.bias"] = (n_out,)


def _res(out: Tensors, p: str, c_in: int, c_out: int) -> None:
    out[f"{p}.residual.0.gamma"] = (c_in, 1, 1, 1)
    _conv3d(out, f"{p}.residual.2", c_out, c_in, (3, 3, 3))
    out[f"{p}.residual.3.gamma"] = (c_out, 1, 1, 1)
    _conv3d(out, f"{p}.residual.6", c_out, c_out, (3, 3, 3))
    if c_in != c_out:
        _conv3d(out, f"{p}.shortcut", c_out, c_in, (1, 1, 1))


def _middle(out: Tensors, p: str, c: int) -> None:
    _res(out, f"{p}.middle.0", c, c)
    out[f"{p}.middle.1.norm.gamma"] = (c, 1, 1)
    out[f"{p}.middle.1.to_qkv.weight"] = (3 * c, c, 1, 1)
    out[f"{p}.middle.1.to_qkv.bias"] = (3 * c,)
    out[f"{p}.middle.1.proj.weight"] = (c, c, 1, 1)
    out[f"{p}.middle.1.proj.bias"] = (c,)
    _res(out, f"{p}.middle.2", c, c)


def _resample(out: Tensors, p: str, c: int, c_out: int, time: tuple[int, int] | None) -> None:
    out[f"{p}.resample.1.weight"] = (c_out, c, 3, 3)
    out[f"{p}.resample.1.bias"] = (c_out,)
    if time:
        _conv3d(out, f"{p}.time_conv", time[0], time[1], (3, 1, 1))


def wan_vae_tensors() -> Tensors:
    out: Tensors = {}
    dims = [VAE_DIM * m for m in (1, *VAE_MULT)]
    _conv3d(out, "encoder.conv1", dims[0], 3, (3, 3, 3))
    idx = 0
    for i in range(len(VAE_MULT)):
        c_in, c_out = dims[i], dims[i + 1]
        for _ in range(VAE_RES):
            _res(out, f"encoder.downsamples.{idx}", c_in, c_out)
            c_in, idx = c_out, idx + 1
        if i != len(VAE_MULT) - 1:
            _resample(out, f"encoder.downsamples.{idx}", c_out, c_out, (c_out, c_out) if VAE_TIME_DOWN[i] else None)
            idx += 1
    _middle(out, "encoder", dims[-1])
    out["encoder.head.0.gamma"] = (dims[-1], 1, 1, 1)
    _conv3d(out, "encoder.head.2", 2 * VAE_Z, dims[-1], (3, 3, 3))
    _conv3d(out, "conv1", 2 * VAE_Z, 2 * VAE_Z, (1, 1, 1))
    _conv3d(out, "conv2", VAE_Z, VAE_Z, (1, 1, 1))
    up = [VAE_DIM * VAE_MULT[-1]] + [VAE_DIM * m for m in reversed(VAE_MULT)]
    _conv3d(out, "decoder.conv1", up[0], VAE_Z, (3, 3, 3))
    _middle(out, "decoder", up[0])
    idx = 0
    for i in range(len(VAE_MULT)):
        # levels after the first take the half-width output of the up-sampler before them
        c_in, c_out = (up[i] // 2 if i else up[i]), up[i + 1]
        for _ in range(VAE_RES + 1):
            _res(out, f"decoder.upsamples.{idx}", c_in, c_out)
            c_in, idx = c_out, idx + 1
        if i != len(VAE_MULT) - 1:
            _resample(out, f"decoder.upsamples.{idx}", c_out, c_out // 2,
                      (2 * c_out, c_out) if VAE_TIME_UP[i] else None)
            idx += 1
    out["decoder.head.0.gamma"] = (up[-1], 1, 1, 1)
    _conv3d(out, "decoder.head.2", 3, up[-1], (3, 3, 3))
    return out


# sd-cli's file flag -> the file's name as distributed
WAN_FILES = {"--diffusion-model": "wan2.1_t2v_1.3B_fp16.safetensors", "--vae": "wan_2.1_vae.safetensors",
             "--t5xxl": "umt5-xxl-encoder-{qtype}.gguf"}


def write_wan(directory: Path, te_qtype: str = "Q8_0", te_layers: int = UMT5_LAYERS,
              size: str = "1.3B") -> dict[str, Path]:
    """Wan2.1-T2V-1.3B's (`size` "14B": the 14B's) three files in `directory`, by the sd-cli flag that
    loads each (written once: an existing file is kept). `te_layers` < 24: the UMT5 stand-in of
    write_umt5_gguf."""
    directory.mkdir(parents=True, exist_ok=True)
    te_name = WAN_FILES["--t5xxl"].format(qtype=te_qtype)
    if te_layers != UMT5_LAYERS:
        te_name = te_name.replace(".gguf", f"-{te_layers}block.gguf")
    dit = WAN_FILES["--diffusion-model"].replace("1.3B", size)
    paths = {"--diffusion-model": directory / dit,
             "--vae": directory / WAN_FILES["--vae"], "--t5xxl": directory / te_name}
    if not paths["--diffusion-model"].exists():
        tensors = wan14b_dit_tensors() if size == "14B" else wan_dit_tensors()
        write_safetensors(paths["--diffusion-model"], {n: ("F16", s) for n, s in tensors.items()})
    if not paths["--vae"].exists():
        write_safetensors(paths["--vae"], {n: ("BF16", s) for n, s in wan_vae_tensors().items()})
    if not paths["--t5xxl"].exists():
        write_umt5_gguf(paths["--t5xxl"], te_qtype, te_layers)
    return paths


# ---- Wan2.2-TI2V-5B (Comfy-Org's `wan2.2_ti2v_5B_fp16.safetensors`, F16, no prefix): the 2.1 layout at
# hidden 3072, 24 heads, FFN 14336, 30 blocks, 48 latent channels in and out (sd.cpp's model_loader.cpp
# tells it from the 30-block 1.3B by the patch embedding's 48 x 3072 channels, VERSION_WAN2_2_TI2V), with
# the same UMT5-XXL; its VAE is `wan2.2_vae.safetensors` (Wan2.2_VAE.pth's names, BF16 as repackaged)
WAN22_DIM, WAN22_FFN, WAN22_HEADS, WAN22_LAYERS, WAN22_CHANNELS = 3072, 14336, 24, 30, 48


def wan22_dit_tensors() -> Tensors:
    out = wan_dit_tensors(WAN22_LAYERS, WAN22_DIM, WAN22_FFN)
    out["patch_embedding.weight"] = (WAN22_DIM, WAN22_CHANNELS, *WAN_PATCH)
    out["head.head.weight"] = (WAN22_CHANNELS * WAN_PATCH[0] * WAN_PATCH[1] * WAN_PATCH[2], WAN22_DIM)
    out["head.head.bias"] = (WAN22_CHANNELS * WAN_PATCH[0] * WAN_PATCH[1] * WAN_PATCH[2],)
    return out


# The Wan2.2 VAE (src/model/vae/wan_vae.hpp with wan2_2): 2x2 pixel patches (12 channels at each end), an
# encoder of base width 160 and a decoder of base width 256 (multipliers 1, 2, 4, 4), z 48; each level one
# block (Down_/Up_ResidualBlock: its residual blocks and re-sampler under `downsamples.{j}` /
# `upsamples.{j}`, a parameter-free avg_shortcut); the decoder's up-samplers keep their width
WAN22_VAE_ENC, WAN22_VAE_DEC, WAN22_VAE_Z, WAN22_VAE_IN = 160, 256, 48, 12


def wan22_vae_tensors() -> Tensors:
    out: Tensors = {}
    dims = [WAN22_VAE_ENC * m for m in (1, *VAE_MULT)]
    _conv3d(out, "encoder.conv1", dims[0], WAN22_VAE_IN, (3, 3, 3))
    for i in range(len(VAE_MULT)):
        p = f"encoder.downsamples.{i}.downsamples"
        c_in, c_out = dims[i], dims[i + 1]
        for j in range(VAE_RES):
            _res(out, f"{p}.{j}", c_in, c_out)
            c_in = c_out
        if i != len(VAE_MULT) - 1:
            _resample(out, f"{p}.{VAE_RES}", c_out, c_out, (c_out, c_out) if VAE_TIME_DOWN[i] else None)
    _middle(out, "encoder", dims[-1])
    out["encoder.head.0.gamma"] = (dims[-1], 1, 1, 1)
    _conv3d(out, "encoder.head.2", 2 * WAN22_VAE_Z, dims[-1], (3, 3, 3))
    _conv3d(out, "conv1", 2 * WAN22_VAE_Z, 2 * WAN22_VAE_Z, (1, 1, 1))
    _conv3d(out, "conv2", WAN22_VAE_Z, WAN22_VAE_Z, (1, 1, 1))
    up = [WAN22_VAE_DEC * VAE_MULT[-1]] + [WAN22_VAE_DEC * m for m in reversed(VAE_MULT)]
    _conv3d(out, "decoder.conv1", up[0], WAN22_VAE_Z, (3, 3, 3))
    _middle(out, "decoder", up[0])
    for i in range(len(VAE_MULT)):
        p = f"decoder.upsamples.{i}.upsamples"
        c_in, c_out = up[i], up[i + 1]
        for j in range(VAE_RES + 1):
            _res(out, f"{p}.{j}", c_in, c_out)
            c_in = c_out
        if i != len(VAE_MULT) - 1:
            _resample(out, f"{p}.{VAE_RES + 1}", c_out, c_out, (2 * c_out, c_out) if VAE_TIME_UP[i] else None)
    out["decoder.head.0.gamma"] = (up[-1], 1, 1, 1)
    _conv3d(out, "decoder.head.2", WAN22_VAE_IN, up[-1], (3, 3, 3))
    return out


WAN22_FILES = {"--diffusion-model": "wan2.2_ti2v_5B_fp16.safetensors", "--vae": "wan2.2_vae.safetensors"}


def write_wan22(directory: Path, te_qtype: str = "Q8_0", te_layers: int = UMT5_LAYERS) -> dict[str, Path]:
    """Wan2.2-TI2V-5B's three files in `directory` by sd-cli flag (the UMT5 file named as write_wan's)."""
    directory.mkdir(parents=True, exist_ok=True)
    te_name = WAN_FILES["--t5xxl"].format(qtype=te_qtype)
    if te_layers != UMT5_LAYERS:
        te_name = te_name.replace(".gguf", f"-{te_layers}block.gguf")
    paths = {"--diffusion-model": directory / WAN22_FILES["--diffusion-model"],
             "--vae": directory / WAN22_FILES["--vae"], "--t5xxl": directory / te_name}
    if not paths["--t5xxl"].exists():
        write_umt5_gguf(paths["--t5xxl"], te_qtype, te_layers)
    if not paths["--diffusion-model"].exists():
        write_safetensors(paths["--diffusion-model"], {n: ("F16", s) for n, s in wan22_dit_tensors().items()})
    if not paths["--vae"].exists():
        write_safetensors(paths["--vae"], {n: ("BF16", s) for n, s in wan22_vae_tensors().items()})
    return paths
