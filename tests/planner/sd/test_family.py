"""Which model a component is (planner/sd/family.py), on the shape-faithful checkpoints and
variants of them that the corpus does not cover."""
from __future__ import annotations

from planner.sd.components import read_components
from planner.sd.family import family
from planner.sd.roles import FileRole, Kind, ModelSource
from planner.synth.safetensors_factory import write_safetensors
from planner.synth.shapes_sd import CHECKPOINTS


def families(tmp_path, tensors):
    path = write_safetensors(tmp_path / "m.safetensors", {n: ("F16", s) for n, s in tensors.items()})
    return {c.kind: family(c) for c in read_components([ModelSource(str(path))]) if c.params_bytes}


def test_released_layouts(tmp_path):
    assert families(tmp_path, CHECKPOINTS["sd15"]()) == {Kind.DIFFUSION: "sd15", Kind.TE: "sd15", Kind.VAE: "kl-f8"}
    assert families(tmp_path, CHECKPOINTS["sdxl"]()) == {Kind.DIFFUSION: "sdxl", Kind.TE: "sdxl", Kind.VAE: "kl-f8"}


def test_a_1024_wide_context_with_1x1_projections_is_neither_sd15_nor_sd2(tmp_path):
    # SD 2.x's cross attention reads a 1024-wide OpenCLIP context through linear projections; an SD 1.x
    # UNet with that context and 1x1-convolution projections is no released model (sd-cli would build
    # convolutions for it, which the sd2 graph does not)
    t = CHECKPOINTS["sd15"]()
    for name in [n for n in t if ".attn2.to_k." in n or ".attn2.to_v." in n]:
        t[name] = (t[name][0], 1024)
    assert families(tmp_path, t)[Kind.DIFFUSION] is None


def test_a_16_channel_vae_is_not_kl_f8(tmp_path):
    # SD3 / Flux VAEs decode 16 latent channels: the 16-channel autoencoder, not KL-f8
    t = CHECKPOINTS["sd15"]()
    t["first_stage_model.decoder.conv_in.weight"] = (512, 16, 3, 3)
    assert families(tmp_path, t)[Kind.VAE] == "ae16"


def test_flux_files(tmp_path):
    from planner.synth.shapes_sd import write_flux

    roles = {"--diffusion-model": FileRole.DIFFUSION_MODEL, "--t5xxl": FileRole.T5XXL, "--clip_l": FileRole.CLIP_L,
             "--vae": FileRole.VAE}
    sources = [ModelSource(str(p), roles[flag]) for flag, p in write_flux(tmp_path).items()]
    got = {c.kind: family(c) for c in read_components(sources)}
    # the 16-channel autoencoder: the decode graph SD3 and Z-Image share (planner/sd/family.py)
    assert got == {Kind.DIFFUSION: "flux", Kind.TE: "flux", Kind.VAE: "ae16"}


def test_sd2_released_layout(tmp_path):
    """v2-1_768-ema-pruned (F32 as released): its UNet and OpenCLIP-H text encoder are "sd2", its VAE the
    KL-f8 network SD 1.x decodes with the same graph."""
    path = write_safetensors(tmp_path / "m.safetensors", {n: ("F32", s) for n, s in CHECKPOINTS["sd2"]().items()})
    got = {c.kind: family(c) for c in read_components([ModelSource(str(path))]) if c.params_bytes}
    assert got == {Kind.DIFFUSION: "sd2", Kind.TE: "sd2", Kind.VAE: "kl-f8"}


def test_sd2_inpainting_is_not_sd2(tmp_path):
    # 512-inpainting-ema: 9 input channels (latent, mask, masked image); sd-cli builds another graph for it
    t = CHECKPOINTS["sd2"]()
    t["model.diffusion_model.input_blocks.0.0.weight"] = (320, 9, 3, 3)
    assert families(tmp_path, t)[Kind.DIFFUSION] is None


def test_sd2_with_the_last_text_block_cut_is_not_sd2(tmp_path):
    # a text tower of 23 blocks (some converted files drop the unused last one): not the released layout
    t = {n: s for n, s in CHECKPOINTS["sd2"]().items() if ".resblocks.23." not in n}
    assert families(tmp_path, t)[Kind.TE] is None
