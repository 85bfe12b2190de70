"""The shape-faithful SD3.5 medium and Z-Image-Turbo files (planner/synth/shapes_sd3.py): the
released models' parameter counts where they are published, the params buffers sd-fit sizes
from them (worked out by hand below), and the families sd-fit recognises.

Published counts (Hugging Face model cards / `sum(p.numel())`): Qwen3-4B 4,022,468,096 (tied
embeddings); T5EncoderModel (t5-v1_1-xxl) 4,762,310,656; the OpenCLIP bigG text tower with its
projection 694,659,840; CLIP ViT-L/14's text model 123,060,480 (+ a 768 x 768 projection in
clip_l.safetensors); FLUX.1's AutoencoderKL 83,819,683.
"""
from __future__ import annotations

import math

from planner.sd.components import read_components
from planner.sd.family import family
from planner.sd.roles import FileRole, Kind, ModelSource
from planner.synth.shapes_sd3 import (
    clip_g_tensors,
    mmdit_tensors,
    qwen3_4b_gguf_tensors,
    sd3_tensors,
    t5xxl_gguf_tensors,
    write_sd3,
    write_z_image,
    z_image_tensors,
)

ROLES = {"-m": FileRole.MODEL, "--clip_l": FileRole.CLIP_L, "--clip_g": FileRole.CLIP_G, "--t5xxl": FileRole.T5XXL,
         "--diffusion-model": FileRole.DIFFUSION_MODEL, "--llm": FileRole.LLM, "--vae": FileRole.VAE}


def components(files):
    return {c.kind: c for c in read_components([ModelSource(str(p), ROLES[f]) for f, p in files.items()])}


def test_published_parameter_counts():
    assert sum(math.prod(s) for _, _, s in qwen3_4b_gguf_tensors()) == 4_022_468_096
    assert sum(math.prod(s) for _, _, s in t5xxl_gguf_tensors()) == 4_762_310_656
    assert sum(math.prod(s) for s in clip_g_tensors().values()) == 694_659_840
    vae = {n: s for n, s in sd3_tensors().items() if n.startswith("first_stage_model.")}
    assert sum(math.prod(s) for s in vae.values()) == 83_819_683


def test_mmdit_layout_by_hand():
    t = mmdit_tensors()
    h = 1536
    # 13 x blocks with a second attention (0-12), the last context block pre-only
    assert sum(1 for n in t if n.endswith("x_block.attn2.qkv.weight")) == 13
    assert t["model.diffusion_model.joint_blocks.23.context_block.adaLN_modulation.1.weight"] == (2 * h, h)
    assert "model.diffusion_model.joint_blocks.23.context_block.mlp.fc1.weight" not in t
    assert t["model.diffusion_model.joint_blocks.0.x_block.adaLN_modulation.1.weight"] == (9 * h, h)
    assert t["model.diffusion_model.joint_blocks.13.x_block.adaLN_modulation.1.weight"] == (6 * h, h)
    assert t["model.diffusion_model.pos_embed"] == (1, 384 * 384, h)


def test_z_image_layout_by_hand():
    t = z_image_tensors()
    assert sum(1 for n in t if n.endswith("attention.qkv.weight")) == 30 + 2 + 2
    assert t["layers.0.attention.qkv.weight"] == (3 * 30 * 128, 3840)
    assert t["layers.0.feed_forward.w1.weight"] == (10240, 3840)   # 8/3 x 3840, a multiple of 256
    assert "context_refiner.0.adaLN_modulation.0.weight" not in t
    assert t["cap_embedder.1.weight"] == (3840, 2560)


def test_sd3_params_buffers(tmp_path):
    comps = components(write_sd3(tmp_path))
    t = sd3_tensors()
    dit = {n: s for n, s in t.items() if n.startswith("model.diffusion_model.")}
    # the file's F16 bytes; the buffer holds 1-D tensors, the position table and the force_f32
    # Linears (t/y embedders, context embedder, final linear) as F32: 2 more bytes per element
    f16 = sum(math.prod(s) * 2 for s in dit.values())
    one_d = sum(math.prod(s) for s in dit.values() if len(s) == 1)
    forced = ("pos_embed", "t_embedder.mlp.0.weight", "t_embedder.mlp.2.weight", "y_embedder.mlp.0.weight",
              "y_embedder.mlp.2.weight", "context_embedder.weight", "final_layer.linear.weight")
    wide = sum(math.prod(s) for n, s in dit.items() if n.endswith(forced))
    padding = sum(-(math.prod(s) * (4 if len(s) == 1 or n.endswith(forced) else 2)) % 32 for n, s in dit.items())
    assert comps[Kind.DIFFUSION].buffer_bytes == f16 + 2 * (one_d + wide) + padding
    assert {k: family(c) for k, c in comps.items()} == {Kind.DIFFUSION: "sd3", Kind.TE: "sd3", Kind.VAE: "ae16"}


def test_z_image_families_and_forced_f32(tmp_path):
    comps = components(write_z_image(tmp_path))
    assert {k: family(c) for k, c in comps.items()} == {Kind.DIFFUSION: "zimage", Kind.TE: "zimage",
                                                          Kind.VAE: "ae16"}
    t = z_image_tensors()
    bf16 = sum(math.prod(s) * 2 for s in t.values())
    one_d = sum(math.prod(s) for s in t.values() if len(s) == 1)
    forced = sum(math.prod(t[n]) for n in ("t_embedder.mlp.0.weight", "t_embedder.mlp.2.weight",
                                              "final_layer.linear.weight"))
    padding = sum(-(math.prod(s) * (4 if len(s) == 1 else 2)) % 32 for s in t.values())
    assert comps[Kind.DIFFUSION].buffer_bytes == bf16 + 2 * (one_d + forced) + padding


def test_stand_ins_are_not_the_released_models(tmp_path):
    """The corpus's one-layer Z-Image (for the VAE) is no model the DiT curves cover."""
    comps = components(write_z_image(tmp_path, layers=1, dit_gguf="Q4_0"))
    assert family(comps[Kind.DIFFUSION]) is None
    assert family(comps[Kind.VAE]) == "ae16"
    comps = components(write_sd3(tmp_path, t5_layers=1))
    assert family(comps[Kind.TE]) is None
