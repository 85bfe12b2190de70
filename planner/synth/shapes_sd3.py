"""Shape-faithful checkpoints of two more stable-diffusion.cpp families: every tensor of the
published files under the names stable-diffusion.cpp's loader reads, shapes in PyTorch order
(out, in, kh, kw), sparse data (holes read as zeros).

SD3.5 medium (stabilityai `sd3.5_medium.safetensors`, F16): the MMDiT-X under
`model.diffusion_model.` and its 16-channel KL-f8 autoencoder under `first_stage_model.` in one
file; the text encoders as the separate files sd.cpp's docs/sd3.md names — CLIP-L
(`clip_l.safetensors`), OpenCLIP bigG as a Hugging Face CLIPTextModelWithProjection
(`clip_g.safetensors`) and T5-XXL's encoder, here as the Q8_0 GGUF people download in its place
(llama.cpp names `enc.blk.N.*`; the F16 file is 9.5 GB). Hyperparameters of the released config:
depth 24, hidden 64 x 24 = 1536, 24 heads of 64, MLP ratio 4, qk RMS norm, self-attention in the
x blocks 0-12 (MMDiT-X), a learned 384 x 384 position table, 2048-wide pooled vector, 4096-wide
context, 2x2 patches of 16 channels; the last joint block's context half is pre-only (no output
projection or MLP).

Z-Image-Turbo (Tongyi-MAI; Comfy-Org `z_image_turbo_bf16.safetensors`, names without a prefix:
sd-cli's --diffusion-model adds `model.diffusion_model.`), with Qwen3-4B as its text encoder
(`--llm`, the Q8_0 GGUF with llama.cpp names; the BF16 file is 8 GB) and FLUX.1's autoencoder
(planner/synth/shapes_sd.ae16_tensors). Hyperparameters of the released config: dim 3840,
30 layers, 2 noise-refiner and 2 context-refiner layers, 30 heads of 128 (no grouping), FFN
10240 (SwiGLU), caption features 2560 (Qwen3-4B's hidden size), adaLN input 256, 2x2 patches of
16 channels. Qwen3-4B: hidden 2560, 36 layers, 32 query and 8 key/value heads of 128, FFN 9728,
vocabulary 151936, tied embeddings (no output matrix).
"""
from __future__ import annotations

from pathlib import Path

from planner.synth.safetensors_factory import write_safetensors
from planner.synth.shapes_sd import (
    CLIP_G,
    T5_BUCKETS,
    T5_FF,
    T5_HEADS,
    T5_LAYERS,
    T5_VOCAB,
    T5_WIDTH,
    Tensors,
    ae16_tensors,
    clip_l_tensors,
    clip_text_tensors,
    vae_tensors,
)

# ---- SD3.5 medium

SD3_DEPTH = 24
SD3_HIDDEN = 64 * SD3_DEPTH
SD3_HEAD = 64
SD3_SELF_ATTN_X = 13           # x blocks 0..12 carry a second self-attention (attn2)
SD3_POS_SIDE = 384             # pos_embed_max_size
SD3_ADM = 2048                 # pooled CLIP-L (768) + CLIP-G (1280)
SD3_PATCH_IN = 16
SD3_CLIP_G_LAYERS = 32


def _linear(out: Tensors, name: str, n_out: int, n_in: int, bias: bool = True) -> None:
    out[f"{name}.weight"] = (n_out, n_in)
    if bias:
        out[f"{name}.bias"] = (n_out,)


def _sd3_attn(out: Tensors, p: str, proj: bool, h: int = SD3_HIDDEN) -> None:
    _linear(out, f"{p}.qkv", 3 * h, h)
    if proj:
        _linear(out, f"{p}.proj", h, h)
    out[f"{p}.ln_q.weight"] = (SD3_HEAD,)
    out[f"{p}.ln_k.weight"] = (SD3_HEAD,)


def _sd3_half(out: Tensors, p: str, pre_only: bool, self_attn: bool, h: int = SD3_HIDDEN) -> None:
    """One DismantledBlock: norms without parameters, attention, MLP, adaLN modulation."""
    _sd3_attn(out, f"{p}.attn", proj=not pre_only, h=h)
    if self_attn:
        _sd3_attn(out, f"{p}.attn2", proj=True, h=h)
    if not pre_only:
        _linear(out, f"{p}.mlp.fc1", 4 * h, h)
        _linear(out, f"{p}.mlp.fc2", h, 4 * h)
    mods = 2 if pre_only else 9 if self_attn else 6
    _linear(out, f"{p}.adaLN_modulation.1", mods * h, h)


def mmdit_tensors(prefix: str = "model.diffusion_model.", depth: int = SD3_DEPTH, hidden: int = SD3_HIDDEN,
                  self_attn_x: int = SD3_SELF_ATTN_X, pos_side: int = SD3_POS_SIDE) -> Tensors:
    """SD3.5 medium's MMDiT-X (the defaults) or another MMDiT of the layout (SD3.5 large:
    sd35_large_mmdit_tensors). `depth` below 24 keeps the first blocks and the last (pre-only)
    one's layout: a stand-in whose VAE decode sd-cli reaches sooner (sd.cpp reads the depth from
    the block names and the hidden size from the embedders, so the width stays 1536)."""
    out: Tensors = {}
    h = hidden
    out[f"{prefix}pos_embed"] = (1, pos_side * pos_side, h)
    out[f"{prefix}x_embedder.proj.weight"] = (h, SD3_PATCH_IN, 2, 2)
    out[f"{prefix}x_embedder.proj.bias"] = (h,)
    _linear(out, f"{prefix}t_embedder.mlp.0", h, 256)
    _linear(out, f"{prefix}t_embedder.mlp.2", h, h)
    _linear(out, f"{prefix}y_embedder.mlp.0", h, SD3_ADM)
    _linear(out, f"{prefix}y_embedder.mlp.2", h, h)
    _linear(out, f"{prefix}context_embedder", h, T5_WIDTH)
    for i in range(depth):
        p = f"{prefix}joint_blocks.{i}"
        _sd3_half(out, f"{p}.context_block", pre_only=i == depth - 1, self_attn=False, h=h)
        _sd3_half(out, f"{p}.x_block", pre_only=False, self_attn=i < min(self_attn_x, depth - 1), h=h)
    _linear(out, f"{prefix}final_layer.linear", 2 * 2 * SD3_PATCH_IN, h)
    _linear(out, f"{prefix}final_layer.adaLN_modulation.1", 2 * h, h)
    return out


# ---- SD3.5 large (stabilityai `sd3.5_large.safetensors`): the MMDiT of the original SD3 layout at
# depth 38 — hidden 64 x 38 = 2432, 38 heads of 64, MLP ratio 4, qk RMS norm as in 3.5, no second
# self-attention in the x blocks (MMDiT-X is medium's), a 192 x 192 position table; the same
# 2048-wide pooled vector, 4096-wide context and 16-channel autoencoder, and the same three text
# encoders (clip_l, clip_g, T5-XXL) as separate files. F16 as medium's file here.

SD35L_DEPTH = 38
SD35L_HIDDEN = 64 * SD35L_DEPTH
SD35L_POS_SIDE = 192


def sd35_large_mmdit_tensors(prefix: str = "model.diffusion_model.") -> Tensors:
    return mmdit_tensors(prefix, SD35L_DEPTH, SD35L_HIDDEN, self_attn_x=0, pos_side=SD35L_POS_SIDE)


def write_sd35_large(directory: Path, t5_layers: int = T5_LAYERS) -> dict[str, Path]:
    """SD3.5 large's four files by sd-cli flag (the text encoders are medium's)."""
    directory.mkdir(parents=True, exist_ok=True)
    model = directory / "sd3.5_large.safetensors"
    if not model.exists():
        tensors = sd35_large_mmdit_tensors()
        tensors.update(ae16_prefixed("first_stage_model."))
        write_safetensors(model, {n: ("F16", s) for n, s in tensors.items()})
    return {"-m": model, **_sd3_encoders(directory, t5_layers)}


def ae16_prefixed(prefix: str) -> Tensors:
    """The 16-channel KL-f8 autoencoder (SD3's and FLUX.1's; no quant convolutions) under `prefix`."""
    out = {f"{prefix}{n}": s for n, s in ae16_tensors().items()}
    assert set(out) <= set(vae_tensors(prefix)), "ae16 is the KL-f8 layout"
    return out


def sd3_tensors(depth: int = SD3_DEPTH) -> Tensors:
    out = mmdit_tensors(depth=depth)
    out.update(ae16_prefixed("first_stage_model."))
    return out


def clip_g_tensors() -> Tensors:
    """OpenCLIP bigG's text tower as clip_g.safetensors has it: Hugging Face CLIP names, 32 layers
    of width 1280, and the pooled output's projection."""
    out = clip_text_tensors("text_model.", CLIP_G, SD3_CLIP_G_LAYERS)
    out["text_projection.weight"] = (CLIP_G, CLIP_G)
    return out


def t5xxl_gguf_tensors(layers: int = T5_LAYERS) -> list[tuple[str, str, tuple[int, ...]]]:
    """T5-XXL's encoder as the llama.cpp-named GGUF: (name, "q" for the quantized matrices or
    "F32", PyTorch-order shape). The relative position bias sits in block 0 only."""
    out: list[tuple[str, str, tuple[int, ...]]] = [("token_embd.weight", "q", (T5_VOCAB, T5_WIDTH))]
    for i in range(layers):
        p = f"enc.blk.{i}"
        if i == 0:
            out.append((f"{p}.attn_rel_b.weight", "F32", (T5_BUCKETS, T5_HEADS)))
        for proj in ("attn_q", "attn_k", "attn_v", "attn_o"):
            out.append((f"{p}.{proj}.weight", "q", (T5_WIDTH, T5_WIDTH)))
        out.append((f"{p}.attn_norm.weight", "F32", (T5_WIDTH,)))
        out.append((f"{p}.ffn_gate.weight", "q", (T5_FF, T5_WIDTH)))
        out.append((f"{p}.ffn_up.weight", "q", (T5_FF, T5_WIDTH)))
        out.append((f"{p}.ffn_down.weight", "q", (T5_WIDTH, T5_FF)))
        out.append((f"{p}.ffn_norm.weight", "F32", (T5_WIDTH,)))
    out.append(("enc.output_norm.weight", "F32", (T5_WIDTH,)))
    return out


def _write_gguf(path: Path, arch: str, tensors: list[tuple[str, str, tuple[int, ...]]], qtype: str) -> Path:
    from planner.synth.gguf_factory import Q, write_model

    q = Q.__members__[qtype]
    rows = [(name, q if kind == "q" else Q.__members__[kind], tuple(reversed(shape))) for name, kind, shape in tensors]
    return write_model(path, arch, {}, rows)[0]


def write_t5xxl_gguf(path: Path, qtype: str = "Q8_0", layers: int = T5_LAYERS) -> Path:
    return _write_gguf(path, "t5encoder", t5xxl_gguf_tensors(layers), qtype)


def write_sd3(directory: Path, depth: int = SD3_DEPTH, t5_layers: int = T5_LAYERS) -> dict[str, Path]:
    """SD3.5 medium's four files, by the sd-cli flag that loads each. `depth` / `t5_layers` below
    the released 24 / 24 write the stand-ins the corpus uses to reach later runners sooner."""
    tag = "" if depth == SD3_DEPTH else f"-{depth}blocks"
    model = directory / f"sd3.5_medium{tag}.safetensors"
    if not model.exists():
        write_safetensors(model, {n: ("F16", s) for n, s in sd3_tensors(depth).items()})
    return {"-m": model, **_sd3_encoders(directory, t5_layers)}


def _sd3_encoders(directory: Path, t5_layers: int) -> dict[str, Path]:
    """SD3.5's three text encoder files (medium's and large's), by sd-cli flag."""
    t5_tag = "" if t5_layers == T5_LAYERS else f"-{t5_layers}blocks"
    clip_l = directory / "clip_l.safetensors"
    if not clip_l.exists():
        write_safetensors(clip_l, {n: ("F16", s) for n, s in clip_l_tensors().items()})
    clip_g = directory / "clip_g.safetensors"
    if not clip_g.exists():
        write_safetensors(clip_g, {n: ("F16", s) for n, s in clip_g_tensors().items()})
    t5 = directory / f"t5xxl-Q8_0{t5_tag}.gguf"
    if not t5.exists():
        write_t5xxl_gguf(t5, "Q8_0", t5_layers)
    return {"--clip_l": clip_l, "--clip_g": clip_g, "--t5xxl": t5}


# ---- Z-Image-Turbo

ZI_DIM = 3840
ZI_LAYERS = 30
ZI_REFINERS = 2
ZI_HEADS = 30
ZI_HEAD = 128
ZI_FF = 10240
ZI_ADALN = 256
ZI_CAP = 2560
ZI_PATCH_IN = 2 * 2 * 16
ZI_T_HIDDEN = 1024             # min(dim, 1024)

QWEN3_4B_DIM = 2560
QWEN3_4B_LAYERS = 36
QWEN3_4B_HEADS, QWEN3_4B_KV, QWEN3_4B_HEAD = 32, 8, 128
QWEN3_4B_FF = 9728
QWEN3_VOCAB = 151936


def _zi_block(out: Tensors, p: str, modulation: bool) -> None:
    d = ZI_DIM
    _linear(out, f"{p}.attention.qkv", 3 * ZI_HEADS * ZI_HEAD, d, bias=False)
    _linear(out, f"{p}.attention.out", d, ZI_HEADS * ZI_HEAD, bias=False)
    out[f"{p}.attention.q_norm.weight"] = (ZI_HEAD,)
    out[f"{p}.attention.k_norm.weight"] = (ZI_HEAD,)
    _linear(out, f"{p}.feed_forward.w1", ZI_FF, d, bias=False)
    _linear(out, f"{p}.feed_forward.w2", d, ZI_FF, bias=False)
    _linear(out, f"{p}.feed_forward.w3", ZI_FF, d, bias=False)
    for n in ("attention_norm1", "ffn_norm1", "attention_norm2", "ffn_norm2"):
        out[f"{p}.{n}.weight"] = (d,)
    if modulation:
        _linear(out, f"{p}.adaLN_modulation.0", 4 * d, ZI_ADALN)


def z_image_tensors(layers: int = ZI_LAYERS) -> Tensors:
    """Z-Image-Turbo's DiT, names as the released file has them (no prefix). `layers` below 30:
    a stand-in with the first main layers only (sd.cpp counts them from the names)."""
    out: Tensors = {}
    d = ZI_DIM
    out["x_pad_token"] = (d,)
    out["cap_pad_token"] = (d,)
    _linear(out, "x_embedder", d, ZI_PATCH_IN)
    _linear(out, "t_embedder.mlp.0", ZI_T_HIDDEN, 256)
    _linear(out, "t_embedder.mlp.2", ZI_ADALN, ZI_T_HIDDEN)
    out["cap_embedder.0.weight"] = (ZI_CAP,)
    _linear(out, "cap_embedder.1", d, ZI_CAP)
    for i in range(ZI_REFINERS):
        _zi_block(out, f"noise_refiner.{i}", modulation=True)
        _zi_block(out, f"context_refiner.{i}", modulation=False)
    for i in range(layers):
        _zi_block(out, f"layers.{i}", modulation=True)
    _linear(out, "final_layer.linear", ZI_PATCH_IN, d)
    _linear(out, "final_layer.adaLN_modulation.1", d, ZI_ADALN)
    return out


def qwen3_4b_gguf_tensors(layers: int = QWEN3_4B_LAYERS) -> list[tuple[str, str, tuple[int, ...]]]:
    """Qwen3-4B as llama.cpp's converter names it (the GGUF people download): matrices "q",
    norms F32, PyTorch-order shapes."""
    d, q, kv = QWEN3_4B_DIM, QWEN3_4B_HEADS * QWEN3_4B_HEAD, QWEN3_4B_KV * QWEN3_4B_HEAD
    out: list[tuple[str, str, tuple[int, ...]]] = [("token_embd.weight", "q", (QWEN3_VOCAB, d))]
    for i in range(layers):
        p = f"blk.{i}"
        out += [(f"{p}.attn_norm.weight", "F32", (d,)),
                (f"{p}.attn_q.weight", "q", (q, d)), (f"{p}.attn_k.weight", "q", (kv, d)),
                (f"{p}.attn_v.weight", "q", (kv, d)), (f"{p}.attn_output.weight", "q", (d, q)),
                (f"{p}.attn_q_norm.weight", "F32", (QWEN3_4B_HEAD,)),
                (f"{p}.attn_k_norm.weight", "F32", (QWEN3_4B_HEAD,)),
                (f"{p}.ffn_norm.weight", "F32", (d,)),
                (f"{p}.ffn_gate.weight", "q", (QWEN3_4B_FF, d)), (f"{p}.ffn_up.weight", "q", (QWEN3_4B_FF, d)),
                (f"{p}.ffn_down.weight", "q", (d, QWEN3_4B_FF))]
    out.append(("output_norm.weight", "F32", (d,)))
    return out


def write_qwen3_4b_gguf(path: Path, qtype: str = "Q8_0", layers: int = QWEN3_4B_LAYERS) -> Path:
    return _write_gguf(path, "qwen3", qwen3_4b_gguf_tensors(layers), qtype)


def write_z_image(directory: Path, layers: int = ZI_LAYERS, llm_layers: int = QWEN3_4B_LAYERS,
                  dit_gguf: str | None = None) -> dict[str, Path]:
    """Z-Image-Turbo's three files by sd-cli flag: the DiT (BF16 safetensors, or the `dit_gguf`
    quantized GGUF: matrices in that type, 1-D tensors F32), Qwen3-4B Q8_0 and the FLUX.1 VAE (F32)."""
    tag = "" if layers == ZI_LAYERS else f"-{layers}layers"
    if dit_gguf:
        dit = directory / f"z_image_turbo-{dit_gguf}{tag}.gguf"
        if not dit.exists():
            rows = [(n, "F32" if len(s) == 1 else "q", s) for n, s in z_image_tensors(layers).items()]
            _write_gguf(dit, "z_image", rows, dit_gguf)
    else:
        dit = directory / f"z_image_turbo_bf16{tag}.safetensors"
        if not dit.exists():
            write_safetensors(dit, {n: ("BF16", s) for n, s in z_image_tensors(layers).items()})
    llm_tag = "" if llm_layers == QWEN3_4B_LAYERS else f"-{llm_layers}layers"
    llm = directory / f"Qwen3-4B-Q8_0{llm_tag}.gguf"
    if not llm.exists():
        write_qwen3_4b_gguf(llm, "Q8_0", llm_layers)
    vae = directory / "ae.safetensors"
    if not vae.exists():
        write_safetensors(vae, {n: ("F32", s) for n, s in ae16_tensors().items()})
    return {"--diffusion-model": dit, "--llm": llm, "--vae": vae}
